//! One test (or more) per mechanism of docs/model.md §5–§8 and §11, with the
//! expected numbers derived by hand in the comments.
//!
//! The tiny deployment: blocks of 4 tokens; a step costs
//! max(0.01, 0.001 × tokens) s; NICs carry 1000 tokens/s; reads wait 5 ms.

use crate::common::*;
use pdsim::engine::Role;

fn sched(steps: &[&pdsim::engine::record::StepRecord]) -> Vec<Vec<(u64, u32)>> {
    steps.iter().map(|s| s.scheduled.clone()).collect()
}

/// docs/model.md §6–§8: the prefiller's blocks stay leased from the end of the
/// prefill until the decoder's read completes, and are freed that instant.
#[test]
fn the_lease_is_held_after_the_prefill_and_freed_when_the_read_completes() {
    // r0: prompt 40 (10 blocks), output 3, remote.
    // P: one step of 40 tokens, 0.040 s → answer t1 = 0.040; 10 blocks leased.
    // D admits it at 0.040 (parks, 10 blocks); read starts at 0.045;
    // 40 tokens at 1000/s → done at 0.085 (lease = 0.045).
    // D: 1 token (the last prompt token) → first token at 0.095, then two
    // decode steps → finish at 0.115.
    let out = run_trace(&tiny(&[]), vec![req(0.0, 40, 3, None, true)]);
    let r = out.req(0);
    assert_close(r.t1.unwrap(), 0.040, "t1");
    assert_close(r.read_done_at.unwrap(), 0.085, "read done");
    assert_close(r.first_token_at.unwrap(), 0.095, "first token");
    assert_close(r.finished_at.unwrap(), 0.115, "finish");
    assert_eq!(r.remote_tokens, 40);
    assert_close(
        out.report.mean("lease").unwrap(),
        0.045,
        "lease observation",
    );
    assert_close(out.report.mean("ttft").unwrap(), 0.095, "ttft observation");

    // Held on P: 10 blocks during the prefill step and throughout the lease…
    assert_eq!(out.at(0.0).p_held_blocks, 10);
    assert_eq!(out.at(0.040).p_held_blocks, 10);
    assert_eq!(out.at(0.084).p_held_blocks, 10);
    // …and none from the instant the read completed.
    assert_eq!(out.at(0.085).p_held_blocks, 0);
    // The decoder held the whole prompt while parked, with no slot.
    let parked = out.at(0.050);
    assert_eq!(
        (parked.d_parked, parked.d_running, parked.d_held_blocks),
        (1, 0, 10)
    );
    // P's step and D's three steps: [40], then [1], [1], [1].
    assert_eq!(sched(&out.steps_of(Role::Prefill)), vec![vec![(0, 40)]]);
    assert_eq!(sched(&out.steps_of(Role::Decode)), vec![vec![(0, 1)]; 3]);
}

/// docs/model.md §4/§5: a prefix hit covers whole blocks only and never the last
/// token of the prompt.
#[test]
fn a_prefix_hit_never_covers_the_last_token_or_a_partial_block() {
    // All on the decoder, one stream, output 1 (so computed = prompt).
    // r0: 40 tokens → 10 full blocks cached.
    // r1: 40 tokens, all cached, but the last must be computed → hit 36.
    // r2: 42 tokens: 10 cached blocks, reusable(42) = 40 → hit 40.
    // r3: 43 tokens: r2 computed 42 → still 10 full blocks (the 11th holds
    //     2 tokens, uncached) → hit 40, not 42.
    let s = Some(7);
    let out = run_trace(
        &tiny(&[]),
        vec![
            req(0.0, 40, 1, s, false),
            req(1.0, 40, 1, s, false),
            req(2.0, 42, 1, s, false),
            req(3.0, 43, 1, s, false),
        ],
    );
    let hits: Vec<u32> = (0..4).map(|i| out.req(i).prefix_hit.unwrap()).collect();
    assert_eq!(hits, vec![0, 36, 40, 40]);
    // local_tokens = prompt − hit: 40, 4, 2, 3.
    assert_close(
        out.report.mean("local_tokens").unwrap(),
        (40.0 + 4.0 + 2.0 + 3.0) / 4.0,
        "local tokens",
    );
    // r1's step computes 4 tokens: cost max(0.01, 0.004) = 0.01.
    assert_eq!(out.steps_of(Role::Decode)[1].scheduled, vec![(1, 4)]);
}

