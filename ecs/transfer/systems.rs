//! The transfer systems of the tick: `Transfers` (leases whose deadline is
//! now, flows that end now, registrations that reach prefillers, transfers
//! whose latency ended start) and `Bandwidth` (the reads or registrations of
//! requests parked in this tick are posted; when flows changed, rates are
//! re-divided).

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, KvSource, Request, RequestStore, Status};
use crate::scenario::TransferMode;
use crate::shared::joining::Places;
use crate::shared::{
    Agenda, Clock, CurrentScenario, Deadlines, Event, FaultRng, Lookup, Parked, TickEvents,
};
use crate::transfer::leases::{renewal, stranded_token_seconds};
use crate::transfer::{Flow, FlowSlice, Flows, Lease, LeaseState, Nic};

/// System: leases at their deadline are renewed or expire; flows that
/// completed now end (leases released, KV delivered); push registrations
/// reach their prefillers; transfers whose latency ended start flowing.
#[allow(clippy::too_many_arguments)]
pub fn transfer_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut flows: ResMut<Flows>,
    flow_q: Query<&Flow>,
    mut leases: Query<&mut Lease>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    nics: Query<&Nic>,
    mut reqs: Query<&mut Request>,
    mut agenda: ResMut<Agenda>,
    mut deadlines: ResMut<Deadlines>,
    mut rng: ResMut<FaultRng>,
    scenario: Res<CurrentScenario>,
) {
    let now = clock.now;
    let flows = &mut *flows;
    for &l in &events.lease_deadlines {
        lease_deadline(
            l,
            now,
            flows,
            &mut commands,
            &mut leases,
            &mut engines,
            &mut reqs,
            &mut deadlines,
            &mut rng,
            &scenario.0.faults,
        );
    }
    finish_flows(
        now,
        &events.flow_done,
        flows,
        |f| flow_q.get(f).expect("active flow"),
        &mut leases,
        &mut engines,
        &mut reqs,
        &mut deadlines,
        &mut commands,
    );
    for &request in &events.registrations {
        let Ok(mut r) = reqs.get_mut(request) else {
            continue;
        };
        if r.status == Status::Failed {
            continue;
        }
        r.registered = true;
        // The prefiller writes once it has both the finished prefill (its
        // lease) and the registration, whichever comes second; the sidecar
        // posts it when the prefill ends after the registration.
        match r.lease.map(|l| leases.get(l).expect("lease").state) {
            Some(LeaseState::Held) => {
                agenda.schedule(now + flows.latency, Event::ReadStart(request))
            }
            Some(LeaseState::Expired | LeaseState::Lost) => r.stuck = true,
            None => {}
        }
    }
    start_reads(
        now,
        &events.read_starts,
        flows,
        (&mut reqs, &mut leases, &nics),
        |f| commands.spawn(f).id(),
    );
}

/// The reads whose latency ended start flowing (`read_starts`), each flow
/// made an entity by `spawn`. (The loop's fast tick calls it too, with a
/// `spawn` that keeps the flows until it stops: [`NewFlows`].)
pub(crate) fn start_reads(
    now: f64,
    read_starts: &[Entity],
    flows: &mut Flows,
    (reqs, leases, nics): (
        &mut impl RequestStore,
        &mut impl Lookup<Lease>,
        &Query<&Nic>,
    ),
    mut spawn: impl FnMut(Flow) -> Entity,
) {
    for &request in read_starts {
        let Some(r) = reqs.find_mut(request) else {
            continue;
        };
        if r.status == Status::Failed {
            continue;
        }
        let Some(lease_id) = r.lease else {
            r.stuck = true; // push: its prefiller went down with the KV
            continue;
        };
        let state = leases.find(lease_id).expect("lease").state;
        if state != LeaseState::Held && flows.mode == TransferMode::NixlPush {
            r.stuck = true; // the prefiller never writes after the expiry
            continue;
        }
        r.read_started_at = Some(now);
        let p = *nics.get(r.prefiller.expect("remote")).expect("prefiller");
        let d = *nics.get(r.decoder.expect("routed")).expect("decoder");
        let parts = flows.start(&mut spawn, request, &p, &d, r.remote_tokens, now);
        leases.find_mut(lease_id).expect("lease").parts_left = parts;
    }
}

