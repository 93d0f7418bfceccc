//! From the raw scenario to the one a run uses: script paths resolved,
//! plugin references expanded, every number checked; an impossible
//! scenario is refused with a sentence saying why.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result, num};
use crate::hardware::presets;
use crate::scenario::{
    Dispatch, EngineSemantics, Fault, ParamValue, RawScenario, Router, Scenario, TransferMode,
    apply_override, pools, workload,
};

/// Script and trace paths written in a file are relative to that file's folder.
pub(crate) fn resolve_paths(raw: &mut RawScenario, dir: &Path) {
    let fix = |s: &mut String| {
        let p = Path::new(s.as_str());
        if !s.is_empty() && p.is_relative() {
            *s = dir.join(p).to_string_lossy().into_owned();
        }
    };
    if let Some(t) = &mut raw.workload.trace {
        fix(&mut t.file);
    }
    for pool in [&mut raw.prefill, &mut raw.decode] {
        if let Some(f) = &mut pool.cost.file {
            fix(f);
        }
        for v in [&mut pool.model, &mut pool.gpu].into_iter().flatten() {
            if presets::is_path(v) {
                fix(v);
            }
        }
    }
    let r = &mut raw.router;
    r.plugins.values_mut().for_each(|p| fix(&mut p.script));
    fix(&mut r.decider.script);
    for profile in [&mut r.decode, &mut r.prefill] {
        profile.filters.iter_mut().for_each(|f| fix(&mut f.script));
        profile.scorers.iter_mut().for_each(|f| fix(&mut f.script));
        fix(&mut profile.picker.script);
    }
    // A phase that swaps a script names it relative to this file too.
    for phase in &mut raw.phases {
        for (path, value) in phase.set.iter_mut() {
            if path.ends_with("script") {
                fix(value);
            }
        }
    }
}

