//! The arguments of `pdsim sweep` and `pdsim merge`, and how seeds, grid
//! axes and shards are written.

use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// `pdsim sweep`.
#[derive(Args, Debug, Clone, Default)]
pub struct SweepArgs {
    /// A scenario (.ron), swept with --grid, or an experiment file
    /// (scenarios/experiments/*.ron) that names its scenario, grid and seeds.
    pub target: PathBuf,
    /// Seeds: an inclusive range `1..20`, a list `1,5,9`, or both `1..4,9`
    /// (default: the experiment's, else the scenario's seed).
    #[arg(long)]
    pub seeds: Option<String>,
    /// A grid axis: a dotted path (as --set) and its values; repeat for more
    /// axes. E.g. --grid router.decider.params.non_cached_tokens=1,512,inf
    #[arg(long = "grid", value_name = "PATH=V1,V2,...")]
    pub grid: Vec<String>,
    /// A fixed override for every run, as in `pdsim run`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub trace: crate::scenario::TraceOptions,
    /// Simulated seconds per run (default: the experiment's, else the scenario's).
    #[arg(long)]
    pub horizon: Option<f64>,
    /// Warm-up per run (default: the experiment's, else the scenario's).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Runs at once (default: the number of cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Where runs and summaries go (default: `out/<experiment or scenario name>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only the K-th of N slices of the runs (K from 1), e.g. --shard 3/8.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Also draw SVG figures under OUT/plots: TTFT and response CDFs per
    /// point, and time series of the first run.
    #[arg(long)]
    pub plots: bool,
    /// Also write, beside each run's report, its `vllm bench serve` JSON
    /// (`seed-S.bench.json`), with these --metric-percentiles.
    #[arg(long)]
    pub bench_json: bool,
    #[arg(long, value_name = "P,P,...", default_value = "99")]
    pub metric_percentiles: String,
    /// Also write each run's AIPerf export (`seed-S.aiperf/`).
    #[arg(long)]
    pub aiperf: bool,
    /// Also write each run's Prometheus metrics (`seed-S.prom`).
    #[arg(long)]
    pub prometheus: bool,
    /// Also write each run's timeline (`seed-S.timeline.json`) of what
    /// overlaps this window of simulated seconds.
    #[arg(long, value_name = "A..B")]
    pub timeline: Option<String>,
    /// Also write one page, OUT/summary.html: the summary table, each
    /// headline metric against the grid with its seed range, the CDFs.
    #[arg(long)]
    pub html: bool,
    /// Time-series sampling interval, simulated seconds (with --plots).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub sample_interval: f64,
}

/// `pdsim merge`.
#[derive(Args, Debug, Clone, Default)]
pub struct MergeArgs {
    /// Out dirs of the shards of one sweep.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where the merged sweep goes (default: the dir when there is one,
    /// else `out/<name>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also draw the CDF figures.
    #[arg(long)]
    pub plots: bool,
    /// Also write OUT/summary.html (as `pdsim sweep --html`).
    #[arg(long)]
    pub html: bool,
}

/// Parses `1..20`, `1,5,9` or a mix: an ordered list of distinct seeds.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    const MAX: u64 = 1_000_000;
    let bad = |why: String| Error::new(format!("--seeds {text}: {why}"));
    if text.trim().is_empty() {
        return Err(Error::new(
            "--seeds is empty: give a range like 1..20 or a list like 1,5,9",
        ));
    }
    let number = |s: &str| -> Result<u64> {
        s.trim().parse::<u64>().map_err(|_| {
            bad(format!(
                "`{}` is not a seed (a whole number >= 0)",
                s.trim()
            ))
        })
    };
    let mut seeds = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(bad("an empty item (two commas, or one at an end)".into()));
        }
        if let Some((a, b)) = item.split_once("..") {
            let b = b.strip_prefix('=').unwrap_or(b);
            if a.trim().is_empty() || b.trim().is_empty() {
                return Err(bad(format!(
                    "`{item}` is not a range: write both ends, e.g. 1..20"
                )));
            }
            let (a, b) = (number(a)?, number(b)?);
            if a > b {
                return Err(bad(format!(
                    "the range {a}..{b} is empty (ranges are inclusive and go up)"
                )));
            }
            if b - a >= MAX {
                return Err(bad(format!("the range {a}..{b} has more than {MAX} seeds")));
            }
            seeds.extend(a..=b);
        } else {
            seeds.push(number(item)?);
        }
        if seeds.len() as u64 > MAX {
            return Err(bad(format!("more than {MAX} seeds")));
        }
    }
    let mut sorted = seeds.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!("seed {} appears twice", w[0])));
    }
    Ok(seeds)
}

