//! The engines' systems in the tick: apply the steps that end now
//! (`StepEnd`), form the next step of every idle engine with new work
//! (`StepStart`).

use bevy_ecs::prelude::*;

use crate::engine::kv::BlockPool;
use crate::engine::record::{StepRecord, StepRecorder};
use crate::engine::request::{Leg, Request, RequestStore};
use crate::engine::{Engine, KvPool, StepLog};
use crate::error::Error;
use crate::shared::{
    Agenda, Clock, EngineIndex, Event, Finished, Handoffs, Parked, RunStatus, TickEvents,
};

/// Scratch log shared by the step systems.
#[derive(Resource, Default, Debug)]
pub struct StepScratch {
    pub log: StepLog,
    /// For the loop's fast ticks: the engines, by position in
    /// [`EngineIndex::all`], that may form a step or cut a run (something
    /// reached them since their last look, or their step just ended). The
    /// others are as the tick before left them, so a fast tick does not
    /// look them up. A look unmarks an engine even when it stays dirty: it
    /// is then busy, its run cut already or not to be cut, and until its
    /// step ends another look changes nothing (the cut falls at the same
    /// step end).
    pub(crate) may_start: Vec<bool>,
}

/// System: apply steps that end now. Answered prefill legs go to the
/// sidecar ([`Handoffs`]), finished requests to their retirement
/// ([`Finished`]).
pub fn step_end_system(
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    mut reqs: Query<&mut Request>,
    mut scratch: ResMut<StepScratch>,
    mut handoffs: ResMut<Handoffs>,
    mut finished: ResMut<Finished>,
) {
    end_steps(
        clock.now,
        &events,
        &mut engines,
        &mut reqs,
        &mut scratch,
        &mut handoffs,
        &mut finished,
    );
}

/// What [`step_end_system`] does (the loop's fast tick calls it too).
pub(crate) fn end_steps(
    now: f64,
    events: &TickEvents,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    reqs: &mut impl RequestStore,
    scratch: &mut StepScratch,
    handoffs: &mut Handoffs,
    finished: &mut Finished,
) {
    for &(e, generation) in &events.step_ends {
        let (mut engine, mut kv) = engines.get_mut(e).expect("engine");
        if engine.generation != generation {
            continue; // a run of repeated steps was cut short: booked anew
        }
        let log = &mut scratch.log;
        log.clear();
        // (A run continued past a block boundary finishes no request.)
        if engine.finish_continued(now, &mut kv.0, reqs) {
            continue;
        }
        engine.finish_step(now, &mut kv.0, reqs, log);
        for &id in &log.finished {
            match reqs.req(id).leg {
                Leg::Prefill => handoffs.queue.push(id),
                Leg::Decode => finished.queue.push(id),
            }
        }
    }
}

/// The sentence for a queue whose head can never be admitted: a run would
/// otherwise go on with that engine stalled for good.
fn never_fits(engine: &Engine, kv: &BlockPool, r: &Request, now: f64) -> Error {
    let bs = kv.block_size();
    let tokens = r.known_tokens();
    let null = if kv.has_null_block() {
        " (one more is vLLM 0.33's null block)"
    } else {
        ""
    };
    Error::new(format!(
        "{}-{} stalled at t = {now:.6} s: request {} (session {}, turn {}) at the head of its queue needs \
         {} blocks of {bs} tokens for its {tokens} tokens, and the pool has {} usable{null}: it can never \
         be admitted, and every request behind it would wait forever; give the pool more blocks \
         or lower max_model_len",
        engine.role.name(),
        engine.index,
        r.id,
        r.session,
        r.turn,
        tokens.div_ceil(bs),
        kv.num_blocks(),
    ))
}

/// System: every idle engine with new work forms its next step.
#[allow(clippy::too_many_arguments)]
pub fn step_start_system(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    mut reqs: Query<&mut Request>,
    mut scratch: ResMut<StepScratch>,
    mut agenda: ResMut<Agenda>,
    mut parked: ResMut<Parked>,
    mut recorder: Option<ResMut<StepRecorder>>,
    mut status: ResMut<RunStatus>,
) {
    start_steps(
        clock.now,
        &index,
        &mut engines,
        &mut reqs,
        &mut scratch,
        &mut agenda,
        &mut parked,
        recorder.as_deref_mut(),
        &mut status,
        false,
        |_, _, _| {},
    );
}

