//! Sweeps: a scenario run over a grid of parameter values × a list of seeds,
//! in parallel, resumable, shardable; and `merge`, which combines shards.
//!
//! # What a sweep is
//!
//! A *plan*: a base scenario, fixed overrides (`set`), grid axes (a dotted
//! path and its values, as `--set` takes them), seeds, horizon and warm-up.
//! Its *points* are the cartesian product of the axes, the first axis
//! varying slowest; its *runs* are every (point, seed), point-major. Every
//! run is a plain `pdsim run` of the base scenario with the point's values
//! and the seed as overrides, so a run of a sweep is bit for bit the run that
//! `pdsim run --set ... --seed S` gives, and the points of a sweep share
//! their random numbers (each session draws from its own stream of the seed).
//!
//! # The out dir
//!
//! ```text
//! manifest.json                      the plan (what "the same arguments" means)
//! runs/p001-rate=1.2/seed-7.json      a run's report, exactly `pdsim run --json`
//! runs/p001-rate=1.2/seed-7.dist.json its TTFT and response histograms (for CDFs)
//! summary.json, summary.csv, summary.txt
//! plots/                              with --plots
//! ```
//!
//! Every file is written atomically, the run's report last: a run is done
//! when its report exists. A sweep started again with the same arguments
//! skips the runs done; with different arguments it refuses. The summary is
//! computed from the run files, in plan order, so it does not depend on the
//! number of threads, on resumption or on sharding.
//!
//! # Headline metrics
//!
//! Per point, over its seeds, the median (even count: mean of the two middle
//! values) and the range (min–max) of each run's:
//! remote fraction (mean of `remote`), mean and p90 TTFT, mean response,
//! mean lease, and the gauges `prefill_kv_held` (tokens per prefiller),
//! `prefill_queue` (requests per prefiller) and `kv_usage_max` (the fullest
//! decoder's held KV fraction). A run with no value (no remote request has
//! no lease) is left out of that metric's statistics; `n` says how many
//! runs counted.
//!
//! # Shards
//!
//! `--shard K/N` runs the runs whose plan index `i` has `i mod N = K − 1`
//! (round-robin, so every shard gets a share of every point). Shards may
//! share one out dir (a shared file system) or use their own; `merge`
//! combines their dirs into one that is exactly what an unsharded sweep
//! writes.

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::plots::{self, LogHistogram};
use crate::report::write_atomic;
use crate::scenario::{self, RawScenario};
use crate::sim::Sim;

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
    /// Simulated seconds per run (default: the experiment's, else the scenario's).
    #[arg(long)]
    pub horizon: Option<f64>,
    /// Warm-up per run (default: the experiment's, else the scenario's).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Runs at once (default: the number of cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Where runs and summaries go (default: out/<experiment or scenario name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only the K-th of N slices of the runs (K from 1), e.g. --shard 3/8.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Also draw SVG figures under OUT/plots: TTFT and response CDFs per
    /// point, and time series of the first run.
    #[arg(long)]
    pub plots: bool,
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
    /// else out/<name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also draw the CDF figures.
    #[arg(long)]
    pub plots: bool,
}

// ---------------------------------------------------------------------------
// Parsing the arguments

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

fn check_axis(axis: &Axis, what: &str) -> Result<()> {
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

// ---------------------------------------------------------------------------
// Experiment files

/// An experiment file (RON): a base scenario and the sweep to run over it.
///
/// ```ron
/// (
///     name: "deciders",                 // default out dir: out/deciders
///     scenario: "../llmd_nixl_pull.ron", // relative to this file
///     seeds: "1..20",                   // as --seeds
///     horizon: 10000.0,                 // optional: else the scenario's
///     warmup: 1000.0,                   // optional: else the scenario's
///     set: {"workload.session_rate": 0.6},  // optional, as --set
///     grid: [                           // optional, as --grid, in order
///         ("router.decider.params.non_cached_tokens", [1, 512, 2048, inf]),
///     ],
/// )
/// ```
///
/// Values may be numbers, `inf`, booleans or strings (enum variants and
/// script paths as strings); they are passed on as `--set` would pass them.
/// `set` is applied in the order of its paths, then `--set` flags; `--grid`
/// flags add axes after the file's; `--seeds`, `--horizon` and `--warmup`
/// replace the file's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    pub scenario: String,
    pub seeds: String,
    #[serde(default)]
    pub horizon: Option<f64>,
    #[serde(default)]
    pub warmup: Option<f64>,
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
    #[serde(default)]
    pub grid: Vec<(String, Vec<Value>)>,
}

