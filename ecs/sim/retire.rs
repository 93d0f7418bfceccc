//! What happens to a request that produced its last token: it is observed
//! (docs/model.md §9), the router's bookkeeping releases it (llm-d counts a decode
//! endpoint's request until the end of its stream), its session books its
//! next turn after the tool call, and it leaves the world. It runs right
//! after the steps end, in the `StepEnd` set, in the order they finished.

use bevy_ecs::prelude::*;
use bevy_ecs::system::SystemParam;

use crate::engine::record::FinishedRequests;
use crate::engine::{Engine, Leg, NextTurn, Request};
use crate::metrics::formats::aiperf::AiperfLog;
use crate::metrics::formats::timeline::Timeline;
use crate::metrics::{Counters, Metrics};
use crate::router::Router;
use crate::shared::{Agenda, Clock, CurrentScenario, Event, FailReason, Failed, Finished};

/// What retiring a request writes to besides the agenda and the counters
/// (which a fast tick holds already: see `sim::schedule::fast_ticks`).
#[derive(SystemParam)]
pub struct Retirement<'w, 's> {
    commands: Commands<'w, 's>,
    metrics: ResMut<'w, Metrics>,
    router: NonSendMut<'w, Router>,
    record: Option<ResMut<'w, FinishedRequests>>,
    aiperf: Option<ResMut<'w, AiperfLog>>,
    timeline: Option<ResMut<'w, Timeline>>,
}

/// System: retire the requests that finished this tick.
pub fn retire_system(
    clock: Res<Clock>,
    mut finished: ResMut<Finished>,
    reqs: Query<&Request>,
    engines: Query<&Engine>,
    mut counters: ResMut<Counters>,
    mut agenda: ResMut<Agenda>,
    mut out: Retirement,
) {
    retire(
        clock.now,
        &mut finished,
        |id| reqs.get(id).expect("a finished request"),
        |e| engines.get(e).expect("decoder").index,
        &mut counters,
        &mut agenda,
        &mut out,
    );
}

/// Retires the requests in `finished` (`request` finds one,
/// `engine_index` an engine's index); each leaves the world when the
/// commands are applied.
pub(crate) fn retire<'a>(
    now: f64,
    finished: &mut Finished,
    request: impl Fn(Entity) -> &'a Request,
    engine_index: impl Fn(Entity) -> u32,
    counters: &mut Counters,
    agenda: &mut Agenda,
    out: &mut Retirement,
) {
    for &id in &finished.queue {
        let r = request(id);
        tracing::debug!(
            request = r.id,
            ttft = r.first_token_at.unwrap_or(f64::NAN) - r.t0,
            response = now - r.t0,
            preemptions = r.preemptions,
            "finished"
        );
        out.metrics.request_finished(r);
        counters.finished(r.output);
        let decoder = engine_index(r.decoder.expect("routed"));
        out.router.book.decode_finished(decoder, r.prompt);
        match r.next_turn {
            Some(NextTurn::Session { session, after }) => {
                agenda.schedule(now + after, Event::NextTurn(session));
            }
            Some(NextTurn::Trace { index, after }) => {
                agenda.schedule(now + after, Event::TraceArrival(index));
            }
            None => {}
        }
        if let Some(f) = out.record.as_deref_mut() {
            f.0.push(r.clone());
        }
        if let Some(a) = out.aiperf.as_deref_mut() {
            a.finished(r, now);
        }
        if let Some(t) = out.timeline.as_deref_mut() {
            t.request(r);
        }
        out.commands.entity(id).despawn();
    }
    finished.queue.clear();
}

impl<'w, 's> Retirement<'w, 's> {
    /// The queue its despawns go to: a fast tick's other despawns (flows
    /// and leases that ended) go there too, so that all are applied in the
    /// order the list would apply them.
    pub(crate) fn commands(&mut self) -> &mut Commands<'w, 's> {
        &mut self.commands
    }

