//! The workload (MODEL.md §3): multi-turn sessions arriving as a Poisson
//! process, or an explicit trace of requests.

use bevy_ecs::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_distr::{Bernoulli, Distribution, Exp, Uniform};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::agenda::{Agenda, Event};
use crate::metrics::Metrics;
use crate::request::Request;
use crate::scenario::Workload;
use crate::sim::{Clock, Gateway, PhaseIndex, TickEvents};

/// splitmix64: derives independent stream seeds from (run seed, stream id).
pub fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A session: its context so far and its own random stream, so that a policy
/// change does not reshuffle the workload (common random numbers).
#[derive(Component, Debug)]
pub struct Session {
    pub id: u64,
    rng: Xoshiro256PlusPlus,
    /// K: tokens of context so far.
    pub context: u32,
    pub turns: u32,
}

/// One turn's draws. All four are drawn every turn, in this order, so a
/// session's stream stays aligned whatever happens to its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub new_tokens: u32,
    pub output: u32,
    pub continues: bool,
    pub tool_time: f64,
}

fn whole(x: f64) -> u32 {
    x.round().max(1.0) as u32
}

impl Session {
    pub fn new(id: u64, run_seed: u64) -> Session {
        Session {
            id,
            rng: Xoshiro256PlusPlus::seed_from_u64(mix(run_seed, id)),
            context: 0,
            turns: 0,
        }
    }

    pub fn draw_turn(&mut self, w: &Workload) -> Turn {
        let n = if self.turns == 0 {
            let (lo, hi) = w.first_turn_tokens;
            Uniform::new_inclusive(lo, hi)
                .expect("validated")
                .sample(&mut self.rng)
        } else {
            Exp::new(1.0 / w.later_turn_tokens_mean)
                .expect("validated")
                .sample(&mut self.rng)
        };
        let o = Exp::new(1.0 / w.output_tokens_mean)
            .expect("validated")
            .sample(&mut self.rng)
            + 1.0;
        let continues = Bernoulli::new(w.continue_probability)
            .expect("validated")
            .sample(&mut self.rng);
        let tool_time = Exp::new(1.0 / w.tool_time_mean)
            .expect("validated")
            .sample(&mut self.rng);
        self.turns += 1;
        Turn {
            new_tokens: whole(n),
            output: whole(o),
            continues,
            tool_time,
        }
    }
}

/// A request given explicitly (trace workloads, replays, tests).
#[derive(Debug, Clone)]
pub struct TraceRequest {
    pub name: String,
    pub arrival: f64,
    pub prompt: u32,
    pub output: u32,
    /// Requests of one stream share prefixes; `None`: shares nothing.
    pub stream: Option<u64>,
    /// Without a router (direct mode): prefill on prefiller 0?
    pub remote: bool,
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> Workload {
        Workload {
            session_rate: 0.6,
            first_turn_tokens: (1000.0, 3000.0),
            later_turn_tokens_mean: 500.0,
            output_tokens_mean: 200.0,
            continue_probability: 0.9,
            tool_time_mean: 3.0,
        }
    }

    #[test]
    fn a_session_stream_depends_only_on_seed_and_id() {
        let mut a = Session::new(5, 1);
        let mut b = Session::new(5, 1);
        let mut c = Session::new(6, 1);
        let ta = a.draw_turn(&w());
        assert_eq!(ta, b.draw_turn(&w()));
        assert_ne!(ta, c.draw_turn(&w()));
        assert!((1000..=3000).contains(&ta.new_tokens));
        assert!(ta.output >= 1);
    }

    #[test]
    fn draws_have_the_model_means() {
        // 20 000 turns: means within a few standard errors.
        let (mut n_sum, mut o_sum, mut cont, mut tool) = (0.0, 0.0, 0.0, 0.0);
        let k = 20_000;
        for id in 0..k {
            let mut s = Session::new(id, 3);
            s.draw_turn(&w());
            let t = s.draw_turn(&w()); // a later turn
            n_sum += t.new_tokens as f64;
            o_sum += t.output as f64;
            cont += t.continues as u32 as f64;
            tool += t.tool_time;
        }
        let k = k as f64;
        assert!(
            (n_sum / k - 500.0).abs() < 15.0,
            "later-turn mean {}",
            n_sum / k
        );
        assert!((o_sum / k - 201.0).abs() < 6.0, "output mean {}", o_sum / k);
        assert!((cont / k - 0.9).abs() < 0.01, "continue {}", cont / k);
        assert!((tool / k - 3.0).abs() < 0.1, "tool {}", tool / k);
    }
}
