//! KV transfers (docs/model.md §6–§8): the prefiller's leases, NIXL reads as
//! flows over two NICs, and the bandwidth allocation among flows.
//!
//! | file | what |
//! |---|---|
//! | [`systems`] | the tick's systems: flows that end, reads that start, rates re-divided |
//! | [`leases`] | leases: grant, heartbeats, expiry, the stranded-KV account |
//! | [`sharing`] | max-min fair sharing of the links (and the ablations) |

use bevy_ecs::prelude::*;

use crate::engine::BlockId;
use crate::scenario::{LeaseConfig, SharingModel, TransferMode};
use crate::shared::DeadlineKey;

pub mod leases;
pub mod sharing;
pub mod systems;

use sharing::FlowSharing;

/// An instance's NICs: `links` consecutive link indices from `first_link`
/// in the bandwidth allocation, each of `tokens_per_s`; its `tp` ranks use
/// them evenly ([`crate::hardware::nic`]). `pod` numbers the instances
/// (prefillers first).
#[derive(Component, Debug, Clone, Copy)]
pub struct Nic {
    pub pod: u32,
    pub first_link: u32,
    pub links: u32,
    pub tp: u32,
    pub tokens_per_s: f64,
}

/// Blocks a prefiller keeps for a finished prefill until the decoder has
/// read them (or, store-and-forward, until they are copied out), or until
/// the lease expires ([`leases`]).
#[derive(Component, Debug)]
pub struct Lease {
    pub prefiller: Entity,
    /// The request whose decode leg reads it.
    pub request: Entity,
    pub blocks: Vec<BlockId>,
    /// Tokens the blocks hold (for the stranded-KV account).
    pub tokens: u64,
    pub since: f64,
    /// Rank-to-rank flows of its transfer still moving.
    pub parts_left: u32,
    pub state: LeaseState,
    /// When it expires unless a heartbeat renews it, and its deadline's key.
    pub expires_at: f64,
    pub deadline: Option<DeadlineKey>,
    /// The decoder heartbeats from here (its decode request reached it) to
    /// `heartbeats_until` (its read done, the decoder or the request
    /// gone); heartbeats up to `heartbeats_seen` are counted.
    pub heartbeats_from: Option<f64>,
    pub heartbeats_until: f64,
    pub heartbeats_seen: f64,
    /// Heartbeats renew it (not with push's parallel dispatch in vLLM 0.33).
    pub renewable: bool,
    /// Since when no decoder will read it (its decoder or its answer is
    /// gone): its KV is stranded until it ends.
    pub stranded_since: Option<f64>,
}

/// Where a lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    Held,
    /// Its blocks were freed at expiry; a transfer of them still counts as
    /// a read of freed blocks.
    Expired,
    /// Its prefiller went down with the blocks.
    Lost,
}

/// One rank-to-rank part of a transfer in progress, over two links: a NIC
/// of the prefiller and a NIC of the decoder. With one rank on each side a
/// transfer is one flow carrying all of it.
#[derive(Component, Debug)]
pub struct Flow {
    pub request: Entity,
    /// The pods at its two ends (for the reads each pod has in progress).
    pub pods: [u32; 2],
    pub links: [u32; 2],
    /// Tokens the whole transfer moves, from `started` on, and this part's
    /// share of them.
    pub tokens: u32,
    pub share: f64,
    pub started: f64,
    /// Tokens left as of `updated` (in whole-token units: `share × tokens`
    /// at the start).
    pub remaining: f64,
    pub rate: f64,
    pub updated: f64,
    /// When it completes at the current rate.
    pub finish_at: f64,
}

/// A completed flow, for a timeline: its request (by id), links and times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSlice {
    pub request: u64,
    pub links: [u32; 2],
    pub tokens: u32,
    pub start: f64,
    pub end: f64,
}