/// docs/model.md §5: a prompt longer than the budget is prefilled in chunks; its
/// KV grows chunk by chunk; the first token comes with the last chunk.
#[test]
fn a_long_prompt_is_prefilled_in_several_chunks() {
    // Budget 16, prompt 40, output 2: chunks 16 (0.016 s), 16 (0.016 s),
    // 8 (0.010 s) → first token at 0.042; one decode step → 0.052.
    // Blocks held: 4, 8, 10, then 11 (41 tokens).
    let out = run_trace(
        &tiny(&["decode.engine.max_num_batched_tokens=16"]),
        vec![req(0.0, 40, 2, None, false)],
    );
    let steps = out.steps_of(Role::Decode);
    assert_eq!(
        sched(&steps),
        vec![vec![(0, 16)], vec![(0, 16)], vec![(0, 8)], vec![(0, 1)]]
    );
    let held: Vec<u32> = steps.iter().map(|s| s.kv_blocks_held).collect();
    assert_eq!(held, vec![4, 8, 10, 11]);
    assert_close(out.req(0).first_token_at.unwrap(), 0.042, "first token");
    assert_close(out.req(0).finished_at.unwrap(), 0.052, "finish");
}

/// docs/model.md §5: admissions are head-of-line: a request that does not fit
/// stops every request behind it, even one that would fit.
#[test]
fn head_of_line_blocking_stops_admissions_behind_a_request_that_does_not_fit() {
    // D pool 16 blocks. r0: prompt 40, output 10 (10 blocks, growing to 13).
    // r1 (0.001): prompt 32 needs 8 blocks; r2 (0.002): prompt 4 needs 1.
    // At 0.040 r0 takes an 11th block: 5 free. r1 does not fit, so r2 —
    // which would — waits too, until r0 finishes at 0.040 + 9 × 0.01 = 0.13.
    // Then both are admitted in one step of 36 tokens (0.036 s).
    let out = run_trace(
        &tiny(&["decode.engine.num_gpu_blocks=16"]),
        vec![
            req(0.0, 40, 10, None, false),
            req(0.001, 32, 1, None, false),
            req(0.002, 4, 1, None, false),
        ],
    );
    let steps = out.steps_of(Role::Decode);
    let first_with = |id: u64| {
        steps
            .iter()
            .find(|s| s.scheduled.iter().any(|&(r, _)| r == id))
            .unwrap()
    };
    assert_close(
        first_with(1).start,
        0.13,
        "r1 admitted when r0 frees its blocks",
    );
    assert_close(first_with(2).start, 0.13, "r2 waits behind r1");
    assert_eq!(first_with(2).scheduled, vec![(1, 32), (2, 4)]);
    assert_close(out.req(2).finished_at.unwrap(), 0.166, "r2 finish");
    // While r0 decoded, r2 alone would have fit: 5 blocks were free.
    assert_eq!(steps[1].kv_blocks_held, 11);
}

