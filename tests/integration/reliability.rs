//! Hostile and extreme input ends in a clear error within seconds and in
//! bounded memory, or in an honest report: never an abort, a hang or a
//! report that looks normal when it is not.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Address space the process may use: an allocation bomb that escaped the
/// limits would fail here (and the test with it), not exhaust the machine.
const MEMORY_KB: u64 = 2_000_000;

/// `pdsim ARGS` under the memory bound; the output and the wall time.
fn pdsim(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_KB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_pdsim"))
        .args(args)
        .output()
        .unwrap();
    (out, start.elapsed())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each script of `tests/hostile/` as the decider of the tiny scenario, run
/// and checked: it says on its first line what it must end in, within two
/// seconds. (The slowest, `state_map_growing.rhai`, takes 0.94 s alone on a
/// slow day, 2026-12-02, with this build and the one before: rhai sizes the
/// whole map after each insertion, so filling it to its limit is quadratic.
/// Beside the other tests it went past one second.)
#[test]
fn hostile_scripts_end_in_their_error_within_two_seconds() {
    let mut dir: Vec<_> = std::fs::read_dir("tests/hostile")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rhai"))
        .collect();
    dir.sort();
    assert!(dir.len() >= 10, "the hostile scripts are there");
    for path in dir {
        let text = std::fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// expect: "))
            .unwrap_or_else(|| panic!("{}: first line `// expect: …`", path.display()));
        let script = std::fs::canonicalize(&path).unwrap();
        let set = format!("router.decider.script={}", script.display());
        for verb in ["check", "run"] {
            let mut args = vec![verb, "tests/scenarios/tiny.ron", "--set", &set];
            if verb == "run" {
                args.extend(["--horizon", "20", "--warmup", "0"]);
            }
            let (out, took) = pdsim(&args);
            let name = path.file_name().unwrap().to_string_lossy();
            assert!(took < Duration::from_secs(2), "{name} {verb}: {took:?}");
            assert!(
                out.status.code().is_some(),
                "{name} {verb}: killed by a signal"
            );
            if expect.starts_with("ok") {
                assert!(out.status.success(), "{name} {verb}: {}", stderr(&out));
            } else if verb == "run" || !name.starts_with("state_") {
                // (A state that doubles per call survives check's few calls.)
                let err = stderr(&out);
                assert_eq!(out.status.code(), Some(1), "{name} {verb}: {err}");
                assert!(err.contains(expect), "{name} {verb}: {err}");
                assert!(
                    err.contains(&*name),
                    "{name} {verb} names the script: {err}"
                );
                assert!(!err.contains("panicked"), "{name} {verb}: {err}");
            }
        }
    }
}

#[test]
fn script_limits_are_overridable() {
    let script = std::fs::canonicalize(Path::new("tests/hostile/string_doubling.rhai")).unwrap();
    let set = format!("router.decider.script={}", script.display());
    let (out, _) = pdsim(&[
        "check",
        "tests/scenarios/tiny.ron",
        "--set",
        &set,
        "--set",
        "router.script_limits.string_bytes=1000",
    ]);
    // "ab" doubled: 1024 bytes is the first length over 1000.
    assert!(stderr(&out).contains("over the limit of 1000 (router.script_limits.string_bytes)"));
}

#[test]
fn a_vllm_pool_exactly_max_model_len_large_is_refused_for_its_null_block() {
    // tiny: blocks of 4 tokens, max_model_len 64. 16 blocks hold 64 tokens,
    // but vLLM's null block leaves 15 × 4 = 60: a 64-token prompt never fits.
    let sets = [
        "engine_semantics=Vllm033",
        "decode.engine.num_gpu_blocks=16",
        "prefill.engine.num_gpu_blocks=17",
    ];
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let err = pdsim::scenario::load(Path::new("tests/scenarios/tiny.ron"), &sets)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains(
            "decode.engine: with engine_semantics: Vllm033 the KV pool (16 blocks × 4 tokens"
        ) && err.contains("holds 60 tokens, fewer than max_model_len (64)"),
        "{err}"
    );
    assert!(
        !err.contains("prefill.engine"),
        "17 blocks are enough: {err}"
    );
    // The same pool with the reference semantics (no null block) runs.
    assert!(pdsim::scenario::load(Path::new("tests/scenarios/tiny.ron"), &sets[1..]).is_ok());
}

