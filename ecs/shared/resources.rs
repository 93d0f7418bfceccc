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
    /// Of those, the ticks the loop's lone lane handed over itself, without
    /// the agenda (a count for tests and profiles: no result depends on it).
    pub lone_ticks: u64,
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
    pub step_ends: Vec<(Entity, u32)>,
    pub faults: Vec<(u32, bool)>,
    pub router_learns: Vec<(u32, bool)>,
    pub prefill_retries: Vec<Entity>,
    pub client_retries: Vec<Entity>,
    pub registrations: Vec<Entity>,
    /// Leases whose deadline is now (from [`Deadlines`]).
    pub lease_deadlines: Vec<Entity>,
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
        self.faults.clear();
        self.router_learns.clear();
        self.prefill_retries.clear();
        self.client_retries.clear();
        self.registrations.clear();
        self.lease_deadlines.clear();
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
            Event::Fault { index, start } => self.faults.push((index, start)),
            Event::RouterLearns { pod, up } => self.router_learns.push((pod, up)),
            Event::PrefillRetry(r) => self.prefill_retries.push(r),
            Event::ClientRetry(r) => self.client_retries.push(r),
            Event::Registration(r) => self.registrations.push(r),
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

impl EngineIndex {
    /// Every engine, prefillers then decoders, each by index: the order
    /// steps are formed in and the gauges read the engines in.
    pub fn all(
        &self,
    ) -> std::iter::Chain<std::slice::Iter<'_, Entity>, std::slice::Iter<'_, Entity>> {
        self.prefill.iter().chain(&self.decode)
    }

    /// Where engine `e` comes in [`Self::all`].
    pub fn position(&self, e: Entity) -> Option<usize> {
        self.all().position(|&x| x == e)
    }

    pub fn len(&self) -> usize {
        self.prefill.len() + self.decode.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Set when the run must stop (a script error); the loop checks it.
#[derive(Resource, Default, Debug)]
pub struct RunStatus {
    pub error: Option<Error>,
    /// Why the run ended before its horizon (an unbounded backlog).
    pub stopped_early: Option<String>,
}

/// The scenario as it stands now (phases edit it).
#[derive(Resource, Debug)]
pub struct CurrentScenario(pub RawScenario);

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FailReason {
    /// Its decoder went down (or was down when it was sent there).
    DecoderDown,
    /// Its prefiller went down (or was down when it was sent there).
    PrefillerDown,
    /// Its KV was lost with its prefiller before the decoder read it.
    KvLost,
    /// The router knew no pod of a role to be up.
    NoEndpoint,
}

impl FailReason {
    pub const ALL: [FailReason; 4] = [
        FailReason::DecoderDown,
        FailReason::PrefillerDown,
        FailReason::KvLost,
        FailReason::NoEndpoint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FailReason::DecoderDown => "decoder_down",
            FailReason::PrefillerDown => "prefiller_down",
            FailReason::KvLost => "kv_lost",
            FailReason::NoEndpoint => "no_endpoint",
        }
    }
}

/// Requests (or prefill legs) that failed this tick, for their retirement
/// (any system → the end of the tick: retries, accounting).
#[derive(Resource, Default, Debug)]
pub struct Failed {
    pub queue: Vec<(Entity, FailReason)>,
}

/// A change to a pod's health, applied by the `Faults` system at the
/// start of the tick: the scenario's faults put them here at their times,
/// and a custom system may too. Pods are numbered prefillers first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultCommand {
    PodDown {
        pod: u32,
    },
    PodUp {
        pod: u32,
    },
    /// The pod's NICs at `factor` of their rate (1: restored).
    NicFactor {
        pod: u32,
        factor: f64,
    },
}

#[derive(Resource, Default, Debug)]
pub struct FaultQueue {
    pub commands: Vec<FaultCommand>,
}

/// The random stream of the faults (heartbeat loss, lost answers), apart
/// from the workload's so that adding a fault does not change the traffic.
#[derive(Resource, Debug)]
pub struct FaultRng(pub rand_xoshiro::Xoshiro256PlusPlus);