/// docs/model.md §5: LIFO preemption; the victim frees its blocks (still cached),
/// goes back to the front of the queue, recomputes on resume and emits no
/// second first token.
#[test]
fn preemption_is_lifo_and_resumption_recomputes_without_a_second_first_token() {
    // D pool 8 blocks, max_model_len 32. r0, r1: prompt 12, output 10, both
    // at t = 0, admitted together: step 0 = 24 tokens (0.024 s), both first
    // tokens at 0.024. Decode steps of 0.01 s; each took a 4th block at step 1
    // (13 tokens): pool full.
    // Step 5 (t = 0.064): r0 needs a 5th block (17 tokens): r1, the last
    // admitted, is preempted (frees 4 blocks, still cached; r0 takes the one
    // that held r1's block 3). No admission in that step.
    // Steps 6–8: r1 (known 12 + 5 = 17 tokens, 3 cached blocks) needs 2 new
    // blocks + its 3 cached ones out of the queue: 5 > 3 free → waits.
    // Step 9 (0.104): r0 takes a 6th block (evicting r1's block 2) and
    // finishes at 0.114 (10 tokens). Step 10: r1 resumes with a hit of 2
    // blocks (8 tokens) and recomputes 9 tokens (0.01 s) → 0.124 (its 6th
    // token, not a first token), then 4 decode steps → finish at 0.164.
    let out = run_trace(
        &tiny(&[
            "decode.engine.num_gpu_blocks=8",
            "decode.engine.max_model_len=32",
            "prefill.engine.max_model_len=32",
        ]),
        vec![req(0.0, 12, 10, None, false), req(0.0, 12, 10, None, false)],
    );
    let steps = out.steps_of(Role::Decode);
    assert_eq!(steps.len(), 15);
    assert_eq!(steps[0].scheduled, vec![(0, 12), (1, 12)]);
    assert_eq!(steps[5].preempted, vec![1]);
    assert_eq!(steps[5].scheduled, vec![(0, 1)]);
    for s in &steps[6..10] {
        assert_eq!(s.scheduled, vec![(0, 1)], "r1 waits while r0 runs");
    }
    assert_close(steps[10].start, 0.114, "r1 resumes when r0 finished");
    assert_eq!(steps[10].scheduled, vec![(1, 9)]);
    let (r0, r1) = (out.req(0), out.req(1));
    assert_eq!((r0.preemptions, r1.preemptions), (0, 1));
    assert_close(
        r1.first_token_at.unwrap(),
        0.024,
        "r1's first token is the one before preemption",
    );
    assert_close(r0.finished_at.unwrap(), 0.114, "r0 finish");
    assert_close(r1.finished_at.unwrap(), 0.164, "r1 finish");
    assert_eq!(r1.generated, 10, "exactly its output, nothing twice");
    assert_eq!(out.report.observations["ttft"].count, 2);
}

/// docs/model.md §7: a parked request holds KV and no slot; when its KV arrives
/// it is promoted ahead of requests that arrived before it.
#[test]
fn a_parked_request_holds_kv_and_no_slot_and_is_promoted_ahead_of_new_arrivals() {
    // D has one slot. r0 remote (prompt 40, output 3): parked at 0.040,
    // read done at 0.085. r1 local (prompt 8, output 5) at 0.05 takes the
    // slot: steps end 0.06 … 0.10. r2 local (prompt 8, output 1) arrives at
    // 0.07, before r0's KV. At 0.10 the slot frees: r0 (ready) goes first:
    // 1 token → first token 0.11, finish 0.13; only then r2: 8 tokens →
    // 0.14.
    let out = run_trace(
        &tiny(&["decode.engine.max_num_seqs=1"]),
        vec![
            req(0.0, 40, 3, None, true),
            req(0.05, 8, 5, None, false),
            req(0.07, 8, 1, None, false),
        ],
    );
    // While r1 runs, r0 is parked: 1 running (the slot), 1 parked, and the
    // decoder holds r0's 10 blocks + r1's 3.
    let s = out.at(0.06);
    assert_eq!((s.d_running, s.d_parked, s.d_held_blocks), (1, 1, 13));
    // After the read, r0 waits ready (no slot) while r1 finishes.
    let s = out.at(0.09);
    assert_eq!((s.d_running, s.d_parked, s.d_ready), (1, 0, 1));
    let steps = out.steps_of(Role::Decode);
    let at_010 = steps.iter().find(|s| (s.start - 0.10).abs() < EPS).unwrap();
    assert_eq!(
        at_010.scheduled,
        vec![(0, 1)],
        "the promoted request goes before r2"
    );
    assert_close(out.req(0).first_token_at.unwrap(), 0.11, "r0 first token");
    assert_close(out.req(0).finished_at.unwrap(), 0.13, "r0 finish");
    assert_close(out.req(2).finished_at.unwrap(), 0.14, "r2 finish");
}

