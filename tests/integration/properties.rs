//! Properties of every run, over random small scenarios and traces: every
//! request accounted for, KV blocks conserved in every pool after every
//! tick (each block's references are exactly the requests' and leases'
//! that hold it, so a lease released twice or never is caught), no negative
//! or NaN observation. The cases are drawn from a seeded generator: a
//! failure prints the case's `--set` overrides, which reproduce it with
//! `pdsim run tests/scenarios/tiny.ron --set …`.

use bevy_ecs::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::HashMap;

use pdsim::engine::{Engine, KvPool, Leg, Request};
use pdsim::metrics::Report;
use pdsim::router::RouterMode;
use pdsim::sim::{Sim, SimSystems};
use pdsim::transfer::{Lease, LeaseState};
use pdsim::workload::TraceRequest;

use crate::common::tiny;

/// Broken invariants, as sentences (empty while all hold).
#[derive(Resource, Default)]
struct Broken(Vec<String>);

/// After every tick: in every pool, blocks held + free = blocks, and each
/// block's reference count is the number of holders (requests on that
/// engine, leases held on that prefiller, releases it has not been told of
/// yet) that list it.
fn check_conservation(
    clock: Res<pdsim::shared::Clock>,
    engines: Query<(Entity, &Engine, &KvPool)>,
    reqs: Query<&Request>,
    leases: Query<&Lease>,
    mut broken: ResMut<Broken>,
) {
    if broken.0.len() > 3 {
        return;
    }
    let mut holders: HashMap<(Entity, u32), u32> = HashMap::new();
    for r in &reqs {
        let on = match r.leg {
            Leg::Prefill => r.prefiller,
            Leg::Decode => r.decoder,
        };
        if let Some(e) = on {
            for &b in &r.blocks {
                *holders.entry((e, b)).or_default() += 1;
            }
        }
    }
    for l in leases.iter().filter(|l| l.state == LeaseState::Held) {
        for &b in &l.blocks {
            *holders.entry((l.prefiller, b)).or_default() += 1;
        }
    }
    // vLLM 0.33: an ended lease's blocks until the scheduler hears of it.
    for (e, engine, _) in &engines {
        for blocks in engine.pending_frees() {
            for &b in blocks {
                *holders.entry((e, b)).or_default() += 1;
            }
        }
    }
    for (e, engine, kv) in &engines {
        let pool = &kv.0;
        let name = format!("{}-{}", engine.role.name(), engine.index);
        let mut held = 0;
        let counts = pool.ref_counts();
        for b in 0..pool.num_blocks() {
            let refs = counts[b as usize];
            held += u32::from(refs > 0);
            let owners = holders.get(&(e, b)).copied().unwrap_or(0);
            if refs != owners {
                let leases: Vec<String> = leases
                    .iter()
                    .filter(|l| l.prefiller == e)
                    .map(|l| format!("{:?} {:?}", l.state, l.blocks))
                    .collect();
                let reqs: Vec<String> = reqs
                    .iter()
                    .filter(|r| r.prefiller == Some(e) || r.decoder == Some(e))
                    .map(|r| format!("{} {:?} {:?} {:?}", r.id, r.leg, r.status, r.blocks))
                    .collect();
                broken.0.push(format!(
                    "t = {}: {name}: block {b} has {refs} references and {owners} holders; leases {leases:?}; requests {reqs:?}",
                    clock.now
                ));
                return;
            }
        }
        if held != pool.num_held() || pool.num_held() + pool.num_free() != pool.num_blocks() {
            broken.0.push(format!(
                "{name}: {held} blocks referenced, {} held, {} free, {} in all",
                pool.num_held(),
                pool.num_free(),
                pool.num_blocks()
            ));
        }
    }
}

/// The checks that follow a run: the accounting and the observations.
fn check_report(report: &Report, broken: &mut Vec<String>) {
    let c = &report.counters;
    let in_flight = report.backlog.in_flight;
    if c["requests_arrived"]
        != c["requests_finished"] + c["requests_too_long"] + c["requests_failed"] + in_flight
    {
        broken.push(format!(
            "unaccounted: arrived {} ≠ finished {} + too long {} + failed {} + in flight {in_flight}",
            c["requests_arrived"], c["requests_finished"], c["requests_too_long"], c["requests_failed"]
        ));
    }
    for (name, s) in &report.observations {
        for v in [s.mean, s.p50, s.p90, s.p99, s.p999].into_iter().flatten() {
            if v.is_nan() || v < 0.0 {
                broken.push(format!("observation {name}: {v}"));
            }
        }
    }
    for (name, v) in &report.gauges {
        if !v.is_finite() || *v < 0.0 {
            broken.push(format!("gauge {name}: {v}"));
        }
    }
}

