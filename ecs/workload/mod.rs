//! The workload (MODEL.md §3): multi-turn sessions arriving as a Poisson
//! process, or an explicit trace of requests.
//!
//! | file | what |
//! |---|---|
//! | [`sessions`] | a session's context and its own random stream; one turn's draws |
//! | [`trace`] | requests given explicitly |

use bevy_ecs::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::engine::Request;
use crate::metrics::Metrics;
use crate::scenario::Workload;
use crate::shared::{Agenda, Clock, Event, Gateway, PhaseIndex, TickEvents};

pub mod sessions;
pub mod trace;

pub use sessions::{Session, Turn, mix};
pub use trace::TraceRequest;

/// Workload state: the arrival stream, counters, and the current parameters
/// (a phase may change them).
#[derive(Resource)]
pub struct WorkloadState {
    pub params: Workload,
    pub max_model_len: u32,
    pub seed: u64,
    pub warmup: f64,
    arrivals: Xoshiro256PlusPlus,
    next_session: u64,
    pub next_request: u64,
    pub trace: Vec<TraceRequest>,
}

/// Stream ids of trace requests without a stream start here, far from sessions.
const LONE_STREAM_BASE: u64 = 1 << 40;

impl WorkloadState {
    pub fn new(params: Workload, max_model_len: u32, seed: u64, warmup: f64) -> Self {
        WorkloadState {
            params,
            max_model_len,
            seed,
            warmup,
            arrivals: Xoshiro256PlusPlus::seed_from_u64(mix(seed, u64::MAX)),
            next_session: 0,
            next_request: 0,
            trace: Vec::new(),
        }
    }

    /// Time to the next session arrival (exponential, rate Λ).
    pub fn next_arrival_gap(&mut self) -> f64 {
        let u: f64 = self.arrivals.random();
        // Inverse transform on (0, 1]: never ln(0).
        -(1.0f64 - u).ln() / self.params.session_rate
    }
}

/// System: new sessions and next turns issue requests to the gateway.
#[allow(clippy::too_many_arguments)]
pub fn workload_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    phase: Res<PhaseIndex>,
    mut state: ResMut<WorkloadState>,
    mut sessions: Query<&mut Session>,
    mut agenda: ResMut<Agenda>,
    mut gateway: ResMut<Gateway>,
    mut metrics: ResMut<Metrics>,
) {
    let now = clock.now;
    let state = &mut *state;
    for _ in 0..events.session_arrivals {
        let id = state.next_session;
        state.next_session += 1;
        let mut session = Session::new(id, state.seed);
        let entity = commands.spawn_empty().id();
        if issue_turn(
            &mut commands,
            entity,
            &mut session,
            state,
            now,
            phase.0,
            &mut gateway,
            &mut metrics,
        ) {
            commands.entity(entity).insert(session);
        } else {
            commands.entity(entity).despawn();
        }
        let gap = state.next_arrival_gap();
        agenda.schedule(now + gap, Event::SessionArrival);
    }
    for &entity in &events.next_turns {
        let mut session = sessions
            .get_mut(entity)
            .expect("a continuing session exists");
        if !issue_turn(
            &mut commands,
            entity,
            &mut session,
            state,
            now,
            phase.0,
            &mut gateway,
            &mut metrics,
        ) {
            commands.entity(entity).despawn();
        }
    }
    for &i in &events.trace_arrivals {
        let t = &state.trace[i as usize];
        let stream = t.stream.unwrap_or(LONE_STREAM_BASE + i as u64);
        let mut r = Request::new(i as u64, stream, t.prompt, t.output, now);
        r.phase = phase.0;
        r.trace_remote = t.remote;
        let id = commands.spawn(r).id();
        gateway.queue.push(id);
    }
}

/// Draws a session's turn; issues its request, or ends the session when the
/// prompt reaches `max_model_len` (counted as too long). Returns whether the
/// session lives on (it has a later turn).
#[allow(clippy::too_many_arguments)]
fn issue_turn(
    commands: &mut Commands,
    entity: Entity,
    session: &mut Session,
    state: &mut WorkloadState,
    now: f64,
    phase: u32,
    gateway: &mut Gateway,
    metrics: &mut Metrics,
) -> bool {
    let turn = session.draw_turn(&state.params);
    let prompt = session.context as u64 + turn.new_tokens as u64;
    let counted = now >= state.warmup;
    if prompt >= state.max_model_len as u64 {
        if counted {
            metrics.turn(phase, true);
        }
        return false;
    }
    if counted {
        metrics.turn(phase, false);
    }
    let prompt = prompt as u32;
    let output = turn.output.min(state.max_model_len - prompt);
    session.context = prompt + output;
    let mut r = Request::new(state.next_request, session.id, prompt, output, now);
    state.next_request += 1;
    r.session = Some(entity);
    r.turn = session.turns - 1;
    r.phase = phase;
    r.new_tokens = turn.new_tokens;
    r.next_turn_in = turn.continues.then_some(turn.tool_time);
    if !turn.continues {
        r.session = None;
    }
    let id = commands.spawn(r).id();
    gateway.queue.push(id);
    turn.continues
}