/// Flows a fast tick started, kept here until the fast ticks stop (their
/// entities are reserved at once; their components are inserted after the
/// fast ticks' commands are applied). Nothing outside the fast ticks looks
/// flows up in between, and inside them each look-up looks here first: a
/// flow is found by its entity's index, not by a scan (a stretch of fast
/// ticks may start dozens, and the bandwidth shares look every active flow
/// up twice).
#[derive(Default)]
pub(crate) struct NewFlows {
    flows: Vec<(Entity, Flow)>,
    /// Each flow's place in `flows`.
    place_of: Places,
}

impl NewFlows {
    /// Keeps flow `flow` of the reserved entity `id`.
    pub(crate) fn push(&mut self, id: Entity, flow: Flow) {
        self.place_of.set(id, self.flows.len() as u64);
        self.flows.push((id, flow));
    }

    /// The flows kept, in the order they started, to join the world.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (Entity, Flow)> + '_ {
        for &(id, _) in &self.flows {
            self.place_of.forget(id);
        }
        self.flows.drain(..)
    }

    /// Where flow `f` is in `flows`, if it is new.
    #[inline]
    fn place(&self, f: Entity) -> Option<usize> {
        self.place_of.get(f).map(|at| at as usize)
    }

    /// Flow `f`, new or in the world.
    pub(crate) fn get<'a>(&'a self, f: Entity, flow_q: &'a Query<&mut Flow>) -> &'a Flow {
        match self.place(f) {
            Some(at) => &self.flows[at].1,
            None => flow_q.get(f).expect("active flow"),
        }
    }

    /// Flow `f`, new or in the world, to change.
    fn get_mut<'a>(&'a mut self, f: Entity, flow_q: &'a mut Query<&mut Flow>) -> &'a mut Flow {
        match self.place(f) {
            Some(at) => &mut self.flows[at].1,
            None => flow_q.get_mut(f).expect("active flow").into_inner(),
        }
    }
}

/// Ends the flows whose completion is now (`flow_done`: the rate
/// generations their completions were booked at; an older generation's is
/// stale): each releases its links, and a transfer whose last flow it was
/// completes ([`complete`]). Returns whether any flow ended. (The loop's
/// fast tick calls it too, for a tick of step ends and flow completions.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_flows<'f>(
    now: f64,
    flow_done: &[u64],
    flows: &mut Flows,
    flow_of: impl Fn(Entity) -> &'f Flow,
    leases: &mut impl Lookup<Lease>,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    reqs: &mut impl RequestStore,
    deadlines: &mut Deadlines,
    commands: &mut Commands,
) -> bool {
    if !flow_done.contains(&flows.generation) {
        return false;
    }
    flows.done.clear();
    for &f in &flows.active {
        if flow_of(f).finish_at <= now {
            flows.done.push(f);
        }
    }
    flows.active.retain(|f| !flows.done.contains(f));
    for i in 0..flows.done.len() {
        let f = flows.done[i];
        let flow = flow_of(f);
        for l in flow.links {
            flows.per_link[l as usize] -= 1;
        }
        let (request_id, lease_id) = {
            let r = reqs.find(flow.request).expect("transferring request");
            (r.id, r.lease)
        };
        if let Some(s) = &mut flows.slices {
            s.push(FlowSlice {
                request: request_id,
                links: flow.links,
                tokens: flow.tokens,
                start: flow.started,
                end: now,
            });
        }
        // The transfer is done when its last rank-to-rank flow is.
        let lease = leases
            .find_mut(lease_id.expect("a transfer has a lease"))
            .expect("lease");
        lease.parts_left -= 1;
        if lease.parts_left > 0 {
            commands.entity(f).despawn();
            continue;
        }
        for pod in flow.pods {
            flows.per_pod[pod as usize] -= 1;
        }
        flows.completed += 1;
        flows.completed_tokens += flow.tokens as u64;
        complete(
            flow.request,
            now,
            flows,
            commands,
            leases,
            engines,
            reqs,
            deadlines,
        );
        commands.entity(f).despawn();
    }
    flows.changed |= !flows.done.is_empty();
    !flows.done.is_empty()
}