/// A scalar of an experiment file, kept as the text `--set` would take.
#[derive(Debug, Clone, PartialEq)]
pub struct Value(pub String);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, inf, a bool or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
                Ok(Value(if v.is_infinite() {
                    if v > 0.0 { "inf" } else { "-inf" }.to_string()
                } else {
                    v.to_string()
                }))
            }
            fn visit_f32<E: de::Error>(self, v: f32) -> std::result::Result<Value, E> {
                self.visit_f64(v as f64)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

fn ron_options() -> ron::Options {
    ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
}

/// Whether a RON file is an experiment (it names a `scenario`) rather than
/// a scenario. A file that does not parse is taken for a scenario, whose
/// loader then says what is wrong with it.
pub fn is_experiment(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    match ron_options().from_str::<ron::Value>(&text) {
        Ok(ron::Value::Map(m)) => m.iter().any(|(k, v)| {
            *k == ron::Value::String("scenario".into()) && matches!(v, ron::Value::String(_))
        }),
        _ => false,
    }
}

/// Reads an experiment file; errors name the file, line, column and field.
pub fn load_experiment(path: &Path) -> Result<Experiment> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read experiment {}: {e}", path.display())))?;
    let mut de = ron::Deserializer::from_str_with_options(&text, &ron_options())
        .map_err(|e| Error::new(format!("{}:{e}", path.display())))?;
    let exp: Experiment = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let spanned = de.span_error(e.into_inner());
        let pos = spanned.span.start;
        Error::new(format!(
            "{}:{}:{}: in field `{field}`: {}",
            path.display(),
            pos.line,
            pos.col,
            spanned.code
        ))
    })?;
    de.end()
        .map_err(|e| Error::new(format!("{}: {}", path.display(), de.span_error(e))))?;
    Ok(exp)
}

// ---------------------------------------------------------------------------
// The plan

/// What a sweep runs; its manifest is what "the same arguments" means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Format version of the out dir.
    pub pdsim_sweep: u32,
    /// The experiment's or the scenario's name (the default out dir).
    pub name: String,
    /// The file given to `pdsim sweep`, as given (`.` and `..` folded).
    pub source: String,
    /// The base scenario file and its `name`.
    pub scenario: String,
    pub scenario_name: String,
    /// A hash of the base scenario's text and of every script the runs use:
    /// a resumed sweep must run the same model.
    pub fingerprint: String,
    pub set: Vec<String>,
    pub grid: Vec<Axis>,
    pub seeds: Vec<u64>,
    pub horizon: f64,
    pub warmup: f64,
}

/// A grid point: one value per axis.
#[derive(Debug, Clone)]
pub struct Point {
    pub index: usize,
    pub values: Vec<String>,
    /// Names its folder: `p003-rate=1.2-blocks=2000`.
    pub label: String,
}

