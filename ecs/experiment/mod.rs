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
//! remote fraction (mean of `remote`), mean and p90 TTFT, mean TPOT, p99
//! ITL, mean response,
//! mean lease, and the gauges `prefill_kv_held` (tokens per prefiller),
//! `prefill_queue` (requests per prefiller) and `kv_usage_max` (the fullest
//! decoder's held KV fraction), and each role's prefix-cache hit rate (hit
//! tokens ÷ queried tokens, from the counters). A run with no value (no remote request has
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
//!
//! | file | what |
//! |---|---|
//! | [`args`] | `pdsim sweep` / `pdsim merge` arguments: seeds, grid axes, shards |
//! | [`file`](mod@file) | experiment files (a base scenario and its sweep, in RON) |
//! | [`plan`](mod@plan) | the manifest: points, runs, the fingerprint of what runs |
//! | [`outdir`] | the out dir: where each run's files go, claiming it |
//! | [`run`](mod@run) | running the plan in parallel, resumably |
//! | [`merge`](mod@merge) | combining the out dirs of shards |
//! | [`summary`] | median and range per point: JSON, CSV, table |
//! | [`figures`] | CDFs per point, pooled over seeds |

pub mod args;
pub mod figures;
pub mod file;
pub mod merge;
pub mod outdir;
pub mod plan;
pub mod run;
pub mod summary;

pub use args::{Axis, MergeArgs, SweepArgs, parse_grid, parse_seeds, parse_shard};
pub use file::{Experiment, is_experiment, load_experiment};
pub use merge::merge;
pub use outdir::RunDistributions;
pub use plan::{Manifest, Point, plan, short_names};
pub use run::{SweepOutcome, sweep};
pub use summary::{At, METRICS, Metric, Stats, sig};