/// The set of flows and what the bandwidth allocation needs.
#[derive(Resource)]
pub struct Flows {
    pub mode: TransferMode,
    pub sharing: SharingModel,
    pub latency: f64,
    /// Push mode: the registration's trip to the prefiller.
    pub notify_latency: f64,
    pub lease: LeaseConfig,
    /// Each link's capacity now, and without faults.
    pub link_capacity: Vec<f64>,
    pub base_capacity: Vec<f64>,
    /// Flows in the order they started (deterministic iteration).
    pub active: Vec<Entity>,
    /// Flows per link.
    pub per_link: Vec<u32>,
    /// Transfers in progress per pod, and the KV tokens per second their
    /// flows move through it, for policies (`nic_flows`, `nic_rate`).
    pub per_pod: Vec<u32>,
    pub pod_rate: Vec<f64>,
    /// The set of flows changed this tick: rates must be recomputed.
    pub changed: bool,
    /// Bumped at each recomputation: older FlowDone events are stale.
    pub generation: u64,
    /// Transfers completed so far, and the tokens they moved.
    pub completed: u64,
    pub completed_tokens: u64,
    /// Leases that expired; transfers that completed from freed blocks;
    /// token·seconds of prefiller KV held for requests no decoder will read.
    pub leases_expired: u64,
    pub reads_of_freed_blocks: u64,
    pub stranded_token_seconds: f64,
    /// Completed flows for a timeline, when asked for (taken every tick).
    pub slices: Option<Vec<FlowSlice>>,
    pub(crate) sharing_state: FlowSharing,
    pub(crate) scratch_links: Vec<[u32; 2]>,
    pub(crate) scratch_rates: Vec<f64>,
    pub(crate) done: Vec<Entity>,
    pub(crate) parts: Vec<crate::hardware::nic::Part>,
}

impl Flows {
    pub fn new(
        transfer: &crate::scenario::Transfer,
        link_capacity: Vec<f64>,
        pods: usize,
    ) -> Flows {
        let n = link_capacity.len();
        Flows {
            mode: transfer.mode,
            sharing: transfer.sharing,
            latency: transfer.latency,
            notify_latency: transfer.notify_latency,
            lease: transfer.lease,
            base_capacity: link_capacity.clone(),
            link_capacity,
            active: Vec::new(),
            per_link: vec![0; n],
            per_pod: vec![0; pods],
            pod_rate: vec![0.0; pods],
            changed: false,
            generation: 0,
            completed: 0,
            completed_tokens: 0,
            leases_expired: 0,
            reads_of_freed_blocks: 0,
            stranded_token_seconds: 0.0,
            slices: None,
            sharing_state: FlowSharing::new(),
            scratch_links: Vec::new(),
            scratch_rates: Vec::new(),
            done: Vec::new(),
            parts: Vec::new(),
        }
    }

    /// Starts the transfer of `tokens` for `request` from prefiller NICs
    /// `p` to decoder NICs `d`: one flow per pair of ranks holding the same
    /// heads, each made an entity by `spawn`. Returns how many flows it
    /// made.
    pub(crate) fn start(
        &mut self,
        mut spawn: impl FnMut(Flow) -> Entity,
        request: Entity,
        p: &Nic,
        d: &Nic,
        tokens: u32,
        now: f64,
    ) -> u32 {
        if p.tp == 1 && d.tp == 1 {
            // One rank each side: one flow carrying the whole read.
            self.parts.clear();
            self.parts.push(crate::hardware::nic::Part {
                source_nic: 0,
                dest_nic: 0,
                share: 1.0,
            });
        } else {
            crate::hardware::nic::read_parts(p.tp, p.links, d.tp, d.links, &mut self.parts);
        }
        for k in 0..self.parts.len() {
            let part = self.parts[k];
            let links = [p.first_link + part.source_nic, d.first_link + part.dest_nic];
            let flow = Flow {
                request,
                pods: [p.pod, d.pod],
                links,
                tokens,
                share: part.share,
                started: now,
                remaining: part.share * tokens as f64,
                rate: 0.0,
                updated: now,
                finish_at: f64::INFINITY,
            };
            let id = spawn(flow);
            self.active.push(id);
            for l in links {
                self.per_link[l as usize] += 1;
            }
        }
        self.per_pod[p.pod as usize] += 1;
        self.per_pod[d.pod as usize] += 1;
        self.changed = true;
        self.parts.len() as u32
    }

    /// Stops every flow of `request` (its decoder or prefiller went down);
    /// returns whether it had any.
    pub(crate) fn cancel(
        &mut self,
        commands: &mut Commands,
        request: Entity,
        flow_q: &Query<&Flow>,
    ) -> bool {
        let mut any = false;
        let mut pods = None;
        let (per_link, active) = (&mut self.per_link, &mut self.active);
        active.retain(|&f| {
            let flow = flow_q.get(f).expect("active flow");
            if flow.request != request {
                return true;
            }
            for l in flow.links {
                per_link[l as usize] -= 1;
            }
            pods = Some(flow.pods);
            commands.entity(f).despawn();
            any = true;
            false
        });
        if let Some(pods) = pods {
            for p in pods {
                self.per_pod[p as usize] -= 1;
            }
        }
        self.changed |= any;
        any
    }

    /// Sets the links of a pod to `factor` of their rate.
    pub fn set_nic_factor(&mut self, nic: &Nic, factor: f64) {
        for l in nic.first_link..nic.first_link + nic.links {
            self.link_capacity[l as usize] = self.base_capacity[l as usize] * factor;
        }
        self.changed = true;
    }
}