impl Manifest {
    pub fn points(&self) -> Vec<Point> {
        let short = short_names(&self.grid);
        let mut points = vec![Vec::<String>::new()];
        for axis in &self.grid {
            points = points
                .into_iter()
                .flat_map(|p| {
                    axis.values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push(v.clone());
                        q
                    })
                })
                .collect();
        }
        points
            .into_iter()
            .enumerate()
            .map(|(index, values)| {
                let mut label = format!("p{index:03}");
                for (s, v) in short.iter().zip(&values) {
                    label.push('-');
                    label.push_str(&sanitize(&format!("{s}={v}")));
                }
                if label.len() > 120 {
                    let mut end = 120;
                    while !label.is_char_boundary(end) {
                        end -= 1;
                    }
                    label.truncate(end);
                }
                Point {
                    index,
                    values,
                    label,
                }
            })
            .collect()
    }

    /// Every run, point-major: (point, seed).
    pub fn runs(&self) -> Vec<(Point, u64)> {
        self.points()
            .into_iter()
            .flat_map(|p| self.seeds.iter().map(move |&s| (p.clone(), s)))
            .collect()
    }

    /// The `--set` overrides of one run.
    pub fn overrides(&self, point: &Point, seed: u64) -> Vec<String> {
        let mut o = self.set.clone();
        for (axis, v) in self.grid.iter().zip(&point.values) {
            o.push(format!("{}={v}", axis.path));
        }
        o.push(format!("seed={seed}"));
        o.push(format!("horizon={}", self.horizon));
        o.push(format!("warmup={}", self.warmup));
        o
    }

    fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a manifest serializes");
        s.push('\n');
        s
    }
}

