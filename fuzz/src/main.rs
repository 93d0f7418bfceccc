//! Mutation fuzzing of pdsim's input formats on stable Rust: RON scenarios,
//! experiment files, replay traces and the three trace formats a workload
//! reads. Seeds are the repository's own files; each case is a seed mutated
//! (bytes flipped, cut, repeated, spliced; numbers swapped for extreme ones;
//! names swapped for others of the format), loaded and, when it loads, run
//! for a few simulated seconds. A finding is a panic, a case slower than
//! `--timeout`, or — when the process dies — the input in `current.*`.
//! Not coverage-guided: it explores around the seeds (docs/fuzzing.md).
//!
//! cargo run --release -p pdsim-fuzz -- TARGET [--seconds N] [--seed S]

use clap::{Parser, ValueEnum};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pdsim::experiment::args::SweepArgs;
use pdsim::sim::Sim;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    Scenario,
    Experiment,
    Replay,
    Mooncake,
    Azure,
    PdsimTrace,
}

#[derive(Parser)]
#[command(about = "Mutation fuzzing of pdsim's input formats (docs/fuzzing.md)")]
struct Args {
    target: Target,
    /// Wall seconds to fuzz for.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A case slower than this (wall seconds) is a finding.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Where findings are written.
    #[arg(long, default_value = "fuzz/findings")]
    findings: PathBuf,
}

/// The sweep command line's arguments, to plan an experiment file.
#[derive(Parser)]
struct Sweep {
    #[command(flatten)]
    args: SweepArgs,
}

/// Values that break naive code: zero, negatives, the ends of the integer
/// types, NaN and the infinities, denormals, huge and tiny floats.
const EXTREMES: [&str; 16] = [
    "0",
    "-1",
    "1",
    "2",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "1e308",
    "1e-300",
    "NaN",
    "inf",
    "-inf",
    "1e9",
    "0.5",
];

/// Names of the formats, swapped for one another.
const NAMES: [&str; 24] = [
    "Vllm033",
    "Reference",
    "NixlPull",
    "NixlPush",
    "StoreAndForward",
    "Parallel",
    "Serial",
    "MaxMin",
    "EqualSplit",
    "PodDown",
    "NicSlow",
    "Mooncake",
    "Azure",
    "Pdsim",
    "inf",
    "decode-0",
    "prefill-1",
    "true",
    "false",
    "null",
    "\"\"",
    "[]",
    "{}",
    "()",
];

/// The target's seeds (repository files) and the extension of its cases.
fn seeds(target: Target) -> (Vec<String>, &'static str) {
    let read_dir = |dir: &str, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{dir}: {e} (run from the repository root)"))
            .map(|e| e.unwrap().path())
            .filter(|p| keep(&p.to_string_lossy()))
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect()
    };
    match target {
        Target::Scenario => {
            let mut s = read_dir("scenarios", &|p| p.ends_with(".ron"));
            s.extend(read_dir("tests/scenarios", &|p| p.ends_with(".ron")));
            (s, "ron")
        }
        Target::Experiment => (
            read_dir("scenarios/experiments", &|p| p.ends_with(".ron")),
            "ron",
        ),
        Target::Replay => (
            read_dir("tests/golden", &|p| {
                p.ends_with(".json") && !p.ends_with(".vllm.json")
            }),
            "json",
        ),
        Target::Mooncake => (read_dir("fuzz/corpus", &|p| p.ends_with(".jsonl")), "jsonl"),
        Target::Azure => (read_dir("fuzz/corpus", &|p| p.ends_with(".csv")), "csv"),
        Target::PdsimTrace => (
            read_dir("fuzz/corpus", &|p| p.ends_with("trace.json")),
            "json",
        ),
    }
}

