//! Sweeps: the same summary whatever the threads, shards or interruptions;
//! bad arguments refused in one line; experiment files and figures.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::Scratch;

use pdsim::experiment::{self, MergeArgs, SweepArgs};

/// A sweep's output folder, not made yet.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("sweep-{name}")).within("out")
}

/// The tiny scenario, 2 grid points × 3 seeds, 100 simulated s each.
fn args(out: &Path) -> SweepArgs {
    SweepArgs {
        target: "tests/scenarios/tiny.ron".into(),
        seeds: Some("1..3".into()),
        grid: vec!["router.decider.params.non_cached_tokens=1,inf".into()],
        set: vec!["workload.session_rate=2".into()],
        horizon: Some(100.0),
        warmup: Some(10.0),
        jobs: Some(1),
        out: Some(out.to_path_buf()),
        ..Default::default()
    }
}

const SUMMARIES: [&str; 3] = ["summary.json", "summary.csv", "summary.txt"];

fn summaries(dir: &Path) -> Vec<Vec<u8>> {
    SUMMARIES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}")))
        .collect()
}

fn run_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for point in std::fs::read_dir(dir.join("runs")).unwrap() {
        for f in std::fs::read_dir(point.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            if f.to_string_lossy().ends_with(".json")
                && !f.to_string_lossy().ends_with(".dist.json")
            {
                files.push(f);
            }
        }
    }
    files.sort();
    files
}

fn sweep_ok(a: &SweepArgs) -> experiment::SweepOutcome {
    experiment::sweep(a, false).unwrap_or_else(|e| panic!("{e}"))
}

fn sweep_err(a: &SweepArgs) -> String {
    let e = experiment::sweep(a, false).expect_err("the sweep must be refused");
    let e = e.to_string();
    assert!(!e.contains('\n'), "one line, got: {e}");
    e
}

