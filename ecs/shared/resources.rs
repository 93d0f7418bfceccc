//! The resources the tick's systems share (see the ordering contract in
//! [`crate::sim`]): filled by one system, read by a later one in the same
//! tick, and cleared by their reader or by the loop.

use bevy_ecs::prelude::*;

use crate::error::Error;
use crate::scenario::RawScenario;
use crate::shared::agenda::Event;

/// Simulated time of the current tick.
#[derive(Resource, Default, Debug)]
pub struct Clock {
    pub now: f64,
    pub ticks: u64,
}

/// The events due at the current instant, sorted by the system that takes
/// them (filled by the loop before each tick).
#[derive(Resource, Default, Debug)]
pub struct TickEvents {
    pub phases: Vec<u32>,
    pub session_arrivals: u32,
    pub next_turns: Vec<Entity>,
    pub trace_arrivals: Vec<u32>,
    pub read_starts: Vec<Entity>,
    pub flow_done: Vec<u64>,
    pub step_ends: Vec<(Entity, u64)>,
}

impl TickEvents {
    pub fn clear(&mut self) {
        self.phases.clear();
        self.session_arrivals = 0;
        self.next_turns.clear();
        self.trace_arrivals.clear();
        self.read_starts.clear();
        self.flow_done.clear();
        self.step_ends.clear();
    }

    pub fn push(&mut self, e: Event) {
        match e {
            Event::Phase(i) => self.phases.push(i),
            Event::SessionArrival => self.session_arrivals += 1,
            Event::NextTurn(s) => self.next_turns.push(s),
            Event::TraceArrival(i) => self.trace_arrivals.push(i),
            Event::ReadStart(r) => self.read_starts.push(r),
            Event::FlowDone { generation } => self.flow_done.push(generation),
            Event::StepEnd(e, generation) => self.step_ends.push((e, generation)),
        }
    }
}

/// Requests that reached the gateway this tick, in arrival order (workload →
/// routing).
#[derive(Resource, Default, Debug)]
pub struct Gateway {
    pub queue: Vec<Entity>,
}

/// Prefill legs answered this tick, for the sidecar (step end → handoff).
#[derive(Resource, Default, Debug)]
pub struct Handoffs {
    pub queue: Vec<Entity>,
}

/// Requests that produced their last token this tick, in the order their
/// steps ended (step end → retirement: observed, released, next turn).
#[derive(Resource, Default, Debug)]
pub struct Finished {
    pub queue: Vec<Entity>,
}

/// Remote requests a decoder admitted and parked this tick: their read is
/// posted (step start → transfers).
#[derive(Resource, Default, Debug)]
pub struct Parked {
    pub queue: Vec<Entity>,
}

/// The hot-swap phase in force.
#[derive(Resource, Default, Debug)]
pub struct PhaseIndex(pub u32);

/// Engines by role and index.
#[derive(Resource, Default, Debug, Clone)]
pub struct EngineIndex {
    pub prefill: Vec<Entity>,
    pub decode: Vec<Entity>,
}

/// Set when the run must stop (a script error); the loop checks it.
#[derive(Resource, Default, Debug)]
pub struct RunStatus {
    pub error: Option<Error>,
}

/// The scenario as it stands now (phases edit it).
#[derive(Resource, Debug)]
pub struct CurrentScenario(pub RawScenario);