/// The shortest dotted suffix of each axis path that tells the axes apart.
pub fn short_names(grid: &[Axis]) -> Vec<String> {
    let parts: Vec<Vec<&str>> = grid.iter().map(|a| a.path.split('.').collect()).collect();
    let suffix = |p: &[&str], k: usize| p[p.len().saturating_sub(k)..].join(".");
    (0..grid.len())
        .map(|i| {
            let mut k = 1;
            loop {
                let mine = suffix(&parts[i], k);
                let clash = (0..grid.len()).any(|j| j != i && suffix(&parts[j], k) == mine);
                if !clash || k >= parts[i].len() {
                    return mine;
                }
                k += 1;
            }
        })
        .collect()
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._=+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Folds `.` and `a/..` out of a path, textually.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            c => out.push(c),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

fn script_paths(raw: &RawScenario) -> Vec<String> {
    let r = &raw.router;
    let mut v = vec![r.decider.script.clone()];
    for p in [&r.decode, &r.prefill] {
        v.extend(p.filters.iter().map(|f| f.script.clone()));
        v.extend(p.scorers.iter().map(|f| f.script.clone()));
        v.push(p.picker.script.clone());
    }
    v
}

/// FNV-1a, 64 bits: stable across platforms and versions.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Builds and checks the plan of `pdsim sweep`: every point must load and
/// compile before any run starts.
pub fn plan(args: &SweepArgs) -> Result<Manifest> {
    let target = &args.target;
    let (name, scenario_path, mut set, mut grid, seeds, horizon, warmup) = if is_experiment(target)
    {
        let exp = load_experiment(target)?;
        let dir = target.parent().unwrap_or(Path::new(""));
        let file = target.display();
        let mut grid = Vec::new();
        for (path, values) in &exp.grid {
            let axis = Axis {
                path: path.clone(),
                values: values.iter().map(|v| v.0.clone()).collect(),
            };
            check_axis(&axis, &format!("{file}: grid axis `{path}`"))?;
            grid.push((axis, format!("{file}: grid axis `{path}`")));
        }
        let seeds = match &args.seeds {
            Some(s) => s.clone(),
            None => exp.seeds.clone(),
        };
        let seeds = parse_seeds(&seeds).map_err(|e| {
            if args.seeds.is_none() {
                Error::new(format!("{file}: seeds: {e}"))
            } else {
                e
            }
        })?;
        (
            exp.name.clone(),
            normalize(&dir.join(&exp.scenario)),
            exp.set
                .iter()
                .map(|(k, v)| format!("{k}={}", v.0))
                .collect::<Vec<_>>(),
            grid,
            Some(seeds),
            args.horizon.or(exp.horizon),
            args.warmup.or(exp.warmup),
        )
    } else {
        let seeds = args.seeds.as_deref().map(parse_seeds).transpose()?;
        (
            String::new(),
            normalize(target),
            Vec::new(),
            Vec::new(),
            seeds,
            args.horizon,
            args.warmup,
        )
    };
    set.extend(args.set.iter().cloned());
    for g in &args.grid {
        grid.push((parse_grid(g)?, format!("--grid {g}")));
    }
    for (i, (axis, what)) in grid.iter().enumerate() {
        if grid[..i].iter().any(|(a, _)| a.path == axis.path) {
            return Err(Error::new(format!(
                "{what}: the path `{}` is swept twice",
                axis.path
            )));
        }
        if let Some(s) = set
            .iter()
            .find(|s| s.split_once('=').map(|(p, _)| p.trim()) == Some(axis.path.as_str()))
        {
            return Err(Error::new(format!(
                "{what}: `{}` is both swept and set (--set {s})",
                axis.path
            )));
        }
    }

    let base = scenario::load(&scenario_path, &set)?;
    // Each axis on its own against the base: a wrong path names the axis.
    for (axis, what) in &grid {
        for v in &axis.values {
            let assignment = format!("{}={v}", axis.path);
            if let Err(e) = scenario::apply_override(&base.raw, &assignment) {
                let msg = e.to_string();
                let msg = msg
                    .strip_prefix(&format!("--set {assignment}: "))
                    .unwrap_or(&msg);
                return Err(Error::new(format!("{what}: value {v}: {msg}")));
            }
        }
    }
    let manifest = Manifest {
        pdsim_sweep: 1,
        name: if name.is_empty() {
            base.raw.name.clone()
        } else {
            name
        },
        source: normalize(target).to_string_lossy().into_owned(),
        scenario: scenario_path.to_string_lossy().into_owned(),
        scenario_name: base.raw.name.clone(),
        fingerprint: String::new(),
        set,
        grid: grid.into_iter().map(|(a, _)| a).collect(),
        seeds: seeds.unwrap_or(vec![base.raw.seed]),
        horizon: horizon.unwrap_or(base.raw.horizon),
        warmup: warmup.unwrap_or(base.raw.warmup),
    };
    // Every point loads and compiles; collect the scripts it runs.
    let mut scripts = std::collections::BTreeSet::new();
    for p in manifest.points() {
        let overrides = manifest.overrides(&p, manifest.seeds[0]);
        let sc = scenario::load(&scenario_path, &overrides)
            .and_then(|sc| Sim::new(&sc).map(|_| sc))
            .map_err(|e| Error::new(format!("grid point {}: {e}", p.label)))?;
        scripts.extend(script_paths(&sc.raw));
    }
    let text = std::fs::read(&scenario_path).unwrap_or_default();
    let mut texts: Vec<Vec<u8>> = scripts
        .iter()
        .map(|s| std::fs::read(s).unwrap_or_default())
        .collect();
    texts.sort();
    texts.dedup();
    let mut h = fnv1a(&text, FNV_OFFSET);
    for t in &texts {
        h = fnv1a(&(t.len() as u64).to_le_bytes(), h);
        h = fnv1a(t, h);
    }
    Ok(Manifest {
        fingerprint: format!("{h:016x}"),
        ..manifest
    })
}

// ---------------------------------------------------------------------------
// The out dir

fn run_path(out: &Path, point: &Point, seed: u64) -> PathBuf {
    out.join("runs")
        .join(&point.label)
        .join(format!("seed-{seed}.json"))
}

fn dist_path(out: &Path, point: &Point, seed: u64) -> PathBuf {
    out.join("runs")
        .join(&point.label)
        .join(format!("seed-{seed}.dist.json"))
}

/// The TTFT and response distributions of one run, for CDFs pooled over seeds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunDistributions {
    pub ttft: LogHistogram,
    pub response: LogHistogram,
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join("manifest.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::new(format!("{}: not a sweep manifest: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::new(format!("cannot read {}: {e}", path.display()))),
    }
}

