//! Benchmark: the cost of the router's scripts, per hook and per decision,
//! on the reference scenario's policies (2 decode pods, 2 prefill pods).
//!
//!     cargo bench --bench routing
//!
//! To measure scripts of your own: `PDSIM_DECIDER=path` swaps the decider;
//! `PDSIM_SET='key=value;key=value'` applies any `--set` overrides, e.g.
//! `PDSIM_SET='router.decode.scorers.0.script=/tmp/my-scorer.rhai'`.

// The allocator of the command-line binary (ecs/main.rs), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::Instant;

use pdsim::engine::Role;
use pdsim::router::policy::{PodView, Policies, ReqView};

fn pod(role: &str, index: i64, active: i64, cached: i64) -> PodView {
    PodView {
        role: role.into(),
        index,
        active,
        running: active,
        queued: 1,
        prompt_backlog: 300 * index,
        kv_capacity: 160_000,
        kv_held: 5_000,
        cached_tokens: cached,
        max_num_seqs: 64,
        ..Default::default()
    }
}

/// Microseconds per call of `f`: the best of five rounds of `n` calls (the
/// minimum is the estimate least disturbed by the rest of the machine).
fn time(name: &str, n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let us = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() / n as f64 * 1e6
        })
        .fold(f64::INFINITY, f64::min);
    println!("  {name:<34}{us:>8.2} µs");
    us
}

fn main() {
    let mut sets: Vec<String> = std::env::var("PDSIM_DECIDER")
        .map(|p| vec![format!("router.decider.script={p}")])
        .unwrap_or_default();
    if let Ok(extra) = std::env::var("PDSIM_SET") {
        sets.extend(extra.split(';').map(String::from));
    }
    let sc =
        pdsim::scenario::load(Path::new("scenarios/llmd_nixl_pull.ron"), &sets).expect("scenario");
    let router = pdsim::scenario::expand_plugins(&sc.raw.router).expect("plugins");
    let mut p = Policies::load(&router, 1, sc.lib_dir.as_deref()).expect("policies");
    println!(
        "setup: policies of {} (release build), 2 candidate pods per profile",
        sc.source.display()
    );
    let direct: Vec<String> = p
        .plugins()
        .filter(|x| x.evaluates_directly())
        .map(|x| {
            format!(
                "{} ({})",
                x.path.rsplit('/').next().unwrap_or(&x.path),
                x.hook.name()
            )
        })
        .collect();
    println!("hooks the host evaluates itself: {}", direct.join(", "));
    // Each call routes a new request (a new id; the request's other
    // properties and the pods stay the same).
    let mut id = 0;
    let mut next_req = || {
        id += 1;
        ReqView {
            id,
            session: 7,
            turn: 2,
            prompt_tokens: 2500,
            new_tokens: 600,
            block_size: 16,
            ..Default::default()
        }
    };
    let decoders = [pod("decode", 0, 3, 1600), pod("decode", 1, 2, 0)];
    let prefillers = [pod("prefill", 0, 1, 0), pod("prefill", 1, 0, 800)];
    let n: u32 = std::env::var("PDSIM_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    // The first round takes the exact shortcuts: hooks in the host's subset
    // evaluated without rhai (router/policy/direct.rs), other pure hooks'
    // answers remembered (router/policy/memo.rs; the same pods every call).
    // The second runs every script in rhai on every call.
    for shortcuts in [true, false] {
        if !shortcuts {
            p.forget_answers();
        }
        println!(
            "{}",
            if shortcuts {
                "with the shortcuts (hooks the host evaluates; remembered answers):"
            } else {
                "every hook run in rhai on every call (the scripts' own cost):"
            }
        );
        time("decide (decider)", n, || {
            std::hint::black_box(p.decide(&next_req(), &decoders[0], None).unwrap());
        });
        time("decode profile (scorer, picker)", n, || {
            std::hint::black_box(p.choose(Role::Decode, &next_req(), &decoders).unwrap());
        });
        time("prefill profile (filter, scorer ×2, picker)", n, || {
            std::hint::black_box(p.choose(Role::Prefill, &next_req(), &prefillers).unwrap());
        });
        // As the router runs them: decode profile, decider, prefill profile.
        time("a remote decision (all three)", n, || {
            let req = next_req();
            let j = p.choose(Role::Decode, &req, &decoders).unwrap();
            assert!(p.decide(&req, &decoders[j], None).unwrap());
            std::hint::black_box(p.choose(Role::Prefill, &req, &prefillers).unwrap());
        });
    }
    println!("(a run's own mix of repeats: `cargo bench --bench reference`, its routing line)");
}
