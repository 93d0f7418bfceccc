//! Trace workloads and prefix sharing across sessions, with the expected
//! numbers derived by hand in the comments (the tiny deployment: 1P1D,
//! blocks of 4 tokens, a step costs max(0.01, 0.001 × tokens) s, NICs of
//! 1000 tokens/s, reads wait 5 ms; its decider prefills remotely whenever a
//! token is not cached on the decoder, so every request here is remote).

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use pdsim::engine::record::FinishedRequests;
use pdsim::engine::{BlockPool, Request};
use pdsim::workload::trace::identity::PathBuilder;

/// Writes `text` as a trace file in a scratch folder.
fn trace_file(name: &str, text: &str) -> Scratch {
    Scratch::file(&format!("traces-{name}"), name, text)
}

/// The `--set` that makes the tiny scenario's workload this trace.
fn trace_set(path: &Path, options: &str) -> String {
    format!(
        "workload={{\"trace\": {{\"file\": {:?}{options}}}}}",
        path.display().to_string()
    )
}

/// The tiny deployment through its router on a trace: finished requests by
/// id, and the report.
fn run(path: &Path, options: &str, sets: &[&str]) -> (BTreeMap<u64, Request>, pdsim::Report) {
    let set = trace_set(path, options);
    let mut all = vec![set.as_str()];
    all.extend_from_slice(sets);
    let mut sim = pdsim::Sim::new(&tiny(&all)).unwrap_or_else(|e| panic!("{e}"));
    sim.record_requests();
    let report = sim.run().unwrap();
    let done = sim.world.remove_resource::<FinishedRequests>().unwrap().0;
    (done.into_iter().map(|r| (r.id, r)).collect(), report)
}

fn counter(report: &pdsim::Report, name: &str) -> u64 {
    report.counters[name]
}

/// Two sessions whose first hash ids agree share those blocks, on the
/// prefiller and on the decoder, though they are different sessions.
#[test]
fn sessions_that_share_leading_hash_ids_hit_each_others_blocks() {
    // 8 tokens per hash id, 20-token prompts: ids cover tokens 0..8, 8..16
    // and 16..20 (partial). A = [1, 2, 3] at t = 0, B = [1, 2, 9] at t = 1,
    // after A is done. A's first 4 engine blocks (tokens 0..16) are the
    // shared chain; B hits them: reusable(20) = 16, so 16 tokens on the
    // prefiller (B prefills 4) and 16 on the decoder (B reads 4 tokens).
    let shared = "{\"session_id\":\"a\",\"timestamp\":0,\"input_length\":20,\"output_length\":2,\"hash_ids\":[1,2,3]}\n\
                  {\"session_id\":\"b\",\"timestamp\":1000,\"input_length\":20,\"output_length\":2,\"hash_ids\":[1,2,9]}\n";
    let (done, report) = run(
        &trace_file("shared.jsonl", shared),
        ", \"block_tokens\": 8",
        &[],
    );
    let (a, b) = (&done[&0], &done[&1]);
    assert_eq!((a.prefix_hit, a.remote_tokens), (Some(0), 20));
    assert_eq!(
        (b.prefix_hit, b.remote_tokens),
        (Some(16), 4),
        "decoder hit"
    );
    // Prefiller: queried 20 + 20 tokens, hit 0 + 16.
    assert_eq!(counter(&report, "prefill_prefix_cache_queries"), 40);
    assert_eq!(counter(&report, "prefill_prefix_cache_hits"), 16);
    assert_eq!(counter(&report, "decode_prefix_cache_hits"), 16);
    assert_eq!(counter(&report, "kv_transfer_tokens"), 24);

    // With different first ids nothing is shared.
    let apart = shared.replace("[1,2,9]", "[4,5,9]");
    let (done, report) = run(
        &trace_file("apart.jsonl", &apart),
        ", \"block_tokens\": 8",
        &[],
    );
    assert_eq!(done[&1].prefix_hit, Some(0));
    assert_eq!(counter(&report, "prefill_prefix_cache_hits"), 0);
}