/// The first field in which two manifests differ.
fn first_difference(a: &Manifest, b: &Manifest) -> Option<String> {
    let (a, b) = (
        serde_json::to_value(a).expect("serializes"),
        serde_json::to_value(b).expect("serializes"),
    );
    let (a, b) = (
        a.as_object().expect("object"),
        b.as_object().expect("object"),
    );
    a.iter()
        .find(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
}

/// Claims `out` for `manifest`: writes the manifest, or checks the one there.
fn claim(out: &Path, manifest: &Manifest) -> Result<()> {
    if let Some(there) = read_manifest(out)? {
        if let Some(field) = first_difference(&there, manifest) {
            let what = if field == "fingerprint" {
                "the scenario or its scripts changed since".to_string()
            } else {
                format!("its `{field}` differs")
            };
            return Err(Error::new(format!(
                "{} holds a sweep made with different arguments ({what}): use another --out, or delete it to start afresh",
                out.display()
            )));
        }
        return Ok(());
    }
    write_atomic(&out.join("manifest.json"), &manifest.to_json())
}

// ---------------------------------------------------------------------------
// Running

/// What a sweep did.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    pub out: PathBuf,
    pub manifest: Manifest,
    /// Runs of this invocation's slice run now, and skipped (already done).
    pub ran: usize,
    pub skipped: usize,
    /// Runs of the whole sweep present in the out dir, and in all.
    pub present: usize,
    pub total: usize,
    /// The summary table (when every run of the sweep is present).
    pub table: Option<String>,
}

impl SweepOutcome {
    /// What `pdsim sweep` prints.
    pub fn to_text(&self) -> String {
        match &self.table {
            Some(t) => t.clone(),
            None => format!(
                "{} holds {} of the sweep's {} runs: run the other shards (same --out, or their own \
                 dirs and then `pdsim merge`) to get the summary\n",
                self.out.display(),
                self.present,
                self.total
            ),
        }
    }
}

/// Runs one simulation of the plan; writes its distributions, then its report.
fn run_one(
    manifest: &Manifest,
    out: &Path,
    point: &Point,
    seed: u64,
    series: Option<(f64, &Path)>,
) -> Result<()> {
    let scenario_path = Path::new(&manifest.scenario);
    let sc = scenario::load(scenario_path, &manifest.overrides(point, seed))?;
    let mut sim = Sim::new(&sc)?;
    if let Some((interval, _)) = series {
        plots::record_series(&mut sim, interval);
    }
    let report = sim.run()?;
    if let Some((_, dir)) = series {
        plots::write_series(&mut sim, dir)?;
    }
    let overall = sim.world.resource::<Metrics>().overall();
    let dists = RunDistributions {
        ttft: LogHistogram::of(overall.get("ttft")),
        response: LogHistogram::of(overall.get("response")),
    };
    let mut text = serde_json::to_string(&dists).expect("serializes");
    text.push('\n');
    write_atomic(&dist_path(out, point, seed), &text)?;
    write_atomic(&run_path(out, point, seed), &report.to_json())
}

