//! The llm-d routing sidecar: takes the prefillers' answers and sends the
//! decode leg on (serial dispatch); with vLLM's push proxy (parallel
//! dispatch) the decode leg is already on its decoder, and the answer only
//! grants the lease.

use bevy_ecs::prelude::*;
use rand::RngExt;

use crate::engine::{Engine, KvPool, KvSource, Request, RequestStore, Status};
use crate::router::Router;
use crate::scenario::{Fault, TransferMode};
use crate::shared::{
    Agenda, Clock, CurrentScenario, Deadlines, Event, FailReason, Failed, FaultRng, Handoffs,
    Joining,
};
use crate::transfer::leases::{NewLease, grant};
use crate::transfer::{Flows, Lease, Nic};

/// Whether a prefill answered now is lost on its way to the sidecar (a
/// `PrefillAnswerLost` fault).
fn answer_lost(faults: &[Fault], now: f64, rng: &mut FaultRng) -> bool {
    let p = faults
        .iter()
        .filter_map(|f| match f {
            Fault::PrefillAnswerLost { probability, .. } if f.covers(now) => Some(*probability),
            _ => None,
        })
        .fold(0.0, f64::max);
    p > 0.0 && rng.0.random::<f64>() < p
}

/// System: the sidecar receives the prefillers' answers (prefill legs that
/// finished this tick). The prefiller's blocks become a lease; the decode
/// leg goes to the decoder carrying where the KV is (NIXL pull and push),
/// or the KV is first copied out (store-and-forward). With parallel
/// dispatch the decode leg is its twin, already booked on its decoder: the
/// write is posted if the decoder's registration came first.
#[allow(clippy::too_many_arguments)]
pub fn handoff_system(
    mut commands: Commands,
    mut granted: ResMut<Joining<Lease>>,
    clock: Res<Clock>,
    mut handoffs: ResMut<Handoffs>,
    mut flows: ResMut<Flows>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    nics: Query<&Nic>,
    mut reqs: Query<&mut Request>,
    mut router: NonSendMut<Router>,
    mut deadlines: ResMut<Deadlines>,
    mut agenda: ResMut<Agenda>,
    mut failed: ResMut<Failed>,
    mut rng: ResMut<FaultRng>,
    scenario: Res<CurrentScenario>,
) {
    hand_off(
        clock.now,
        &mut handoffs,
        &mut flows,
        (&mut engines, &nics, &mut reqs),
        &mut router,
        (&mut deadlines, &mut agenda, &mut failed),
        (&mut rng, &scenario.0.faults),
        (&mut commands, &mut granted),
    );
}

/// The body of [`handoff_system`], also run by the fast ticks on their own
/// fetch where it spawns only leases, which they look up in `granted`
/// until they stop (`sim::schedule`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn hand_off(
    now: f64,
    handoffs: &mut Handoffs,
    flows: &mut Flows,
    (engines, nics, reqs): (
        &mut Query<(&mut Engine, &mut KvPool)>,
        &Query<&Nic>,
        &mut impl RequestStore,
    ),
    router: &mut Router,
    (deadlines, agenda, failed): (&mut Deadlines, &mut Agenda, &mut Failed),
    (rng, faults): (&mut FaultRng, &[Fault]),
    (commands, granted): (&mut Commands, &mut Joining<Lease>),
) {
    for &id in &handoffs.queue {
        let r = reqs.req(id);
        let prefiller = r.prefiller.expect("remote");
        let decoder = r.decoder.expect("routed");
        r.t1 = Some(now);
        let blocks = std::mem::take(&mut r.blocks);
        let p = engines.get(prefiller).expect("prefiller").0;
        let p_nic = *nics.get(prefiller).expect("prefiller");
        let (p_index, block_size) = (p.index, p.cfg.block_size);
        router.book.prefill_answered(p_index, r.prompt);
        let lost = !faults.is_empty() && answer_lost(faults, now, rng);
        let mut lease = NewLease {
            prefiller,
            request: id,
            blocks,
            block_size,
            expires: flows.mode != TransferMode::StoreAndForward,
            renewable: true,
            heartbeats_from: None,
            stranded: lost,
            parts_left: 0,
        };
        if let Some(twin) = r.twin {
            // Parallel dispatch: the request is the decode leg; this prefill
            // leg's work is done.
            let first_scheduled = r.first_scheduled_at;
            commands.entity(id).despawn();
            let booked = reqs.find(twin).filter(|t| t.status != Status::Failed);
            lease.request = twin;
            lease.renewable = flows.lease.renew_in_parallel_dispatch;
            lease.heartbeats_from = booked.map(|t| t.leg_arrived_at);
            lease.stranded |= booked.is_none();
            let stranded = lease.stranded;
            let l = grant(commands, granted, deadlines, &flows.lease, lease, now);
            let Some(d) = reqs.find_mut(twin) else {
                continue;
            };
            if d.status == Status::Failed {
                continue;
            }
            d.first_scheduled_at = first_scheduled;
            d.t1 = Some(now);
            d.lease = Some(l);
            if stranded {
                d.stuck = true;
            } else if d.registered {
                agenda.schedule(now + flows.latency, Event::ReadStart(twin));
            }
            continue;
        }
        if lost {
            // No decode leg is sent: the request waits for ever, its lease
            // for its expiry.
            r.stuck = true;
            let l = grant(commands, granted, deadlines, &flows.lease, lease, now);
            r.lease = Some(l);
            continue;
        }
        let (mut d, _) = engines.get_mut(decoder).expect("decoder");
        if d.down {
            lease.stranded = true;
            let l = grant(commands, granted, deadlines, &flows.lease, lease, now);
            r.lease = Some(l);
            r.status = Status::Failed;
            failed.queue.push((id, FailReason::DecoderDown));
            continue;
        }
        match flows.mode {
            TransferMode::NixlPull | TransferMode::NixlPush => {
                r.start_decode_leg(KvSource::RemotePending, now);
                d.enqueue(id);
                lease.heartbeats_from = Some(now);
            }
            TransferMode::StoreAndForward => {
                r.start_decode_leg(KvSource::RemotePending, now);
                r.status = Status::PrefillDone; // until the copy completes
                r.remote_tokens = r.prompt;
                r.read_started_at = Some(now);
                let d_nic = *nics.get(decoder).expect("decoder");
                lease.parts_left = flows.start(
                    |f| commands.spawn(f).id(),
                    id,
                    &p_nic,
                    &d_nic,
                    r.prompt,
                    now,
                );
            }
        }
        let l = grant(commands, granted, deadlines, &flows.lease, lease, now);
        r.lease = Some(l);
    }
    handoffs.queue.clear();
}