/// One mutation of `text` (a few applied in a row).
fn mutate(text: &str, seeds: &[String], rng: &mut Xoshiro256PlusPlus) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..rng.random_range(1..4) {
        if b.is_empty() {
            b.extend_from_slice(seeds[0].as_bytes());
        }
        let at = rng.random_range(0..b.len());
        match rng.random_range(0..8) {
            // A number swapped for an extreme one.
            0 | 1 => {
                let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
                if let Some(&i) = digits.get(rng.random_range(0..digits.len().max(1))) {
                    let (mut s, mut e) = (i, i);
                    while s > 0 && (b[s - 1].is_ascii_digit() || b[s - 1] == b'.') {
                        s -= 1;
                    }
                    while e < b.len() && (b[e].is_ascii_digit() || b[e] == b'.' || b[e] == b'e') {
                        e += 1;
                    }
                    let v = EXTREMES[rng.random_range(0..EXTREMES.len())];
                    b.splice(s..e, v.bytes());
                }
            }
            // A word swapped for another name of the formats.
            2 => {
                let (mut s, mut e) = (at, at);
                while s > 0 && b[s - 1].is_ascii_alphanumeric() {
                    s -= 1;
                }
                while e < b.len() && b[e].is_ascii_alphanumeric() {
                    e += 1;
                }
                let v = NAMES[rng.random_range(0..NAMES.len())];
                b.splice(s..e, v.bytes());
            }
            // Bytes cut, repeated, flipped; a splice of another seed.
            3 => {
                let end = (at + rng.random_range(1..64)).min(b.len());
                b.drain(at..end);
            }
            4 => {
                let end = (at + rng.random_range(1..256)).min(b.len());
                let chunk = b[at..end].to_vec();
                let times = if rng.random_bool(0.1) { 1000 } else { 1 };
                for _ in 0..times {
                    b.splice(at..at, chunk.iter().copied());
                }
            }
            5 => b[at] ^= 1 << rng.random_range(0..8),
            6 => {
                let other = seeds[rng.random_range(0..seeds.len())].as_bytes();
                let from = rng.random_range(0..other.len());
                let end = (from + rng.random_range(1..512)).min(other.len());
                b.splice(at..at, other[from..end].iter().copied());
            }
            _ => b.truncate(at),
        }
    }
    b
}

/// A scratch tree mirroring the repository's (scripts, lib, scenarios), so
/// cases find what their relative paths name.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pdsim-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("scenarios/experiments")).unwrap();
    std::fs::create_dir_all(dir.join("tests/scenarios")).unwrap();
    std::fs::create_dir_all(dir.join("traces")).unwrap();
    let root = std::env::current_dir().unwrap();
    for d in ["scripts", "lib"] {
        std::os::unix::fs::symlink(root.join(d), dir.join(d)).unwrap();
    }
    for f in std::fs::read_dir("scenarios").unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            std::fs::copy(&f, dir.join("scenarios").join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        "tests/scenarios/tiny.ron",
        dir.join("tests/scenarios/tiny.ron"),
    )
    .unwrap();
    // A tiny deployment whose workload is the trace under test.
    let tiny = std::fs::read_to_string("tests/scenarios/tiny.ron").unwrap();
    let (a, b) = (
        tiny.find("    workload: (").unwrap(),
        tiny.find("    prefill: (").unwrap(),
    );
    let base = format!(
        "{}    workload: (trace: (file: \"TRACE\", block_tokens: 16)),\n{}",
        &tiny[..a],
        &tiny[b..]
    );
    std::fs::write(dir.join("tests/scenarios/trace_base.ron"), base).unwrap();
    dir
}

