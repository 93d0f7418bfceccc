//! The replay: the trace through one engine or one P/D pair without a
//! router, every step recorded; then per engine its steps and requests in
//! the oracle's shape.

use bevy_ecs::prelude::*;
use std::collections::HashMap;
use std::path::Path;

use crate::engine::record::{FinishedRequests, StepRecorder};
use crate::engine::{Engine, Request, Role};
use crate::error::{Error, Result};
use crate::replay::report::{EngineReport, RemoteRow, ReplayReport, RequestRow, StepRow};
use crate::replay::trace::{Mode, Trace};
use crate::router::RouterMode;
use crate::shared::EngineIndex;
use crate::sim::{Sim, SimSystems};

/// A step's entry: (request, tokens, tokens computed before the step).
type Scheduled = (u64, u32, u32);

/// What the replay observes beside the step recorder: per formed step, each
/// scheduled request's computed tokens before the step; when each remote
/// request was first parked (read off the requests after the run: a scan
/// of every request each tick would make a long trace quadratic).
#[derive(Resource, Default)]
struct ReplayLog {
    generation: HashMap<Entity, u32>,
    /// Steps in formation order.
    formed: Vec<(Entity, Vec<Scheduled>)>,
    parked: HashMap<u64, f64>,
}

fn observe_replay(
    index: Res<EngineIndex>,
    engines: Query<&Engine>,
    reqs: Query<&Request>,
    mut log: ResMut<ReplayLog>,
) {
    for &e in index.all() {
        let engine = engines.get(e).expect("engine");
        let seen = log.generation.insert(e, engine.generation);
        if seen.unwrap_or(0) == engine.generation || engine.is_idle() {
            continue;
        }
        let entries = engine
            .step
            .iter()
            .map(|&(id, n)| {
                let r = reqs.get(id).expect("scheduled request");
                (r.id, n, r.computed)
            })
            .collect();
        log.formed.push((e, entries));
    }
}

/// Replays a trace file (with `--set` overrides on the scenario it builds).
pub fn replay_file(path: &Path, overrides: &[String]) -> Result<ReplayReport> {
    let trace = Trace::load(path)?;
    replay(&trace, path, overrides)
}

pub fn replay(trace: &Trace, source: &Path, overrides: &[String]) -> Result<ReplayReport> {
    let mode = trace.mode()?;
    let sc = trace.scenario(source, overrides)?;
    let requests = trace.requests(source)?;
    let names: Vec<String> = requests.iter().map(|r| r.name.clone()).collect();
    let arrivals: Vec<f64> = requests
        .iter()
        .map(|r| r.arrival.expect("a replay trace is open loop"))
        .collect();
    let prompts: Vec<u32> = requests.iter().map(|r| r.prompt).collect();
    let mut sim = Sim::with_trace(&sc, RouterMode::Direct, requests)?;
    sim.record();
    sim.world.insert_resource(ReplayLog::default());
    sim.add_systems(observe_replay.after(SimSystems::Observe));
    sim.run()?;
    let index = sim.world.resource::<EngineIndex>().clone();
    let finished = sim
        .world
        .remove_resource::<FinishedRequests>()
        .expect("recording")
        .0;
    let recorded = sim
        .world
        .remove_resource::<StepRecorder>()
        .expect("recording")
        .steps;
    let mut log = sim
        .world
        .remove_resource::<ReplayLog>()
        .expect("replay log");
    let live: Vec<(u64, f64)> = sim
        .world
        .query::<&Request>()
        .iter(&sim.world)
        .filter_map(|r| Some((r.id, r.parked_at?)))
        .collect();
    log.parked = finished
        .iter()
        .filter_map(|r| Some((r.id, r.parked_at?)))
        .chain(live)
        .collect();
    if recorded.len() != log.formed.len() {
        return Err(Error::new(format!(
            "internal: {} steps recorded, {} observed",
            recorded.len(),
            log.formed.len()
        )));
    }
    let finished: HashMap<u64, Request> = finished.into_iter().map(|r| (r.id, r)).collect();
    let name = |id: u64| names[id as usize].clone();
    let by_name: HashMap<&str, u64> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u64))
        .collect();

    // Per engine: its steps, and per step the computed tokens before it.
    let mut per_engine: HashMap<Entity, Vec<(StepRow, Vec<u32>)>> = HashMap::new();
    for (rec, (e, entries)) in recorded.iter().zip(&log.formed) {
        debug_assert_eq!(rec.engine, *e);
        debug_assert!(
            rec.scheduled
                .iter()
                .zip(entries)
                .all(|(&(a, n), &(b, m, _))| a == b && n == m)
        );
        let steps = per_engine.entry(rec.engine).or_default();
        let row = StepRow {
            step: steps.len(),
            start: rec.start,
            end: rec.end,
            scheduled: rec.scheduled.iter().map(|&(id, n)| (name(id), n)).collect(),
            preempted: rec.preempted.iter().map(|&id| name(id)).collect(),
            kv_blocks_held: rec.kv_blocks_held,
        };
        steps.push((row, entries.iter().map(|e| e.2).collect()));
    }
    let x0 = sc.raw.transfer.latency;
    let max_model_len = sc.raw.decode.engine.max_model_len;
    let parallel = sc.raw.router.dispatch == crate::scenario::Dispatch::Parallel;
    let empty = Vec::new();
    let engine_report = |e: Entity, role: Role| -> EngineReport {
        let steps = per_engine.get(&e).unwrap_or(&empty);
        let order: Vec<u64> = match (mode, role) {
            // Requests reach this engine at their trace arrival, in trace order.
            (Mode::Single, _) | (Mode::Pd, Role::Prefill) => (0..names.len() as u64).collect(),
            // The decoder gets a request when the prefiller answers: those
            // that finished, or that it scheduled or parked.
            (Mode::Pd, Role::Decode) => {
                // (And those refused: listed by both engines, as the oracle does.)
                let mut ids: Vec<u64> = finished.keys().copied().collect();
                ids.extend(
                    (0..names.len() as u64).filter(|&i| prompts[i as usize] >= max_model_len),
                );
                ids.extend(log.parked.keys().copied());
                for (s, _) in steps {
                    ids.extend(s.scheduled.iter().map(|(n, _)| by_name[n.as_str()]));
                }
                ids.sort_unstable();
                ids.dedup();
                ids
            }
        };
        let prefiller = mode == Mode::Pd && role == Role::Prefill;
        let requests = request_rows(
            &order,
            &names,
            &prompts,
            &arrivals,
            steps,
            mode == Mode::Pd && role == Role::Decode,
            prefiller,
            &finished,
            &log,
            parallel,
            max_model_len,
        );
        EngineReport {
            requests,
            steps: steps.iter().map(|(s, _)| s.clone()).collect(),
        }
    };
    let decode = engine_report(index.decode[0], Role::Decode);
    let prefill = (mode == Mode::Pd).then(|| engine_report(index.prefill[0], Role::Prefill));
    let mut report = ReplayReport {
        mode,
        decode,
        prefill,
        x0,
    };
    if let Some(p) = report.prefill.as_ref().filter(|_| !parallel) {
        // As the oracle submits decode legs: when their prefill finished, in
        // the order the prefiller's step listed them.
        let keys: HashMap<&str, (f64, usize, usize)> = p
            .requests
            .iter()
            .filter_map(|r| {
                let s = r.finish_step?;
                let pos = p.steps[s].scheduled.iter().position(|x| x.0 == r.id)?;
                Some((r.id.as_str(), (r.finish_time?, s, pos)))
            })
            .collect();
        let key = |id: &str| {
            keys.get(id)
                .copied()
                .unwrap_or((f64::INFINITY, usize::MAX, usize::MAX))
        };
        report.decode.requests.sort_by(|a, b| {
            let (ka, kb) = (key(&a.id), key(&b.id));
            ka.0.total_cmp(&kb.0)
                .then(ka.1.cmp(&kb.1))
                .then(ka.2.cmp(&kb.2))
        });
    }
    Ok(report)
}