/// `pdsim sweep`: plans, claims the out dir, runs what is missing of this
/// slice, and summarises when the sweep is complete.
pub fn sweep(args: &SweepArgs, progress: bool) -> Result<SweepOutcome> {
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let jobs = match args.jobs {
        Some(0) => return Err(Error::new("--jobs must be at least 1")),
        Some(j) => j,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if args.plots && !(args.sample_interval.is_finite() && args.sample_interval > 0.0) {
        return Err(Error::new(format!(
            "--sample-interval must be a positive number of seconds, got {}",
            args.sample_interval
        )));
    }
    let manifest = plan(args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(sanitize(&manifest.name)));
    claim(&out, &manifest)?;

    let runs = manifest.runs();
    let total = runs.len();
    let plots_dir = out.join("plots");
    let want_series = args.plots
        && !plots_dir.join("timeseries.csv").exists()
        && shard.is_none_or(|(k, _)| k == 1);
    let mine: Vec<(usize, &(Point, u64))> = runs
        .iter()
        .enumerate()
        .filter(|(i, _)| shard.is_none_or(|(k, n)| i % n == k - 1))
        .collect();
    let todo: Vec<(usize, &(Point, u64))> = mine
        .iter()
        .copied()
        .filter(|(i, (p, s))| !run_path(&out, p, *s).exists() || (*i == 0 && want_series))
        .collect();
    let skipped = mine.len() - todo.len();

    let bar = if progress && !todo.is_empty() {
        let bar =
            ProgressBar::with_draw_target(Some(todo.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} runs, ETA {eta_precise}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Error::new(format!("cannot start {jobs} threads: {e}")))?;
    pool.install(|| {
        todo.par_iter()
            .with_max_len(1)
            .try_for_each(|&(i, (p, s))| {
                let series =
                    (i == 0 && want_series).then_some((args.sample_interval, plots_dir.as_path()));
                run_one(&manifest, &out, p, *s, series)
                    .map_err(|e| Error::new(format!("run {} seed {s}: {e}", p.label)))?;
                bar.inc(1);
                Ok(())
            })
    })?;
    bar.finish_and_clear();

    let present = runs
        .iter()
        .filter(|(p, s)| run_path(&out, p, *s).exists())
        .count();
    let table = if present == total {
        let table = write_summary(&out, &manifest)?;
        if args.plots {
            plots::sweep_plots(&out, &manifest)?;
        }
        Some(table)
    } else {
        None
    };
    Ok(SweepOutcome {
        out,
        manifest,
        ran: todo.len(),
        skipped,
        present,
        total,
        table,
    })
}

/// `pdsim merge`: the shards' out dirs, made by one sweep, into one.
pub fn merge(args: &MergeArgs) -> Result<SweepOutcome> {
    let mut manifest: Option<(Manifest, &Path)> = None;
    for dir in &args.dirs {
        let m = read_manifest(dir)?.ok_or_else(|| {
            Error::new(format!(
                "{}: no manifest.json: not the out dir of a sweep",
                dir.display()
            ))
        })?;
        match &manifest {
            None => manifest = Some((m, dir)),
            Some((first, first_dir)) => {
                if let Some(field) = first_difference(first, &m) {
                    return Err(Error::new(format!(
                        "{} and {} come from different sweeps (their `{field}` differs)",
                        first_dir.display(),
                        dir.display()
                    )));
                }
            }
        }
    }
    let (manifest, _) = manifest.expect("at least one dir");
    let out = match (&args.out, args.dirs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.clone(),
        (None, _) => Path::new("out").join(sanitize(&manifest.name)),
    };
    claim(&out, &manifest)?;
    let runs = manifest.runs();
    let total = runs.len();
    let mut missing = Vec::new();
    let mut copied = 0;
    for (p, s) in &runs {
        let target = run_path(&out, p, *s);
        if target.exists() {
            continue;
        }
        let Some(dir) = args.dirs.iter().find(|d| run_path(d, p, *s).exists()) else {
            missing.push((p.label.clone(), *s));
            continue;
        };
        let dist = dist_path(dir, p, *s);
        if dist.exists() {
            write_atomic(&dist_path(&out, p, *s), &read(&dist)?)?;
        }
        write_atomic(&target, &read(&run_path(dir, p, *s))?)?;
        copied += 1;
    }
    if let Some((label, seed)) = missing.first() {
        return Err(Error::new(format!(
            "{} of the sweep's {total} runs are in none of the dirs (the first: {label} seed {seed}): run the shards that made them, then merge again",
            missing.len()
        )));
    }
    let table = write_summary(&out, &manifest)?;
    if args.plots {
        plots::sweep_plots(&out, &manifest)?;
        // The first run's time series, drawn by the shard that ran it.
        let series = Path::new("plots").join("timeseries.csv");
        if !out.join(&series).exists()
            && let Some(dir) = args.dirs.iter().find(|d| d.join(&series).exists())
        {
            let svg = Path::new("plots").join("timeseries.svg");
            if dir.join(&svg).exists() {
                write_atomic(&out.join(&svg), &read(&dir.join(&svg))?)?;
            }
            write_atomic(&out.join(&series), &read(&dir.join(&series))?)?;
        }
    }
    Ok(SweepOutcome {
        out,
        manifest,
        ran: copied,
        skipped: total - copied,
        present: total,
        total,
        table: Some(table),
    })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))
}

