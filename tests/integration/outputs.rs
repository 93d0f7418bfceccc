//! The numbers users already read — TPOT, ITL, throughput, goodput — and
//! the output formats (vLLM bench JSON, AIPerf, Prometheus, the timeline),
//! with expected values derived by hand (the tiny deployment: blocks of 4
//! tokens, a step costs max(0.01, 0.001 × tokens) s, NICs of 1000 tokens/s,
//! reads wait 5 ms).

use crate::common::*;
use pdsim::metrics::Obs;
use pdsim::router::RouterMode;
use pdsim::sim::Outputs;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("outputs-{name}"))
}

/// Runs a trace through the tiny deployment without a router, writing the
/// files of `outputs` (repeated decode steps on or off).
fn run_with(
    sets: &[&str],
    trace: Vec<pdsim::workload::TraceRequest>,
    outputs: &Outputs,
    repeats: bool,
) -> pdsim::Report {
    let mut sim = pdsim::Sim::with_trace(&tiny(sets), RouterMode::Direct, trace).unwrap();
    sim.set_step_repeats(repeats);
    outputs.prepare(&mut sim).unwrap();
    let report = sim.run().unwrap();
    outputs.write(&mut sim, &report).unwrap();
    report
}

/// A local request of 8 prompt tokens and 4 output tokens: the prefill step
/// (8 tokens: max(0.01, 0.008) = 0.010 s) gives the first token at 0.010,
/// three decode steps of 0.010 s the others at 0.020, 0.030, 0.040. So TPOT =
/// (0.040 − 0.010) / 3 = 0.010 and the ITL samples are three gaps of 0.010 —
/// the same whether the three decode steps are booked as one run or not.
#[test]
fn tpot_and_itl_of_a_request_with_known_token_times() {
    for repeats in [true, false] {
        let r = run_with(
            &[],
            vec![req(0.0, 8, 4, None, false)],
            &Outputs::default(),
            repeats,
        );
        let itl = r.overall.get(Obs::Itl);
        assert_eq!(itl.count(), 3, "repeats {repeats}");
        assert_close(itl.min().unwrap(), 0.010, "shortest gap");
        assert_close(itl.max().unwrap(), 0.010, "longest gap");
        assert_close(r.mean("tpot").unwrap(), 0.010, "tpot");
        assert_close(r.mean("decode_time").unwrap(), 0.030, "decode time");
        assert_close(r.mean("prefill_time").unwrap(), 0.010, "prefill time");
        assert_close(r.mean("queue_time").unwrap(), 0.0, "queue time");
        assert_close(r.mean("e2e").unwrap(), 0.040, "e2e");
        assert_eq!(r.observations["response"], r.observations["e2e"]);
    }
    // A one-token request has no TPOT and no gap.
    let r = run_with(
        &[],
        vec![req(0.0, 8, 1, None, false)],
        &Outputs::default(),
        true,
    );
    assert_eq!(
        (r.observations["tpot"].count, r.observations["itl"].count),
        (0, 0)
    );
}

/// Goodput counts exactly the requests within every SLO given.
#[test]
fn goodput_counts_the_requests_within_every_slo() {
    // Local requests a second apart, 2 output tokens each: prompts of 8,
    // 20 and 40 tokens give TTFTs of 0.010, 0.020, 0.040 s, and a decode
    // step of 0.010 s more: e2e 0.020, 0.030, 0.050.
    let trace = || {
        vec![
            req(0.0, 8, 2, None, false),
            req(1.0, 20, 2, None, false),
            req(2.0, 40, 2, None, false),
        ]
    };
    // TTFT ≤ 0.025: the first two.
    let r = run_with(
        &["slo.ttft=0.025", "horizon=4"],
        trace(),
        &Outputs::default(),
        true,
    );
    assert_eq!(r.throughput.good_requests, Some(2));
    assert_close(r.throughput.goodput_per_s.unwrap(), 2.0 / 4.0, "goodput");
    assert_close(r.throughput.requests_per_s, 3.0 / 4.0, "throughput");
    // ... and e2e ≤ 0.025: only the first.
    let r = run_with(
        &["slo.ttft=0.025", "slo.e2e=0.025", "horizon=4"],
        trace(),
        &Outputs::default(),
        true,
    );
    assert_eq!(r.throughput.good_requests, Some(1));
    // Tokens per second: (8 + 20 + 40) input, 6 output over 4 s.
    assert_close(
        r.throughput.input_tokens_per_s,
        68.0 / 4.0,
        "input tokens/s",
    );
    assert_close(
        r.throughput.output_tokens_per_s,
        6.0 / 4.0,
        "output tokens/s",
    );
    // No SLO: no goodput.
    let r = run_with(&["horizon=4"], trace(), &Outputs::default(), true);
    assert_eq!(
        (r.throughput.good_requests, r.throughput.goodput_per_s),
        (None, None)
    );
}

