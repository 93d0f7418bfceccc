//! The `Faults` system, first in the tick: the scenario's faults that start
//! or end now, and whatever a custom system put in the
//! [`FaultQueue`], are applied (docs/faults.md):
//!
//! * a pod goes down: every request it holds fails; its KV is lost with
//!   the leases on it; the decode legs that were to read those leases fail
//!   (pull) or wait for ever (push: the write never comes, as in vLLM);
//!   leases whose decoder went down stop being renewed; the router learns
//!   of it `detection_delay` later;
//! * a pod comes back, empty; the router learns of it the same delay later;
//! * a pod's NICs slow down, or recover.

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, Leg, Request, Role, Status};
use crate::router::Router;
use crate::scenario::{Fault, TransferMode};
use crate::shared::{
    Agenda, Clock, CurrentScenario, Deadlines, EngineIndex, Event, FailReason, Failed,
    FaultCommand, FaultQueue, TickEvents,
};
use crate::transfer::leases::strand;
use crate::transfer::{Flow, Flows, Lease, LeaseState, Nic};

/// The engine of pod `pod` (prefillers first).
pub fn pod_entity(index: &EngineIndex, pod: u32) -> Entity {
    let p = index.prefill.len() as u32;
    if pod < p {
        index.prefill[pod as usize]
    } else {
        index.decode[(pod - p) as usize]
    }
}

/// System: apply the faults due now.
#[allow(clippy::too_many_arguments)]
pub fn faults_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut queue: ResMut<FaultQueue>,
    index: Res<EngineIndex>,
    scenario: Res<CurrentScenario>,
    mut engines: Query<(&mut Engine, &mut KvPool, &Nic)>,
    mut reqs: Query<(Entity, &mut Request)>,
    mut leases: Query<(Entity, &mut Lease)>,
    flow_q: Query<&Flow>,
    mut flows: ResMut<Flows>,
    mut deadlines: ResMut<Deadlines>,
    mut failed: ResMut<Failed>,
    mut agenda: ResMut<Agenda>,
    mut router: NonSendMut<Router>,
) {
    let now = clock.now;
    let pod_of = |name: &str| pod_number(&index, name).expect("fault pods are checked");
    for &(i, start) in &events.faults {
        let command = match &scenario.0.faults[i as usize] {
            Fault::PodDown { pod, .. } => {
                let pod = pod_of(pod);
                if start {
                    FaultCommand::PodDown { pod }
                } else {
                    FaultCommand::PodUp { pod }
                }
            }
            Fault::NicSlow { pod, factor, .. } => FaultCommand::NicFactor {
                pod: pod_of(pod),
                factor: if start { *factor } else { 1.0 },
            },
            Fault::HeartbeatLoss { .. } | Fault::PrefillAnswerLost { .. } => continue,
        };
        queue.commands.push(command);
    }
    for &(pod, up) in &events.router_learns {
        let known = &mut router.known_down;
        if known.len() <= pod as usize {
            known.resize(pod as usize + 1, false);
        }
        known[pod as usize] = !up;
    }
    let delay = scenario.0.router.detection_delay;
    for command in std::mem::take(&mut queue.commands) {
        match command {
            FaultCommand::PodDown { pod } => {
                let e = pod_entity(&index, pod);
                let role = {
                    let (mut engine, mut kv, _) = engines.get_mut(e).expect("engine");
                    if engine.down {
                        continue;
                    }
                    engine.go_down(&mut kv.0);
                    engine.role
                };
                agenda.schedule(now + delay, Event::RouterLearns { pod, up: false });
                match role {
                    Role::Decode => decoder_down(
                        e,
                        now,
                        &mut commands,
                        &mut engines,
                        &mut reqs,
                        &mut leases,
                        &flow_q,
                        &mut flows,
                        &mut deadlines,
                        &mut failed,
                    ),
                    Role::Prefill => prefiller_down(
                        e,
                        &mut commands,
                        &mut engines,
                        &mut reqs,
                        &mut leases,
                        &flow_q,
                        &mut flows,
                        &mut deadlines,
                        &mut failed,
                    ),
                }
            }
            FaultCommand::PodUp { pod } => {
                let (mut engine, _, _) = engines.get_mut(pod_entity(&index, pod)).expect("engine");
                if engine.down {
                    engine.come_up();
                    agenda.schedule(now + delay, Event::RouterLearns { pod, up: true });
                }
            }
            FaultCommand::NicFactor { pod, factor } => {
                let (_, _, nic) = engines.get(pod_entity(&index, pod)).expect("engine");
                flows.set_nic_factor(nic, factor);
            }
        }
    }
}

