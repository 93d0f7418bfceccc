//! The plugin catalogue in scripts/: each plugin against choices computed
//! by hand on small pod states, tie-breaking, the router's bookkeeping as a
//! source, hot swap, and the decider written in docs/policies.md.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::Scratch;

use pdsim::engine::Role;
use pdsim::router::policy::{PodView, Policies, ReqView};
use pdsim::scenario::{self, ParamValue, Plugin, Profile, Router, Scorer};

fn params(kv: &[(&str, ParamValue)]) -> BTreeMap<String, ParamValue> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}
fn s(v: &str) -> ParamValue {
    ParamValue::Str(v.into())
}
fn plugin(script: &str, p: BTreeMap<String, ParamValue>) -> Plugin {
    Plugin {
        plugin: None,
        script: format!("scripts/{script}.rhai"),
        params: p,
    }
}

/// Policies whose decode profile is (filters, scorers, picker) and whose
/// decider is `decider`; the prefill profile is the same as the decode one.
fn policies(
    decider: Plugin,
    filters: Vec<Plugin>,
    scorers: Vec<(&str, f64, BTreeMap<String, ParamValue>)>,
    picker: Plugin,
    seed: u64,
) -> Policies {
    let profile = Profile {
        filters,
        scorers: scorers
            .into_iter()
            .map(|(name, weight, p)| Scorer {
                plugin: None,
                script: format!("scripts/{name}.rhai"),
                weight,
                params: p,
            })
            .collect(),
        picker,
    };
    let router = Router::with_profiles(decider, profile.clone(), profile);
    Policies::load(&router, seed, Some(Path::new("lib"))).unwrap_or_else(|e| panic!("{e}"))
}

/// A plugin whose script `text` is written to a scratch file named `name`.
/// (The file lives as long as the first of the two.)
fn scratch_plugin(name: &str, text: &str) -> (Scratch, Plugin) {
    let file = Scratch::file(&format!("scripts-{name}"), &format!("{name}.rhai"), text);
    let plugin = Plugin {
        plugin: None,
        script: file.to_string_lossy().into_owned(),
        params: BTreeMap::new(),
    };
    (file, plugin)
}

fn first() -> Plugin {
    plugin("max-score-picker", params(&[("ties", s("first"))]))
}
fn never() -> Plugin {
    plugin("never-disagg-pd-decider", BTreeMap::new())
}

fn req(prompt: i64) -> ReqView {
    ReqView {
        id: 1,
        session: 3,
        turn: 1,
        prompt_tokens: prompt,
        new_tokens: prompt,
        block_size: 16,
        ..Default::default()
    }
}

fn pod(index: i64) -> PodView {
    PodView {
        role: "decode".into(),
        index,
        kv_capacity: 1000,
        max_num_seqs: 8,
        ..Default::default()
    }
}

/// Pods 0, 1, … with one field set from `values`.
fn pods_with(values: &[i64], set: impl Fn(&mut PodView, i64)) -> Vec<PodView> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let mut p = pod(i as i64);
            set(&mut p, v);
            p
        })
        .collect()
}

/// Picks with a decode profile of one scorer and a first-index picker.
fn pick_with(scorer: &str, p: BTreeMap<String, ParamValue>, pods: &[PodView]) -> usize {
    let mut pol = policies(never(), vec![], vec![(scorer, 1.0, p)], first(), 1);
    pol.choose(Role::Decode, &req(1000), pods).unwrap()
}