/// A hash block of 512 tokens spans 32 engine blocks of 16; only full hash
/// blocks are shared, and the partial last one never is.
#[test]
fn a_512_token_hash_block_is_32_engine_blocks_and_a_partial_one_is_not_shared() {
    let mut b = PathBuilder::new(512);
    // A: 1000 tokens, ids [1, 2] (the second covers tokens 512..1000 only).
    let (a, _) = b.path(&[1, 2], 1000, 100).unwrap();
    let mut pool = BlockPool::new(200, 16);
    let mut table = Vec::new();
    assert!(pool.allocate(1000_u32.div_ceil(16), &mut table));
    // A's 62 full blocks (992 tokens) are cached under A's path.
    for k in 0..62 {
        pool.cache_block(table[k as usize], a.key(k, 16));
    }
    // B has the same ids and prompt: it shares hash block 0 (32 engine
    // blocks, 512 tokens) but not A's partial second block.
    let (bp, seen) = b.path(&[1, 2], 1000, 101).unwrap();
    assert_eq!(seen, 512);
    assert_eq!(pool.cached_prefix_blocks(&bp, 62), 32);
    // C: 1024 tokens, ids [1, 2]: its second hash block is full, but A never
    // had it full (A's tokens 512..1000 are A's own): still 32 blocks.
    let (c, _) = b.path(&[1, 2], 1024, 102).unwrap();
    assert_eq!(pool.cached_prefix_blocks(&c, 63), 32);
    // D: 1024 tokens, ids [1, 2] again: now C's full chain [1, 2] exists.
    let mut c_table = Vec::new();
    assert!(pool.allocate(64, &mut c_table));
    for k in 0..64 {
        pool.cache_block(c_table[k as usize], c.key(k, 16));
    }
    let (d, seen) = b.path(&[1, 2], 1024, 103).unwrap();
    assert_eq!(seen, 1024);
    // reusable(1024) = 1008 tokens = 63 blocks.
    assert_eq!(pool.cached_prefix_blocks(&d, 63), 63);
}

/// DynoSim's multi-turn form: a later turn is issued `delay` after the
/// previous turn of its session finished (closed loop).
#[test]
fn a_later_turn_is_issued_delay_after_the_previous_one_finishes() {
    // Turn 1 at t = 0: 8 tokens, output 2. Prefill step: max(0.01, 0.008) =
    // 0.010 → t1 = 0.010; the decoder parks it, the read starts at 0.015
    // and moves 8 tokens at 1000/s: done at 0.023; the last prompt token
    // (0.010) gives the first token at 0.033, one decode step more finishes
    // it at 0.043. Turn 2 (delay 250 ms) reaches the gateway at 0.293.
    let text = "{\"session_id\":\"s\",\"timestamp\":0,\"input_length\":8,\"output_length\":2,\"hash_ids\":[1]}\n\
                {\"session_id\":\"s\",\"delay\":250,\"input_length\":16,\"output_length\":1,\"hash_ids\":[1,2]}\n";
    let (done, report) = run(
        &trace_file("turns.jsonl", text),
        ", \"block_tokens\": 8",
        &[],
    );
    assert_close(done[&0].finished_at.unwrap(), 0.043, "turn 1 finishes");
    assert_close(done[&1].t0, 0.293, "turn 2 arrives");
    // Turn 2 shares turn 1's first hash block: 8 tokens on the prefiller.
    assert_eq!(counter(&report, "prefill_prefix_cache_hits"), 8);

    // Twice as fast: the delay halves (125 ms).
    let (done, _) = run(
        &trace_file("turns2.jsonl", text),
        ", \"block_tokens\": 8, \"speedup\": 2.0",
        &[],
    );
    assert_close(done[&1].t0, 0.043 + 0.125, "turn 2 arrives, ×2");
}

/// Five Azure requests a second apart from t = 0: prompts of 10, 20, 30,
/// 64 and 12 tokens, 3 output tokens each.
const AZURE_FIVE: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                          2023-11-16 18:15:46.0000000,10,3\n\
                          2023-11-16 18:15:47.0000000,20,3\n\
                          2023-11-16 18:15:48.0000000,30,3\n\
                          2023-11-16 18:15:49.0000000,64,3\n\
                          2023-11-16 18:15:50.0000000,12,3\n";