// ---------------------------------------------------------------------------
// Summaries

/// A headline metric: where it is in a run's report.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its key in summary.json and the stem of its columns in summary.csv.
    pub key: &'static str,
    /// Its column header in the printed table.
    pub header: &'static str,
    /// (section, name, field): `observations.ttft.mean`, `gauges.prefill_queue`.
    pub at: (&'static str, &'static str, Option<&'static str>),
}

/// The headline metrics of a sweep's summary (see the module docs).
pub const METRICS: [Metric; 8] = [
    Metric {
        key: "remote_fraction",
        header: "remote",
        at: ("observations", "remote", Some("mean")),
    },
    Metric {
        key: "ttft_mean",
        header: "TTFT mean (s)",
        at: ("observations", "ttft", Some("mean")),
    },
    Metric {
        key: "ttft_p90",
        header: "TTFT p90 (s)",
        at: ("observations", "ttft", Some("p90")),
    },
    Metric {
        key: "response_mean",
        header: "response (s)",
        at: ("observations", "response", Some("mean")),
    },
    Metric {
        key: "lease_mean",
        header: "lease (s)",
        at: ("observations", "lease", Some("mean")),
    },
    Metric {
        key: "prefill_kv_held",
        header: "P KV held (tok)",
        at: ("gauges", "prefill_kv_held", None),
    },
    Metric {
        key: "prefill_queue",
        header: "P queue",
        at: ("gauges", "prefill_queue", None),
    },
    Metric {
        key: "kv_usage_max",
        header: "D KV max",
        at: ("gauges", "kv_usage_max", None),
    },
];