/// docs/model.md §8: two reads from one prefiller share its NIC max-min fairly;
/// rates are recomputed when one ends.
#[test]
fn concurrent_reads_share_the_prefillers_nic() {
    // Prefill budget 128: r0, r1 remote, prompt 40 each, at t = 0: one P
    // step of 80 tokens (0.08 s), both answered at 0.08 and parked on the
    // decoder; two reads start at 0.085 over the same two NICs: 500 tokens/s
    // each → both done at 0.165 (lease 0.085 each).
    let wide = tiny(&["prefill.engine.max_num_batched_tokens=128"]);
    let out = run_trace(
        &wide,
        vec![req(0.0, 40, 1, None, true), req(0.0, 40, 1, None, true)],
    );
    for i in 0..2 {
        assert_close(out.req(i).t1.unwrap(), 0.08, "t1");
        assert_close(out.req(i).read_done_at.unwrap(), 0.165, "shared read");
    }
    assert_close(out.report.mean("lease").unwrap(), 0.085, "lease");
    // Budget 64 instead: r0's prompt (40) and 24 tokens of r1 in the first
    // step (0.064 s), r1's last 16 in a second (0.016 s). r0's read runs
    // alone from 0.069 to 0.085 (16 tokens), then shares with r1's (from
    // 0.085) at 500/s: its last 24 tokens take 0.048 → done at 0.133. r1 has
    // 40 − 24 = 16 left, alone at 1000/s → done at 0.149.
    let out = run_trace(
        &tiny(&[]),
        vec![req(0.0, 40, 1, None, true), req(0.0, 40, 1, None, true)],
    );
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.133,
        "r0 read, shared in its second half",
    );
    assert_close(
        out.req(1).read_done_at.unwrap(),
        0.149,
        "r1 read, alone again at the end",
    );
}

