//! KV transfers (MODEL.md §6–§8): the prefiller's leases, NIXL reads as
//! flows over two NICs, and the bandwidth allocation among flows.

use bevy_ecs::prelude::*;

use crate::agenda::{Agenda, Event};
use crate::engine::{Engine, KvPool, Nic};
use crate::kv::BlockId;
use crate::request::{KvSource, Request, Status};
use crate::scenario::{SharingModel, TransferMode};
use crate::sharing::FlowSharing;
use crate::sim::{Clock, TickEvents};

/// Blocks a prefiller keeps for a finished prefill until the decoder has
/// read them (or, store-and-forward, until they are copied out).
#[derive(Component, Debug)]
pub struct Lease {
    pub prefiller: Entity,
    pub request: Entity,
    pub blocks: Vec<BlockId>,
    pub since: f64,
}

/// A transfer in progress over two links: the prefiller's NIC and the
/// decoder's NIC.
#[derive(Component, Debug)]
pub struct Flow {
    pub request: Entity,
    pub links: [u32; 2],
    /// Tokens left as of `updated`.
    pub remaining: f64,
    pub rate: f64,
    pub updated: f64,
    /// When it completes at the current rate.
    pub finish_at: f64,
}

/// The set of flows and what the bandwidth allocation needs.
#[derive(Resource)]
pub struct Flows {
    pub mode: TransferMode,
    pub sharing: SharingModel,
    pub latency: f64,
    pub link_capacity: Vec<f64>,
    /// Flows in the order they started (deterministic iteration).
    pub active: Vec<Entity>,
    /// Flows per link, for policies (NIC flows in progress).
    pub per_link: Vec<u32>,
    /// The set of flows changed this tick: rates must be recomputed.
    pub changed: bool,
    /// Bumped at each recomputation: older FlowDone events are stale.
    pub generation: u64,
    sharing_state: FlowSharing,
    scratch_links: Vec<[u32; 2]>,
    scratch_rates: Vec<f64>,
    done: Vec<Entity>,
}

impl Flows {
    pub fn new(
        mode: TransferMode,
        sharing: SharingModel,
        latency: f64,
        link_capacity: Vec<f64>,
    ) -> Flows {
        let n = link_capacity.len();
        Flows {
            mode,
            sharing,
            latency,
            link_capacity,
            active: Vec::new(),
            per_link: vec![0; n],
            changed: false,
            generation: 0,
            sharing_state: FlowSharing::new(),
            scratch_links: Vec::new(),
            scratch_rates: Vec::new(),
            done: Vec::new(),
        }
    }

    fn start(
        &mut self,
        commands: &mut Commands,
        request: Entity,
        links: [u32; 2],
        tokens: u32,
        now: f64,
    ) {
        let flow = Flow {
            request,
            links,
            remaining: tokens as f64,
            rate: 0.0,
            updated: now,
            finish_at: f64::INFINITY,
        };
        let id = commands.spawn(flow).id();
        self.active.push(id);
        for l in links {
            self.per_link[l as usize] += 1;
        }
        self.changed = true;
    }
}

/// Starts the copy of a finished prefill out of the prefiller
/// (store-and-forward mode), over the same two NICs as a read.
pub fn start_copy(
    flows: &mut Flows,
    commands: &mut Commands,
    request: Entity,
    links: [u32; 2],
    tokens: u32,
    now: f64,
) {
    flows.start(commands, request, links, tokens, now);
}

/// System: flows that completed now end (leases released, KV delivered);
/// reads whose latency ended start flowing.
#[allow(clippy::too_many_arguments)]
pub fn transfer_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut flows: ResMut<Flows>,
    flow_q: Query<&Flow>,
    leases: Query<&Lease>,
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
        let r = reqs.get(request).expect("a parked request");
        let p = engines
            .get(r.prefiller.expect("remote"))
            .expect("prefiller")
            .2
            .link;
        let d = engines
            .get(r.decoder.expect("routed"))
            .expect("decoder")
            .2
            .link;
        let tokens = r.remote_tokens;
        flows.start(&mut commands, request, [p, d], tokens, now);
    }
}

/// A transfer finished: the prefiller's lease ends, the decoder gets the KV.
fn complete(
    request: Entity,
    now: f64,
    mode: TransferMode,
    commands: &mut Commands,
    leases: &Query<&Lease>,
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
            d.enqueue(request);
        }
    }
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
