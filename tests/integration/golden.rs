//! Golden traces (tests/golden/): each NAME.json is a trace, NAME.vllm.json
//! what vLLM 0.33's real scheduler did with it (tools/vllm_oracle/). pdsim's
//! replay with `engine_semantics: Vllm033` must agree: every step's start,
//! end, scheduled (id, tokens) list, preempted list and blocks held, and every
//! request's first scheduled step, prefix hit, first-token and finish steps
//! and times, preemptions (and on the decoder its read); times within 1e-9 s.
//! CI runs this comparison, not vLLM (docs/fidelity.md).

use std::path::{Path, PathBuf};

use pdsim::replay::{self, Trace};

fn goldens() -> Vec<PathBuf> {
    let mut traces: Vec<PathBuf> = std::fs::read_dir("tests/golden")
        .expect("tests/golden exists")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".json") && !name.ends_with(".vllm.json")
        })
        .collect();
    traces.sort();
    traces
}

fn oracle_report(trace: &Path) -> serde_json::Value {
    let path = trace.with_extension("vllm.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with tools/vllm_oracle/golden.sh)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn differences(trace: &Path, sets: &[String]) -> Vec<String> {
    let t = Trace::load(trace).unwrap();
    let ours = replay::replay(&t, trace, sets).unwrap().to_value();
    replay::compare(&ours, &oracle_report(trace), 1e-9)
}

#[test]
fn every_golden_trace_replays_as_vllm_scheduled_it() {
    let traces = goldens();
    assert!(traces.len() >= 7, "golden traces: {traces:?}");
    let mut failures = Vec::new();
    for trace in &traces {
        let diffs = differences(trace, &[]);
        if !diffs.is_empty() {
            failures.push(format!(
                "{}: {} differences, first ones:\n    {}",
                trace.display(),
                diffs.len(),
                diffs
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The option matters: with docs/model.md's semantics the traces that exercise
/// vLLM's differences (the null block, the partial block freed to the front,
/// lazy promotion) do not replay identically, the others do (max_model_len's
/// refusals and length caps are the same in both).
#[test]
fn the_reference_semantics_differ_exactly_where_vllm_does() {
    let reference = ["engine_semantics=Reference".to_string()];
    for trace in goldens() {
        let name = trace.file_stem().unwrap().to_string_lossy().into_owned();
        let diffs = differences(&trace, &reference);
        let expect_same = matches!(
            name.as_str(),
            "chunked_prefill"
                | "head_of_line"
                | "max_num_seqs"
                | "max_model_len"
                | "pd_max_model_len"
        );
        assert_eq!(
            diffs.is_empty(),
            expect_same,
            "{name} with the reference semantics: {diffs:?}"
        );
    }
}

/// The report is the oracle's format, and the same on every run.
#[test]
fn the_replay_report_is_deterministic_json_in_the_oracle_format() {
    let trace = Path::new("tests/golden/pd_parking.json");
    let t = Trace::load(trace).unwrap();
    let a = replay::replay(&t, trace, &[]).unwrap().to_json_text();
    let b = replay::replay(&t, trace, &[]).unwrap().to_json_text();
    assert_eq!(a, b);
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    assert_eq!(v["mode"], "pd");
    let r = &v["decode"]["requests"][0];
    for key in ["parked_time", "remote_tokens", "read_start", "read_done"] {
        assert!(r.get(key).is_some(), "decoder rows carry {key}: {r}");
    }
}