#[test]
fn deciders() {
    let d = |script: &str, p: BTreeMap<String, ParamValue>, prompt: i64, cached: i64| {
        let mut pol = policies(plugin(script, p), vec![], vec![], first(), 1);
        pol.decide(
            &req(prompt),
            &PodView {
                cached_tokens: cached,
                ..pod(0)
            },
            None,
        )
        .unwrap()
    };
    let pb = |nct: ParamValue, pt: i64| {
        params(&[
            ("non_cached_tokens", nct),
            ("prompt_tokens", ParamValue::Int(pt)),
        ])
    };
    let int = ParamValue::Int;
    // prompt 2000, 1600 cached: 400 uncached < 512 → local; 1000 cached → remote.
    assert!(!d("prefix-based-pd-decider", pb(int(512), 0), 2000, 1600));
    assert!(d("prefix-based-pd-decider", pb(int(512), 0), 2000, 1000));
    // Exactly at the threshold counts as remote (≥).
    assert!(d("prefix-based-pd-decider", pb(int(512), 0), 2000, 1488));
    // promptTokens: a prompt shorter than 3000 stays local.
    assert!(!d("prefix-based-pd-decider", pb(int(512), 3000), 2000, 0));
    // 1 = always, inf = never, 0 = disabled (llm-d).
    assert!(d("prefix-based-pd-decider", pb(int(1), 0), 20, 16));
    assert!(!d(
        "prefix-based-pd-decider",
        pb(ParamValue::Float(f64::INFINITY), 0),
        16000,
        0
    ));
    assert!(!d("prefix-based-pd-decider", pb(int(0), 0), 16000, 0));
    assert!(d("always-disagg-pd-decider", BTreeMap::new(), 10, 0));
    assert!(!d("never-disagg-pd-decider", BTreeMap::new(), 10000, 0));
    // The router's estimate instead of the pod's cache.
    let mut pol = policies(
        plugin(
            "prefix-based-pd-decider",
            params(&[("source", s("router"))]),
        ),
        vec![],
        vec![],
        first(),
        1,
    );
    let p = PodView {
        cached_tokens: 1600,
        router_cached_tokens: 0,
        ..pod(0)
    };
    assert!(
        pol.decide(&req(2000), &p, None).unwrap(),
        "the router believes nothing is cached"
    );
}

#[test]
fn prefix_cache_affinity_filter() {
    // Prompt 1000; cached 0, 800, 900, 100 on pods 0..3; token load equal, so
    // the first-index picker shows the lowest kept pod.
    let pods = pods_with(&[0, 800, 900, 100], |p, v| p.cached_tokens = v);
    let choose = |ratio: f64, pods: &[PodView]| {
        let f = plugin(
            "prefix-cache-affinity-filter",
            params(&[("min_match_ratio", ParamValue::Float(ratio))]),
        );
        let mut pol = policies(never(), vec![f], vec![], first(), 1);
        pol.choose(Role::Decode, &req(1000), pods).unwrap()
    };
    assert_eq!(choose(0.8, &pods), 1, "0.8 keeps pods 1 and 2");
    assert_eq!(choose(0.85, &pods), 2, "0.85 keeps pod 2 only");
    assert_eq!(choose(0.0, &pods), 1, "0 keeps any cached pod: 1, 2, 3");
    assert_eq!(choose(0.95, &pods), 0, "nobody qualifies: all kept");
    // With a scorer preferring higher indices, "any cached" never picks pod 0.
    let f = plugin(
        "prefix-cache-affinity-filter",
        params(&[("min_match_ratio", ParamValue::Float(0.0))]),
    );
    let mut pol = policies(
        never(),
        vec![f],
        vec![("queue-scorer", 1.0, BTreeMap::new())],
        first(),
        1,
    );
    let queued: Vec<PodView> = pods
        .iter()
        .map(|p| PodView {
            queued: 3 - p.index,
            ..p.clone()
        })
        .collect();
    assert_eq!(pol.choose(Role::Decode, &req(1000), &queued).unwrap(), 3);
}

#[test]
fn scorers() {
    // active-request: counts 3, 1, 3 → max 3 → scores 0, 2/3, 0 → pod 1.
    let pods = pods_with(&[3, 1, 3], |p, v| p.active = v);
    assert_eq!(
        pick_with("active-request-scorer", BTreeMap::new(), &pods),
        1
    );
    // …counted by the router instead: 0, 5, 2 → pod 0.
    let pods: Vec<PodView> = [0, 5, 2]
        .iter()
        .enumerate()
        .map(|(i, &r)| PodView {
            router_requests: r,
            active: 9,
            ..pod(i as i64)
        })
        .collect();
    assert_eq!(
        pick_with(
            "active-request-scorer",
            params(&[("source", s("router"))]),
            &pods
        ),
        0
    );
    // token-load: backlog + queued = 500+1, 200+3, 200+0 → pod 2.
    let pods: Vec<PodView> = [(500, 1), (200, 3), (200, 0)]
        .iter()
        .enumerate()
        .map(|(i, &(b, q))| PodView {
            prompt_backlog: b,
            queued: q,
            ..pod(i as i64)
        })
        .collect();
    assert_eq!(pick_with("token-load-scorer", BTreeMap::new(), &pods), 2);
    // kv-cache-utilization: held 900, 100, 500 of 1000 → pod 1.
    let pods = pods_with(&[900, 100, 500], |p, v| p.kv_held = v);
    assert_eq!(
        pick_with("kv-cache-utilization-scorer", BTreeMap::new(), &pods),
        1
    );
    // queue: 4, 2, 0 waiting → (4 − q) / 4 = 0, 0.5, 1 → pod 2.
    let pods = pods_with(&[4, 2, 0], |p, v| p.queued = v);
    assert_eq!(pick_with("queue-scorer", BTreeMap::new(), &pods), 2);
    // load-aware (threshold 128): 0 → 0.5, 64 → 0.25, 200 → 0: pod 0.
    let pods = pods_with(&[0, 64, 200], |p, v| p.queued = v);
    assert_eq!(pick_with("load-aware-scorer", BTreeMap::new(), &pods), 0);
    // prefix-cache: 160, 640, 320 of 1000 cached → pod 1.
    let pods = pods_with(&[160, 640, 320], |p, v| p.cached_tokens = v);
    assert_eq!(pick_with("prefix-cache-scorer", BTreeMap::new(), &pods), 1);
}