/// A lease reached its deadline: renewed by the heartbeats since, or it
/// expires and the prefiller frees its blocks (they stay cached).
#[allow(clippy::too_many_arguments)]
fn lease_deadline(
    l: Entity,
    now: f64,
    flows: &mut Flows,
    commands: &mut Commands,
    leases: &mut Query<&mut Lease>,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    reqs: &mut Query<&mut Request>,
    deadlines: &mut Deadlines,
    rng: &mut FaultRng,
    faults: &[crate::scenario::Fault],
) {
    let Ok(mut lease) = leases.get_mut(l) else {
        return;
    };
    lease.deadline = None;
    if let Some(t) = renewal(&mut lease, now, &flows.lease, faults, &mut rng.0) {
        lease.expires_at = t;
        lease.deadline = Some(deadlines.insert(t, l));
        return;
    }
    lease.state = LeaseState::Expired;
    flows.leases_expired += 1;
    {
        let (mut p, mut kv) = engines.get_mut(lease.prefiller).expect("prefiller");
        p.lease_ended(&lease.blocks, &mut kv.0);
    }
    flows.stranded_token_seconds += stranded_token_seconds(&lease, now);
    let request = lease.request;
    let transferring = lease.parts_left > 0;
    let reader = reqs
        .get_mut(request)
        .ok()
        .filter(|r| r.status != Status::Failed && lease.stranded_since.is_none());
    match reader {
        // Its transfer completes all the same (from freed blocks).
        _ if transferring => {}
        // A pull read still to come reads the freed blocks (vLLM only logs it).
        Some(_) if flows.mode == TransferMode::NixlPull => {}
        // Push: the prefiller never writes after the expiry.
        Some(mut r) => {
            r.stuck = true;
            r.lease = None;
            commands.entity(l).despawn();
        }
        None => {
            if let Ok(mut r) = reqs.get_mut(request)
                && r.lease == Some(l)
            {
                r.lease = None;
            }
            commands.entity(l).despawn();
        }
    }
}

/// A transfer finished: the prefiller's lease ends, the decoder gets the KV.
#[allow(clippy::too_many_arguments)]
fn complete(
    request: Entity,
    now: f64,
    flows: &mut Flows,
    commands: &mut Commands,
    leases: &impl Lookup<Lease>,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    reqs: &mut impl RequestStore,
    deadlines: &mut Deadlines,
) {
    let r = reqs.req(request);
    let lease_id = r.lease.take().expect("a transfer has a lease");
    let lease = leases.find(lease_id).expect("lease");
    if let Some(key) = lease.deadline {
        deadlines.remove(key);
    }
    match lease.state {
        LeaseState::Held => {
            let (mut p, mut kv) = engines.get_mut(lease.prefiller).expect("prefiller");
            // Freed tail first; the prompt's full blocks stay cached.
            p.lease_ended(&lease.blocks, &mut kv.0);
        }
        LeaseState::Expired => flows.reads_of_freed_blocks += 1,
        LeaseState::Lost => unreachable!("a lost lease's flows were stopped"),
    }
    commands.entity(lease_id).despawn();
    r.read_done_at = Some(now);
    let decoder = r.decoder.expect("routed");
    let (mut d, mut kv) = engines.get_mut(decoder).expect("decoder");
    match flows.mode {
        TransferMode::NixlPull | TransferMode::NixlPush => d.read_done(request, &mut kv.0, r),
        TransferMode::StoreAndForward => {
            // Only now does the request queue for the decoder.
            r.kv_source = KvSource::Delivered;
            r.status = Status::Waiting;
            r.leg_arrived_at = now;
            d.enqueue(request);
        }
    }
}

/// System: for every request parked in this tick the decoder's worker posts
/// a READ, whose flow starts after the fixed latency `x0` (docs/model.md §7.2);
/// or, in push mode, registers its blocks with the prefiller, which learns
/// of them a notification later.
pub fn post_reads_system(
    clock: Res<Clock>,
    flows: Res<Flows>,
    mut parked: ResMut<Parked>,
    mut agenda: ResMut<Agenda>,
) {
    post_reads(clock.now, &flows, &mut parked, &mut agenda);
}