/// What [`step_start_system`] does (the loop's fast tick calls it too),
/// with `after` shown each engine, prefillers then decoders, once its step
/// is formed (the fast tick reads the gauges' inputs on the same look-up).
/// With `only_marked`, only the engines `scratch.may_start` marks are
/// looked at (and shown), and each is unmarked: an engine that is not
/// dirty forms nothing and changes nothing here, nor does one left dirty by
/// a look (busy: its run is cut at the first step end at or after the
/// look, which a later look finds again) until its step ends.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_steps(
    now: f64,
    index: &EngineIndex,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    reqs: &mut impl RequestStore,
    scratch: &mut StepScratch,
    agenda: &mut Agenda,
    parked: &mut Parked,
    mut recorder: Option<&mut StepRecorder>,
    status: &mut RunStatus,
    only_marked: bool,
    mut after: impl FnMut(usize, &Engine, &KvPool),
) {
    for (k, &e) in index.all().enumerate() {
        if only_marked && !scratch.may_start[k] {
            debug_assert!(
                {
                    let engine = engines.get(e).expect("engine").0;
                    !engine.dirty || !engine.is_idle()
                },
                "an unmarked engine is dirty and idle (nothing left it busy)"
            );
            continue;
        }
        let (mut engine, mut kv) = engines.get_mut(e).expect("engine");
        'engine: {
            if !engine.dirty {
                break 'engine;
            }
            let log = &mut scratch.log;
            log.clear();
            if !engine.is_idle() {
                // Something reached an engine running repeated decode steps:
                // cut the run at the first step boundary at or after now.
                match engine.cut_run(now) {
                    Some(end) if end > now => {
                        let generation = engine.generation;
                        agenda.schedule(end, Event::StepEnd(e, generation));
                        break 'engine;
                    }
                    Some(_) => {
                        // The boundary is now: end the run here and form the next
                        // step at once, as the step-by-step tick would.
                        engine.finish_step(now, &mut kv.0, reqs, log);
                        debug_assert!(log.finished.is_empty() && log.first_tokens.is_empty());
                        log.clear();
                    }
                    None => break 'engine,
                }
            }
            // The same step again after a continued run's block boundary,
            // where nothing else changed; else formed anew.
            let end = match engine.continues() {
                true => engine.continue_run(now, &mut kv.0, reqs),
                false => None,
            }
            .or_else(|| engine.start_step(now, &mut kv.0, reqs, log));
            if let Some(id) = log.never_fits
                && status.error.is_none()
            {
                status.error = Some(never_fits(&engine, &kv.0, reqs.req(id), now));
            }
            parked.queue.extend_from_slice(&log.parked);
            if end.is_none()
                && let Some(rec) = recorder.as_deref_mut()
            {
                for &id in &log.preempted {
                    rec.pending_preempted.push((e, reqs.req(id).id));
                }
            }
            if let Some(end) = end {
                let generation = engine.generation;
                agenda.schedule(end, Event::StepEnd(e, generation));
                if let Some(rec) = recorder.as_deref_mut() {
                    let scheduled = engine
                        .step
                        .iter()
                        .map(|&(id, n)| (reqs.req(id).id, n))
                        .collect();
                    let mut preempted: Vec<u64> = Vec::new();
                    rec.pending_preempted.retain(|&(engine, id)| {
                        if engine == e {
                            preempted.push(id);
                        }
                        engine != e
                    });
                    preempted.extend(log.preempted.iter().map(|&id| reqs.req(id).id));
                    rec.steps.push(StepRecord {
                        engine: e,
                        start: now,
                        end,
                        scheduled,
                        preempted,
                        kv_blocks_held: kv.0.num_held(),
                    });
                }
            }
        }
        if only_marked {
            scratch.may_start[k] = false;
        }
        after(k, &engine, &kv);
    }
}