/// An Azure trace: every request is counted — finished, refused as too long,
/// or in flight at the horizon.
#[test]
fn every_request_of_an_azure_trace_is_accounted_for() {
    // Five requests a second apart; the fourth (64 tokens) reaches
    // max_model_len = 64 and is refused; the fifth arrives at t = 4, 5 ms
    // before the horizon, and is still in flight there.
    let (done, report) = run(&trace_file("azure.csv", AZURE_FIVE), "", &["horizon=4.005"]);
    assert_eq!(done.len(), 3);
    let t = report.trace.as_ref().expect("a trace summary");
    assert_eq!((t.format.as_str(), t.requests), ("Azure", 5));
    assert_close(t.span, 4.0, "span");
    assert_eq!(counter(&report, "requests_arrived"), 5);
    assert_eq!(counter(&report, "requests_finished"), 3);
    assert_eq!(counter(&report, "requests_too_long"), 1);
    assert_eq!(counter(&report, "requests_in_flight"), 1);
    assert_eq!(report.observations["too_long"].count, 5);
    // Prompt tokens of the served ones: 10 + 20 + 30 + 12.
    assert_eq!(counter(&report, "prompt_tokens"), 72);
}

/// The options: a window of the trace's clock, a first-N cut, speed-up and
/// rate scaling.
#[test]
fn window_cut_and_scaling_shape_the_arrivals() {
    // Four requests at 0, 1, 2, 3 s (pdsim format, no sessions).
    let text = r#"{"config": {}, "requests": [
        {"id": "a", "arrival_time": 0.0, "prompt_len": 10, "output_len": 1},
        {"id": "b", "arrival_time": 1.0, "prompt_len": 10, "output_len": 1},
        {"id": "c", "arrival_time": 2.0, "prompt_len": 10, "output_len": 1},
        {"id": "d", "arrival_time": 3.0, "prompt_len": 10, "output_len": 1}]}"#;
    let path = trace_file("window.json", text);
    // Window [1, 3): b and c, from t = 0; ×2 speed-up and ×2 rate: arrivals
    // divided by 4 → b at 0, c at 0.25.
    let (done, report) = run(
        &path,
        ", \"window\": [1.0, 3.0], \"speedup\": 2.0, \"rate_scale\": 2.0",
        &[],
    );
    let t0: Vec<f64> = done.values().map(|r| r.t0).collect();
    assert_eq!(t0, [0.0, 0.25]);
    assert_eq!(report.trace.as_ref().unwrap().left_out, 2);
    // The first three only.
    let (done, report) = run(&path, ", \"max_requests\": 3", &[]);
    assert_eq!(done.len(), 3);
    assert!(report.trace.as_ref().unwrap().cut);
}

/// A malformed line is refused naming the file, the line, the column and
/// the field; a wrong `block_tokens` is caught by the id count.
#[test]
fn a_malformed_trace_line_names_file_line_and_field() {
    let text = "{\"timestamp\":0,\"input_length\":8,\"output_length\":2,\"hash_ids\":[1]}\n\
                {\"timestamp\":1,\"input_length\":\"eight\",\"output_length\":2,\"hash_ids\":[1]}\n";
    let path = trace_file("bad.jsonl", text);
    let sc = tiny(&[trace_set(&path, ", \"block_tokens\": 8").as_str()]);
    let err = pdsim::Sim::new(&sc).err().expect("refused").to_string();
    assert!(
        err.contains("bad.jsonl:2:") && err.contains("input_length"),
        "{err}"
    );
    // 16 tokens with an id per 8, read at the default 512 tokens per id.
    let text = "{\"timestamp\":0,\"input_length\":16,\"output_length\":2,\"hash_ids\":[1,2]}\n";
    let path = trace_file("per8.jsonl", text);
    let sc = tiny(&[trace_set(&path, "").as_str()]);
    let err = pdsim::Sim::new(&sc).err().expect("refused").to_string();
    // The ids' `[` is byte 62 of the line (`"hash_ids":` ends at 61):
    // column 63.
    assert!(
        err.contains("per8.jsonl:1:63: `hash_ids` has 2 ids")
            && err.contains("needs 1")
            && err.contains("block_tokens"),
        "{err}"
    );
    let text = "{\"timestamp\":0,\"input_length\":8,\"output_length\":2,\"hash_ids\":[1],\"priority\":3}\n";
    let path = trace_file("extra.jsonl", text);
    let sc = tiny(&[trace_set(&path, ", \"block_tokens\": 8").as_str()]);
    let err = pdsim::Sim::new(&sc).err().expect("refused").to_string();
    assert!(
        err.contains("extra.jsonl:1:") && err.contains("priority"),
        "{err}"
    );
}