/// docs/model.md §11: six requests at once; the decoder has room for one prompt,
/// the prefiller for two. With NIXL the decoder's shortage is held on the
/// prefiller (leases); with store-and-forward the prefiller never waits.
#[test]
fn store_and_forward_decouples_the_prefiller_nixl_does_not() {
    // Prompt 40 (10 blocks), output 2; P pool 24 blocks (2 prompts), D pool
    // 12 blocks (1 prompt), max_model_len 48.
    let trace = || {
        (0..6)
            .map(|_| req(0.0, 40, 2, None, true))
            .collect::<Vec<_>>()
    };
    let base = [
        "prefill.engine.num_gpu_blocks=24",
        "prefill.engine.max_model_len=48",
        "decode.engine.max_model_len=48",
    ];
    let run = |mode: &str, d_blocks: &str| {
        let mut sets = base.to_vec();
        let m = format!("transfer.mode={mode}");
        let d = format!("decode.engine.num_gpu_blocks={d_blocks}");
        sets.push(&m);
        sets.push(&d);
        run_trace(&tiny(&sets), trace())
    };
    let t1s = |o: &Outcome| (0..6).map(|i| o.req(i).t1.unwrap()).collect::<Vec<f64>>();

    let nixl_small = run("NixlPull", "12");
    let nixl_large = run("NixlPull", "1000");
    let sf_small = run("StoreAndForward", "12");
    let sf_large = run("StoreAndForward", "1000");

    // Store-and-forward: the decoder's room changes nothing on the prefiller.
    assert_eq!(t1s(&sf_small), t1s(&sf_large));
    // NIXL: it does.
    assert_ne!(t1s(&nixl_small), t1s(&nixl_large));
    // After two prefills the prefiller is full of leases: each later
    // prefill starts only once a read has freed a lease — with the small
    // decoder, once the decoder has room to read the one before.
    let p_steps = nixl_small.steps_of(Role::Prefill);
    let start_of = |id: u64| {
        p_steps
            .iter()
            .find(|s| s.scheduled.iter().any(|&(r, _)| r == id))
            .unwrap()
            .start
    };
    for k in 2..6u64 {
        let freed = nixl_small.req(k - 2).read_done_at.unwrap();
        assert_close(
            start_of(k),
            freed,
            &format!("prefill {k} starts when read {} frees its lease", k - 2),
        );
    }
    // With the small decoder a read waits for the previous request to finish
    // decoding: request k's read ends after request k−1 finished.
    for k in 1..6u64 {
        assert!(
            nixl_small.req(k).read_done_at.unwrap() > nixl_small.req(k - 1).finished_at.unwrap()
        );
    }
    let max_p_held = nixl_small
        .timeline
        .iter()
        .map(|s| s.p_held_blocks)
        .max()
        .unwrap();
    assert_eq!(max_p_held, 20, "two leased prompts fill the prefiller");
    // The decoder's shortage shows as memory held on the prefiller.
    let held = |o: &Outcome| o.report.gauges["prefill_kv_held"];
    assert!(
        held(&nixl_small) > held(&nixl_large),
        "{} vs {}",
        held(&nixl_small),
        held(&nixl_large)
    );
    assert!(
        held(&nixl_small) > held(&sf_small),
        "{} vs {}",
        held(&nixl_small),
        held(&sf_small)
    );
    assert_eq!(held(&sf_small), held(&sf_large));
    // Store-and-forward: the prefiller waits only for its own copies. Copy 0
    // runs 0.064–0.128 (alone, then sharing the NIC with copy 1 from 0.08);
    // copy 1 ends at 0.144; every later copy runs alone, 40 tokens in 0.04 s
    // — none waits for the decoder. Prefill k starts once copy k − 2 is done
    // and the prefiller is free: back to back from 0.128, 0.04 s each.
    let p_steps = sf_small.steps_of(Role::Prefill);
    let start_of = |id: u64| {
        p_steps
            .iter()
            .find(|s| s.scheduled.iter().any(|&(r, _)| r == id))
            .unwrap()
            .start
    };
    let expected_done = [0.128, 0.144, 0.208, 0.248, 0.288, 0.328];
    for k in 0..6u64 {
        assert_close(
            sf_small.req(k).read_done_at.unwrap(),
            expected_done[k as usize],
            "copy done",
        );
    }
    for k in 2..6u64 {
        assert_close(
            start_of(k),
            0.128 + 0.04 * (k - 2) as f64,
            "prefills back to back",
        );
        assert!(start_of(k) >= sf_small.req(k - 2).read_done_at.unwrap() - EPS);
    }
}