/// `--bench-json` is the report in vLLM's keys and units; `--aiperf` has a
/// record per request and AIPerf's tags.
#[test]
fn bench_json_and_aiperf_hold_the_reports_numbers() {
    let dir = scratch("bench");
    let outputs = Outputs {
        bench_json: Some(dir.join("bench.json")),
        percentiles: vec![50.0, 99.9],
        aiperf: Some(dir.join("aiperf")),
        ..Outputs::default()
    };
    let sc = pdsim::scenario::load(
        std::path::Path::new("scenarios/llmd_nixl_pull.ron"),
        &["horizon=200".into(), "warmup=20".into()],
    )
    .unwrap();
    let report = outputs.run(&sc).unwrap();
    let bench: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    let ms = |k: &str| bench[k].as_f64().unwrap();
    assert_close(
        ms("mean_ttft_ms"),
        1000.0 * report.mean("ttft").unwrap(),
        "mean TTFT",
    );
    assert_close(
        ms("mean_tpot_ms"),
        1000.0 * report.mean("tpot").unwrap(),
        "mean TPOT",
    );
    assert_close(
        ms("mean_itl_ms"),
        1000.0 * report.mean("itl").unwrap(),
        "mean ITL",
    );
    assert_close(
        ms("median_e2el_ms"),
        1000.0 * report.observations["e2e"].p50.unwrap(),
        "median e2e",
    );
    assert_close(
        ms("p99.9_ttft_ms"),
        1000.0 * report.observations["ttft"].p999.unwrap(),
        "p99.9 TTFT",
    );
    assert!(bench.get("p50_itl_ms").is_some());
    assert_eq!(
        bench["completed"].as_u64().unwrap(),
        report.throughput.completed
    );
    assert_eq!(bench["duration"].as_f64().unwrap(), 180.0);
    assert!(bench["request_goodput"].is_null(), "no SLO given");

    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("aiperf/profile_export_aiperf.json")).unwrap(),
    )
    .unwrap();
    let ttft = &summary["time_to_first_token"];
    assert_eq!(ttft["unit"], "ms");
    assert_close(
        ttft["avg"].as_f64().unwrap(),
        1000.0 * report.mean("ttft").unwrap(),
        "AIPerf TTFT",
    );
    assert_eq!(
        ttft["count"].as_u64().unwrap(),
        report.observations["ttft"].count
    );
    // AIPerf's inter_token_latency is per request: pdsim's TPOT.
    assert_close(
        summary["inter_token_latency"]["avg"].as_f64().unwrap(),
        1000.0 * report.mean("tpot").unwrap(),
        "AIPerf ITL",
    );
    let records = std::fs::read_to_string(dir.join("aiperf/profile_export.jsonl")).unwrap();
    let finished = report.counters["requests_finished"] + report.counters["requests_too_long"];
    assert_eq!(
        records.lines().count() as u64,
        finished,
        "a record per request"
    );
    let first: serde_json::Value = serde_json::from_str(records.lines().next().unwrap()).unwrap();
    assert_eq!(first["metrics"]["time_to_first_token"]["unit"], "ms");
    assert_eq!(first["metadata"]["benchmark_phase"], "warmup");
}