/// The request rows of one engine, in `order`, from its steps (one pass).
#[allow(clippy::too_many_arguments)]
fn request_rows(
    order: &[u64],
    names: &[String],
    prompts: &[u32],
    arrivals: &[f64],
    steps: &[(StepRow, Vec<u32>)],
    decoder_of_pd: bool,
    prefiller: bool,
    finished: &HashMap<u64, Request>,
    log: &ReplayLog,
    parallel: bool,
    max_model_len: u32,
) -> Vec<RequestRow> {
    let mut rows: Vec<RequestRow> = order
        .iter()
        .map(|&id| RequestRow {
            id: names[id as usize].clone(),
            arrival_time: arrivals[id as usize],
            first_scheduled_step: None,
            prefix_hit: None,
            first_token_step: None,
            first_token_time: None,
            finish_step: None,
            finish_time: None,
            preemptions: 0,
            remote: None,
            // vLLM's input processor refuses a prompt that leaves no room
            // for an output token; so does pdsim's workload (docs/model.md §3).
            refused: prompts[id as usize] >= max_model_len,
        })
        .collect();
    let at: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(k, &id)| (names[id as usize].as_str(), k))
        .collect();
    for (i, (s, computed)) in steps.iter().enumerate() {
        for p in &s.preempted {
            if let Some(&k) = at.get(p.as_str()) {
                rows[k].preemptions += 1;
            }
        }
        for ((name, n), &before) in s.scheduled.iter().zip(computed) {
            let Some(&k) = at.get(name.as_str()) else {
                continue;
            };
            let prompt = prompts[order[k] as usize];
            let row = &mut rows[k];
            if row.first_scheduled_step.is_none() {
                row.first_scheduled_step = Some(i);
                row.prefix_hit = Some(before);
            }
            // Before its first token a request knows only its prompt: the
            // step that completes the prompt samples the first token.
            if row.first_token_step.is_none() && before + n >= prompt {
                row.first_token_step = Some(i);
                row.first_token_time = Some(s.end);
            }
            // Its last step is the one that sampled its last token (on a
            // prefiller, the first token is the last).
            row.finish_step = Some(i);
            row.finish_time = Some(s.end);
        }
    }
    for (row, &id) in rows.iter_mut().zip(order) {
        let done = finished.get(&id);
        if decoder_of_pd {
            // The decode leg arrives when the prefiller answers (with
            // parallel dispatch, with the prefill leg); its prefix hit is the
            // decoder's local hit at parking (its first scheduled step starts
            // from prompt − 1 computed tokens).
            if !parallel && !row.refused {
                row.arrival_time = done.and_then(|r| r.t1).unwrap_or(f64::NAN);
            }
            row.prefix_hit = done.and_then(|r| r.prefix_hit);
            if let Some(&parked) = log.parked.get(&id) {
                row.remote = Some(RemoteRow {
                    parked_time: parked,
                    remote_tokens: done.map_or(0, |r| r.remote_tokens),
                    read_start: done.and_then(|r| r.read_started_at).unwrap_or(f64::NAN),
                    read_done: done.and_then(|r| r.read_done_at),
                });
            }
        }
        // A prefill leg is done with its first token; other legs when the
        // request finished.
        let leg_done = match prefiller {
            true => row.first_token_step.is_some(),
            false => done.is_some(),
        };
        if !leg_done {
            // Never finished: no finish to report.
            row.finish_step = None;
            row.finish_time = None;
        }
    }
    rows
}
