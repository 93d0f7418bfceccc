//! The transfer systems of the tick: `Transfers` (flows that end now, reads
//! whose latency ended start) and `Bandwidth` (reads of requests parked in
//! this tick are posted; when flows changed, rates are re-divided).

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, KvSource, Request, Status};
use crate::scenario::TransferMode;
use crate::shared::{Agenda, Clock, Event, Parked, TickEvents};
use crate::transfer::{Flow, FlowSlice, Flows, Lease, Nic};

/// System: flows that completed now end (leases released, KV delivered);
/// reads whose latency ended start flowing.
#[allow(clippy::too_many_arguments)]
pub fn transfer_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut flows: ResMut<Flows>,
    flow_q: Query<&Flow>,
    mut leases: Query<&mut Lease>,
    mut engines: Query<(&mut Engine, &mut KvPool, &Nic)>,
    mut reqs: Query<&mut Request>,
) {
    let now = clock.now;
    let flows = &mut *flows;
    if events.flow_done.contains(&flows.generation) {
        flows.done.clear();
        for &f in &flows.active {
            if flow_q.get(f).expect("active flow").finish_at <= now {
                flows.done.push(f);
            }
        }
        flows.active.retain(|f| !flows.done.contains(f));
        for i in 0..flows.done.len() {
            let f = flows.done[i];
            let flow = flow_q.get(f).expect("active flow");
            for l in flow.links {
                flows.per_link[l as usize] -= 1;
            }
            if let Some(s) = &mut flows.slices {
                s.push(FlowSlice {
                    request: reqs.get(flow.request).expect("transferring request").id,
                    links: flow.links,
                    tokens: flow.tokens,
                    start: flow.started,
                    end: now,
                });
            }
            // The transfer is done when its last rank-to-rank flow is.
            let lease_id = reqs.get(flow.request).expect("transferring request").lease;
            let mut lease = leases
                .get_mut(lease_id.expect("a transfer has a lease"))
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
                flows.mode,
                &mut commands,
                &leases,
                &mut engines,
                &mut reqs,
            );
            commands.entity(f).despawn();
        }
        flows.changed |= !flows.done.is_empty();
    }
    for &request in &events.read_starts {
        let mut r = reqs.get_mut(request).expect("a parked request");
        r.read_started_at = Some(now);
        let p = *engines
            .get(r.prefiller.expect("remote"))
            .expect("prefiller")
            .2;
        let d = *engines.get(r.decoder.expect("routed")).expect("decoder").2;
        let parts = flows.start(&mut commands, request, &p, &d, r.remote_tokens, now);
        leases
            .get_mut(r.lease.expect("a read has a lease"))
            .expect("lease")
            .parts_left = parts;
    }
}

/// A transfer finished: the prefiller's lease ends, the decoder gets the KV.
fn complete(
    request: Entity,
    now: f64,
    mode: TransferMode,
    commands: &mut Commands,
    leases: &Query<&mut Lease>,
    engines: &mut Query<(&mut Engine, &mut KvPool, &Nic)>,
    reqs: &mut Query<&mut Request>,
) {
    let mut r = reqs.get_mut(request).expect("transferring request");
    let lease_id = r.lease.take().expect("a transfer has a lease");
    let lease = leases.get(lease_id).expect("lease");
    {
        let (mut p, mut kv, _) = engines.get_mut(lease.prefiller).expect("prefiller");
        // Freed tail first; the prompt's full blocks stay cached.
        p.lease_ended(&lease.blocks, &mut kv.0);
    }
    commands.entity(lease_id).despawn();
    r.read_done_at = Some(now);
    let decoder = r.decoder.expect("routed");
    let (mut d, mut kv, _) = engines.get_mut(decoder).expect("decoder");
    match mode {
        TransferMode::NixlPull => d.read_done(request, &mut kv.0, r.into_inner()),
        TransferMode::StoreAndForward => {
            // Only now does the request queue for the decoder.
            r.kv_source = KvSource::Delivered;
            r.status = Status::Waiting;
            r.leg_arrived_at = now;
            d.enqueue(request);
        }
    }
}

/// System: the decoders' workers post a READ for every request parked in
/// this tick; its flow starts after the fixed latency `x0` (MODEL.md §7.2).
pub fn post_reads_system(
    clock: Res<Clock>,
    flows: Res<Flows>,
    mut parked: ResMut<Parked>,
    mut agenda: ResMut<Agenda>,
) {
    for &id in &parked.queue {
        agenda.schedule(clock.now + flows.latency, Event::ReadStart(id));
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
    if !flows.changed {
        return;
    }
    let now = clock.now;
    let flows = &mut *flows;
    flows.changed = false;
    flows.generation += 1;
    if flows.active.is_empty() {
        return;
    }
    flows.scratch_links.clear();
    for &f in &flows.active {
        let mut flow = flow_q.get_mut(f).expect("active flow");
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
        let mut flow = flow_q.get_mut(f).expect("active flow");
        flow.rate = flows.scratch_rates[k];
        flow.finish_at = now + flow.remaining / flow.rate;
        earliest = earliest.min(flow.finish_at);
    }
    agenda.schedule(
        earliest,
        Event::FlowDone {
            generation: flows.generation,
        },
    );
}