#[test]
fn a_queue_whose_head_can_never_be_admitted_stops_the_run_with_a_sentence() {
    use pdsim::router::RouterMode;
    use pdsim::sim::Sim;
    // A pool shrunk after validation (as an extension could): 8 blocks of 4
    // tokens = 32 tokens, and a 60-token prompt needs 15 blocks.
    let mut sc = crate::common::tiny(&[]);
    sc.pools[1].num_gpu_blocks = 8;
    let trace = vec![
        crate::common::req(0.0, 60, 3, None, true),
        crate::common::req(0.5, 10, 3, None, true),
    ];
    let mut sim = Sim::with_trace(&sc, RouterMode::Direct, trace).unwrap();
    let err = sim.run().expect_err("a stall is an error").to_string();
    assert!(
        err.contains("decode-0 stalled")
            && err.contains(
                "needs 15 blocks of 4 tokens for its 60 tokens, and the pool has 8 usable"
            )
            && err.contains("can never be admitted"),
        "{err}"
    );
}

/// `pdsim run tiny.ron --set …`: refused, and the sentence.
fn refused(sets: &[&str]) -> String {
    refused_in("tests/scenarios/tiny.ron", sets)
}

fn refused_in(scenario: &str, sets: &[&str]) -> String {
    let mut args = vec!["run", scenario];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (out, took) = pdsim(&args);
    let err = stderr(&out);
    assert!(took < Duration::from_secs(1), "{sets:?}: {took:?}");
    assert_eq!(out.status.code(), Some(1), "{sets:?}: {err}");
    err
}