/// Parses `K/N`: (K, N) with 1 ≤ K ≤ N.
pub fn parse_shard(text: &str) -> Result<(usize, usize)> {
    let malformed = || {
        Error::new(format!(
            "--shard {text}: expected K/N with whole numbers, e.g. --shard 2/8"
        ))
    };
    let (k, n) = text.split_once('/').ok_or_else(malformed)?;
    let k: usize = k.trim().parse().map_err(|_| malformed())?;
    let n: usize = n.trim().parse().map_err(|_| malformed())?;
    if n == 0 {
        return Err(Error::new(format!(
            "--shard {text}: the number of shards N must be at least 1"
        )));
    }
    if k == 0 || k > n {
        return Err(Error::new(format!(
            "--shard {text}: shard index {k} is out of range: K goes from 1 to N = {n}"
        )));
    }
    Ok((k, n))
}

/// One grid axis: a dotted path and its values (as `--set` takes them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    pub path: String,
    pub values: Vec<String>,
}

/// Parses `PATH=V1,V2,...` (commas inside brackets or quotes do not split).
pub fn parse_grid(text: &str) -> Result<Axis> {
    let (path, values) = text.split_once('=').ok_or_else(|| {
        Error::new(format!(
            "--grid {text}: expected PATH=V1,V2,..., e.g. --grid workload.session_rate=0.6,1.2"
        ))
    })?;
    let path = path.trim();
    if path.is_empty() {
        return Err(Error::new(format!("--grid {text}: the path is empty")));
    }
    let mut items = Vec::new();
    let (mut depth, mut quoted, mut cur) = (0i32, false, String::new());
    for c in values.chars() {
        match c {
            '"' => quoted = !quoted,
            '[' | '{' | '(' if !quoted => depth += 1,
            ']' | '}' | ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                items.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    items.push(cur);
    let values: Vec<String> = items.iter().map(|s| s.trim().to_string()).collect();
    if values.iter().all(|v| v.is_empty()) {
        return Err(Error::new(format!("--grid {text}: no values after `=`")));
    }
    let axis = Axis {
        path: path.to_string(),
        values,
    };
    check_axis(&axis, &format!("--grid {text}"))?;
    Ok(axis)
}

pub(crate) fn check_axis(axis: &Axis, what: &str) -> Result<()> {
    if axis.values.is_empty() {
        return Err(Error::new(format!("{what}: no values")));
    }
    if axis.values.iter().any(|v| v.is_empty()) {
        return Err(Error::new(format!(
            "{what}: an empty value (two commas, or one at an end)"
        )));
    }
    for (i, v) in axis.values.iter().enumerate() {
        if axis.values[..i].contains(v) {
            return Err(Error::new(format!("{what}: value {v} appears twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_ranges_lists_and_mixes() {
        assert_eq!(parse_seeds("1..5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse_seeds("1..=3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("1, 5,9").unwrap(), vec![1, 5, 9]);
        assert_eq!(parse_seeds("1..3,9").unwrap(), vec![1, 2, 3, 9]);
        assert_eq!(parse_seeds("4..4").unwrap(), vec![4]);
    }

    #[test]
    fn bad_seeds_say_what_is_wrong() {
        let e = |s: &str| parse_seeds(s).unwrap_err().to_string();
        assert!(e("").contains("empty"), "{}", e(""));
        assert!(e("5..1").contains("empty"), "{}", e("5..1"));
        assert!(e("1..x").contains("`x` is not a seed"), "{}", e("1..x"));
        assert!(e("1,,2").contains("empty item"), "{}", e("1,,2"));
        assert!(e("1..").contains("both ends"), "{}", e("1.."));
        assert!(
            e("1,2,1").contains("seed 1 appears twice"),
            "{}",
            e("1,2,1")
        );
        assert!(e("-3").contains("not a seed"), "{}", e("-3"));
        for s in ["", "5..1", "1..x", "1,,2"] {
            assert!(!e(s).contains('\n'));
        }
    }

    #[test]
    fn shards_parse_and_refuse_out_of_range() {
        assert_eq!(parse_shard("1/1").unwrap(), (1, 1));
        assert_eq!(parse_shard("3/8").unwrap(), (3, 8));
        let e = parse_shard("3/2").unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("N = 2"), "{e}");
        let e = parse_shard("0/2").unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        assert!(parse_shard("2").unwrap_err().to_string().contains("K/N"));
        assert!(
            parse_shard("1/0")
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
    }

    #[test]
    fn grid_axes_split_on_top_level_commas() {
        let a = parse_grid("a.b=1, 512 ,inf").unwrap();
        assert_eq!(a.path, "a.b");
        assert_eq!(a.values, ["1", "512", "inf"]);
        let a = parse_grid("x=[1,2],[3,4]").unwrap();
        assert_eq!(a.values, ["[1,2]", "[3,4]"]);
        assert!(parse_grid("x").unwrap_err().to_string().contains("PATH=V1"));
        assert!(
            parse_grid("x=")
                .unwrap_err()
                .to_string()
                .contains("no values")
        );
        assert!(
            parse_grid("x=1,,2")
                .unwrap_err()
                .to_string()
                .contains("empty value")
        );
        assert!(
            parse_grid("x=1,1")
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }
}