#[test]
fn weighted_scorers_add_up() {
    // Pod 0: queue score 1 (empty), kv score 0.1 (held 900). Pod 1: queue 0,
    // kv 0.9. Weights 1 and 1 → 1.1 vs 0.9: pod 0. Weights 1 and 3 →
    // 1.3 vs 2.7: pod 1.
    let pods = vec![
        PodView {
            queued: 0,
            kv_held: 900,
            ..pod(0)
        },
        PodView {
            queued: 5,
            kv_held: 100,
            ..pod(1)
        },
    ];
    let run = |w: f64| {
        let mut pol = policies(
            never(),
            vec![],
            vec![
                ("queue-scorer", 1.0, BTreeMap::new()),
                ("kv-cache-utilization-scorer", w, BTreeMap::new()),
            ],
            first(),
            1,
        );
        pol.choose(Role::Decode, &req(100), &pods).unwrap()
    };
    assert_eq!(run(1.0), 0);
    assert_eq!(run(3.0), 1);
}

#[test]
fn tie_breaking_first_is_deterministic_random_is_seeded() {
    // Pods 0 and 2 tie for the best score; pod 1 is worse.
    let pods = pods_with(&[1, 4, 1], |p, v| p.active = v);
    let picks = |ties: &str, seed: u64| {
        let picker = plugin("max-score-picker", params(&[("ties", s(ties))]));
        let mut pol = policies(
            never(),
            vec![],
            vec![("active-request-scorer", 1.0, BTreeMap::new())],
            picker,
            seed,
        );
        (0..200)
            .map(|_| pol.choose(Role::Decode, &req(100), &pods).unwrap())
            .collect::<Vec<_>>()
    };
    assert!(
        picks("first", 1).iter().all(|&p| p == 0),
        "first index, always"
    );
    let a = picks("random", 7);
    assert_eq!(a, picks("random", 7), "same seed, same picks");
    assert_ne!(a, picks("random", 8), "another seed, other picks");
    assert!(a.iter().all(|&p| p == 0 || p == 2), "only tied pods");
    let zeros = a.iter().filter(|&&p| p == 0).count();
    assert!(
        (70..130).contains(&zeros),
        "about half each: {zeros} of 200"
    );
}

#[test]
fn random_and_round_robin_pickers() {
    let pods: Vec<PodView> = (0..3).map(pod).collect();
    let picks = |name: &str, seed: u64| {
        let mut pol = policies(never(), vec![], vec![], plugin(name, BTreeMap::new()), seed);
        (0..300)
            .map(|_| pol.choose(Role::Decode, &req(100), &pods).unwrap())
            .collect::<Vec<_>>()
    };
    let rr = picks("round-robin-picker", 1);
    assert_eq!(&rr[..7], &[0, 1, 2, 0, 1, 2, 0]);
    let r = picks("random-picker", 3);
    assert_eq!(r, picks("random-picker", 3));
    for k in 0..3 {
        let n = r.iter().filter(|&&p| p == k).count();
        assert!((70..130).contains(&n), "pod {k} picked {n} of 300");
    }
}