#[test]
fn threads_and_shards_do_not_change_the_summary() {
    let root = scratch("jobs");
    let one = sweep_ok(&args(&root.join("j1")));
    assert_eq!((one.ran, one.skipped, one.total), (6, 0, 6));
    let table = one.table.expect("a complete sweep has a table");
    assert!(table.contains("p000") && table.contains("p001"), "{table}");
    let two = sweep_ok(&SweepArgs {
        jobs: Some(2),
        ..args(&root.join("j2"))
    });
    assert_eq!(two.ran, 6);
    assert_eq!(summaries(&root.join("j1")), summaries(&root.join("j2")));
    let (r1, r2) = (run_files(&root.join("j1")), run_files(&root.join("j2")));
    assert_eq!(r1.len(), 6);
    for (a, b) in r1.iter().zip(&r2) {
        assert_eq!(
            std::fs::read(a).unwrap(),
            std::fs::read(b).unwrap(),
            "{a:?}"
        );
    }

    // Two shards in their own dirs, then merged.
    let mut shard_runs = 0;
    for k in 1..=2 {
        let s = sweep_ok(&SweepArgs {
            shard: Some(format!("{k}/2")),
            ..args(&root.join(format!("s{k}")))
        });
        assert!(s.table.is_none(), "a lone shard has no summary");
        assert!(!root.join(format!("s{k}/summary.json")).exists());
        shard_runs += s.ran;
    }
    assert_eq!(shard_runs, 6, "the shards split the runs");
    let merged = experiment::merge(&MergeArgs {
        dirs: vec![root.join("s1"), root.join("s2")],
        out: Some(root.join("merged")),
        plots: false,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(merged.total, 6);
    assert_eq!(summaries(&root.join("j1")), summaries(&root.join("merged")));

    // A shard alone cannot be merged into a summary.
    let e = experiment::merge(&MergeArgs {
        dirs: vec![root.join("s1")],
        out: Some(root.join("half")),
        plots: false,
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("3 of the sweep's 6 runs"), "{e}");
}

#[test]
fn a_run_of_a_sweep_is_the_run_pdsim_run_gives() {
    let root = scratch("same");
    sweep_ok(&args(&root));
    let report = pdsim::run_scenario(
        Path::new("tests/scenarios/tiny.ron"),
        &[
            "workload.session_rate=2".into(),
            "router.decider.params.non_cached_tokens=inf".into(),
            "seed=2".into(),
            "horizon=100".into(),
            "warmup=10".into(),
        ],
    )
    .unwrap();
    let file = root.join("runs/p001-non_cached_tokens=inf/seed-2.json");
    assert_eq!(std::fs::read_to_string(file).unwrap(), report.to_json());
}

/// A sweep over a trace reads it once for all its runs (two at a time
/// here): each run is still the one `pdsim run --trace` gives.
#[test]
fn a_run_of_a_sweep_over_a_trace_is_the_run_pdsim_run_gives() {
    let root = scratch("trace");
    std::fs::create_dir_all(&root).unwrap();
    let trace = root.join("turns.jsonl");
    // Two sessions of two turns each, over 16-token blocks (the tiny
    // deployment's block is 4 tokens: hash ids of 16 tokens are 4 blocks).
    std::fs::write(
        &trace,
        "{\"session_id\":\"a\",\"timestamp\":0,\"input_length\":32,\"output_length\":3,\"hash_ids\":[1,2]}\n\
         {\"session_id\":\"b\",\"timestamp\":100,\"input_length\":16,\"output_length\":2,\"hash_ids\":[1]}\n\
         {\"session_id\":\"a\",\"delay\":50,\"input_length\":48,\"output_length\":2,\"hash_ids\":[1,2,3]}\n\
         {\"session_id\":\"b\",\"delay\":20,\"input_length\":40,\"output_length\":4,\"hash_ids\":[1,4,5]}\n",
    )
    .unwrap();
    let out = root.join("out");
    let mut a = args(&out);
    a.trace.trace = Some(trace.clone());
    a.set = vec!["workload.trace.block_tokens=16".into()];
    a.horizon = Some(f64::INFINITY);
    a.warmup = Some(0.0);
    a.seeds = Some("1..2".into());
    a.jobs = Some(2);
    sweep_ok(&a);
    let mut sets: Vec<String> = a.trace.override_().into_iter().collect();
    sets.extend([
        "workload.trace.block_tokens=16".into(),
        "router.decider.params.non_cached_tokens=1".into(),
        "seed=2".into(),
        "horizon=inf".into(),
        "warmup=0".into(),
    ]);
    let report = pdsim::run_scenario(Path::new("tests/scenarios/tiny.ron"), &sets).unwrap();
    assert_eq!(report.trace.as_ref().map(|t| t.requests), Some(4));
    let file = out.join("runs/p000-non_cached_tokens=1/seed-2.json");
    assert_eq!(std::fs::read_to_string(file).unwrap(), report.to_json());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_resumed_sweep_equals_an_uninterrupted_one() {
    let root = scratch("resume");
    sweep_ok(&args(&root.join("whole")));

    // Interrupted: some runs lost.
    let dir = root.join("cut");
    sweep_ok(&args(&dir));
    let files = run_files(&dir);
    std::fs::remove_file(&files[1]).unwrap();
    std::fs::remove_file(&files[4]).unwrap();
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    let again = sweep_ok(&args(&dir));
    assert_eq!((again.ran, again.skipped), (2, 4));
    assert_eq!(summaries(&root.join("whole")), summaries(&dir));

    // A shard first, then the whole sweep into the same dir.
    let dir = root.join("shard-first");
    let first = sweep_ok(&SweepArgs {
        shard: Some("2/3".into()),
        ..args(&dir)
    });
    assert_eq!(first.ran, 2);
    let rest = sweep_ok(&SweepArgs {
        jobs: Some(2),
        ..args(&dir)
    });
    assert_eq!((rest.ran, rest.skipped), (4, 2));
    assert_eq!(summaries(&root.join("whole")), summaries(&dir));

    // Nothing left to do: the same summary again.
    let idle = sweep_ok(&args(&dir));
    assert_eq!((idle.ran, idle.skipped), (0, 6));
    assert_eq!(summaries(&root.join("whole")), summaries(&dir));
}

#[test]
fn a_dir_made_by_different_arguments_is_refused() {
    let root = scratch("refuse");
    sweep_ok(&SweepArgs {
        seeds: Some("1".into()),
        ..args(&root)
    });
    let e = sweep_err(&SweepArgs {
        seeds: Some("1..2".into()),
        ..args(&root)
    });
    assert!(
        e.contains("different arguments") && e.contains("`seeds`"),
        "{e}"
    );
    let e = sweep_err(&SweepArgs {
        seeds: Some("1".into()),
        set: vec!["workload.session_rate=3".into()],
        ..args(&root)
    });
    assert!(e.contains("`set`"), "{e}");
}

#[test]
fn bad_arguments_get_one_line_naming_what_is_wrong() {
    let root = scratch("bad");
    let e = sweep_err(&SweepArgs {
        grid: vec!["decode.engine.num_gpu_blokcs=10,20".into()],
        ..args(&root)
    });
    assert!(
        e.contains("--grid decode.engine.num_gpu_blokcs")
            && e.contains("no field `num_gpu_blokcs`"),
        "{e}"
    );
    let e = sweep_err(&SweepArgs {
        seeds: Some("".into()),
        ..args(&root)
    });
    assert!(e.contains("--seeds is empty"), "{e}");
    let e = sweep_err(&SweepArgs {
        seeds: Some("5..2".into()),
        ..args(&root)
    });
    assert!(e.contains("--seeds 5..2") && e.contains("empty"), "{e}");
    let e = sweep_err(&SweepArgs {
        seeds: Some("1..x".into()),
        ..args(&root)
    });
    assert!(e.contains("`x` is not a seed"), "{e}");
    let e = sweep_err(&SweepArgs {
        shard: Some("3/2".into()),
        ..args(&root)
    });
    assert!(
        e.contains("--shard 3/2") && e.contains("out of range"),
        "{e}"
    );
    let e = sweep_err(&SweepArgs {
        shard: Some("0/4".into()),
        ..args(&root)
    });
    assert!(e.contains("out of range"), "{e}");
    // A run's seed, horizon and warm-up are the sweep's: set or swept they
    // would be replaced without a word, so they are refused.
    let e = sweep_err(&SweepArgs {
        set: vec!["horizon=1".into()],
        ..args(&root)
    });
    assert!(
        e.starts_with("--set horizon=1: ") && e.contains("use --horizon"),
        "{e}"
    );
    let e = sweep_err(&SweepArgs {
        grid: vec![" seed =1,2".into()],
        ..args(&root)
    });
    assert!(e.contains("`seed`") && e.contains("use --seeds"), "{e}");
    let e = sweep_err(&SweepArgs {
        grid: vec!["warmup=0,10".into()],
        ..args(&root)
    });
    assert!(e.contains("use --warmup"), "{e}");
    let tiny = std::fs::canonicalize("tests/scenarios/tiny.ron").unwrap();
    let file = Scratch::file(
        "sweep-exp-horizon",
        "exp.ron",
        &format!(
            "(name: \"x\", scenario: {:?}, seeds: \"1\", set: {{\"horizon\": 5}}, \
             grid: [(\"workload.session_rate\", [1, 2])])",
            tiny.display().to_string()
        ),
    );
    let e = sweep_err(&SweepArgs {
        target: file.to_path_buf(),
        out: Some(root.to_path_buf()),
        ..Default::default()
    });
    assert!(
        e.contains("exp.ron: set `horizon`") && e.contains("use --horizon"),
        "{e}"
    );
    assert!(!root.exists(), "nothing is written for refused arguments");

    // The command line prints the same single line.
    let out = Command::new(env!("CARGO_BIN_EXE_pdsim"))
        .args([
            "sweep",
            "tests/scenarios/tiny.ron",
            "--seeds",
            "4..1",
            "--out",
        ])
        .arg(&root)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: --seeds 4..1"), "{stderr}");
}

#[test]
fn experiment_files_plan_their_tables() {
    let plan = |file: &str| {
        experiment::plan(
            &SweepArgs {
                target: format!("scenarios/experiments/{file}").into(),
                ..Default::default()
            },
            &Default::default(),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"))
    };
    let d = plan("deciders.ron");
    assert_eq!(d.scenario, "scenarios/llmd_nixl_pull.ron");
    assert_eq!(d.points().len(), 4);
    assert_eq!(d.seeds, (1..=20).collect::<Vec<u64>>());
    assert_eq!((d.horizon, d.warmup), (10000.0, 1000.0));
    assert_eq!(d.grid[0].values, ["1", "512", "2048", "inf"]);
    for file in ["leases.ron", "leases_decoder_nic.ron"] {
        let l = plan(file);
        assert_eq!(l.points().len(), 6);
        assert_eq!(l.grid[0].values, ["10000", "2000", "1100"]);
        assert_eq!(l.grid[1].values, ["0.6", "1.2"]);
    }
    assert!(
        plan("leases_decoder_nic.ron")
            .set
            .contains(&"transfer.sharing=DecoderNicOnly".to_string())
    );
    // Every experiment file in the folder plans.
    for f in std::fs::read_dir("scenarios/experiments").unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "ron") {
            assert!(experiment::is_experiment(&p), "{p:?}");
            plan(p.file_name().unwrap().to_str().unwrap());
        }
    }
    assert!(!experiment::is_experiment(Path::new(
        "scenarios/llmd_nixl_pull.ron"
    )));
}

#[test]
fn plots_are_svg_figures() {
    let root = scratch("plots");
    let done = sweep_ok(&SweepArgs {
        plots: true,
        sample_interval: 0.5,
        ..args(&root)
    });
    assert!(done.table.is_some());
    for f in [
        "cdf_ttft.svg",
        "cdf_tpot.svg",
        "cdf_itl.svg",
        "cdf_e2e.svg",
        "timeseries.svg",
    ] {
        let text = std::fs::read_to_string(root.join("plots").join(f)).unwrap();
        assert!(text.starts_with("<svg") && text.contains("polyline"), "{f}");
    }
    let csv = std::fs::read_to_string(root.join("plots/timeseries.csv")).unwrap();
    assert!(
        csv.starts_with(
            "t,decode0_kv_usage,prefill0_kv_held_tokens,prefill0_queue,decode0_queue\n"
        )
    );
    // Samples at 0, 0.5, ..., 100.
    assert_eq!(csv.lines().count(), 1 + 201);
    assert!(csv.lines().last().unwrap().starts_with("100,"));

    // One run: the same recorder, and the run's report is unchanged by it.
    let dir = root.join("one");
    let sc = pdsim::scenario::load(Path::new("tests/scenarios/tiny.ron"), &[]).unwrap();
    let with = pdsim::cli::run_with_plots(&sc, &dir, 1.0).unwrap();
    let without = pdsim::Sim::new(&sc).unwrap().run().unwrap();
    assert_eq!(with.to_json(), without.to_json());
    for f in [
        "cdf_ttft.svg",
        "cdf_tpot.svg",
        "cdf_itl.svg",
        "cdf_e2e.svg",
        "timeseries.svg",
        "timeseries.csv",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
}