/// What [`post_reads_system`] does (the loop's fast tick calls it too).
pub(crate) fn post_reads(now: f64, flows: &Flows, parked: &mut Parked, agenda: &mut Agenda) {
    for &id in &parked.queue {
        match flows.mode {
            TransferMode::NixlPush => {
                agenda.schedule(now + flows.notify_latency, Event::Registration(id))
            }
            _ => agenda.schedule(now + flows.latency, Event::ReadStart(id)),
        }
    }
    parked.queue.clear();
}

/// System: when the set of flows changed, bring every flow to now,
/// re-divide the links and schedule the earliest completion.
pub fn bandwidth_system(
    clock: Res<Clock>,
    mut flows: ResMut<Flows>,
    mut flow_q: Query<&mut Flow>,
    mut agenda: ResMut<Agenda>,
) {
    let mut none = NewFlows::default();
    share_bandwidth(clock.now, &mut flows, (&mut flow_q, &mut none), &mut agenda);
}

/// What [`bandwidth_system`] does (the loop's fast tick calls it too).
pub(crate) fn share_bandwidth(
    now: f64,
    flows: &mut Flows,
    (flow_q, new): (&mut Query<&mut Flow>, &mut NewFlows),
    agenda: &mut Agenda,
) {
    if !flows.changed {
        return;
    }
    flows.changed = false;
    flows.generation += 1;
    flows.pod_rate.iter_mut().for_each(|r| *r = 0.0);
    if flows.active.is_empty() {
        return;
    }
    flows.scratch_links.clear();
    for &f in &flows.active {
        let flow = new.get_mut(f, flow_q);
        let elapsed = now - flow.updated;
        flow.remaining = (flow.remaining - flow.rate * elapsed).max(0.0);
        flow.updated = now;
        flows.scratch_links.push(flow.links);
    }
    flows.scratch_rates.clear();
    flows.scratch_rates.resize(flows.active.len(), 0.0);
    flows.sharing_state.compute(
        flows.sharing,
        &flows.link_capacity,
        &flows.scratch_links,
        &mut flows.scratch_rates,
    );
    let mut earliest = f64::INFINITY;
    for (k, &f) in flows.active.iter().enumerate() {
        let flow = new.get_mut(f, flow_q);
        flow.rate = flows.scratch_rates[k];
        flow.finish_at = now + flow.remaining / flow.rate;
        for p in flow.pods {
            flows.pod_rate[p as usize] += flow.rate;
        }
        earliest = earliest.min(flow.finish_at);
    }
    agenda.schedule(
        earliest,
        Event::FlowDone {
            generation: flows.generation,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(tokens: u32) -> Flow {
        Flow {
            request: Entity::PLACEHOLDER,
            pods: [0, 1],
            links: [0, 1],
            tokens,
            share: 1.0,
            started: 0.0,
            remaining: f64::from(tokens),
            rate: 0.0,
            updated: 0.0,
            finish_at: f64::INFINITY,
        }
    }

    #[test]
    fn a_new_flow_is_found_by_its_index_and_only_in_its_own_stretch() {
        let mut world = World::new();
        let [a, b, c] = std::array::from_fn(|_| world.spawn_empty().id());
        let mut new = NewFlows::default();
        new.push(b, flow(10));
        new.push(a, flow(20));
        assert_eq!(new.place(a), Some(1));
        assert_eq!(new.place(b), Some(0));
        assert_eq!(new.place(c), None);
        // The same index in another generation is another flow.
        let b_later =
            Entity::from_index_and_generation(b.index(), b.generation().after_versions(1));
        assert_eq!(new.place(b_later), None);
        // The flows join the world in the order they started.
        let joined: Vec<u32> = new.drain().map(|(_, f)| f.tokens).collect();
        assert_eq!(joined, [10, 20]);
        // The next stretch: a joined the world, and is not found here.
        assert_eq!(new.place(a), None);
        new.push(c, flow(30));
        new.push(b_later, flow(40));
        assert_eq!(new.place(a), None);
        assert_eq!(new.place(b), None);
        assert_eq!(new.place(b_later), Some(1));
        assert_eq!(new.place(c), Some(0));
    }
}