/// `--prometheus`: per engine, each histogram's buckets are cumulative and
/// its `_count` is the requests the engine finished.
#[test]
fn prometheus_histograms_are_cumulative_and_count_the_requests() {
    let dir = scratch("prom");
    let outputs = Outputs {
        prometheus: Some(dir.join("metrics.prom")),
        ..Outputs::default()
    };
    let sc = pdsim::scenario::load(
        std::path::Path::new("scenarios/llmd_nixl_pull.ron"),
        &["horizon=200".into(), "warmup=20".into()],
    )
    .unwrap();
    let report = outputs.run(&sc).unwrap();
    let text = std::fs::read_to_string(dir.join("metrics.prom")).unwrap();
    let value = |line: &str| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
    let name = "vllm:e2e_request_latency_seconds";
    let mut counts = std::collections::BTreeMap::new();
    for role in ["prefill", "decode"] {
        for engine in ["0", "1"] {
            let mine = |l: &&str| {
                l.contains(&format!("engine=\"{engine}\""))
                    && l.contains(&format!("role=\"{role}\""))
            };
            let buckets: Vec<f64> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket")))
                .filter(mine)
                .map(value)
                .collect();
            assert_eq!(buckets.len(), 22, "21 bounds and +Inf");
            assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative");
            let count = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}_count")))
                .find(mine)
                .map(value)
                .unwrap();
            assert_eq!(*buckets.last().unwrap(), count, "+Inf is the count");
            *counts.entry(role).or_insert(0.0) += count;
        }
    }
    // Decoders finish every request; prefillers every remote one.
    assert_eq!(
        counts["decode"],
        report.counters["requests_finished"] as f64
    );
    // Prefillers answer every remote request read so far, and at most the
    // ones the router sent them.
    let sent: f64 = text
        .lines()
        .filter(|l| l.starts_with("pdsim:router_requests_total") && l.contains("role=\"prefill\""))
        .map(value)
        .sum();
    assert!(
        counts["prefill"] >= report.counters["kv_transfers"] as f64 && counts["prefill"] <= sent
    );
    assert!(text.contains("# TYPE vllm:prefix_cache_hits_total counter"));
}

/// `--timeline`: valid trace-event JSON with the slices one remote request
/// makes (docs/model.md's lifecycle: mechanisms.rs derives the times).
#[test]
fn the_timeline_holds_the_steps_flows_and_request_phases() {
    // r0: prompt 40, output 3, remote. Prefiller: one step of 40 tokens,
    // [0, 0.040]. Read [0.045, 0.085]. Decoder: steps [0.085, 0.095] (the
    // last prompt token), then two decode steps to 0.115.
    let dir = scratch("timeline");
    let path = dir.join("t.json");
    let outputs = Outputs {
        timeline: Some(path.clone()),
        timeline_window: (0.0, f64::INFINITY),
        ..Outputs::default()
    };
    run_with(&[], vec![req(0.0, 40, 3, None, true)], &outputs, true);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let steps: Vec<(f64, f64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            (
                e["ts"].as_f64().unwrap(),
                e["dur"].as_f64().unwrap(),
                e["pid"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps.len(),
        4,
        "one prefill step, three decoder steps: {steps:?}"
    );
    assert!((steps[0].0 - 0.0).abs() < 1e-6 && (steps[0].1 - 40_000.0).abs() < 1e-6);
    let names = |ph: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["ph"] == ph && e["cat"] == "request")
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names("b"),
        [
            "request 0",
            "queued",
            "prefill",
            "leased",
            "parked",
            "read",
            "decode"
        ]
    );
    assert_eq!(names("b").len(), names("e").len(), "every begin has an end");
    let read: Vec<f64> = events
        .iter()
        .filter(|e| e["cat"] == "nic")
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    // The read on both NICs: begins at 45 ms, ends at 85 ms.
    assert_eq!(read.len(), 4);
    assert!(
        read.iter()
            .all(|&ts| (ts - 45_000.0).abs() < 1e-6 || (ts - 85_000.0).abs() < 1e-6)
    );
    // A window that misses the run keeps only the names of the tracks.
    let outputs = Outputs {
        timeline: Some(path.clone()),
        timeline_window: (5.0, 6.0),
        ..Outputs::default()
    };
    run_with(&[], vec![req(0.0, 40, 3, None, true)], &outputs, true);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["ph"] == "M")
    );
}
