//! The workload (docs/model.md §3): multi-turn sessions arriving as a Poisson
//! process, or an explicit trace of requests.
//!
//! | file | what |
//! |---|---|
//! | [`sessions`] | a session's context and its own random stream; one turn's draws |
//! | [`trace`] | requests given explicitly: trace files (Mooncake, Azure, pdsim), block identity from hash ids |

use bevy_ecs::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::sync::Arc;

use crate::engine::{BlockPath, NextTurn, Request};
use crate::metrics::formats::aiperf::{self, AiperfLog};
use crate::metrics::{Counters, Metrics};
use crate::scenario::Sessions;
use crate::shared::{
    Agenda, Clock, Event, Gateway, Joining, Lookup, PhaseIndex, TickEvents, WithJoining,
};

pub mod sessions;
pub mod trace;

pub use sessions::{Session, Turn, mix};
pub use trace::{LONE_STREAMS, SharedTrace, Trace, TraceRequest};

/// Workload state: the arrival stream, the current session parameters (a
/// phase may change them), the trace being replayed.
#[derive(Resource)]
pub struct WorkloadState {
    pub params: Sessions,
    pub max_model_len: u32,
    pub seed: u64,
    pub warmup: f64,
    arrivals: Xoshiro256PlusPlus,
    next_session: u64,
    pub next_request: u64,
    pub trace: Arc<[TraceRequest]>,
}

impl WorkloadState {
    pub fn new(params: Sessions, max_model_len: u32, seed: u64, warmup: f64) -> Self {
        WorkloadState {
            params,
            max_model_len,
            seed,
            warmup,
            arrivals: Xoshiro256PlusPlus::seed_from_u64(mix(seed, u64::MAX)),
            next_session: 0,
            next_request: 0,
            trace: Arc::new([]),
        }
    }

    /// Time to the next session arrival (exponential, rate Λ).
    pub fn next_arrival_gap(&mut self) -> f64 {
        let u: f64 = self.arrivals.random();
        // Inverse transform on (0, 1]: never ln(0).
        -(1.0f64 - u).ln() / self.params.session_rate
    }
}

/// System: new sessions, sessions back from a tool call, and trace requests
/// due now issue their requests to the gateway.
#[allow(clippy::too_many_arguments)]
pub fn workload_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    phase: Res<PhaseIndex>,
    mut state: ResMut<WorkloadState>,
    (mut sessions, mut begun): (Query<&mut Session>, ResMut<Joining<Session>>),
    mut agenda: ResMut<Agenda>,
    mut gateway: ResMut<Gateway>,
    mut metrics: ResMut<Metrics>,
    mut counters: ResMut<Counters>,
    mut aiperf: Option<ResMut<AiperfLog>>,
    mut issued: ResMut<Joining<Request>>,
) {
    let mut sessions = WithJoining {
        table: &mut sessions,
        joining: &mut begun,
    };
    issue_arrivals(
        clock.now,
        &events,
        (&mut state, phase.0, &mut sessions),
        (&mut agenda, &mut gateway),
        (&mut metrics, &mut counters, aiperf.as_deref_mut()),
        &mut commands,
        &mut issued,
    );
}

