//! KV transfers (MODEL.md §6–§8): the prefiller's leases, NIXL reads as
//! flows over two NICs, and the bandwidth allocation among flows.
//!
//! | file | what |
//! |---|---|
//! | [`systems`] | the tick's systems: flows that end, reads that start, rates re-divided |
//! | [`sharing`] | max-min fair sharing of the links (and the ablations) |

use bevy_ecs::prelude::*;

use crate::engine::BlockId;
use crate::scenario::{SharingModel, TransferMode};

pub mod sharing;
pub mod systems;

use sharing::FlowSharing;

/// An instance's NIC: the link index flows use in the bandwidth allocation.
#[derive(Component, Debug, Clone, Copy)]
pub struct Nic {
    pub link: u32,
    pub tokens_per_s: f64,
}

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
    /// Tokens it moves in all, from `started` on.
    pub tokens: u32,
    pub started: f64,
    /// Tokens left as of `updated`.
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
    pub link_capacity: Vec<f64>,
    /// Flows in the order they started (deterministic iteration).
    pub active: Vec<Entity>,
    /// Flows per link, for policies (NIC flows in progress).
    pub per_link: Vec<u32>,
    /// The set of flows changed this tick: rates must be recomputed.
    pub changed: bool,
    /// Bumped at each recomputation: older FlowDone events are stale.
    pub generation: u64,
    /// Transfers completed so far, and the tokens they moved.
    pub completed: u64,
    pub completed_tokens: u64,
    /// Completed flows for a timeline, when asked for (taken every tick).
    pub slices: Option<Vec<FlowSlice>>,
    pub(crate) sharing_state: FlowSharing,
    pub(crate) scratch_links: Vec<[u32; 2]>,
    pub(crate) scratch_rates: Vec<f64>,
    pub(crate) done: Vec<Entity>,
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
            completed: 0,
            completed_tokens: 0,
            slices: None,
            sharing_state: FlowSharing::new(),
            scratch_links: Vec::new(),
            scratch_rates: Vec::new(),
            done: Vec::new(),
        }
    }

    pub(crate) fn start(
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
            tokens,
            started: now,
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
