//! What happens to a request that produced its last token: it is observed
//! (MODEL.md §9), the router's bookkeeping releases it (llm-d counts a decode
//! endpoint's request until the end of its stream), its session books its
//! next turn after the tool call, and it leaves the world. It runs right
//! after the steps end, in the `StepEnd` set, in the order they finished.

use bevy_ecs::prelude::*;

use crate::engine::record::FinishedRequests;
use crate::engine::{Engine, NextTurn, Request};
use crate::metrics::formats::aiperf::AiperfLog;
use crate::metrics::formats::timeline::Timeline;
use crate::metrics::{Counters, Metrics};
use crate::router::Router;
use crate::shared::{Agenda, Clock, Event, Finished};

/// System: retire the requests that finished this tick.
#[allow(clippy::too_many_arguments)]
pub fn retire_system(
    mut commands: Commands,
    clock: Res<Clock>,
    mut finished: ResMut<Finished>,
    reqs: Query<&Request>,
    engines: Query<&Engine>,
    mut metrics: ResMut<Metrics>,
    mut counters: ResMut<Counters>,
    mut router: NonSendMut<Router>,
    mut agenda: ResMut<Agenda>,
    mut record: Option<ResMut<FinishedRequests>>,
    mut aiperf: Option<ResMut<AiperfLog>>,
    mut timeline: Option<ResMut<Timeline>>,
) {
    let now = clock.now;
    for &id in &finished.queue {
        let r = reqs.get(id).expect("a finished request");
        tracing::debug!(
            request = r.id,
            ttft = r.first_token_at.unwrap_or(f64::NAN) - r.t0,
            response = now - r.t0,
            preemptions = r.preemptions,
            "finished"
        );
        metrics.request_finished(r);
        counters.finished(r.output);
        let decoder = engines.get(r.decoder.expect("routed")).expect("decoder");
        router.book.decode_finished(decoder.index, r.prompt);
        match r.next_turn {
            Some(NextTurn::Session { session, after }) => {
                agenda.schedule(now + after, Event::NextTurn(session));
            }
            Some(NextTurn::Trace { index, after }) => {
                agenda.schedule(now + after, Event::TraceArrival(index));
            }
            None => {}
        }
        if let Some(f) = record.as_deref_mut() {
            f.0.push(r.clone());
        }
        if let Some(a) = aiperf.as_deref_mut() {
            a.finished(r, now);
        }
        if let Some(t) = timeline.as_deref_mut() {
            t.request(r);
        }
        commands.entity(id).despawn();
    }
    finished.queue.clear();
}