/// The body of [`workload_system`], also run by the fast ticks on their own
/// fetch (`sim::schedule`). New sessions and requests are kept in
/// `sessions.joining` and `issued`, each joined to the world by a command
/// queued now: where the list spawns it, so its table keeps the list's
/// order; until then the fast ticks look them up there.
#[allow(clippy::too_many_arguments)]
pub(crate) fn issue_arrivals<S: Lookup<Session>>(
    now: f64,
    events: &TickEvents,
    (state, phase, sessions): (&mut WorkloadState, u32, &mut WithJoining<'_, S, Session>),
    (agenda, gateway): (&mut Agenda, &mut Gateway),
    (metrics, counters, aiperf): (&mut Metrics, &mut Counters, Option<&mut AiperfLog>),
    commands: &mut Commands,
    issued: &mut Joining<Request>,
) {
    let mut issue = Issue {
        commands,
        issued,
        gateway,
        metrics,
        counters,
        aiperf,
        now,
        phase,
    };
    for _ in 0..events.session_arrivals {
        let id = state.next_session;
        state.next_session += 1;
        let mut session = Session::new(id, state.seed, &state.params);
        let entity = sessions.joining.reserve();
        if issue.turn(entity, &mut session, state) {
            sessions.joining.keep(issue.commands, entity, session);
        } else {
            sessions.joining.give_back(issue.commands, entity);
        }
        let gap = state.next_arrival_gap();
        agenda.schedule(now + gap, Event::SessionArrival);
    }
    for &entity in &events.next_turns {
        let session = sessions
            .find_mut(entity)
            .expect("a continuing session exists");
        if !issue.turn(entity, session, state) {
            issue.commands.entity(entity).despawn();
        }
    }
    for &i in &events.trace_arrivals {
        issue.trace_request(i, state);
    }
}

/// What issuing a request touches.
struct Issue<'a, 'w, 's> {
    commands: &'a mut Commands<'w, 's>,
    /// The requests issued, until they join the world.
    issued: &'a mut Joining<Request>,
    gateway: &'a mut Gateway,
    metrics: &'a mut Metrics,
    counters: &'a mut Counters,
    aiperf: Option<&'a mut AiperfLog>,
    now: f64,
    phase: u32,
}

impl Issue<'_, '_, '_> {
    /// A turn with this prompt arrives: counted, and refused when the
    /// prompt reaches `max_model_len` (vLLM refuses it: docs/model.md §3).
    /// Returns whether it goes on to the gateway.
    fn arrives(&mut self, prompt: u64, session: u64, turn: u32, state: &WorkloadState) -> bool {
        let too_long = prompt >= state.max_model_len as u64;
        self.counters.arrived(prompt, too_long);
        if self.now >= state.warmup {
            self.metrics.turn(self.phase, too_long);
        }
        if too_long && let Some(log) = self.aiperf.as_deref_mut() {
            let who = aiperf::Turn {
                id: format!("refused-{session}-{turn}"),
                session,
                turn,
                t0: self.now,
            };
            log.refused(&who, prompt);
        }
        !too_long
    }

    /// The request goes to the gateway (it joins the world when the
    /// commands are applied).
    fn send(&mut self, r: Request) {
        let id = self.issued.reserve();
        self.issued.keep(self.commands, id, r);
        self.gateway.queue.push(id);
    }

    /// Draws a session's turn; issues its request, or ends the session when
    /// the prompt is too long. Returns whether the session lives on (it has
    /// a later turn).
    fn turn(&mut self, entity: Entity, session: &mut Session, state: &mut WorkloadState) -> bool {
        let turn = session.draw_turn(&state.params);
        let prompt = session.context as u64 + turn.new_tokens as u64;
        if !self.arrives(prompt, session.id, session.turns - 1, state) {
            return false;
        }
        let prompt = prompt as u32;
        let output = turn.output.min(state.max_model_len - prompt);
        session.context = prompt + output;
        let mut r = Request::new(
            state.next_request,
            session.id,
            session.path.clone(),
            prompt,
            output,
            self.now,
        );
        state.next_request += 1;
        r.turn = session.turns - 1;
        r.phase = self.phase;
        r.new_tokens = turn.new_tokens;
        r.next_turn = turn.continues.then_some(NextTurn::Session {
            session: entity,
            after: turn.tool_time,
        });
        self.send(r);
        turn.continues
    }

    /// Trace request `i` is due: it goes to the gateway (its output cut at
    /// `max_model_len`), with its session's next turn to follow.
    fn trace_request(&mut self, i: u32, state: &WorkloadState) {
        let t = &state.trace[i as usize];
        let lone = LONE_STREAMS + i as u64;
        if !self.arrives(t.prompt as u64, t.session.unwrap_or(lone), 0, state) {
            return; // refused: its session ends here
        }
        let path = t.path.clone().unwrap_or_else(|| BlockPath::stream(lone));
        let output = t.output.min(state.max_model_len - t.prompt);
        let mut r = Request::new(
            i as u64,
            t.session.unwrap_or(lone),
            path,
            t.prompt,
            output,
            self.now,
        );
        r.phase = self.phase;
        r.trace_remote = t.remote;
        r.next_turn = t.next.map(|j| NextTurn::Trace {
            index: j,
            after: state.trace[j as usize].delay,
        });
        self.send(r);
    }
}
