//! The plan of a sweep: its manifest (what "the same arguments" means), its
//! points and runs, and the fingerprint of the model the runs use.

use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::experiment::args::{Axis, SweepArgs, check_axis, parse_grid, parse_seeds};
use crate::experiment::file::{is_experiment, load_experiment};
use crate::scenario::{self, RawScenario};
use crate::sim::Sim;
use crate::workload::trace::TraceReads;

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

    pub(crate) fn to_json(&self) -> String {
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

pub(crate) fn sanitize(s: &str) -> String {
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

/// The dotted path of an assignment `PATH=VALUE`, as `--set` takes it.
fn assigned_path(assignment: &str) -> &str {
    assignment
        .split_once('=')
        .map_or(assignment, |(path, _)| path)
        .trim()
}

/// Refuses `path` (set or swept, as `what` says) when it is one of the
/// fields a sweep gives every run itself, naming the option to use.
fn refuse_run_field(path: &str, what: &str) -> Result<()> {
    let instead = match path {
        "seed" => "--seeds (or the experiment's `seeds`)",
        "horizon" => "--horizon (or the experiment's `horizon`)",
        "warmup" => "--warmup (or the experiment's `warmup`)",
        _ => return Ok(()),
    };
    Err(Error::new(format!(
        "{what}: a sweep gives every run its `{path}` itself; use {instead}"
    )))
}

/// Builds and checks the plan of `pdsim sweep`: every point must load and
/// compile before any run starts.
pub fn plan(args: &SweepArgs, reads: &TraceReads) -> Result<Manifest> {
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
    // Every run's seed, horizon and warm-up are the sweep's own, written
    // after the overrides: set or swept, they would be silently replaced.
    for s in &set {
        let path = assigned_path(s);
        refuse_run_field(path, &format!("{}: set `{path}`", target.display()))?;
    }
    for s in &args.set {
        refuse_run_field(assigned_path(s), &format!("--set {s}"))?;
    }
    set.splice(0..0, args.trace.override_());
    set.extend(args.set.iter().cloned());
    for g in &args.grid {
        grid.push((parse_grid(g)?, format!("--grid {g}")));
    }
    for (axis, what) in &grid {
        refuse_run_field(&axis.path, what)?;
    }
    for (i, (axis, what)) in grid.iter().enumerate() {
        if grid[..i].iter().any(|(a, _)| a.path == axis.path) {
            return Err(Error::new(format!(
                "{what}: the path `{}` is swept twice",
                axis.path
            )));
        }
        if let Some(s) = set.iter().find(|s| assigned_path(s) == axis.path) {
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
            .and_then(|sc| Sim::new_sharing(&sc, reads).map(|_| sc))
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn paths_fold_dots() {
        assert_eq!(
            normalize(Path::new("scenarios/experiments/../llmd.ron")),
            Path::new("scenarios/llmd.ron")
        );
        assert_eq!(normalize(Path::new("./a/b.ron")), Path::new("a/b.ron"));
        assert_eq!(normalize(Path::new("../a.ron")), Path::new("../a.ron"));
    }
}
