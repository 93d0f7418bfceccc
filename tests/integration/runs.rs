//! Whole runs: every scenario file loads, runs are deterministic, the CLI
//! works end to end.

use std::path::Path;
use std::process::Command;

fn pdsim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pdsim"))
}

#[test]
fn every_scenario_file_loads_and_compiles_its_scripts() {
    let mut n = 0;
    let mut stack = vec![Path::new("scenarios").to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                // Experiment files (a base scenario + a grid) have their own
                // loader and tests.
                if p.file_name().is_some_and(|n| n != "experiments") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "ron") {
                let sc = pdsim::scenario::load(&p, &[]).unwrap_or_else(|e| panic!("{e}"));
                pdsim::Sim::new(&sc).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                n += 1;
            }
        }
    }
    assert!(n >= 1);
}

#[test]
fn same_scenario_and_seed_give_byte_identical_json() {
    let dir = std::env::temp_dir().join(format!("pdsim-det-{}", std::process::id()));
    let run = |name: &str, seed: &str| {
        let out = dir.join(name);
        let status = pdsim()
            .args([
                "run",
                "scenarios/llmd_nixl_pull.ron",
                "--horizon",
                "150",
                "--warmup",
                "20",
                "--seed",
                seed,
                "--json",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        std::fs::read(out).unwrap()
    };
    let a = run("a.json", "3");
    let b = run("b.json", "3");
    assert_eq!(a, b, "same seed, same bytes");
    let c = run("c.json", "4");
    assert_ne!(a, c, "another seed, another run");
    let v: serde_json::Value = serde_json::from_slice(&a).unwrap();
    assert_eq!(v["scenario"], "llmd_nixl_pull");
    assert_eq!(v["seed"], 3);
    for name in [
        "ttft",
        "response",
        "remote",
        "lease",
        "remote_tokens",
        "local_tokens",
        "too_long",
    ] {
        assert!(
            v["observations"][name]["count"].as_u64().unwrap() > 0,
            "{name}"
        );
        for k in ["mean", "p50", "p90", "p99"] {
            assert!(v["observations"][name][k].is_number(), "{name}.{k}");
        }
    }
    for g in [
        "running_spread",
        "load_spread",
        "kv_usage_max",
        "kv_usage_mean",
        "prefill_kv_held",
        "prefill_queue",
    ] {
        assert!(v["gauges"][g].is_number(), "{g}");
    }
}

#[test]
fn the_cli_prints_a_report_and_errors_without_panicking() {
    let out = pdsim()
        .args([
            "run",
            "scenarios/llmd_nixl_pull.ron",
            "--horizon",
            "200",
            "--warmup",
            "20",
            "--set",
            "router.decider.params.non_cached_tokens=inf",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ttft") && text.contains("remote fraction 0.0000"),
        "{text}"
    );
    assert!(text.contains("simulated s per wall s"), "{text}");

    let out = pdsim()
        .args([
            "run",
            "scenarios/llmd_nixl_pull.ron",
            "--set",
            "decode.engine.num_gpu_blocks=10",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.starts_with("error: ")
            && err.contains("smaller than max_model_len")
            && !err.contains("panicked"),
        "{err}"
    );

    let out = pdsim()
        .args(["check", "scenarios/llmd_nixl_pull.ron"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn the_decider_threshold_moves_the_remote_fraction() {
    // Always (1) ≥ 512 ≥ 2048 ≥ never (inf) in remote fraction.
    let frac = |v: &str| {
        let sets = vec![
            "horizon=300".to_string(),
            "warmup=30".to_string(),
            format!("router.decider.params.non_cached_tokens={v}"),
        ];
        pdsim::run_scenario(Path::new("scenarios/llmd_nixl_pull.ron"), &sets)
            .unwrap()
            .mean("remote")
            .unwrap()
    };
    let (always, r512, r2048, never) = (frac("1"), frac("512"), frac("2048"), frac("inf"));
    assert_eq!(always, 1.0);
    assert_eq!(never, 0.0);
    assert!(
        always > r512 && r512 > r2048 && r2048 > never,
        "{always} {r512} {r2048} {never}"
    );
}