#[test]
fn inputs_that_never_end_or_exhaust_memory_are_refused_with_the_bound() {
    // tiny: horizon 100 s, continue_probability 0.5 (2 turns a session);
    // the reference: 2 000 s, 0.9 (10 turns): 1e5 × 2000 × 10 = 2e9.
    for (scenario, rate, requests) in [
        ("tests/scenarios/tiny.ron", "1e308", "inf"),
        ("tests/scenarios/tiny.ron", "1e9", "2.00e11"),
        ("scenarios/llmd_nixl_pull.ron", "100000", "2.00e9"),
    ] {
        let err = refused_in(scenario, &[&format!("workload.session_rate={rate}")]);
        assert!(
            err.contains(&format!(
                "about {requests} requests in the run (session_rate {rate} per s"
            )),
            "{err}"
        );
        assert!(err.contains("more than 1e8 is refused"), "{err}");
    }
    let err = refused(&["decode.engine.num_gpu_blocks=4294967295"]);
    assert!(err.contains("more than 16777216 (2^24) blocks"), "{err}");
    // 4294967295 × 44 B = 176 GiB.
    assert!(err.contains("would take 176.0 GiB of memory"), "{err}");
    // Blocks of 2^32 - 1 tokens: 1 000 of them hold 4 294 967 295 000
    // tokens, past the 32-bit token counts.
    let err = refused(&[
        "decode.engine.block_size=4294967295",
        "decode.engine.num_gpu_blocks=1000",
    ]);
    assert!(
        err.contains("decode.engine: 1000 blocks of 4294967295 tokens hold 4294967295000 tokens, more than the 2^32 - 1"),
        "{err}"
    );
    let err = refused(&["prefill.count=65535"]);
    assert!(
        err.contains("prefill.count 65535 is more than 10000 pods"),
        "{err}"
    );
    let err = refused(&[
        "prefill.count=10000",
        "prefill.engine.num_gpu_blocks=16000000",
    ]);
    // 10 000 pods × 16 000 000 blocks × 44 B = 7.04e12 B = 6556.5 GiB.
    assert!(err.contains("would take 6556.5 GiB"), "{err}");

    let dir = crate::common::Scratch::new("plots");
    let plots = dir.to_string_lossy();
    let (out, _) = pdsim(&[
        "run",
        "tests/scenarios/tiny.ron",
        "--plots",
        &plots,
        "--sample-interval",
        "1e-300",
    ]);
    // 100 s ÷ 1e-300 s = 1e302 samples; at most 1e6: at least 1e-4 s.
    assert!(
        stderr(&out).contains("is 1.000e302 samples per series; at most 1e6 are kept")
            && stderr(&out).contains("give at least 0.0001 s"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_overloaded_run_reports_its_backlog_and_says_it_did_not_keep_up() {
    use pdsim::sim::Sim;
    // tiny serves a session a second easily; at 40 a second (80 requests a
    // second, one prefiller of 4 slots) its queues grow all run long.
    for (rate, keeps_up) in [("1.0", true), ("40.0", false)] {
        let sc = crate::common::tiny(&[&format!("workload.session_rate={rate}")]);
        let report = Sim::new(&sc).unwrap().run().unwrap();
        let b = &report.backlog;
        let c = &report.counters;
        assert_eq!(b.kept_up, keeps_up, "rate {rate}: {b:?}");
        // Every request accounted for.
        assert_eq!(
            c["requests_arrived"],
            c["requests_finished"] + c["requests_too_long"] + c["requests_failed"] + b.in_flight,
            "rate {rate}"
        );
        assert_eq!(b.in_flight, c["requests_in_flight"]);
        assert_eq!(b.by_place.values().sum::<u64>(), b.in_flight);
        if !keeps_up {
            assert!(b.in_flight > 1000 && b.growth > b.mean_in_flight, "{b:?}");
            let waited = b.waiting_for_first_token.mean.unwrap();
            assert!(waited > 1.0, "the backlog has waited: {waited}");
            assert!(
                report
                    .to_text()
                    .contains("WARNING: the deployment did not keep up")
            );
        } else {
            assert!(!report.to_text().contains("WARNING"));
        }
    }
}

#[test]
fn a_backlog_past_the_memory_bound_stops_the_run_early_and_says_so() {
    use pdsim::sim::Sim;
    let sc = crate::common::tiny(&["workload.session_rate=40.0"]);
    let mut sim = Sim::new(&sc).unwrap();
    sim.max_in_flight = 500;
    let report = sim.run().unwrap();
    let why = report
        .backlog
        .stopped_early
        .as_deref()
        .expect("stopped early");
    assert!(why.contains("requests in flight (more than 500)"), "{why}");
    assert!(report.horizon < 100.0 && !report.backlog.kept_up);
    // Checked every 1024 ticks: stopped soon after passing the bound.
    assert!(
        report.backlog.in_flight > 500 && report.backlog.in_flight < 2000,
        "{:?}",
        report.backlog
    );
}

#[test]
fn a_replay_trace_with_impossible_times_or_unknown_keys_is_refused() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("tests/golden/chunked_prefill.json").unwrap(),
    )
    .unwrap();
    let dir = crate::common::Scratch::new("badtrace");
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "far",
            Box::new(|t| t["requests"][0]["arrival_time"] = 1e300.into()),
            "arrival_time 1e300 s is past the longest run pdsim simulates (1e9 s",
        ),
        (
            "ms",
            Box::new(|t| t["requests"][0]["arrival_time"] = 2e12.into()),
            "arrival_time 2e12 s is past the longest run",
        ),
        (
            "reqkey",
            Box::new(|t| t["requests"][0]["output_lne"] = 3.into()),
            "unknown field `output_lne`, expected one of",
        ),
        (
            "cfgkey",
            Box::new(|t| t["config"]["num_gpu_block"] = 3.into()),
            "config.num_gpu_block is not a trace setting (did you mean `num_gpu_blocks`?)",
        ),
        (
            "topkey",
            Box::new(|t| {
                let c = t["config"].take();
                t.as_object_mut().unwrap().remove("config");
                t["confg"] = c;
            }),
            "unknown field `confg`, expected `config` or `requests`",
        ),
    ];
    for (name, edit, expect) in cases {
        let mut t = golden.clone();
        edit(&mut t);
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, t.to_string()).unwrap();
        let (out, took) = pdsim(&["replay", &path.to_string_lossy()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(took < Duration::from_secs(1), "{name}: {took:?}");
        assert!(
            err.contains(expect) && err.contains(&*path.to_string_lossy()),
            "{name}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_script_longer_than_rhai_can_number_is_refused_with_the_real_limit() {
    let dir = crate::common::Scratch::new("long");
    let path = dir.join("long.rhai");
    let text = format!(
        "const DEFAULTS = #{{ non_cached_tokens: 1, prompt_tokens: 0 }};\n{}fn decide(req, pod) {{ true }}\n",
        "// padding\n".repeat(70_000)
    );
    std::fs::write(&path, text).unwrap();
    let set = format!("router.decider.script={}", path.display());
    let (out, _) = pdsim(&["check", "tests/scenarios/tiny.ron", "--set", &set]);
    let err = stderr(&out);
    assert!(
        err.contains("has 70002 lines") && err.contains("at most 65535"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_nan_in_a_ron_file_is_blamed_on_its_field() {
    let dir = crate::common::Scratch::new("nan");
    let path = dir.join("nan.ron");
    let text = std::fs::read_to_string("tests/scenarios/tiny.ron")
        .unwrap()
        .replace("session_rate: 1.0", "session_rate: NaN")
        .replace(
            "../../scripts/",
            &format!("{}/scripts/", std::env::current_dir().unwrap().display()),
        );
    std::fs::write(&path, text).unwrap();
    let (out, _) = pdsim(&["check", &path.to_string_lossy()]);
    let err = stderr(&out);
    assert!(
        err.contains("workload.session_rate must be positive, got NaN"),
        "{err}"
    );
    assert!(!err.contains("horizon"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