#[test]
fn pods_kept_in_state_are_not_changed_by_later_requests() {
    // The router refills its script values in place between requests and
    // gives scripts copies: this picker keeps the first request, its pods
    // and a pod, and checks at every later request that they read the same.
    let (_file, picker) = scratch_plugin(
        "keeping-picker",
        "fn pick(req, pods, scores) {\n    if !(\"pods\" in state) {\n        state.pods = pods; state.req = req;\n        for pod in pods { state.pod = pod; }\n        state.active = [pods[0].active, pods[1].active, state.pod.active, req.prompt_tokens];\n    }\n    let now = [state.pods[0].active, state.pods[1].active, state.pod.active, state.req.prompt_tokens];\n    if now != state.active { throw `kept values changed: ${state.active} became ${now}`; }\n    0\n}\n",
    );
    let mut pol = policies(never(), vec![], vec![], picker, 1);
    pol.choose(
        Role::Decode,
        &req(100),
        &pods_with(&[1, 2], |p, v| p.active = v),
    )
    .unwrap();
    for (k, prompt) in [(5, 200), (9, 300)] {
        let pods = pods_with(&[k, k + 1], |p, v| p.active = v);
        pol.choose(Role::Decode, &req(prompt), &pods)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_filter_that_returns_a_pod_twice_is_an_error() {
    let (_file, twice) = scratch_plugin(
        "twice-filter",
        "fn filter(req, pods) { pods + [pods[0]] }\n",
    );
    let mut pol = policies(never(), vec![twice], vec![], first(), 1);
    let err = pol
        .choose(Role::Decode, &req(100), &[pod(0), pod(1)])
        .expect_err("refused")
        .to_string();
    assert!(err.contains("`filter` returned pod 0 twice"), "{err}");
}

#[test]
fn random_int_of_less_than_one_is_an_error() {
    let (_file, picker) = scratch_plugin(
        "zero-picker",
        "fn pick(req, pods, scores) { random_int(0) }\n",
    );
    let mut pol = policies(never(), vec![], vec![], picker, 1);
    let err = pol
        .choose(Role::Decode, &req(100), &[pod(0), pod(1)])
        .expect_err("refused")
        .to_string();
    assert!(err.contains("n must be at least 1, got 0"), "{err}");
}

#[test]
fn scores_whose_weighted_sum_overflows_are_an_error() {
    // 1e308 + 1e308 = inf: finite scores, an infinite sum.
    let dir = crate::common::Scratch::new("huge");
    let path = dir.join("huge-scorer.rhai");
    std::fs::write(&path, "fn score(req, pod) { 1e308 }\n").unwrap();
    let script = path.to_string_lossy().into_owned();
    let scorer = || Scorer {
        plugin: None,
        script: script.clone(),
        weight: 1.0,
        params: BTreeMap::new(),
    };
    let profile = Profile {
        filters: vec![],
        scorers: vec![scorer(), scorer()],
        picker: first(),
    };
    let router = Router::with_profiles(never(), profile.clone(), profile);
    let mut pol = Policies::load(&router, 1, Some(Path::new("lib"))).unwrap();
    let err = pol
        .choose(Role::Decode, &req(100), &[pod(0), pod(1)])
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("the weighted sum of the scores of pod 0 is inf"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hook_parameter_may_be_named_state() {
    // The parameter hides the plugin's `state`, as any parameter hides an
    // outer name: here `state` is the pods, so this picks the last one.
    let (_file, picker) = scratch_plugin(
        "last-picker",
        "fn pick(req, state, scores) {\n    state.len() - 1\n}\n",
    );
    let mut pol = policies(never(), vec![], vec![], picker, 1);
    let pods: Vec<PodView> = (0..3).map(pod).collect();
    assert_eq!(pol.choose(Role::Decode, &req(100), &pods).unwrap(), 2);
}

#[test]
fn the_guide_scenario_runs_on_the_routers_own_bookkeeping() {
    let report = pdsim::run_scenario(
        Path::new("scenarios/llmd_guide_8p2d.ron"),
        &["horizon=120".to_string(), "warmup=20".to_string()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.mean("remote"), Some(1.0), "always-disagg");
    assert!(report.observations["ttft"].count > 20);
}

#[test]
fn hot_swap_from_never_to_always_changes_the_remote_fraction_between_phases() {
    // Never disaggregate until t = 150 s, then always: phase 1's requests are
    // all local, phase 2's all remote.
    let report = pdsim::run_scenario(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &[
            "horizon=300".to_string(),
            "warmup=0".to_string(),
            format!("router.decider.script={}", "scripts/never-disagg-pd-decider.rhai"),
            // The reference decider's parameters do not belong to these.
            "router.decider.params={}".to_string(),
            r#"phases=[{"at": 150.0, "set": {"router.decider.script": "scripts/always-disagg-pd-decider.rhai"}}]"#.to_string(),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.phases.len(), 2);
    let remote = |p: usize| report.phases[p].observations["remote"].clone();
    assert!(remote(0).count > 50 && remote(1).count > 50);
    assert_eq!(remote(0).mean, Some(0.0));
    assert_eq!(remote(1).mean, Some(1.0));
    assert_eq!(report.phases[1].start, 150.0);
}

#[test]
fn a_phase_may_not_change_the_hardware() {
    let err = pdsim::run_scenario(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &[r#"phases=[{"at": 10.0, "set": {"decode.engine.num_gpu_blocks": "2000"}}]"#.to_string()],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot change during a run"), "{err}");
}

#[test]
fn named_plugins_are_expanded_with_their_parameters() {
    let sc = scenario::load(Path::new("scenarios/llmd_guide_8p2d.ron"), &[]).unwrap();
    let r = scenario::expand_plugins(&sc.raw.router).unwrap();
    assert!(
        r.prefill.filters[0]
            .script
            .ends_with("prefix-cache-affinity-filter.rhai")
    );
    assert_eq!(
        r.prefill.filters[0].params["min_match_ratio"],
        ParamValue::Float(0.8)
    );
    // An unknown plugin name is refused with the names that exist.
    let err = scenario::load(
        Path::new("scenarios/llmd_guide_8p2d.ron"),
        &["router.decider.plugin=nope".to_string()],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("plugin `nope`") && err.contains("defines"),
        "{err}"
    );
}

/// docs/policies.md walks through writing a decider; this runs that exact
/// script (the first ```rhai block of the walkthrough).
#[test]
fn the_decider_from_the_docs_works() {
    let doc = std::fs::read_to_string("docs/policies.md").unwrap();
    let start = doc
        .find("\n```rhai\n")
        .expect("a rhai block at the start of a line in docs/policies.md")
        + "\n```rhai\n".len();
    let script = &doc[start..start + doc[start..].find("```").unwrap()];
    assert!(script.lines().count() <= 14, "about ten lines");
    let dir = crate::common::Scratch::new("doc");
    let path = dir.join("busy-decoder-decider.rhai");
    std::fs::write(&path, script).unwrap();

    // By hand: remote when ≥ 4096 uncached tokens, or ≥ 256 uncached and the
    // decoder runs at least 8 requests.
    let decider = Plugin {
        plugin: None,
        script: path.to_string_lossy().into_owned(),
        params: BTreeMap::new(),
    };
    let mut pol = policies(decider, vec![], vec![], first(), 1);
    let mut at = |prompt: i64, cached: i64, running: i64| {
        pol.decide(
            &req(prompt),
            &PodView {
                cached_tokens: cached,
                running,
                ..pod(0)
            },
            None,
        )
        .unwrap()
    };
    assert!(at(5000, 0, 0), "long prompt");
    assert!(!at(5000, 2000, 0), "3000 uncached, idle decoder");
    assert!(at(5000, 2000, 8), "busy decoder");
    assert!(!at(300, 100, 8), "200 uncached: too little to move");

    // And in a run, from the command line's --set.
    let report = pdsim::run_scenario(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &[
            "horizon=200".to_string(),
            "warmup=20".to_string(),
            format!("router.decider.script={}", path.display()),
            "router.decider.params={}".to_string(),
        ],
    )
    .unwrap();
    let remote = report.mean("remote").unwrap();
    assert!(
        remote > 0.0 && remote < 0.5,
        "only some prompts are long: {remote}"
    );
}

fn load_err(sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    scenario::load(Path::new("scenarios/llmd_nixl_pull.ron"), &sets)
        .and_then(|sc| pdsim::Sim::new(&sc).map(|_| ()))
        .expect_err("refused")
        .to_string()
}

#[test]
fn unknown_and_mistyped_parameters_are_refused_with_the_nearest_name() {
    let err = load_err(&["router.decider.params.non_cached_tokenz=3"]);
    assert!(
        err.contains(
            "parameter `non_cached_tokenz` is neither declared in its `DEFAULTS` nor read"
        ) && err.contains("did you mean `non_cached_tokens`?"),
        "{err}"
    );
    let err = load_err(&["router.decider.params.non_cached_tokens=abc"]);
    assert!(
        err.contains(
            "parameter `non_cached_tokens` is a string (abc), but its default is a number (512)"
        ),
        "{err}"
    );
    // An integer where the default is a float (and `inf` where it is an
    // integer) are both numbers: accepted.
    scenario::load(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &["router.decider.params.non_cached_tokens=inf".to_string()],
    )
    .and_then(|sc| pdsim::Sim::new(&sc).map(|_| ()))
    .unwrap();
    // In a phase: refused before the run, naming the phase.
    let err = load_err(&[
        r#"phases=[{"at": 300.0, "set": {"router.decider.params.prompt_tokenz": "9"}}]"#,
    ]);
    assert!(
        err.starts_with("phases.0 (at 300 s): script")
            && err.contains("did you mean `prompt_tokens`?"),
        "{err}"
    );
}

#[test]
fn a_property_typo_is_refused_even_in_a_branch_no_request_takes() {
    let dir = crate::common::Scratch::new("typo");
    let script = dir.join("d.rhai");
    // `pdsim check` of the reference with `text` as its decider: its stderr.
    let check = |text: &str| {
        std::fs::write(&script, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdsim"))
            .args([
                "check",
                "scenarios/llmd_nixl_pull.ron",
                "--set",
                "router.decider.params={}",
                "--set",
            ])
            .arg(format!("router.decider.script={}", script.display()))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // No request of the reference has a million-token prompt.
    let err = check(
        "fn decide(req, pod) {\n    if req.prompt_tokens > 1000000 {\n        pod.runing > 3\n    } else {\n        false\n    }\n}\n",
    );
    assert!(
        err.contains("line 3: hook `decide` reads `.runing`, which a pod does not have (did you mean `running`?)"),
        "{err}"
    );
    // A runtime error in a branch taken by one of check's made-up
    // situations (a busy decoder) is caught by `check`, before a run.
    let err = check(
        "fn decide(req, pod) {\n    if pod.active > 10 {\n        pod.active / 0 > 1\n    } else {\n        false\n    }\n}\n",
    );
    assert!(
        err.contains("hook `decide`, line 3") && err.contains("zero"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_decider_may_see_the_prefill_pods() {
    // Remote only when some prefiller is idle.
    let dir = crate::common::Scratch::new("sees");
    let path = dir.join("idle-prefiller-decider.rhai");
    std::fs::write(
        &path,
        "fn decide(req, pod, prefill_pods) {\n    for p in prefill_pods {\n        if p.active == 0 { return true; }\n    }\n    false\n}\n",
    )
    .unwrap();
    let decider = Plugin {
        plugin: None,
        script: path.to_string_lossy().into_owned(),
        params: BTreeMap::new(),
    };
    let mut pol = policies(decider, vec![], vec![], first(), 1);
    let prefill = |active: &[i64]| -> Vec<PodView> {
        active
            .iter()
            .enumerate()
            .map(|(i, &a)| PodView {
                role: "prefill".into(),
                active: a,
                ..pod(i as i64)
            })
            .collect()
    };
    assert!(
        pol.decide(&req(3000), &pod(0), Some(&prefill(&[2, 0])))
            .unwrap(),
        "prefill-1 is idle"
    );
    assert!(
        !pol.decide(&req(3000), &pod(0), Some(&prefill(&[2, 5])))
            .unwrap(),
        "none idle"
    );
    // In a run: every remote request found an idle prefiller when routed.
    let report = pdsim::run_scenario(
        Path::new("scenarios/llmd_nixl_pull.ron"),
        &[
            "horizon=300".to_string(),
            "warmup=30".to_string(),
            format!("router.decider.script={}", path.display()),
            "router.decider.params={}".to_string(),
        ],
    )
    .unwrap();
    let remote = report.mean("remote").unwrap();
    assert!(
        remote > 0.5 && remote < 1.0,
        "most, not all, find one: {remote}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn per_pod_routing_counts_add_up_in_the_json() {
    let dir = crate::common::Scratch::new("pods");
    let json = dir.join("r.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdsim"))
        .args([
            "run",
            "scenarios/llmd_nixl_pull.ron",
            "--horizon",
            "300",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success());
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let pods = &r["pods"];
    let n = |pod: &str, k: &str| pods[pod][k].as_u64().unwrap();
    // Every routed request went to one decoder; its remote ones also to one
    // prefiller.
    let decoded = n("decode-0", "requests") + n("decode-1", "requests");
    let remote = n("decode-0", "remote") + n("decode-1", "remote");
    let prefilled = n("prefill-0", "requests") + n("prefill-1", "requests");
    assert_eq!(remote, prefilled);
    let c = &r["counters"];
    let refused = c["requests_too_long"].as_u64().unwrap();
    assert_eq!(decoded, c["requests_arrived"].as_u64().unwrap() - refused);
    assert!(String::from_utf8_lossy(&out.stdout).contains("routed (whole run)"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plugins_state_starts_as_its_top_level_leaves_it() {
    let dir = crate::common::Scratch::new("state");
    let path = dir.join("rr.rhai");
    std::fs::write(
        &path,
        "state.n = 5;\n\nfn pick(req, pods, scores) {\n    state.n += 1;\n    state.n % pods.len()\n}\n",
    )
    .unwrap();
    let picker = Plugin {
        plugin: None,
        script: path.to_string_lossy().into_owned(),
        params: BTreeMap::new(),
    };
    let mut pol = policies(
        plugin("always-disagg-pd-decider", BTreeMap::new()),
        vec![],
        vec![],
        picker,
        1,
    );
    let pods: Vec<PodView> = (0..3).map(pod).collect();
    // 6 % 3, 7 % 3, 8 % 3: the counter starts at the top level's 5.
    let picks: Vec<usize> = (0..3)
        .map(|_| pol.choose(Role::Decode, &req(100), &pods).unwrap())
        .collect();
    assert_eq!(picks, vec![0, 1, 2]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_routing_shortcuts_change_no_number_of_a_run() {
    // Hooks in the host's subset are evaluated without rhai, and other
    // hooks that read only their arguments have their answers remembered
    // by what they read (both exact shortcuts): a run with every hook run
    // in rhai on every call must report the same numbers, on the reference
    // policies, on the router's own bookkeeping as the source, with a
    // random tie-break (rhai's), and with a pure decode scorer outside the
    // subset (a range loop: remembered).
    use pdsim::router::{Router, RouterMode};
    use pdsim::sim::Sim;
    let dir = crate::common::Scratch::new("shortcuts");
    let ranged = dir.join("ranged-active-scorer.rhai");
    std::fs::write(
        &ranged,
        "const DEFAULTS = #{ source: \"pods\" };\n\
         fn score_all(req, pods) {\n\
         let s = [];\n\
         for i in 0..pods.len() { s.push(1.0 / (1 + pods[i].active)); }\n\
         s\n}\n",
    )
    .unwrap();
    let ranged_set = format!("router.decode.scorers.0.script={}", ranged.display());
    let cases: [(&str, Vec<&str>); 5] = [
        ("scenarios/llmd_nixl_pull.ron", vec!["horizon=600"]),
        (
            "scenarios/llmd_nixl_pull.ron",
            vec![
                "horizon=400",
                "router.decider.params.source=router",
                "router.decode.scorers.0.params.source=router",
                "router.prefill.scorers.0.params.source=router",
            ],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            vec!["horizon=400", "router.decode.picker.params.ties=random"],
        ),
        (
            "scenarios/llmd_guide_8p2d.ron",
            vec!["horizon=300", "warmup=50"],
        ),
        (
            "scenarios/llmd_nixl_pull.ron",
            vec!["horizon=400", &ranged_set],
        ),
    ];
    for (n, (path, sets)) in cases.iter().enumerate() {
        let sc = crate::common::scenario_with(path, sets);
        let mut remembering = Sim::new(&sc).unwrap();
        let mut plain = Sim::new(&sc).unwrap();
        if let RouterMode::Scripts(p) = &plain.world.non_send::<Router>().mode {
            p.forget_answers();
        }
        let a = remembering.run().unwrap();
        let b = plain.run().unwrap();
        assert_eq!(a.to_json(), b.to_json(), "{path} {sets:?}");
        // The shortcuts were taken: the decode scorer is the host's, or
        // (the range loop) its answers repeat.
        let RouterMode::Scripts(p) = &remembering.world.non_send::<Router>().mode else {
            panic!("scripts route")
        };
        let scorer = &p.decode.scorers[0];
        if n == 4 {
            assert!(
                !scorer.evaluates_directly() && scorer.remembers(),
                "{sets:?}"
            );
        } else {
            assert!(scorer.evaluates_directly(), "{path} {sets:?}");
        }
        assert!(
            a.routing_decisions > 500,
            "{path}: {} decisions",
            a.routing_decisions
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
