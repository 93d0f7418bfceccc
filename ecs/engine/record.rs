//! Optional records for replays and tests: every step formed, every
//! finished request. A run keeps neither unless asked ([`crate::Sim::record`]).

use bevy_ecs::prelude::*;

use crate::engine::request::Request;

/// Optional per-step recording (replays, tests): every step formed.
#[derive(Resource, Default, Debug)]
pub struct StepRecorder {
    pub steps: Vec<StepRecord>,
    /// Preemptions by formations that computed nothing, reported with the
    /// engine's next step (as the vLLM oracle does).
    pub pending_preempted: Vec<(Entity, u64)>,
}

#[derive(Debug, Clone)]
pub struct StepRecord {
    pub engine: Entity,
    pub start: f64,
    pub end: f64,
    pub scheduled: Vec<(u64, u32)>,
    pub preempted: Vec<u64>,
    pub kv_blocks_held: u32,
}

/// Optional record of every finished request (replays, tests).
#[derive(Resource, Default, Debug)]
pub struct FinishedRequests(pub Vec<Request>);