    /// The router (a fast tick routes on this fetch), with the queue.
    pub(crate) fn router(&mut self) -> (&mut Router, &mut Commands<'w, 's>) {
        (&mut self.router, &mut self.commands)
    }

    /// What issuing a request writes besides the counters (a fast tick
    /// issues the arrivals on this fetch), with the queue.
    pub(crate) fn issue(
        &mut self,
    ) -> (&mut Commands<'w, 's>, &mut Metrics, Option<&mut AiperfLog>) {
        (
            &mut self.commands,
            &mut self.metrics,
            self.aiperf.as_deref_mut(),
        )
    }
}

/// System, at the end of the tick: requests (and prefill legs) that failed
/// in it. A serial prefill leg whose prefiller was down is sent again by
/// the sidecar (`prefill_max_retries`); a failed request is released from
/// the router's bookkeeping and sent again by its client (`client.retries`)
/// or fails for good, ending its session. A parallel prefill leg that
/// fails leaves its decode leg waiting for a write that never comes, as
/// vLLM's push proxy does.
#[allow(clippy::too_many_arguments)]
pub fn fail_system(
    mut commands: Commands,
    clock: Res<Clock>,
    mut failed: ResMut<Failed>,
    mut reqs: Query<&mut Request>,
    engines: Query<&Engine>,
    mut counters: ResMut<Counters>,
    mut router: NonSendMut<Router>,
    mut agenda: ResMut<Agenda>,
    scenario: Res<CurrentScenario>,
) {
    let now = clock.now;
    let raw = &scenario.0;
    for (id, reason) in std::mem::take(&mut failed.queue) {
        let Ok(mut r) = reqs.get_mut(id) else {
            continue;
        };
        let serial_prefill = r.leg == Leg::Prefill && r.twin.is_none();
        if serial_prefill
            && reason == FailReason::PrefillerDown
            && r.prefill_retries < raw.router.prefill_max_retries
        {
            r.prefill_retries += 1;
            counters.prefill_retries += 1;
            agenda.schedule(
                now + raw.router.prefill_retry_backoff,
                Event::PrefillRetry(id),
            );
            continue;
        }
        let index = |e: Option<Entity>| e.map(|e| engines.get(e).expect("engine").index);
        let (p, d, prompt) = (index(r.prefiller), index(r.decoder), r.prompt);
        // A prefill leg is released from the router's books once: when its
        // prefiller answers (the sidecar, which stamps `t1`), or here.
        if r.leg == Leg::Prefill
            && r.t1.is_none()
            && let Some(p) = p
        {
            router.book.prefill_answered(p, prompt);
        }
        if let Some(twin) = r.twin {
            let leg = r.leg;
            if leg == Leg::Decode {
                r.twin = None;
            }
            if leg == Leg::Prefill {
                // The decode leg, booked on its decoder, waits for ever.
                if let Ok(mut t) = reqs.get_mut(twin) {
                    t.stuck = true;
                }
                commands.entity(id).despawn();
                continue;
            }
            // The prefill leg runs on; its lease will find no reader.
            if let Ok(mut prefill_leg) = reqs.get_mut(twin) {
                prefill_leg.twin = Some(Entity::PLACEHOLDER);
            }
            r = reqs.get_mut(id).expect("the failed request");
        }
        if let Some(d) = d {
            router.book.decode_finished(d, prompt);
        }
        if r.client_retries < raw.client.retries {
            r.client_retries += 1;
            counters.client_retries += 1;
            r.reset_for_retry();
            agenda.schedule(now + raw.client.backoff, Event::ClientRetry(id));
            continue;
        }
        counters.failed(reason.name());
        match r.next_turn {
            Some(NextTurn::Session { session, .. }) => {
                counters.sessions_ended_by_failure += 1;
                commands.entity(session).despawn();
            }
            Some(NextTurn::Trace { .. }) => counters.sessions_ended_by_failure += 1,
            None => {}
        }
        commands.entity(id).despawn();
    }
}
