//! The summary of a sweep: per point, over its seeds, the median and range
//! of each headline metric; written as JSON, CSV and a table.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::experiment::args::Axis;
use crate::experiment::outdir::{read, run_path};
use crate::experiment::plan::{Manifest, short_names};
use crate::metrics::write_atomic;

/// A headline metric: where it is in a run's report.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its key in summary.json and the stem of its columns in summary.csv.
    pub key: &'static str,
    /// Its column header in the printed tables, with the unit shown.
    pub header: &'static str,
    /// What a value is multiplied by to be shown in that unit (seconds as
    /// milliseconds); the JSON and CSV keep the report's units.
    pub scale: f64,
    pub at: At,
}

/// Where a metric is in a run's report.
#[derive(Debug, Clone, Copy)]
pub enum At {
    /// (section, name, field): `observations.ttft.mean`, `gauges.prefill_queue`.
    Field(&'static str, &'static str, Option<&'static str>),
    /// The ratio of two counters (None when the second is 0).
    Ratio(&'static str, &'static str),
}

/// The headline metrics of a sweep's summary (see the module docs).
pub const METRICS: [Metric; 13] = [
    Metric {
        key: "remote_fraction",
        header: "remote",
        scale: 1.0,
        at: At::Field("observations", "remote", Some("mean")),
    },
    Metric {
        key: "ttft_mean",
        header: "TTFT mean (ms)",
        scale: 1e3,
        at: At::Field("observations", "ttft", Some("mean")),
    },
    Metric {
        key: "ttft_p90",
        header: "TTFT p90 (ms)",
        scale: 1e3,
        at: At::Field("observations", "ttft", Some("p90")),
    },
    Metric {
        key: "tpot_mean",
        header: "TPOT mean (ms)",
        scale: 1e3,
        at: At::Field("observations", "tpot", Some("mean")),
    },
    Metric {
        key: "itl_p99",
        header: "ITL p99 (ms)",
        scale: 1e3,
        at: At::Field("observations", "itl", Some("p99")),
    },
    Metric {
        key: "response_mean",
        header: "e2e mean (ms)",
        scale: 1e3,
        at: At::Field("observations", "response", Some("mean")),
    },
    Metric {
        key: "lease_mean",
        header: "lease (ms)",
        scale: 1e3,
        at: At::Field("observations", "lease", Some("mean")),
    },
    Metric {
        key: "prefill_kv_held",
        header: "P KV held (tok)",
        scale: 1.0,
        at: At::Field("gauges", "prefill_kv_held", None),
    },
    Metric {
        key: "prefill_queue",
        header: "P queue",
        scale: 1.0,
        at: At::Field("gauges", "prefill_queue", None),
    },
    Metric {
        key: "kv_usage_max",
        header: "D KV max",
        scale: 1.0,
        at: At::Field("gauges", "kv_usage_max", None),
    },
    Metric {
        key: "prefill_hit_rate",
        header: "P hit",
        scale: 1.0,
        at: At::Ratio("prefill_prefix_cache_hits", "prefill_prefix_cache_queries"),
    },
    Metric {
        key: "in_flight",
        header: "in flight",
        scale: 1.0,
        at: At::Field("backlog", "in_flight", None),
    },
    Metric {
        key: "decode_hit_rate",
        header: "D hit",
        scale: 1.0,
        at: At::Ratio("decode_prefix_cache_hits", "decode_prefix_cache_queries"),
    },
];

impl Metric {
    /// The metric's value in a run's JSON report (None: not observed).
    pub fn of(&self, report: &serde_json::Value) -> Option<f64> {
        match self.at {
            At::Field(section, name, field) => {
                let v = &report[section][name];
                match field {
                    Some(f) => v[f].as_f64(),
                    None => v.as_f64(),
                }
            }
            At::Ratio(num, den) => {
                let c = &report["counters"];
                let den = c[den].as_f64().filter(|&d| d > 0.0)?;
                Some(c[num].as_f64()? / den)
            }
        }
    }
}

/// Median and range of one metric over the seeds of one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Runs that had a value.
    pub n: usize,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Stats {
    /// Median (even count: mean of the two middle values), min and max of
    /// the values present.
    pub fn of(values: &[Option<f64>]) -> Stats {
        let mut v: Vec<f64> = values.iter().flatten().copied().collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return Stats {
                n,
                median: None,
                min: None,
                max: None,
            };
        }
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            n,
            median: Some(median),
            min: Some(v[0]),
            max: Some(v[n - 1]),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PointSummary {
    pub index: usize,
    pub label: String,
    /// The point's value of each grid axis, by path.
    pub values: BTreeMap<String, String>,
    pub seeds: usize,
    /// The headline metrics by key, then the scenario's own systems'
    /// values (`custom.NAME`).
    pub metrics: BTreeMap<String, Stats>,
}

#[derive(Debug, Serialize)]
struct SweepSummary<'a> {
    name: &'a str,
    scenario: &'a str,
    scenario_name: &'a str,
    set: &'a [String],
    grid: &'a [Axis],
    seeds: &'a [u64],
    horizon: f64,
    warmup: f64,
    points: Vec<PointSummary>,
}

/// Reads every run of the sweep and writes summary.json, summary.csv and
/// summary.txt; returns the table and the points' statistics.
pub(crate) fn write_summary(
    out: &Path,
    manifest: &Manifest,
) -> Result<(String, Vec<PointSummary>)> {
    // The scenario's own systems' values: a column each, from every run.
    let mut reports = Vec::new();
    let mut custom = std::collections::BTreeSet::new();
    for p in manifest.points() {
        let mut runs = Vec::new();
        for &seed in &manifest.seeds {
            let path = run_path(out, &p, seed);
            let report: serde_json::Value = serde_json::from_str(&read(&path)?)
                .map_err(|e| Error::new(format!("{}: not a run report: {e}", path.display())))?;
            if let Some(c) = report["custom"].as_object() {
                custom.extend(c.keys().cloned());
            }
            runs.push(report);
        }
        reports.push((p, runs));
    }
    let mut points = Vec::new();
    for (p, runs) in reports {
        let mut metrics = BTreeMap::new();
        for m in METRICS {
            let v: Vec<Option<f64>> = runs.iter().map(|r| m.of(r)).collect();
            metrics.insert(m.key.to_string(), Stats::of(&v));
        }
        for name in &custom {
            let v: Vec<Option<f64>> = runs.iter().map(|r| r["custom"][name].as_f64()).collect();
            metrics.insert(format!("custom.{name}"), Stats::of(&v));
        }
        points.push(PointSummary {
            index: p.index,
            label: p.label.clone(),
            values: manifest
                .grid
                .iter()
                .zip(&p.values)
                .map(|(a, v)| (a.path.clone(), v.clone()))
                .collect(),
            seeds: manifest.seeds.len(),
            metrics,
        });
    }
    let columns: Vec<Column> = METRICS
        .iter()
        .map(|m| Column {
            key: m.key.to_string(),
            header: m.header.to_string(),
            scale: m.scale,
        })
        .chain(custom.iter().map(|name| Column {
            key: format!("custom.{name}"),
            header: name.clone(),
            scale: 1.0,
        }))
        .collect();
    let summary = SweepSummary {
        name: &manifest.name,
        scenario: &manifest.scenario,
        scenario_name: &manifest.scenario_name,
        set: &manifest.set,
        grid: &manifest.grid,
        seeds: &manifest.seeds,
        horizon: manifest.horizon,
        warmup: manifest.warmup,
        points: points.clone(),
    };
    let mut json = serde_json::to_string_pretty(&summary).expect("serializes");
    json.push('\n');
    write_atomic(&out.join("summary.json"), &json)?;
    write_atomic(&out.join("summary.csv"), &summary_csv(&summary, &columns))?;
    write_atomic(
        &out.join("summary.txt"),
        &summary_table(&summary, &columns, true),
    )?;
    Ok((summary_table(&summary, &columns, false), points))
}

/// A column of the summary: a headline metric or a custom value.
struct Column {
    key: String,
    header: String,
    scale: f64,
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn summary_csv(s: &SweepSummary, columns: &[Column]) -> String {
    let mut header = vec!["point".to_string()];
    header.extend(s.grid.iter().map(|a| csv_field(&a.path)));
    header.push("seeds".into());
    for m in columns {
        for f in ["median", "min", "max", "n"] {
            header.push(csv_field(&format!("{}_{f}", m.key)));
        }
    }
    let mut out = header.join(",");
    out.push('\n');
    let num = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    for p in &s.points {
        let mut row = vec![p.label.clone()];
        row.extend(s.grid.iter().map(|a| csv_field(&p.values[&a.path])));
        row.push(p.seeds.to_string());
        for m in columns {
            let st = &p.metrics[&m.key];
            row.extend([num(st.median), num(st.min), num(st.max), st.n.to_string()]);
        }
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// Three significant digits, plain where that reads well (the CSV and JSON
/// summaries keep every digit).
pub fn sig(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-3..5).contains(&mag) {
        return format!("{x:.2e}");
    }
    let decimals = (2 - mag).max(0) as usize;
    format!("{x:.decimals$}")
}

fn seeds_text(seeds: &[u64]) -> String {
    let contiguous = seeds.windows(2).all(|w| w[1] == w[0] + 1);
    match seeds {
        [] => String::new(),
        [one] => one.to_string(),
        [first, .., last] if contiguous => format!("{first}..{last}"),
        _ => seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The summary as a table: medians only (`full`: with the range over the
/// seeds), three significant digits, times in milliseconds.
fn summary_table(s: &SweepSummary, columns: &[Column], full: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sweep {} ({}): {} points × {} seeds ({}), horizon {} s, warm-up {} s",
        s.name,
        s.scenario,
        s.points.len(),
        s.seeds.len(),
        seeds_text(s.seeds),
        s.horizon,
        s.warmup
    );
    if !s.set.is_empty() {
        let _ = writeln!(out, "set: {}", s.set.join("  "));
    }
    let _ = writeln!(
        out,
        "{}",
        if full {
            "each cell: median over seeds (min–max)"
        } else {
            "each cell: median over seeds (the range is in summary.txt, every digit in summary.csv)"
        }
    );
    let short = short_names(s.grid);
    let mut header: Vec<String> = vec!["point".into()];
    header.extend(short.iter().cloned());
    header.extend(columns.iter().map(|m| m.header.clone()));
    let mut rows = vec![header];
    for p in &s.points {
        let mut row = vec![format!("p{:03}", p.index)];
        row.extend(s.grid.iter().map(|a| p.values[&a.path].clone()));
        for m in columns {
            let st = &p.metrics[&m.key];
            let v = |x: f64| sig(x * m.scale);
            row.push(match (st.median, st.min, st.max) {
                (Some(md), Some(lo), Some(hi)) => {
                    let partial = if st.n < p.seeds {
                        format!(" n={}", st.n)
                    } else {
                        String::new()
                    };
                    if full {
                        format!("{} ({}–{}){partial}", v(md), v(lo), v(hi))
                    } else {
                        format!("{}{partial}", v(md))
                    }
                }
                _ => "-".into(),
            });
        }
        rows.push(row);
    }
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..rows[0].len()).map(width).collect();
    for row in &rows {
        let mut line = String::new();
        for (c, (cell, w)) in row.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            if c > 0 {
                line.push_str("  ");
            }
            if c <= s.grid.len() {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_odd_count_is_the_middle_value() {
        let s = Stats::of(&[Some(5.0), Some(1.0), Some(3.0)]);
        assert_eq!(
            s,
            Stats {
                n: 3,
                median: Some(3.0),
                min: Some(1.0),
                max: Some(5.0)
            }
        );
        let s = Stats::of(&[Some(2.5)]);
        assert_eq!((s.median, s.min, s.max), (Some(2.5), Some(2.5), Some(2.5)));
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = Stats::of(&[Some(4.0), Some(1.0), Some(10.0), Some(2.0)]);
        assert_eq!(s.median, Some(3.0));
        assert_eq!((s.min, s.max, s.n), (Some(1.0), Some(10.0), 4));
        let s = Stats::of(&[Some(-1.0), Some(7.0)]);
        assert_eq!(s.median, Some(3.0));
    }

    #[test]
    fn missing_values_are_left_out_and_none_gives_none() {
        let s = Stats::of(&[None, Some(2.0), Some(6.0), None, Some(1.0)]);
        assert_eq!(
            (s.n, s.median, s.min, s.max),
            (3, Some(2.0), Some(1.0), Some(6.0))
        );
        let s = Stats::of(&[None, None]);
        assert_eq!((s.n, s.median, s.min, s.max), (0, None, None, None));
    }

    #[test]
    fn significant_digits() {
        assert_eq!(sig(0.58912), "0.589");
        assert_eq!(sig(418.4175), "418");
        assert_eq!(sig(0.0134), "0.0134");
        assert_eq!(sig(0.0), "0");
        assert_eq!(sig(1.0), "1.00");
        assert_eq!(sig(12345.0), "12345");
        assert_eq!(sig(0.00023), "2.30e-4");
    }
}