/// Synthetic sessions with one shared system prompt: every session's first
/// turn hits the prompt's blocks that an earlier session left cached.
#[test]
fn sessions_with_a_shared_system_prompt_hit_it_across_sessions() {
    // One prompt of 16 tokens (4 blocks). A first turn's prompt is 16 + n
    // (n ≥ 10), so reusable ≥ 24 tokens; once the first session's first
    // turn is done, the prompt's 16 tokens (and nothing else of a new
    // session) are cached on the decoder: a first turn arriving later hits
    // exactly 16 there (the pools are large: nothing is evicted).
    let sets = [
        "horizon=30",
        "decode.engine.num_gpu_blocks=2000",
        "prefill.engine.num_gpu_blocks=2000",
        "decode.engine.max_model_len=4000",
        "prefill.engine.max_model_len=4000",
        "workload.system_prompts={\"count\": 1, \"tokens\": 16}",
    ];
    let mut sim = pdsim::Sim::new(&tiny(&sets)).unwrap();
    sim.record_requests();
    sim.run().unwrap();
    let done = sim.world.remove_resource::<FinishedRequests>().unwrap().0;
    let mut first_turns: Vec<&Request> = done.iter().filter(|r| r.turn == 0).collect();
    first_turns.sort_by_key(|r| r.id);
    assert_eq!(first_turns[0].prefix_hit, Some(0));
    let cached_from = first_turns[0].finished_at.unwrap();
    let later: Vec<&&Request> = first_turns.iter().filter(|r| r.t0 > cached_from).collect();
    assert!(later.len() > 10, "{} later sessions", later.len());
    for r in later {
        assert_eq!(r.prefix_hit, Some(16), "request {}", r.id);
    }
}

#[test]
fn an_infinite_horizon_serves_the_whole_trace_and_only_a_trace() {
    // The same five requests with horizon inf: the run ends when the last
    // is served (the fifth, 12 prompt tokens at t = 4: prefilled in one
    // step of max(10 ms, 12 ms), then 2 more tokens), and reports over
    // [0, that end].
    let (done, report) = run(
        &trace_file("azure-inf.csv", AZURE_FIVE),
        "",
        &["horizon=inf"],
    );
    assert_eq!(done.len(), 4, "every request but the refused one");
    assert!(
        report.horizon > 4.0 && report.horizon < 5.0,
        "{}",
        report.horizon
    );
    assert_eq!(counter(&report, "requests_in_flight"), 0);
    // Without a trace, an infinite horizon would never end: refused.
    let err = pdsim::scenario::load(
        std::path::Path::new("tests/scenarios/tiny.ron"),
        &["horizon=inf".to_string()],
    )
    .expect_err("refused")
    .to_string();
    assert!(err.contains("inf only with a trace workload"), "{err}");
}

/// A session turn whose prompt and output together pass 2^32 tokens (a
/// 32-bit count) still counts what the next turn has seen before.
#[test]
fn a_session_past_four_billion_tokens_still_counts_what_its_next_turn_saw() {
    // Turn 1: 4294967290 + 10 tokens, past u32::MAX (4294967295): refused
    // at arrival (longer than max_model_len), but its tokens are the
    // session's stream. Turn 2's 100-token prompt is all within it: seen
    // before = 100 / (4294967290 + 100). (Adding the two in 32 bits wrapped
    // to 4, and turn 2 had seen 4 tokens.)
    let text = "{\"requests\": [\n\
        {\"id\": \"t1\", \"arrival_time\": 0.0, \"prompt_len\": 4294967290, \"output_len\": 10, \"session\": \"s\"},\n\
        {\"id\": \"t2\", \"arrival_time\": 1.0, \"prompt_len\": 100, \"output_len\": 2, \"session\": \"s\"}\n\
        ]}\n";
    let (_, report) = run(&trace_file("long-session.json", text), "", &[]);
    let seen = report.trace.expect("a trace run").seen_before;
    assert_eq!(seen, 100.0 / (4294967290.0 + 100.0));
}