/// A random small deployment and synthetic workload, as `--set` overrides
/// of the tiny scenario.
fn random_scenario(rng: &mut Xoshiro256PlusPlus) -> Vec<String> {
    let vllm = rng.random_bool(0.5);
    let block = [1u32, 2, 4, 8][rng.random_range(0..4)];
    let max_model_len = rng.random_range(16..=96u32);
    let mut sets = vec![
        format!("seed={}", rng.random_range(1..1000u32)),
        format!("horizon={}", rng.random_range(10..40u32)),
        format!("warmup={}", rng.random_range(0..5u32)),
        format!(
            "engine_semantics={}",
            if vllm { "Vllm033" } else { "Reference" }
        ),
        format!("workload.session_rate={:.2}", rng.random_range(0.2..12.0)),
        format!(
            "workload.continue_probability={:.2}",
            rng.random_range(0.0..0.9)
        ),
        format!(
            "workload.first_turn_tokens=({}, {})",
            rng.random_range(1..20u32),
            rng.random_range(20..100u32)
        ),
        format!(
            "workload.later_turn_tokens_mean={:.1}",
            rng.random_range(1.0..30.0)
        ),
        format!(
            "workload.output_tokens_mean={:.1}",
            rng.random_range(1.0..20.0)
        ),
        format!("workload.tool_time_mean={:.2}", rng.random_range(0.05..2.0)),
    ];
    for role in ["prefill", "decode"] {
        // The pool holds at least one max_model_len request (and the null block).
        let least = max_model_len.div_ceil(block) + u32::from(vllm);
        let seqs = rng.random_range(1..=6u32);
        sets.extend([
            format!("{role}.count={}", rng.random_range(1..=3u32)),
            format!("{role}.engine.block_size={block}"),
            format!("{role}.engine.max_model_len={max_model_len}"),
            format!(
                "{role}.engine.num_gpu_blocks={}",
                least + rng.random_range(0..3 * least)
            ),
            format!("{role}.engine.max_num_seqs={seqs}"),
            format!(
                "{role}.engine.max_num_batched_tokens={}",
                rng.random_range(seqs.max(4)..=64)
            ),
            format!("{role}.nic.tokens_per_s={}", rng.random_range(100..5000u32)),
        ]);
    }
    let (mode, dispatch) = match rng.random_range(0..4) {
        0 => ("NixlPull", "Serial"),
        1 => ("StoreAndForward", "Serial"),
        2 => ("NixlPush", "Serial"),
        _ => ("NixlPush", "Parallel"),
    };
    sets.push(format!("transfer.mode={mode}"));
    sets.push(format!("router.dispatch={dispatch}"));
    let threshold = ["1", "16", "inf"][rng.random_range(0..3)];
    sets.push(format!(
        "router.decider.params.non_cached_tokens={threshold}"
    ));
    // Short leases, some without heartbeats: expiries mid-run.
    match rng.random_range(0..3) {
        0 => sets.push(format!(
            "transfer.lease.duration={}",
            rng.random_range(6..12u32)
        )),
        1 => sets.extend([
            "transfer.lease.heartbeats=false".to_string(),
            format!("transfer.lease.duration={:.2}", rng.random_range(0.05..3.0)),
        ]),
        _ => {}
    }
    sets
}

fn describe(case: usize, sets: &[String]) -> String {
    let args: Vec<String> = sets.iter().map(|s| format!("--set '{s}'")).collect();
    format!(
        "case {case}: pdsim run tests/scenarios/tiny.ron {}",
        args.join(" ")
    )
}

#[test]
fn every_run_of_random_small_scenarios_keeps_its_invariants() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2026);
    for case in 0..1500 {
        let sets = random_scenario(&mut rng);
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let sc = tiny(&refs);
        let mut sim = Sim::new(&sc).unwrap_or_else(|e| panic!("{}: {e}", describe(case, &sets)));
        sim.world.insert_resource(Broken::default());
        sim.add_systems(check_conservation.after(SimSystems::Observe));
        let report = sim
            .run()
            .unwrap_or_else(|e| panic!("{}: {e}", describe(case, &sets)));
        let mut broken = sim.world.remove_resource::<Broken>().unwrap().0;
        check_report(&report, &mut broken);
        assert!(
            broken.is_empty(),
            "{}:\n  {}",
            describe(case, &sets),
            broken.join("\n  ")
        );
    }
}

#[test]
fn every_replay_of_random_traces_keeps_its_invariants() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(33);
    for case in 0..1500 {
        let mut sets = random_scenario(&mut rng);
        sets.retain(|s| !s.starts_with("workload.") && !s.starts_with("router.decider"));
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let sc = tiny(&refs);
        // Requests of 1–100 prompt tokens (some past max_model_len), some
        // sharing a stream's prefix, some remote, at random times.
        let n = rng.random_range(1..30);
        let mut at = 0.0;
        let trace: Vec<TraceRequest> = (0..n)
            .map(|_| {
                at += rng.random_range(0.0..0.5);
                crate::common::req(
                    at,
                    rng.random_range(1..100),
                    rng.random_range(1..20),
                    rng.random_bool(0.5).then(|| rng.random_range(0..3)),
                    rng.random_bool(0.6),
                )
            })
            .collect();
        let what = format!("{} with the trace {trace:?}", describe(case, &sets));
        let mut sim = Sim::with_trace(&sc, RouterMode::Direct, trace)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        sim.world.insert_resource(Broken::default());
        sim.add_systems(check_conservation.after(SimSystems::Observe));
        let report = sim.run().unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut broken = sim.world.remove_resource::<Broken>().unwrap().0;
        check_report(&report, &mut broken);
        assert!(broken.is_empty(), "{what}:\n  {}", broken.join("\n  "));
    }
}