/// A pod's number from its name (`prefill-0`, `decode-1`).
pub fn pod_number(index: &EngineIndex, name: &str) -> Option<u32> {
    let (role, i) = name.rsplit_once('-')?;
    let i: usize = i.parse().ok()?;
    match role {
        "prefill" if i < index.prefill.len() => Some(i as u32),
        "decode" if i < index.decode.len() => Some((index.prefill.len() + i) as u32),
        _ => None,
    }
}

fn fail(failed: &mut Failed, id: Entity, r: &mut Request, reason: FailReason) {
    if r.status != Status::Failed {
        r.status = Status::Failed;
        failed.queue.push((id, reason));
    }
}

/// Decoder `e` went down: its decode legs fail; the leases they were to
/// read are stranded (no more heartbeats) until they expire; their flows
/// stop. (Store-and-forward's copy, not vLLM's, ends with its lease.)
#[allow(clippy::too_many_arguments)]
fn decoder_down(
    e: Entity,
    now: f64,
    commands: &mut Commands,
    engines: &mut Query<(&mut Engine, &mut KvPool, &Nic)>,
    reqs: &mut Query<(Entity, &mut Request)>,
    leases: &mut Query<(Entity, &mut Lease)>,
    flow_q: &Query<&Flow>,
    flows: &mut Flows,
    deadlines: &mut Deadlines,
    failed: &mut Failed,
) {
    for (id, mut r) in reqs.iter_mut() {
        let on_it = r.decoder == Some(e)
            && r.leg == Leg::Decode
            && !matches!(r.status, Status::Failed | Status::Finished);
        if !on_it {
            continue;
        }
        // Its blocks went with the decoder's pool.
        r.blocks.clear();
        if let Some(l) = r.lease
            && let Ok((_, mut lease)) = leases.get_mut(l)
        {
            if lease.parts_left > 0 && flows.cancel(commands, id, flow_q) {
                lease.parts_left = 0;
            }
            if flows.mode == TransferMode::StoreAndForward {
                let (mut p, mut kv, _) = engines.get_mut(lease.prefiller).expect("prefiller");
                p.lease_ended(&lease.blocks, &mut kv.0);
                if let Some(key) = lease.deadline.take() {
                    deadlines.remove(key);
                }
                commands.entity(l).despawn();
                r.lease = None;
            } else {
                strand(&mut lease, now);
            }
        }
        fail(failed, id, &mut r, FailReason::DecoderDown);
    }
}

/// Prefiller `e` went down: its prefill legs fail; the leases on it are
/// lost with its KV; a decode leg that was to read one fails (pull) or
/// waits for ever (push).
#[allow(clippy::too_many_arguments)]
fn prefiller_down(
    e: Entity,
    commands: &mut Commands,
    engines: &mut Query<(&mut Engine, &mut KvPool, &Nic)>,
    reqs: &mut Query<(Entity, &mut Request)>,
    leases: &mut Query<(Entity, &mut Lease)>,
    flow_q: &Query<&Flow>,
    flows: &mut Flows,
    deadlines: &mut Deadlines,
    failed: &mut Failed,
) {
    for (id, mut r) in reqs.iter_mut() {
        let on_it = r.prefiller == Some(e)
            && r.leg == Leg::Prefill
            && matches!(r.status, Status::Waiting | Status::Running);
        if on_it {
            r.blocks.clear();
            fail(failed, id, &mut r, FailReason::PrefillerDown);
        }
    }
    for (l, mut lease) in leases.iter_mut() {
        if lease.prefiller != e || lease.state == LeaseState::Lost {
            continue;
        }
        lease.state = LeaseState::Lost;
        if let Some(key) = lease.deadline.take() {
            deadlines.remove(key);
        }
        commands.entity(l).despawn();
        let Ok((id, mut r)) = reqs.get_mut(lease.request) else {
            continue;
        };
        if r.lease != Some(l) {
            continue;
        }
        r.lease = None;
        flows.cancel(commands, id, flow_q);
        if matches!(r.status, Status::Failed | Status::Finished) {
            continue;
        }
        if flows.mode == TransferMode::NixlPush {
            r.stuck = true; // D waits in WAITING_FOR_REMOTE_KVS: no write comes
            continue;
        }
        // The read fails (vLLM: a KV load failure, policy "fail"): the
        // decoder drops the request and frees its blocks.
        let decoder = r.decoder.expect("routed");
        let (mut d, mut kv, _) = engines.get_mut(decoder).expect("decoder");
        if !d.down && r.status != Status::PrefillDone {
            d.abort_queued(id, &mut kv.0, &mut r);
        }
        fail(failed, id, &mut r, FailReason::KvLost);
    }
}
