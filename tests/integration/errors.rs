//! Bad input gets a clear error naming what is wrong, never a panic.

use crate::common::Scratch;
use pdsim::scenario;
use std::path::Path;

/// A scratch folder with a copy of the tiny scenario whose scripts live
/// beside it, so a test can break one script.
fn sandbox(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("test-{name}"));
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    for f in std::fs::read_dir("scripts").unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join("scripts").join(f.file_name().unwrap())).unwrap();
    }
    let text = std::fs::read_to_string("tests/scenarios/tiny.ron")
        .unwrap()
        .replace("../../scripts/", "scripts/");
    std::fs::write(dir.join("s.ron"), text).unwrap();
    dir
}

/// Replaces one of the sandbox's scripts by `text`, a script of the test's
/// own: the scenario's parameters for it, which `text` does not declare,
/// are dropped.
fn replace_script(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join("scripts").join(file), text).unwrap();
    let path = dir.join("s.ron");
    let ron = std::fs::read_to_string(&path).unwrap();
    let out: Vec<String> = ron
        .lines()
        .map(|l| {
            if !l.contains(&format!("scripts/{file}")) {
                return l.to_string();
            }
            match (l.find(", params: {"), l.find('}')) {
                (Some(a), Some(b)) if b > a => format!("{}{}", &l[..a], &l[b + 1..]),
                _ => l.to_string(),
            }
        })
        .collect();
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
}

fn run(dir: &Path, sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    pdsim::run_scenario(&dir.join("s.ron"), &sets)
        .expect_err("the run must fail")
        .to_string()
}

#[test]
fn a_ron_typo_names_file_line_column_and_field() {
    let dir = sandbox("typo");
    let path = dir.join("s.ron");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "max_num_seqs: 4, num_gpu_blocks: 64",
        "max_num_seqs: 4, num_gpu_blokcs: 64",
    );
    std::fs::write(&path, &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.contains("num_gpu_blokcs"))
        .unwrap()
        + 1;
    let err = scenario::load(&path, &[]).unwrap_err().to_string();
    assert!(err.contains(&format!("s.ron:{line}:")), "{err}");
    assert!(
        err.contains("num_gpu_blokcs") && err.contains("prefill.engine"),
        "{err}"
    );
}

#[test]
fn a_missing_script_names_the_script() {
    let dir = sandbox("missing");
    std::fs::remove_file(dir.join("scripts/token-load-scorer.rhai")).unwrap();
    let err = run(&dir, &[]);
    assert!(
        err.contains("token-load-scorer.rhai") && err.contains("cannot read script"),
        "{err}"
    );
}

#[test]
fn a_script_syntax_error_names_the_script_and_line() {
    let dir = sandbox("syntax");
    replace_script(
        &dir,
        "prefix-based-pd-decider.rhai",
        "// a decider\nfn decide(req, pod) {\n    req.prompt_tokens >=\n}\n",
    );
    let err = run(&dir, &[]);
    assert!(
        err.contains("prefix-based-pd-decider.rhai")
            && err.contains("line 4")
            && err.contains("syntax error"),
        "{err}"
    );
}

#[test]
fn an_undefined_variable_is_a_compile_error_with_its_line() {
    let dir = sandbox("strict");
    replace_script(
        &dir,
        "prefix-based-pd-decider.rhai",
        "fn decide(req, pod) {\n    req.prompt_tokens > treshold\n}\n",
    );
    let err = run(&dir, &[]);
    assert!(err.contains("line 2") && err.contains("treshold"), "{err}");
}

#[test]
fn a_script_runtime_error_names_script_hook_line_and_request() {
    let dir = sandbox("runtime");
    replace_script(
        &dir,
        "active-request-scorer.rhai",
        "fn score(req, pod) {\n    let x = 1;\n    x / (pod.active - pod.active)\n}\n",
    );
    let err = run(&dir, &[]);
    assert!(
        err.contains("active-request-scorer.rhai")
            && err.contains("hook `score`")
            && err.contains("line 3"),
        "{err}"
    );
    assert!(err.contains("while routing request 0"), "{err}");
}

#[test]
fn a_script_that_loops_forever_is_stopped() {
    let dir = sandbox("loop");
    replace_script(
        &dir,
        "prefix-based-pd-decider.rhai",
        "fn decide(req, pod) {\n    loop { }\n}\n",
    );
    let err = run(&dir, &[]);
    assert!(
        err.contains("hook `decide`") && err.contains("operations"),
        "{err}"
    );
}

