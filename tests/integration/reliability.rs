//! Hostile and extreme input ends in a clear error within a second and in
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
/// and checked: it says on its first line what it must end in.
#[test]
fn hostile_scripts_end_in_their_error_within_a_second() {
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
            assert!(took < Duration::from_secs(1), "{name} {verb}: {took:?}");
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