/// The router with every plugin reference replaced by its script and
/// parameters (entry parameters merged over the named plugin's).
pub fn expand_plugins(router: &Router) -> Result<Router> {
    let mut out = router.clone();
    let expand = |what: &str,
                  plugin: &Option<String>,
                  script: &mut String,
                  params: &mut BTreeMap<String, ParamValue>|
     -> Result<()> {
        if let Some(name) = plugin {
            let named = router.plugins.get(name).ok_or_else(|| {
                let known: Vec<String> = router.plugins.keys().map(|k| format!("`{k}`")).collect();
                Error::new(format!(
                    "{what} refers to plugin `{name}`, which router.plugins does not define (it defines {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ))
            })?;
            if script.is_empty() {
                *script = named.script.clone();
            }
            let mut merged = named.params.clone();
            merged.extend(std::mem::take(params));
            *params = merged;
        }
        if script.is_empty() {
            return Err(Error::new(format!(
                "{what} names neither a `script` nor a `plugin`"
            )));
        }
        Ok(())
    };
    let d = &mut out.decider;
    expand("router.decider", &d.plugin, &mut d.script, &mut d.params)?;
    for (role, profile) in [("decode", &mut out.decode), ("prefill", &mut out.prefill)] {
        for (i, f) in profile.filters.iter_mut().enumerate() {
            expand(
                &format!("router.{role}.filters.{i}"),
                &f.plugin,
                &mut f.script,
                &mut f.params,
            )?;
        }
        for (i, s) in profile.scorers.iter_mut().enumerate() {
            expand(
                &format!("router.{role}.scorers.{i}"),
                &s.plugin,
                &mut s.script,
                &mut s.params,
            )?;
        }
        let p = &mut profile.picker;
        expand(
            &format!("router.{role}.picker"),
            &p.plugin,
            &mut p.script,
            &mut p.params,
        )?;
    }
    Ok(out)
}

/// The longest horizon accepted (a synthetic workload never ends on its own).
pub const MAX_HORIZON: f64 = 1e9;
/// Network and control-plane delays, seconds.
pub const MAX_DELAY: f64 = 3600.0;
/// Pods per role.
pub const MAX_PODS: u32 = 10_000;
/// KV blocks per pod: 2^24, beyond any GPU (an H200's 141 GB at Llama-3.1-8B's
/// 128 KiB per token holds about 70 000 blocks of 16 tokens).
pub const MAX_BLOCKS_PER_POD: u32 = 1 << 24;
/// What a KV block costs pdsim's memory (its entry in the pool and its slot
/// in the prefix index; the engine asserts it at compile time).
pub const KV_BYTES_PER_BLOCK: u64 = 44;
/// Memory the KV pools' bookkeeping may take, in all.
pub const MAX_KV_BYTES: u64 = 8 << 30;
/// Requests a synthetic workload may issue over a run (the reference issues
/// about 5 a second).
pub const MAX_REQUESTS: f64 = 1e8;
const GIB: f64 = (1u64 << 30) as f64;

/// Checks every number a run depends on; refuses impossible scenarios with
/// a sentence saying why.
pub fn resolve(raw: RawScenario, source: &Path) -> Result<Scenario> {
    let mut problems = workload::problems(&raw.workload);
    let mut need = |ok: bool, msg: String| {
        if !ok {
            problems.push(msg);
        }
    };
    let finite_pos = |x: f64| x.is_finite() && x > 0.0;
    let finite_nonneg = |x: f64| x.is_finite() && x >= 0.0;

    let trace = raw.workload.trace.is_some();
    need(
        raw.horizon > 0.0 && (raw.horizon.is_finite() || trace),
        format!(
            "horizon must be a positive number of seconds{}, got {}",
            if trace {
                " or inf (until the trace is served)"
            } else {
                " (inf only with a trace workload, which ends)"
            },
            raw.horizon
        ),
    );
    need(
        raw.horizon <= MAX_HORIZON || raw.horizon.is_infinite(),
        format!(
            "horizon {} s is more than {MAX_HORIZON:e} s (about 32 years) of simulated time: \
             at the reference's speed that is days of wall time; give a shorter horizon",
            raw.horizon
        ),
    );
    need(
        finite_nonneg(raw.warmup) && raw.warmup < raw.horizon,
        format!(
            "warmup must be at least 0 and below the horizon ({}), got {}",
            raw.horizon, raw.warmup
        ),
    );
    for (role, pool) in [("prefill", &raw.prefill), ("decode", &raw.decode)] {
        let e = &pool.engine;
        need(pool.count > 0, format!("{role}.count must be at least 1"));
        need(
            e.block_size > 0,
            format!("{role}.engine.block_size must be at least 1"),
        );
        need(
            e.max_num_seqs > 0,
            format!("{role}.engine.max_num_seqs must be at least 1"),
        );
        need(
            e.max_num_batched_tokens > 0,
            format!("{role}.engine.max_num_batched_tokens must be at least 1"),
        );
        need(
            e.max_model_len > 1,
            format!("{role}.engine.max_model_len must be at least 2"),
        );
    }
    let lib_dir = lib_dir_of(&raw, source);
    let lib = lib_dir.as_deref();
    let prefill = pools::resolve_pool("prefill", &raw.prefill, lib, &mut problems);
    let decode = pools::resolve_pool("decode", &raw.decode, lib, &mut problems);
    let plans = pools::finish(
        [
            ("prefill", &raw.prefill, prefill),
            ("decode", &raw.decode, decode),
        ],
        &mut problems,
    );
    let mut need = |ok: bool, msg: String| {
        if !ok {
            problems.push(msg);
        }
    };
    // What the machine can hold and the clock can resolve: refused with the
    // bound rather than discovered by the allocator or a run that never ends.
    for (role, pool) in [("prefill", &raw.prefill), ("decode", &raw.decode)] {
        need(
            pool.count <= MAX_PODS,
            format!(
                "{role}.count {} is more than {MAX_PODS} pods: the router scores every candidate pod \
                 for every request, and each pod keeps its own KV pool",
                pool.count
            ),
        );
    }
    if let Some(plans) = &plans {
        let mut bytes = 0u64;
        for ((role, pool), plan) in [("prefill", &raw.prefill), ("decode", &raw.decode)]
            .into_iter()
            .zip(plans)
        {
            need(
                plan.num_gpu_blocks <= MAX_BLOCKS_PER_POD,
                format!(
                    "{role}.engine.num_gpu_blocks {} is more than {MAX_BLOCKS_PER_POD} (2^24) blocks: no GPU \
                     holds that much KV ({} tokens at {} tokens a block)",
                    plan.num_gpu_blocks,
                    u64::from(plan.num_gpu_blocks) * u64::from(pool.engine.block_size),
                    pool.engine.block_size
                ),
            );
            // Token counts (a pool's, a request's) are 32-bit: a pool that
            // holds more tokens would overflow them.
            let tokens = u64::from(plan.num_gpu_blocks) * u64::from(pool.engine.block_size);
            need(
                tokens <= u64::from(u32::MAX),
                format!(
                    "{role}.engine: {} blocks of {} tokens hold {tokens} tokens, more than the \
                     2^32 - 1 tokens pdsim counts in one pool: use fewer or smaller blocks",
                    plan.num_gpu_blocks, pool.engine.block_size
                ),
            );
            bytes += u64::from(pool.count) * u64::from(plan.num_gpu_blocks) * KV_BYTES_PER_BLOCK;
        }
        need(
            bytes <= MAX_KV_BYTES,
            format!(
                "the KV pools would take {:.1} GiB of memory to simulate (pods × \
                 num_gpu_blocks × {} B a block), more than the {} GiB pdsim allows itself: use fewer \
                 pods or blocks (larger blocks: block_size)",
                bytes as f64 / GIB,
                KV_BYTES_PER_BLOCK,
                MAX_KV_BYTES as f64 / GIB
            ),
        );
    }
    if raw.workload.trace.is_none() && raw.horizon.is_finite() {
        let mut workloads = vec![("workload".to_string(), raw.workload.clone())];
        for (i, p) in raw.phases.iter().enumerate() {
            let sets: Vec<String> = p.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if sets.iter().any(|s| s.starts_with("workload.")) {
                let mut r = raw.clone();
                for s in &sets {
                    if let Ok(next) = apply_override(&r, s) {
                        r = next;
                    }
                }
                workloads.push((format!("phases.{i}"), r.workload));
            }
        }
        for (what, w) in &workloads {
            let s = workload::Sessions::of(w);
            if !(s.session_rate.is_finite() && s.session_rate > 0.0) {
                continue; // refused above
            }
            let p = s.continue_probability;
            let turns = if p < 1.0 {
                1.0 / (1.0 - p)
            } else {
                f64::INFINITY
            }
            .min(1.0 + raw.horizon / s.tool_time_mean);
            let requests = s.session_rate * raw.horizon * turns;
            need(
                requests <= MAX_REQUESTS,
                format!(
                    "{what}: about {requests:.2e} requests in the run (session_rate {} per s × horizon {} s × \
                     {turns:.2} turns a session); more than {MAX_REQUESTS:e} is refused: arrivals that \
                     close together outrun any deployment and the simulated clock, and every request \
                     waiting is kept in memory; lower the rate or the horizon",
                    num(s.session_rate),
                    num(raw.horizon)
                ),
            );
        }
    }
    // A NIC so slow that one request's KV takes hours to move is a typo (a
    // unit), and would have leases renewed by heartbeats for ages.
    if let Some(plans) = &plans {
        for ((role, pool), plan) in [("prefill", &raw.prefill), ("decode", &raw.decode)]
            .into_iter()
            .zip(plans)
        {
            let read = f64::from(pool.engine.max_model_len) / plan.nic_tokens_per_s;
            need(
                read <= MAX_DELAY,
                format!(
                    "{role}.nic: {} KV tokens per second would take {} s to move one max_model_len \
                     ({}) request, more than an hour; is its unit right?",
                    num(plan.nic_tokens_per_s),
                    num(read),
                    pool.engine.max_model_len
                ),
            );
        }
    }
    // vLLM accepts a pool exactly max_model_len large, but its null block
    // leaves one block fewer: a prompt that long would never be admitted.
    if raw.engine_semantics == EngineSemantics::Vllm033
        && let Some(plans) = &plans
    {
        for ((role, pool), plan) in [("prefill", &raw.prefill), ("decode", &raw.decode)]
            .into_iter()
            .zip(plans)
        {
            let e = &pool.engine;
            let usable = u64::from(plan.num_gpu_blocks.saturating_sub(1)) * u64::from(e.block_size);
            need(
                usable >= u64::from(e.max_model_len),
                format!(
                    "{role}.engine: with engine_semantics: Vllm033 the KV pool ({} blocks × {} tokens, one of \
                     them vLLM's null block) holds {usable} tokens, fewer than max_model_len ({}): vLLM starts, \
                     but a prompt of max_model_len tokens would wait forever; give it one more block",
                    plan.num_gpu_blocks, e.block_size, e.max_model_len
                ),
            );
        }
    }
    need(
        raw.prefill.engine.max_model_len == raw.decode.engine.max_model_len,
        format!(
            "prefill and decode must serve the same max_model_len (got {} and {})",
            raw.prefill.engine.max_model_len, raw.decode.engine.max_model_len
        ),
    );
    for (name, v) in [
        ("ttft", raw.slo.ttft),
        ("tpot", raw.slo.tpot),
        ("e2e", raw.slo.e2e),
    ] {
        if let Some(v) = v {
            need(
                finite_pos(v),
                format!("slo.{name} must be a positive number of seconds, got {v}"),
            );
        }
    }
    // Delays of the network and the control plane: at most an hour (a run
    // would otherwise tick through heartbeats and retries for ages).
    for (name, v) in [
        ("transfer.latency", raw.transfer.latency),
        ("transfer.notify_latency", raw.transfer.notify_latency),
        (
            "router.prefill_retry_backoff",
            raw.router.prefill_retry_backoff,
        ),
        ("router.detection_delay", raw.router.detection_delay),
        ("client.backoff", raw.client.backoff),
    ] {
        need(
            finite_nonneg(v) && v <= MAX_DELAY,
            format!(
                "{name} must be a number of seconds from 0 to {MAX_DELAY} (an hour), got {}",
                num(v)
            ),
        );
    }
    let lease = &raw.transfer.lease;
    need(
        finite_pos(lease.duration),
        format!(
            "transfer.lease.duration must be a positive number of seconds, got {}",
            lease.duration
        ),
    );
    need(
        !lease.heartbeats || lease.duration >= 6.0,
        format!(
            "transfer.lease.duration must be at least 6 s with heartbeats (vLLM heartbeats every duration // 6 s), got {}",
            lease.duration
        ),
    );
    need(
        raw.router.dispatch == Dispatch::Serial || raw.transfer.mode == TransferMode::NixlPush,
        format!(
            "router.dispatch: Parallel needs transfer.mode: NixlPush (with {:?} the decoder needs the prefiller's answer before it can take the KV)",
            raw.transfer.mode
        ),
    );
    // The pods' names, listed only when few (a count may be absurd: refused above).
    let exists = |pod: &str| {
        let (role, index) = pod.split_once('-').unwrap_or((pod, ""));
        let count = match role {
            "prefill" => raw.prefill.count,
            "decode" => raw.decode.count,
            _ => 0,
        };
        index
            .parse::<u32>()
            .is_ok_and(|i| i < count && index == i.to_string())
    };
    let pods: Vec<String> = (0..raw.prefill.count.min(64))
        .map(|i| format!("prefill-{i}"))
        .chain((0..raw.decode.count.min(64)).map(|i| format!("decode-{i}")))
        .collect();
    for (i, f) in raw.faults.iter().enumerate() {
        let (at, duration) = f.window();
        need(
            finite_nonneg(at),
            format!("faults.{i}.at must be a finite number >= 0, got {at}"),
        );
        need(
            finite_pos(duration),
            format!("faults.{i}.duration must be a positive number of seconds, got {duration}"),
        );
        match f {
            Fault::PodDown { pod, .. } | Fault::NicSlow { pod, .. } if !exists(pod) => {
                let hint = crate::error::suggest(pod, pods.iter().map(String::as_str))
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                need(
                    false,
                    format!(
                        "faults.{i}: there is no pod `{pod}`{hint}; the pods are {}",
                        pods.join(", ")
                    ),
                );
            }
            Fault::NicSlow { factor, .. } => need(
                finite_pos(*factor),
                format!("faults.{i}.factor must be a positive number, got {factor}"),
            ),
            Fault::HeartbeatLoss { probability, .. }
            | Fault::PrefillAnswerLost { probability, .. } => need(
                (0.0..=1.0).contains(probability),
                format!("faults.{i}.probability must be in [0, 1], got {probability}"),
            ),
            _ => {}
        }
    }
    for (name, profile) in [
        ("decode", &raw.router.decode),
        ("prefill", &raw.router.prefill),
    ] {
        for (i, s) in profile.scorers.iter().enumerate() {
            need(
                s.weight.is_finite(),
                format!(
                    "router.{name}.scorers.{i}.weight must be finite, got {}",
                    s.weight
                ),
            );
        }
    }
    if let Err(e) = expand_plugins(&raw.router) {
        need(false, e.to_string());
    }
    let mut last_at = 0.0;
    for (i, p) in raw.phases.iter().enumerate() {
        need(
            p.at.is_finite() && p.at >= last_at,
            format!(
                "phases.{i}.at must be finite and not before the previous phase, got {}",
                p.at
            ),
        );
        last_at = p.at;
        for (path, value) in &p.set {
            let routing_only = [
                "router.dispatch",
                "router.detection_delay",
                "router.prefill_",
            ];
            if !(path.starts_with("router.") || path.starts_with("workload."))
                || path.starts_with("workload.trace")
                || routing_only.iter().any(|p| path.starts_with(p))
            {
                need(
                    false,
                    format!(
                        "phases.{i}: `{path}` cannot change during a run (a phase may change the router's plugins and profiles and the synthetic workload.*)"
                    ),
                );
                continue;
            }
            if let Err(e) = apply_override(&raw, &format!("{path}={value}")) {
                need(false, format!("phases.{i}: {e}"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(Error::new(format!(
            "{}: scenario refused:\n  - {}",
            source.display(),
            problems.join("\n  - ")
        )));
    }
    let pools = plans.expect("pools resolve when nothing was refused");
    Ok(Scenario {
        lib_dir,
        raw,
        source: source.to_path_buf(),
        pools,
    })
}

/// Shared script modules and presets: `lib/` beside the scenario's folder,
/// else beside the folder of the scripts it uses, else in the current
/// directory.
fn lib_dir_of(raw: &RawScenario, source: &Path) -> Option<std::path::PathBuf> {
    let scenario_dir = source.parent().unwrap_or(Path::new("."));
    let script_dir = Path::new(&raw.router.decider.script)
        .parent()
        .map(Path::to_path_buf);
    [
        Some(scenario_dir.join("../lib")),
        script_dir.map(|d| d.join("../lib")),
        Some("lib".into()),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::REFERENCE;
    use crate::scenario::parse;

    #[test]
    fn impossible_scenarios_are_refused_with_a_reason() {
        let raw = parse(REFERENCE, Path::new("ref.ron")).unwrap();
        let small = apply_override(&raw, "decode.engine.num_gpu_blocks=100").unwrap();
        let err = resolve(small, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("smaller than max_model_len"), "{err}");
        let neg = apply_override(&raw, "workload.session_rate=-1").unwrap();
        let err = resolve(neg, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("session_rate must be positive"), "{err}");
        let zero = apply_override(&raw, "prefill.count=0").unwrap();
        let err = resolve(zero, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("prefill.count must be at least 1"), "{err}");
        let err = apply_override(&raw, "decode.count=-2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("decode.count"), "{err}");
    }
}
