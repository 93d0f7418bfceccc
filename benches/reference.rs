//! Benchmark: the reference scenario (docs/model.md §10) over a long horizon.
//! Prints its setup and simulated seconds per wall second.
//!
//!     cargo bench --bench reference            # horizon 10 000 s, seed 1
//!     cargo bench --bench reference -- 3600 5  # horizon, seed

// The allocator of the command-line binary (ecs/main.rs), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let horizon: f64 = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000.0);
    let seed: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let path = Path::new("scenarios/llmd_nixl_pull.ron");
    let sets = vec![
        format!("horizon={horizon}"),
        format!("warmup={}", horizon / 10.0),
        format!("seed={seed}"),
    ];
    let scenario = pdsim::scenario::load(path, &sets).expect("reference scenario");
    println!(
        "setup: {} (2P2D, Λ = {}/s), horizon {horizon} s, seed {seed}, {} cores, release build",
        path.display(),
        pdsim::scenario::Sessions::of(&scenario.raw.workload).session_rate,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    // One warm-up run (page cache, allocator), then three measured runs.
    let mut runs = Vec::new();
    for i in 0..4 {
        let mut sim = pdsim::Sim::new(&scenario).expect("sim");
        let t = Instant::now();
        let report = sim.run().expect("run");
        let wall = t.elapsed().as_secs_f64();
        if i > 0 {
            runs.push((wall, report));
        }
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (wall, report) = &runs[runs.len() / 2];
    let requests = report.observations["ttft"].count;
    println!(
        "median of 3: {wall:.3} s wall, {:.0} simulated s per wall s; {} ticks ({:.0} ns each), {} engine steps, {requests} requests counted",
        horizon / wall,
        report.ticks,
        wall / report.ticks as f64 * 1e9,
        report.steps,
    );
    println!(
        "routing: {} decisions, {:.2} µs each, {:.1}% of the run",
        report.routing_decisions,
        report.routing_seconds / report.routing_decisions.max(1) as f64 * 1e6,
        report.routing_seconds / wall * 100.0
    );
}