impl Metric {
    /// The metric's value in a run's JSON report (None: not observed).
    pub fn of(&self, report: &serde_json::Value) -> Option<f64> {
        let (section, name, field) = self.at;
        let v = &report[section][name];
        match field {
            Some(f) => v[f].as_f64(),
            None => v.as_f64(),
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

#[derive(Debug, Serialize)]
struct PointSummary {
    index: usize,
    label: String,
    /// The point's value of each grid axis, by path.
    values: BTreeMap<String, String>,
    seeds: usize,
    metrics: BTreeMap<&'static str, Stats>,
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
/// summary.txt; returns the table.
fn write_summary(out: &Path, manifest: &Manifest) -> Result<String> {
    let mut points = Vec::new();
    for p in manifest.points() {
        let mut values: Vec<Vec<Option<f64>>> = vec![Vec::new(); METRICS.len()];
        for &seed in &manifest.seeds {
            let path = run_path(out, &p, seed);
            let report: serde_json::Value = serde_json::from_str(&read(&path)?)
                .map_err(|e| Error::new(format!("{}: not a run report: {e}", path.display())))?;
            for (m, v) in METRICS.iter().zip(values.iter_mut()) {
                v.push(m.of(&report));
            }
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
            metrics: METRICS
                .iter()
                .zip(&values)
                .map(|(m, v)| (m.key, Stats::of(v)))
                .collect(),
        });
    }
    let summary = SweepSummary {
        name: &manifest.name,
        scenario: &manifest.scenario,
        scenario_name: &manifest.scenario_name,
        set: &manifest.set,
        grid: &manifest.grid,
        seeds: &manifest.seeds,
        horizon: manifest.horizon,
        warmup: manifest.warmup,
        points,
    };
    let mut json = serde_json::to_string_pretty(&summary).expect("serializes");
    json.push('\n');
    write_atomic(&out.join("summary.json"), &json)?;
    write_atomic(&out.join("summary.csv"), &summary_csv(&summary))?;
    let table = summary_table(&summary);
    write_atomic(&out.join("summary.txt"), &table)?;
    Ok(table)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn summary_csv(s: &SweepSummary) -> String {
    let mut header = vec!["point".to_string()];
    header.extend(s.grid.iter().map(|a| csv_field(&a.path)));
    header.push("seeds".into());
    for m in METRICS {
        for f in ["median", "min", "max", "n"] {
            header.push(format!("{}_{f}", m.key));
        }
    }
    let mut out = header.join(",");
    out.push('\n');
    let num = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    for p in &s.points {
        let mut row = vec![p.label.clone()];
        row.extend(s.grid.iter().map(|a| csv_field(&p.values[&a.path])));
        row.push(p.seeds.to_string());
        for m in METRICS {
            let st = &p.metrics[m.key];
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

fn summary_table(s: &SweepSummary) -> String {
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
    let _ = writeln!(out, "each cell: median over seeds (min–max)");
    let short = short_names(s.grid);
    let mut header: Vec<String> = vec!["point".into()];
    header.extend(short.iter().cloned());
    header.extend(METRICS.iter().map(|m| m.header.to_string()));
    let mut rows = vec![header];
    for p in &s.points {
        let mut row = vec![format!("p{:03}", p.index)];
        row.extend(s.grid.iter().map(|a| p.values[&a.path].clone()));
        for m in METRICS {
            let st = &p.metrics[m.key];
            row.push(match (st.median, st.min, st.max) {
                (Some(md), Some(lo), Some(hi)) => {
                    let partial = if st.n < p.seeds {
                        format!(" n={}", st.n)
                    } else {
                        String::new()
                    };
                    format!("{} ({}–{}){partial}", sig(md), sig(lo), sig(hi))
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

    #[test]
    fn points_are_the_cartesian_product_first_axis_slowest() {
        let m = Manifest {
            pdsim_sweep: 1,
            name: "n".into(),
            source: "s".into(),
            scenario: "s".into(),
            scenario_name: "s".into(),
            fingerprint: String::new(),
            set: vec![],
            grid: vec![
                Axis {
                    path: "decode.engine.num_gpu_blocks".into(),
                    values: vec!["1".into(), "2".into()],
                },
                Axis {
                    path: "prefill.engine.num_gpu_blocks".into(),
                    values: vec!["a".into(), "b".into(), "c".into()],
                },
            ],
            seeds: vec![3, 4],
            horizon: 10.0,
            warmup: 1.0,
        };
        let p = m.points();
        assert_eq!(p.len(), 6);
        assert_eq!(p[1].values, ["1", "b"]);
        assert_eq!(p[3].values, ["2", "a"]);
        assert_eq!(
            p[1].label,
            "p001-decode.engine.num_gpu_blocks=1-prefill.engine.num_gpu_blocks=b"
        );
        assert_eq!(m.runs().len(), 12);
        assert_eq!(m.runs()[3].1, 4);
    }

    #[test]
    fn short_names_tell_axes_apart() {
        let ax = |p: &str| Axis {
            path: p.into(),
            values: vec![],
        };
        let s = short_names(&[
            ax("decode.engine.num_gpu_blocks"),
            ax("prefill.engine.num_gpu_blocks"),
            ax("workload.session_rate"),
        ]);
        assert_eq!(
            s,
            [
                "decode.engine.num_gpu_blocks",
                "prefill.engine.num_gpu_blocks",
                "session_rate"
            ]
        );
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

    #[test]
    fn paths_fold_dots() {
        assert_eq!(
            normalize(Path::new("scenarios/experiments/../llmd.ron")),
            Path::new("scenarios/llmd.ron")
        );
        assert_eq!(normalize(Path::new("./a/b.ron")), Path::new("a/b.ron"));
        assert_eq!(normalize(Path::new("../a.ron")), Path::new("../a.ron"));
    }
}