/// The exact shortcut: booking runs of identical decode steps as one changes
/// no request's times — bit for bit — on a busy multi-turn workload.
#[test]
fn repeated_decode_steps_give_the_same_times_as_step_by_step() {
    let sets: Vec<String> = [
        "horizon=60",
        "workload.session_rate=2",
        "workload.output_tokens_mean=40",
        "decode.engine.num_gpu_blocks=48",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let sc =
        pdsim::scenario::load(std::path::Path::new("tests/scenarios/tiny.ron"), &sets).unwrap();
    let run = |repeats: bool| {
        let mut sim = pdsim::Sim::new(&sc).unwrap();
        sim.set_step_repeats(repeats);
        sim.record_requests();
        let report = sim.run().unwrap();
        let done = sim
            .world
            .remove_resource::<pdsim::engine::record::FinishedRequests>()
            .unwrap()
            .0;
        let times: Vec<(u64, f64, f64, u32, u32)> = done
            .iter()
            .map(|r| {
                (
                    r.id,
                    r.first_token_at.unwrap(),
                    r.finished_at.unwrap(),
                    r.preemptions,
                    r.prefix_hit.unwrap(),
                )
            })
            .collect();
        (times, report)
    };
    let (step_by_step, slow) = run(false);
    let (repeated, fast) = run(true);
    assert!(
        step_by_step.len() > 50,
        "a busy workload: {} requests",
        step_by_step.len()
    );
    assert!(step_by_step.iter().any(|t| t.3 > 0), "with preemptions");
    assert_eq!(step_by_step, repeated);
    assert_eq!(slow.steps, fast.steps, "the same number of engine steps");
    assert!(
        fast.ticks < slow.ticks,
        "fewer ticks: {} vs {}",
        fast.ticks,
        slow.ticks
    );
    assert_eq!(slow.observations, fast.observations);
}

/// The exact shortcut past block boundaries: a run that reaches one
/// request's block boundary books its next run from the run's entries
/// (that request's new block taken, the others' tokens applied later).
/// The report is byte for byte the one of runs formed anew at every
/// boundary — ticks, gauges and every histogram's sums included — on busy
/// workloads that evict and preempt (runs against step by step:
/// `repeated_decode_steps_give_the_same_times_as_step_by_step`). The
/// shortcut is taken: else this would test nothing.
#[test]
fn runs_continued_past_block_boundaries_give_the_same_report() {
    let tiny = |blocks: &str| {
        let sets: Vec<String> = [
            "horizon=60",
            "workload.session_rate=2",
            "workload.output_tokens_mean=40",
            &format!("decode.engine.num_gpu_blocks={blocks}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        pdsim::scenario::load(std::path::Path::new("tests/scenarios/tiny.ron"), &sets).unwrap()
    };
    let reference = |blocks: &str| {
        let sets: Vec<String> = [
            "horizon=400",
            "warmup=100",
            "workload.session_rate=1.2",
            &format!("decode.engine.num_gpu_blocks={blocks}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        pdsim::scenario::load(std::path::Path::new("scenarios/llmd_nixl_pull.ron"), &sets).unwrap()
    };
    let run = |sc: &pdsim::scenario::Scenario, continued: bool| {
        let mut sim = pdsim::Sim::new(sc).unwrap();
        sim.set_continued_runs(continued);
        let mut report = sim.run().unwrap();
        let steps: u64 = sim
            .world
            .query::<&pdsim::engine::Engine>()
            .iter(&sim.world)
            .map(|e| e.continued_steps)
            .sum();
        (report.wall_seconds, report.routing_seconds) = (0.0, 0.0);
        let lone = sim.world.resource::<pdsim::shared::Clock>().lone_ticks;
        (report, steps, lone)
    };
    for (what, sc) in [
        ("tiny, 48 blocks", tiny("48")),
        ("tiny, 400 blocks", tiny("400")),
        ("the reference, 1100 blocks", reference("1100")),
        ("the reference, 10000 blocks", reference("10000")),
    ] {
        let (anew, none, no_lane) = run(&sc, false);
        let (continued, taken, lone) = run(&sc, true);
        assert_eq!(none, 0, "{what}: none continued when asked not to");
        assert_eq!(
            no_lane, 0,
            "{what}: the lone lane only takes continued runs"
        );
        assert!(
            taken * 4 > continued.ticks,
            "{what}: most ticks continue a run ({taken} of {} ticks)",
            continued.ticks
        );
        assert_eq!(anew.to_json(), continued.to_json(), "{what}");
        // The lone lane hands over the ticks of a request decoding alone
        // itself: on these light loads, most continued runs' ticks.
        assert!(
            lone * 2 > taken,
            "{what}: the lone lane is taken ({lone} ticks of {taken} continued)"
        );
    }
}
