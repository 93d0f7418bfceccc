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
use crate::shared::{Agenda, Clock, Event, Gateway, Joining, PhaseIndex, TickEvents};

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
    mut sessions: Query<&mut Session>,
    mut agenda: ResMut<Agenda>,
    mut gateway: ResMut<Gateway>,
    mut metrics: ResMut<Metrics>,
    mut counters: ResMut<Counters>,
    mut aiperf: Option<ResMut<AiperfLog>>,
) {
    let now = clock.now;
    let state = &mut *state;
    let mut issue = Issue {
        commands: &mut commands,
        arriving: None,
        gateway: &mut gateway,
        metrics: &mut metrics,
        counters: &mut counters,
        aiperf: aiperf.as_deref_mut(),
        now,
        phase: phase.0,
    };
    for _ in 0..events.session_arrivals {
        let id = state.next_session;
        state.next_session += 1;
        let mut session = Session::new(id, state.seed, &state.params);
        let entity = issue.commands.spawn_empty().id();
        if issue.turn(entity, &mut session, state) {
            issue.commands.entity(entity).insert(session);
        } else {
            issue.commands.entity(entity).despawn();
        }
        let gap = state.next_arrival_gap();
        agenda.schedule(now + gap, Event::SessionArrival);
    }
    issue.later_turns(&events, &mut sessions, state);
}

/// What the fast ticks take of [`workload_system`] (`sim::schedule`): the
/// turns of sessions in the world and the trace's requests, when no new
/// session arrives (its session is spawned, and looked up at its next
/// turn). The requests wait in `arriving` until the fast ticks stop.
#[allow(clippy::too_many_arguments)]
pub(crate) fn issue_later_turns(
    now: f64,
    events: &TickEvents,
    (state, phase, sessions): (&mut WorkloadState, u32, &mut Query<&mut Session>),
    gateway: &mut Gateway,
    (metrics, counters, aiperf): (&mut Metrics, &mut Counters, Option<&mut AiperfLog>),
    commands: &mut Commands,
    arriving: &mut Joining<Request>,
) {
    debug_assert_eq!(events.session_arrivals, 0, "a new session is the list's");
    Issue {
        commands,
        arriving: Some(arriving),
        gateway,
        metrics,
        counters,
        aiperf,
        now,
        phase,
    }
    .later_turns(events, sessions, state);
}

/// What issuing a request touches.
struct Issue<'a, 'w, 's> {
    commands: &'a mut Commands<'w, 's>,
    /// Where the fast ticks keep the requests they issue (None: a system's,
    /// spawned when its commands are applied).
    arriving: Option<&'a mut Joining<Request>>,
    gateway: &'a mut Gateway,
    metrics: &'a mut Metrics,
    counters: &'a mut Counters,
    aiperf: Option<&'a mut AiperfLog>,
    now: f64,
    phase: u32,
}

impl Issue<'_, '_, '_> {
    /// The turns due now of sessions back from a tool call, then the trace's
    /// requests due now.
    fn later_turns(
        &mut self,
        events: &TickEvents,
        sessions: &mut Query<&mut Session>,
        state: &mut WorkloadState,
    ) {
        for &entity in &events.next_turns {
            let mut session = sessions
                .get_mut(entity)
                .expect("a continuing session exists");
            if !self.turn(entity, &mut session, state) {
                self.commands.entity(entity).despawn();
            }
        }
        for &i in &events.trace_arrivals {
            self.trace_request(i, state);
        }
    }

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

    /// The request goes to the gateway. Issued by the fast ticks, it joins
    /// the world by a command queued now, after what the ticks before
    /// queued and before what routing and the steps queue: where the list
    /// would have spawned it in the requests' table.
    fn send(&mut self, r: Request) {
        let id = match self.arriving.as_deref_mut() {
            None => self.commands.spawn(r).id(),
            Some(arriving) => {
                let id = self.commands.spawn_empty().id();
                arriving.keep(self.commands, id, r);
                id
            }
        };
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
