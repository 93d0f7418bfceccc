//! Measured step times: a CSV of `prefill_tokens, decode_requests,
//! kv_tokens, seconds` on a full grid (every combination of the values
//! each column takes), interpolated linearly along each axis; beyond the
//! grid, the edge cell's slope carries on, and no step is faster than the
//! fastest measured one. docs/hardware.md says how to measure such a
//! table on a vLLM deployment.

use std::path::Path;

use crate::error::{Error, Result};
use crate::hardware::StepShape;

pub const COLUMNS: [&str; 4] = ["prefill_tokens", "decode_requests", "kv_tokens", "seconds"];

#[derive(Clone, Debug, PartialEq)]
pub struct StepTable {
    /// The grid's values along each axis, ascending.
    pub axes: [Vec<f64>; 3],
    /// seconds[(i · |axis 1| + j) · |axis 2| + k]
    seconds: Vec<f64>,
    fastest: f64,
}

impl StepTable {
    pub fn read(path: &Path) -> Result<StepTable> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read step table {}: {e}", path.display())))?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<StepTable> {
        let at = |line: usize, msg: String| Error::new(format!("{}:{line}: {msg}", path.display()));
        let mut rows: Vec<(usize, [f64; 4])> = Vec::new();
        let mut header_seen = false;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            if !header_seen {
                if cells != COLUMNS {
                    return Err(at(
                        n + 1,
                        format!("the header must be `{}`, got `{line}`", COLUMNS.join(",")),
                    ));
                }
                header_seen = true;
                continue;
            }
            if cells.len() != 4 {
                return Err(at(n + 1, format!("expected 4 values, got {}", cells.len())));
            }
            let mut row = [0.0; 4];
            for (k, c) in cells.iter().enumerate() {
                row[k] = c
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0 && (k < 3 || *v > 0.0))
                    .ok_or_else(|| {
                        at(
                            n + 1,
                            format!(
                                "`{}` must be a number {}, got `{c}`",
                                COLUMNS[k],
                                if k < 3 { ">= 0" } else { "> 0" }
                            ),
                        )
                    })?;
            }
            rows.push((n + 1, row));
        }
        if rows.is_empty() {
            return Err(Error::new(format!(
                "{}: the step table has no rows",
                path.display()
            )));
        }
        let mut axes: [Vec<f64>; 3] = Default::default();
        for (k, axis) in axes.iter_mut().enumerate() {
            *axis = rows.iter().map(|r| r.1[k]).collect();
            axis.sort_by(f64::total_cmp);
            axis.dedup();
        }
        let (n1, n2) = (axes[1].len(), axes[2].len());
        let cells = axes[0].len() * n1 * n2;
        let mut seconds = vec![f64::NAN; cells];
        for (line, r) in &rows {
            let idx = |k: usize| axes[k].binary_search_by(|v| v.total_cmp(&r[k])).unwrap();
            let i = (idx(0) * n1 + idx(1)) * n2 + idx(2);
            if !seconds[i].is_nan() {
                return Err(at(
                    *line,
                    format!("a second row for ({}, {}, {})", r[0], r[1], r[2]),
                ));
            }
            seconds[i] = r[3];
        }
        if let Some(i) = seconds.iter().position(|s| s.is_nan()) {
            let (a, b, c) = (i / (n1 * n2), (i / n2) % n1, i % n2);
            return Err(Error::new(format!(
                "{}: the table is not a full grid: no row for prefill_tokens {}, decode_requests {}, kv_tokens {}",
                path.display(),
                axes[0][a],
                axes[1][b],
                axes[2][c]
            )));
        }
        let fastest = seconds.iter().copied().fold(f64::INFINITY, f64::min);
        Ok(StepTable {
            axes,
            seconds,
            fastest,
        })
    }

    /// The step time of a shape, interpolated (see the module docs).
    pub fn step_time(&self, s: &StepShape) -> f64 {
        self.lookup([
            s.prompt_tokens as f64,
            f64::from(s.decode_requests),
            s.kv_tokens as f64,
        ])
    }

    pub fn lookup(&self, x: [f64; 3]) -> f64 {
        // Per axis: the cell's lower index, and the weight of the upper one
        // (outside [0, 1] beyond the grid).
        let mut lo = [0usize; 3];
        let mut w = [0.0; 3];
        for k in 0..3 {
            let a = &self.axes[k];
            if a.len() == 1 {
                continue;
            }
            let i = a
                .partition_point(|v| *v <= x[k])
                .saturating_sub(1)
                .min(a.len() - 2);
            lo[k] = i;
            w[k] = (x[k] - a[i]) / (a[i + 1] - a[i]);
        }
        let (n1, n2) = (self.axes[1].len(), self.axes[2].len());
        let mut t = 0.0;
        for corner in 0..8usize {
            let mut weight = 1.0;
            let mut idx = [0usize; 3];
            for k in 0..3 {
                let up = corner >> k & 1 == 1;
                if self.axes[k].len() == 1 {
                    if up {
                        weight = 0.0;
                    }
                    idx[k] = 0;
                    continue;
                }
                idx[k] = lo[k] + usize::from(up);
                weight *= if up { w[k] } else { 1.0 - w[k] };
            }
            if weight != 0.0 {
                t += weight * self.seconds[(idx[0] * n1 + idx[1]) * n2 + idx[2]];
            }
        }
        t.max(self.fastest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: &str = "\
# measured on one pod
prefill_tokens,decode_requests,kv_tokens,seconds
0,1,0,0.010
0,1,10000,0.020
0,9,0,0.030
0,9,10000,0.050
1000,1,0,0.110
1000,1,10000,0.120
1000,9,0,0.130
1000,9,10000,0.150
";

    #[test]
    fn between_grid_points_by_hand() {
        let t = StepTable::parse(GRID, Path::new("t.csv")).unwrap();
        // Midway on every axis: the mean of the 8 corners =
        // (0.010+0.020+0.030+0.050+0.110+0.120+0.130+0.150)/8 = 0.0775.
        let mid = t.lookup([500.0, 5.0, 5000.0]);
        assert!((mid - 0.0775).abs() < 1e-12, "{mid}");
        // On the prefill_tokens = 0 face, a quarter along decode_requests
        // (3 of 1..9) and along kv_tokens (2500): bilinear over
        // 0.010, 0.020, 0.030, 0.050 with weights 0.75·0.75, 0.75·0.25,
        // 0.25·0.75, 0.25·0.25 = 0.005625 + 0.00375 + 0.005625 + 0.003125
        // = 0.018125.
        let q = t.lookup([0.0, 3.0, 2500.0]);
        assert!((q - 0.018125).abs() < 1e-12, "{q}");
        // Beyond the grid the edge's slope carries on: kv 20000 at
        // (0, 1): 0.010 + 2 × 0.010 = 0.030.
        let far = t.lookup([0.0, 1.0, 20000.0]);
        assert!((far - 0.030).abs() < 1e-12, "{far}");
    }

    #[test]
    fn a_hole_in_the_grid_is_named() {
        let holed: String = GRID
            .lines()
            .filter(|l| !l.starts_with("1000,9,0,"))
            .collect::<Vec<_>>()
            .join("\n");
        let err = StepTable::parse(&holed, Path::new("t.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no row for prefill_tokens 1000, decode_requests 9, kv_tokens 0"),
            "{err}"
        );
        let bad = GRID.replace("0.150", "fast");
        let err = StepTable::parse(&bad, Path::new("t.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.csv:10:") && err.contains("`seconds`"),
            "{err}"
        );
    }
}