#[test]
fn the_operation_limit_is_per_call_not_per_run() {
    // About 600 000 operations per call: under the limit each time, over it
    // in total after two requests. The run must finish (each plugin keeps
    // its runtime between calls, and its count restarts with each call).
    let dir = sandbox("ops");
    replace_script(
        &dir,
        "prefix-based-pd-decider.rhai",
        "fn decide(req, pod) {\n    let x = 0;\n    for i in 0..200000 { x += 1; }\n    x > 0\n}\n",
    );
    let report = pdsim::run_scenario(&dir.join("s.ron"), &["horizon=20".to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.routing_decisions >= 2,
        "{}",
        report.routing_decisions
    );
}

#[test]
fn a_parameter_read_but_never_given_is_refused_at_load() {
    let dir = sandbox("param");
    let decider = "const DEFAULTS = #{ threshold: 512 };\n\nfn decide(req, pod) {\n    req.prompt_tokens >= params.treshold\n}\n";
    replace_script(&dir, "prefix-based-pd-decider.rhai", decider);
    let err = run(&dir, &[]);
    assert!(
        err.contains("prefix-based-pd-decider.rhai, line 4")
            && err.contains("params.treshold")
            && err.contains("threshold"),
        "{err}"
    );
    // `params?.x` is an optional read: `()` when the parameter is absent.
    let decider = "fn decide(req, pod) {\n    params?.long == ()\n}\n";
    replace_script(&dir, "prefix-based-pd-decider.rhai", decider);
    let report = pdsim::run_scenario(&dir.join("s.ron"), &["horizon=20".to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(report.routing_decisions > 0);
}

#[test]
fn parameters_are_read_only() {
    let dir = sandbox("readonly");
    let decider = "fn decide(req, pod) {\n    params.non_cached_tokens = 0;\n    true\n}\n";
    replace_script(&dir, "prefix-based-pd-decider.rhai", decider);
    let err = run(&dir, &[]);
    assert!(
        err.contains("prefix-based-pd-decider.rhai") && err.contains("line 2"),
        "{err}"
    );
    assert!(err.contains("`params`, which is read-only"), "{err}");
}

#[test]
fn a_wrong_return_type_and_an_out_of_range_pick_are_errors() {
    let dir = sandbox("types");
    let decider = "// answers a number\nfn decide(req, pod) {\n    42\n}\n";
    replace_script(&dir, "prefix-based-pd-decider.rhai", decider);
    let err = run(&dir, &[]);
    assert!(
        err.contains("must return a bool") && err.contains("hook `decide`, line 2"),
        "{err}"
    );
    assert!(
        err.contains("prefix-based-pd-decider.rhai") && err.contains("request 0"),
        "{err}"
    );
    let dir = sandbox("pick");
    let picker = "fn pick(req, pods, scores) {\n    pods.len()\n}\n";
    replace_script(&dir, "max-score-picker.rhai", picker);
    let err = run(&dir, &[]);
    assert!(
        err.contains("max-score-picker.rhai, hook `pick`, line 1") && err.contains("index 1"),
        "{err}"
    );
}

#[test]
fn a_nan_score_is_an_error() {
    let dir = sandbox("nan");
    let scorer = "\n\nfn score(req, pod) {\n    0.0 / 0.0\n}\n";
    replace_script(&dir, "token-load-scorer.rhai", scorer);
    // Every request is remote (non_cached_tokens 1), so the prefill profile runs.
    let err = run(&dir, &[]);
    assert!(
        err.contains("token-load-scorer.rhai, hook `score`, line 3") && err.contains("NaN"),
        "{err}"
    );
    assert!(err.contains("scores must be finite"), "{err}");
}

#[test]
fn argmax_refuses_what_is_not_a_number() {
    let dir = sandbox("argmax");
    for (scores, found) in [
        ("[0.0 / 0.0]", "f64 NaN"),
        ("[1.0, \"x\"]", "string x"),
        ("[]", "no scores"),
    ] {
        let picker =
            format!("fn pick(req, pods, scores) {{\n    argmax({scores}, \"random\")\n}}\n");
        replace_script(&dir, "max-score-picker.rhai", &picker);
        let err = run(&dir, &[]);
        assert!(
            err.contains("hook `pick`, line 2") && err.contains("argmax") && err.contains(found),
            "{err}"
        );
    }
}

#[test]
fn a_filter_that_keeps_nobody_is_an_error() {
    let dir = sandbox("empty");
    let filter = "fn filter(req, pods) {\n    []\n}\n";
    replace_script(&dir, "prefix-cache-affinity-filter.rhai", filter);
    let err = run(&dir, &[]);
    assert!(
        err.contains("hook `filter`, line 1") && err.contains("kept no pod"),
        "{err}"
    );
}

#[test]
fn a_missing_hook_is_refused_at_load() {
    let dir = sandbox("hook");
    replace_script(
        &dir,
        "token-load-scorer.rhai",
        "fn scor(req, pod) { 1.0 }\n",
    );
    let err = run(&dir, &[]);
    assert!(
        err.contains("token-load-scorer.rhai") && err.contains("fn score(req, pod)"),
        "{err}"
    );
}

#[test]
fn impossible_scenarios_are_refused_before_the_run() {
    let dir = sandbox("impossible");
    let cases = [
        (
            "decode.engine.num_gpu_blocks=15",
            "smaller than max_model_len",
        ),
        ("workload.session_rate=0", "session_rate must be positive"),
        (
            "workload.session_rate=-0.5",
            "session_rate must be positive",
        ),
        // A first gap of -ln(u) / 1e-300 s, a tool time of 1e308 s on
        // average: past f64's range, events at infinity (found by the
        // fuzzer).
        (
            "workload.session_rate=1e-300",
            "session_rate must be at least 1e-9 per s (one session in the longest horizon, 1e9 s), got 1e-300",
        ),
        (
            "workload.tool_time_mean=1e308",
            "tool_time_mean must be at most the longest horizon, 1e9 s, got 1e308",
        ),
        ("prefill.count=0", "prefill.count must be at least 1"),
        ("decode.nic.tokens_per_s=0", "tokens_per_s must be positive"),
        ("transfer.latency=-1", "transfer.latency"),
        ("warmup=200", "warmup must be"),
        (
            "decode.engine.block_size=0",
            "block_size must be at least 1",
        ),
    ];
    for (set, expected) in cases {
        let err = run(&dir, &[set]);
        assert!(err.contains(expected), "--set {set}: {err}");
        assert!(err.contains("refused") || err.contains("--set"), "{err}");
    }
    // A negative count cannot even be written into an unsigned field.
    let err = run(&dir, &["decode.count=-2"]);
    assert!(err.contains("decode.count"), "{err}");
}
