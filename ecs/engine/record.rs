//! Optional records: every step formed and every finished request (replays,
//! tests: [`crate::Sim::record`]), and the steps of a time window as they
//! end (the timeline: [`StepSlices`]). A run keeps none unless asked.

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

/// One step as it ended: its time, its tokens (and how many were prompt
/// tokens), its requests, the requests its formation preempted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSlice {
    pub start: f64,
    pub end: f64,
    pub tokens: u32,
    pub prompt_tokens: u32,
    pub requests: u32,
    pub preempted: u32,
}

/// The steps of an engine that ended within `window` since they were last
/// taken (by the timeline writer, every tick).
#[derive(Debug, Clone, Default)]
pub struct StepSlices {
    pub window: (f64, f64),
    pub steps: Vec<StepSlice>,
}