/// Runs one case; an Err is pdsim refusing it (the expected outcome of
/// most cases), a panic is a finding.
fn run_case(target: Target, path: &Path, dir: &Path) -> pdsim::Result<()> {
    let short = ["horizon=5".to_string(), "warmup=0".to_string()];
    match target {
        Target::Scenario => {
            pdsim::scenario::load(path, &[])?;
            let sc = pdsim::scenario::load(path, &short)?;
            // pdsim accepts up to 8 GiB of KV pools; the fuzzer runs under a
            // smaller address space, so it only loads the large ones.
            let blocks: u64 = [&sc.raw.prefill, &sc.raw.decode]
                .iter()
                .zip(&sc.pools)
                .map(|(pool, plan)| u64::from(pool.count) * u64::from(plan.num_gpu_blocks))
                .sum();
            if blocks * pdsim::scenario::validate::KV_BYTES_PER_BLOCK > 1 << 30 {
                return Ok(());
            }
            Sim::new(&sc)?.run()?;
        }
        Target::Experiment => {
            let sweep = Sweep::try_parse_from(["sweep", &path.to_string_lossy(), "--horizon", "5"])
                .map_err(|e| pdsim::Error::new(e.to_string()))?;
            pdsim::experiment::plan::plan(&sweep.args, &Default::default())?;
        }
        Target::Replay => {
            let t = pdsim::replay::Trace::load(path)?;
            pdsim::replay::replay(&t, path, &[])?;
        }
        Target::Mooncake | Target::Azure | Target::PdsimTrace => {
            let format = match target {
                Target::Mooncake => "Mooncake",
                Target::Azure => "Azure",
                _ => "Pdsim",
            };
            let sets = [
                format!("workload.trace.file={}", path.display()),
                format!("workload.trace.format={format}"),
                "horizon=20".to_string(),
            ];
            let sc = pdsim::scenario::load(&dir.join("tests/scenarios/trace_base.ron"), &sets)?;
            Sim::new(&sc)?.run()?;
        }
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let (seeds, ext) = seeds(args.target);
    assert!(!seeds.is_empty(), "no seeds for {:?}", args.target);
    let dir = scratch();
    let case_path = match args.target {
        Target::Scenario => dir.join("scenarios/case.ron"),
        Target::Experiment => dir.join("scenarios/experiments/case.ron"),
        _ => dir.join(format!("traces/case.{ext}")),
    };
    std::fs::create_dir_all(&args.findings).unwrap();
    let name = format!("{:?}", args.target).to_lowercase();
    // The input of the case in progress, for the watchdog and for a death.
    let current = args.findings.join(format!("current-{name}.{ext}"));
    let started = Arc::new(Mutex::new((Instant::now(), Vec::<u8>::new())));
    {
        let (started, findings, name) = (started.clone(), args.findings.clone(), name.clone());
        let limit = Duration::from_secs_f64(args.timeout);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let (t, input) = started.lock().unwrap().clone();
                if t.elapsed() > limit {
                    let f = findings.join(format!("{name}-hang.{ext}"));
                    std::fs::write(&f, input).unwrap();
                    eprintln!("finding: a case ran over {limit:?}: {}", f.display());
                    std::process::exit(2);
                }
            }
        });
    }
    // Panics are findings, reported below: keep their default message quiet.
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(args.seed);
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let (mut cases, mut loaded, mut findings) = (0u64, 0u64, 0u64);
    let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
    let t0 = Instant::now();
    while Instant::now() < deadline {
        let seed = &seeds[rng.random_range(0..seeds.len())];
        let input = mutate(seed, &seeds, &mut rng);
        std::fs::write(&case_path, &input).unwrap();
        std::fs::write(&current, &input).unwrap();
        *started.lock().unwrap() = (Instant::now(), input.clone());
        let out = std::panic::catch_unwind(|| run_case(args.target, &case_path, &dir));
        cases += 1;
        match out {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(e)) => {
                // The kind of refusal, for the summary: its words without
                // the scratch path, numbers and quoted text.
                let msg = e.to_string().replace(&*dir.to_string_lossy(), "");
                let mut key = String::new();
                let mut quoted = false;
                for c in msg.chars() {
                    match c {
                        '`' | '"' => quoted = !quoted,
                        _ if quoted || c.is_ascii_digit() => {}
                        _ => key.push(c),
                    }
                }
                let key: String = key.split_whitespace().take(9).collect::<Vec<_>>().join(" ");
                *errors.entry(key).or_default() += 1;
            }
            Err(p) => {
                findings += 1;
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let f = args.findings.join(format!("{name}-panic-{findings}.{ext}"));
                std::fs::write(&f, &input).unwrap();
                eprintln!("finding: panic `{what}`: {}", f.display());
            }
        }
    }
    let _ = std::fs::remove_file(&current);
    let _ = std::fs::remove_dir_all(&dir);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{name}: {cases} cases in {wall:.0} s ({:.0}/s) from {} seeds (seed {}): {loaded} ran, {} refused, {findings} findings",
        cases as f64 / wall,
        seeds.len(),
        args.seed,
        cases - loaded - findings
    );
    let mut top: Vec<_> = errors.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    for (k, n) in top.iter().take(5) {
        println!("  refused {n:>6}: {k}");
    }
    std::process::exit(i32::from(findings > 0));
}
