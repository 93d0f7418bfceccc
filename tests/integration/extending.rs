//! Extending pdsim from Rust: the two examples run under the ordinary
//! command line and do what they say; custom metrics reach the report;
//! a custom system the schedule cannot order is refused, not a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::Scratch;

use pdsim::ecs::prelude::*;
use pdsim::metrics::CustomMetrics;
use pdsim::{Sim, SimSystems};

/// An example's binary (`cargo test` builds the examples beside the tests).
fn example(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_pdsim"));
    bin.parent().unwrap().join("examples").join(name)
}

fn json_of(cmd: &mut Command, out: &Path) -> serde_json::Value {
    let o = cmd
        .arg("--json")
        .arg(out)
        .output()
        .expect("the example runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("ext-{name}"))
}

#[test]
fn the_parked_peak_example_writes_its_metric_into_the_report() {
    let dir = scratch("parked");
    let report = json_of(
        Command::new(example("parked_peak")).args([
            "run",
            "scenarios/llmd_nixl_pull.ron",
            "--horizon",
            "300",
        ]),
        &dir.join("r.json"),
    );
    let peak = report["custom"]["parked_peak_decode-0"]
        .as_f64()
        .expect("the metric is there");
    assert!(peak >= 1.0, "a decoder parked at least one request: {peak}");
    // And in a sweep's summary, as a column.
    let out = dir.join("sweep");
    let o = Command::new(example("parked_peak"))
        .args([
            "sweep",
            "scenarios/llmd_nixl_pull.ron",
            "--seeds",
            "1..2",
            "--horizon",
            "200",
            "--warmup",
            "20",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("parked_peak_decode-1"));
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    assert!(summary.contains("custom.parked_peak_decode-0"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_slow_decoder_example_raises_the_latency_tail() {
    let dir = scratch("slow");
    let args = [
        "run",
        "scenarios/llmd_nixl_pull.ron",
        "--horizon",
        "1200",
        "--warmup",
        "100",
    ];
    let before = json_of(
        Command::new(env!("CARGO_BIN_EXE_pdsim")).args(args),
        &dir.join("a.json"),
    );
    let after = json_of(
        Command::new(example("slow_decoder"))
            .args(args)
            .env("SLOW_FROM", "300")
            .env("SLOW_FACTOR", "4")
            .env("SLOW_POD", "0"),
        &dir.join("b.json"),
    );
    let p99 = |r: &serde_json::Value| r["observations"]["e2e"]["p99"].as_f64().unwrap();
    assert!(
        p99(&after) > 1.5 * p99(&before),
        "decoder 0 four times slower from 300 s: e2e p99 {} vs {}",
        p99(&after),
        p99(&before)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_custom_systems_observations_and_values_reach_the_report() {
    fn count_ticks(mut c: ResMut<CustomMetrics>, clock: Res<pdsim::shared::Clock>) {
        c.add("ticks_seen", 1.0);
        c.observe("tick_time", clock.now);
    }
    let sc = pdsim::scenario::load(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &["horizon=100".into(), "warmup=10".into()],
    )
    .unwrap();
    let mut sim = Sim::new(&sc).unwrap();
    sim.add_systems(count_ticks.in_set(SimSystems::Observe));
    let report = sim.run().unwrap();
    assert_eq!(
        report.custom["ticks_seen"], report.ticks as f64,
        "once per tick"
    );
    assert_eq!(report.observations["tick_time"].count, report.ticks);
    assert!(report.to_text().contains("ticks_seen"));
}

#[test]
fn a_custom_system_the_schedule_cannot_order_is_refused() {
    // Writes the engines, as the StepEnd and StepStart systems do, with no
    // order against them.
    fn meddle(_engines: Query<&mut pdsim::engine::Engine>) {}
    let sc = pdsim::scenario::load(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &["horizon=10".into(), "warmup=1".into()],
    )
    .unwrap();
    let mut sim = Sim::new(&sc).unwrap();
    sim.add_systems(meddle);
    let err = sim.run().expect_err("refused").to_string();
    assert!(
        err.contains("cannot be ordered") && err.contains("docs/extending.md"),
        "{err}"
    );
}

#[test]
fn a_run_with_a_custom_system_gives_the_numbers_of_one_without() {
    // Without custom systems the built-in ones run without the schedule's
    // executor (an exact shortcut); one custom system that does nothing puts
    // the run through the schedule. Every number must agree, on scenarios
    // that wake every built-in system: phases, a fault, lease expiries,
    // push, its parallel dispatch (whose routing spawns decode legs, so the
    // list keeps it), store-and-forward, vLLM's semantics; leases expiring
    // while their reads flow (1 806 of them), and transfers of several
    // rank-to-rank flows (TP 2 to TP 4), whose completions the fast ticks
    // take; a pod's failure where every request stays on its decoder, so
    // that requests issued by the fast ticks also finish before their
    // commands join them to the world; a failure under load (the requests'
    // table is swept in its order, and the clients' retries are routed in
    // that order: the requests the fast ticks issue must join it where the
    // list would spawn them — joined after the other commands instead, the
    // numbers differ); a trace of multi-turn sessions, whose arrivals the
    // fast ticks issue.
    fn nothing(_clock: Res<pdsim::shared::Clock>) {}
    let trace = Scratch::file("ext-trace", "sessions.jsonl", &sessions_trace());
    let trace_set = format!(
        "workload={{\"trace\": {{\"file\": {:?}, \"block_tokens\": 256}}}}",
        trace.display().to_string()
    );
    let cases: [(&str, &[&str]); 11] = [
        ("scenarios/llmd_nixl_pull.ron", &["horizon=400"]),
        ("scenarios/decoder_failure.ron", &[]),
        (
            "scenarios/decoder_failure.ron",
            &["router.decider.params.non_cached_tokens=1000000"],
        ),
        (
            "scenarios/decoder_failure.ron",
            &[
                r#"faults=[{"PodDown": {"pod": "decode-1", "at": 100.0, "duration": 30.0}}]"#,
                "phases=[]",
                "workload.session_rate=4",
                "horizon=200",
                "warmup=0",
            ],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            &[&trace_set, "horizon=400", "warmup=0"],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            &["horizon=300", "transfer.mode=NixlPush"],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            &[
                "horizon=300",
                "transfer.mode=NixlPush",
                "router.dispatch=Parallel",
            ],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            &["horizon=300", "transfer.mode=StoreAndForward"],
        ),
        (
            "scenarios/shared_prefixes.ron",
            &["horizon=300", "engine_semantics=Vllm033"],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            &[
                "horizon=300",
                "warmup=0",
                "transfer.lease.duration=0.02",
                "transfer.lease.heartbeats=false",
                "decode.engine.num_gpu_blocks=2000",
                "workload.session_rate=1.2",
            ],
        ),
        ("scenarios/h200_llama70b_4p2d.ron", &["horizon=300"]),
    ];
    for (path, sets) in cases {
        let sc = crate::common::scenario_with(path, sets);
        let direct = Sim::new(&sc).unwrap().run().unwrap();
        let mut sim = Sim::new(&sc).unwrap();
        sim.add_systems(nothing.in_set(SimSystems::Observe));
        let scheduled = sim.run().unwrap();
        assert!(direct.ticks > 1000, "{path}: {} ticks", direct.ticks);
        assert_eq!(direct.to_json(), scheduled.to_json(), "{path} {sets:?}");
    }
}

/// A Mooncake-style trace of 300 sessions of 1 to 4 turns, one session
/// arriving a second, for the comparison above: each turn adds 1 to 12
/// hash blocks of 256 tokens to its session's prompt.
fn sessions_trace() -> String {
    let mut text = String::new();
    for s in 0..300u32 {
        let mut ids = Vec::new();
        for turn in 0..1 + s % 4 {
            let new = 1 + (s * 7 + turn * 3) % 12;
            ids.extend((0..new).map(|k| s * 100 + turn * 20 + k));
            let when = if turn == 0 {
                format!("\"timestamp\":{}", s * 1000)
            } else {
                format!("\"delay\":{}", 500 + 100 * turn)
            };
            text += &format!(
                "{{\"session_id\":\"s{s}\",{when},\"input_length\":{},\"output_length\":{},\"hash_ids\":{ids:?}}}\n",
                ids.len() as u32 * 256 - s % 100,
                20 + (s * 13 + turn) % 200,
            );
        }
    }
    text
}

#[test]
fn a_run_stopped_early_stops_at_the_same_tick_with_a_custom_system_or_without() {
    // Without custom systems a fast tick runs the fast ticks after it on one
    // fetch, but never past the loop's backlog check (every 1024 ticks): the
    // run must stop at the same tick, time and backlog as one through the
    // schedule, which runs a tick at a time. (The reference scenario has
    // long stretches of fast ticks, and more than 2 requests in flight at
    // one of the first checks; a fast tick that ran past the check would
    // skip it.)
    fn nothing(_clock: Res<pdsim::shared::Clock>) {}
    let sc = crate::common::scenario_with("scenarios/llmd_nixl_pull.ron", &["horizon=400"]);
    let run = |custom: bool| {
        let mut sim = Sim::new(&sc).unwrap();
        sim.max_in_flight = 2;
        if custom {
            sim.add_systems(nothing.in_set(SimSystems::Observe));
        }
        sim.run().unwrap()
    };
    let (direct, scheduled) = (run(false), run(true));
    let why = direct
        .backlog
        .stopped_early
        .as_deref()
        .expect("stopped early");
    assert!(why.contains("more than 2)"), "{why}");
    assert!(direct.ticks.is_multiple_of(1024), "{} ticks", direct.ticks);
    assert_eq!(
        direct.backlog.stopped_early,
        scheduled.backlog.stopped_early
    );
    assert_eq!(direct.to_json(), scheduled.to_json());
}
