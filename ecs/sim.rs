//! The simulation: a bevy_ecs `World`, one `Schedule` run once per tick, and
//! the next-event loop around it.
//!
//! # The ordering contract
//!
//! Time advances from one instant at which something happens to the next.
//! Everything that happens at one instant is one *tick*: the agenda hands
//! over every event due now, then the systems run once, in this order
//! ([`SimSystems`], chained):
//!
//! 1. `Phases` — hot-swap phases that start now change policies/parameters.
//! 2. `Workload` — new sessions and sessions whose tool call ended issue a
//!    request (sessions in arrival order, turns in agenda order).
//! 3. `Routing` — requests at the gateway are routed, in the order they
//!    arrived; the router's scripts decide; each goes to one engine's queue.
//! 4. `Transfers` — flows whose finish time is now complete (in start order):
//!    the prefiller's lease is released and the decoder's request promoted;
//!    then reads whose latency ended start flowing.
//! 5. `StepEnd` — steps that end now are applied (engines in agenda order):
//!    tokens computed, first tokens, finishes (KV freed, next turn booked).
//! 6. `Handoff` — the sidecar takes the prefillers' answers: lease, then the
//!    decode leg to its decoder (or the store-and-forward copy starts).
//! 7. `StepStart` — every idle engine whose state changed forms its next step
//!    (prefillers by index, then decoders by index) and books its end;
//!    remote admissions book their read start `x0` later.
//! 8. `Bandwidth` — if flows started or ended, every flow is brought to now,
//!    the links are re-divided (max-min) and the earliest finish is booked.
//! 9. `Observe` — gauges integrate the interval just passed and sample the
//!    new state.
//!
//! An event booked for the current instant by a later system (a read with
//! `x0 = 0`) runs in a following tick at the same time. Ties between events
//! at one instant are broken by (rank = the system above, insertion order).
//!
//! Custom systems (a metric, a fault) go in with
//! [`Sim::add_systems`], ordered against these sets.

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{LogLevel, ScheduleBuildSettings, SingleThreadedExecutor};
use std::time::Instant;

use crate::agenda::{Agenda, Event};
use crate::engine::{Engine, KvPool, Nic, StepLog};
use crate::error::{Error, Result};
use crate::gateway::{Router, RouterMode, handoff_system, routing_system};
use crate::kv::BlockPool;
use crate::metrics::{Gauges, Metrics};
use crate::policy::{Policies, Role};
use crate::report::Report;
use crate::request::{Leg, Request, RequestStore};
use crate::router_book::RouterBook;
use crate::scenario::{self, RawScenario, Scenario};
use crate::transfer::{Flows, bandwidth_system, transfer_system};
use crate::workload::{TraceRequest, WorkloadState, workload_system};

/// The tick's systems, in the order they run (see the module docs).
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimSystems {
    Phases,
    Workload,
    Routing,
    Transfers,
    StepEnd,
    Handoff,
    StepStart,
    Bandwidth,
    Observe,
}

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
    fn clear(&mut self) {
        self.phases.clear();
        self.session_arrivals = 0;
        self.next_turns.clear();
        self.trace_arrivals.clear();
        self.read_starts.clear();
        self.flow_done.clear();
        self.step_ends.clear();
    }

    fn push(&mut self, e: Event) {
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

/// Requests that reached the gateway this tick, in arrival order.
#[derive(Resource, Default, Debug)]
pub struct Gateway {
    pub queue: Vec<Entity>,
}

/// Prefill legs answered this tick, for the sidecar.
#[derive(Resource, Default, Debug)]
pub struct Handoffs {
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

/// Scratch log shared by the step systems.
#[derive(Resource, Default, Debug)]
pub struct StepScratch {
    pub log: StepLog,
}

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

/// System: apply steps that end now.
#[allow(clippy::too_many_arguments)]
pub fn step_end_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    mut reqs: Query<&mut Request>,
    mut scratch: ResMut<StepScratch>,
    mut handoffs: ResMut<Handoffs>,
    mut agenda: ResMut<Agenda>,
    mut metrics: ResMut<Metrics>,
    mut router: NonSendMut<Router>,
    mut finished: Option<ResMut<FinishedRequests>>,
) {
    let now = clock.now;
    for &(e, generation) in &events.step_ends {
        let (mut engine, mut kv) = engines.get_mut(e).expect("engine");
        if engine.generation != generation {
            continue; // a run of repeated steps was cut short: booked anew
        }
        let log = &mut scratch.log;
        log.clear();
        engine.finish_step(now, &mut kv.0, &mut reqs, log);
        for &id in &log.finished {
            let r = reqs.req(id);
            match r.leg {
                Leg::Prefill => handoffs.queue.push(id),
                Leg::Decode => {
                    tracing::debug!(
                        request = r.id,
                        ttft = r.first_token_at.unwrap_or(f64::NAN) - r.t0,
                        response = now - r.t0,
                        preemptions = r.preemptions,
                        "finished"
                    );
                    metrics.request_finished(r);
                    router.book.decode_finished(engine.index, r.prompt);
                    if let (Some(session), Some(delay)) = (r.session, r.next_turn_in) {
                        agenda.schedule(now + delay, Event::NextTurn(session));
                    }
                    if let Some(f) = finished.as_deref_mut() {
                        f.0.push(r.clone());
                    }
                    commands.entity(id).despawn();
                }
            }
        }
    }
}

/// System: every idle engine with new work forms its next step.
#[allow(clippy::too_many_arguments)]
pub fn step_start_system(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    flows: Res<Flows>,
    mut engines: Query<(Entity, &mut Engine, &mut KvPool)>,
    mut reqs: Query<&mut Request>,
    mut scratch: ResMut<StepScratch>,
    mut agenda: ResMut<Agenda>,
    mut recorder: Option<ResMut<StepRecorder>>,
) {
    let now = clock.now;
    for &e in index.prefill.iter().chain(&index.decode) {
        let (_, mut engine, mut kv) = engines.get_mut(e).expect("engine");
        if !engine.dirty {
            continue;
        }
        let log = &mut scratch.log;
        log.clear();
        if !engine.is_idle() {
            // Something reached an engine running repeated decode steps:
            // cut the run at the first step boundary at or after now.
            match engine.cut_run(now) {
                Some(end) if end > now => {
                    let generation = engine.generation;
                    agenda.schedule(end, Event::StepEnd(e, generation));
                    continue;
                }
                Some(_) => {
                    // The boundary is now: end the run here and form the next
                    // step at once, as the step-by-step tick would.
                    engine.finish_step(now, &mut kv.0, &mut reqs, log);
                    debug_assert!(log.finished.is_empty() && log.first_tokens.is_empty());
                    log.clear();
                }
                None => continue,
            }
        }
        let end = engine.start_step(now, &mut kv.0, &mut reqs, log);
        for &id in &log.parked {
            agenda.schedule(now + flows.latency, Event::ReadStart(id));
        }
        if end.is_none()
            && let Some(rec) = recorder.as_deref_mut()
        {
            for &id in &log.preempted {
                rec.pending_preempted.push((e, reqs.req(id).id));
            }
        }
        if let Some(end) = end {
            let generation = engine.generation;
            agenda.schedule(end, Event::StepEnd(e, generation));
            if let Some(rec) = recorder.as_deref_mut() {
                let scheduled = engine
                    .step
                    .iter()
                    .map(|&(id, n)| (reqs.req(id).id, n))
                    .collect();
                let mut preempted: Vec<u64> = Vec::new();
                rec.pending_preempted.retain(|&(engine, id)| {
                    if engine == e {
                        preempted.push(id);
                    }
                    engine != e
                });
                preempted.extend(log.preempted.iter().map(|&id| reqs.req(id).id));
                rec.steps.push(StepRecord {
                    engine: e,
                    start: now,
                    end,
                    scheduled,
                    preempted,
                    kv_blocks_held: kv.0.num_held(),
                });
            }
        }
    }
}

/// System: integrate the gauges of MODEL.md §9.
pub fn observe_system(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    engines: Query<(&Engine, &KvPool)>,
    mut gauges: ResMut<Gauges>,
) {
    let (mut run_min, mut run_max) = (u32::MAX, 0u32);
    let (mut load_min, mut load_max) = (u32::MAX, 0u32);
    let (mut usage_max, mut usage_sum) = (0.0f64, 0.0f64);
    for &e in &index.decode {
        let (eng, kv) = engines.get(e).expect("decoder");
        let running = eng.running.len() as u32;
        let active = eng.active();
        run_min = run_min.min(running);
        run_max = run_max.max(running);
        load_min = load_min.min(active);
        load_max = load_max.max(active);
        let usage = kv.0.num_held() as f64 / kv.0.num_blocks() as f64;
        usage_max = usage_max.max(usage);
        usage_sum += usage;
    }
    let (mut held, mut queue) = (0.0f64, 0.0f64);
    for &e in &index.prefill {
        let (eng, kv) = engines.get(e).expect("prefiller");
        held += (kv.0.num_held() * kv.0.block_size()) as f64;
        queue += eng.waiting.len() as f64;
    }
    let nd = index.decode.len().max(1) as f64;
    let np = index.prefill.len().max(1) as f64;
    gauges.sample(
        clock.now,
        [
            (run_max - run_min) as f64,
            (load_max - load_min) as f64,
            usage_max,
            usage_sum / nd,
            held / np,
            queue / np,
        ],
    );
}

/// System: a phase starts: apply its changes to the scenario, then to the
/// router's policies and the workload.
#[allow(clippy::too_many_arguments)]
pub fn phase_system(
    events: Res<TickEvents>,
    mut current: ResMut<CurrentScenario>,
    mut router: NonSendMut<Router>,
    mut workload: ResMut<WorkloadState>,
    mut phase: ResMut<PhaseIndex>,
    mut status: ResMut<RunStatus>,
) {
    for &i in &events.phases {
        let changes = current.0.phases[i as usize].set.clone();
        let mut raw = current.0.clone();
        for (path, value) in &changes {
            match scenario::apply_override(&raw, &format!("{path}={value}")) {
                Ok(r) => raw = r,
                Err(e) => {
                    status.error = Some(Error::new(format!(
                        "phase {} (at t={}): {e}",
                        i + 1,
                        raw.phases[i as usize].at
                    )));
                    return;
                }
            }
        }
        if let RouterMode::Scripts(p) = &mut router.mode
            && let Err(e) = scenario::expand_plugins(&raw.router).and_then(|r| p.reload(&r))
        {
            status.error = Some(e);
            return;
        }
        workload.params = raw.workload.clone();
        current.0 = raw;
        phase.0 = i + 1;
    }
}

/// A simulation ready to run: the world and the tick schedule.
pub struct Sim {
    pub world: World,
    schedule: Schedule,
    horizon: f64,
}

impl Sim {
    /// Builds the world of a scenario: engines with their pools and NICs,
    /// the router with its compiled scripts, the workload.
    pub fn new(scenario: &Scenario) -> Result<Sim> {
        let raw = &scenario.raw;
        let router = scenario::expand_plugins(&raw.router)?;
        let policies = Policies::load(&router, raw.seed, scenario.lib_dir.as_deref())?;
        Self::build(scenario, RouterMode::Scripts(Box::new(policies)), None)
    }

    /// Builds a simulation fed by an explicit trace instead of sessions.
    pub fn with_trace(
        scenario: &Scenario,
        router: RouterMode,
        trace: Vec<TraceRequest>,
    ) -> Result<Sim> {
        Self::build(scenario, router, Some(trace))
    }

    fn build(
        scenario: &Scenario,
        router: RouterMode,
        trace: Option<Vec<TraceRequest>>,
    ) -> Result<Sim> {
        let raw = &scenario.raw;
        let mut world = World::new();
        let mut index = EngineIndex::default();
        let mut links = Vec::new();
        for (role, pool, nic_rate) in [
            (
                Role::Prefill,
                &raw.prefill,
                scenario.prefill_nic_tokens_per_s,
            ),
            (Role::Decode, &raw.decode, scenario.decode_nic_tokens_per_s),
        ] {
            for i in 0..pool.count {
                let link = links.len() as u32;
                links.push(nic_rate);
                let e = world
                    .spawn((
                        Engine::new(role, i, pool.engine, pool.cost)
                            .with_semantics(raw.engine_semantics),
                        KvPool(BlockPool::for_engine(&pool.engine, raw.engine_semantics)),
                        Nic {
                            link,
                            tokens_per_s: nic_rate,
                        },
                    ))
                    .id();
                match role {
                    Role::Prefill => index.prefill.push(e),
                    Role::Decode => index.decode.push(e),
                }
            }
        }
        let mut agenda = Agenda::default();
        let mut workload = WorkloadState::new(
            raw.workload.clone(),
            raw.decode.engine.max_model_len,
            raw.seed,
            raw.warmup,
        );
        match trace {
            Some(t) => {
                for (i, r) in t.iter().enumerate() {
                    agenda.schedule(r.arrival, Event::TraceArrival(i as u32));
                }
                workload.trace = t;
            }
            None => {
                let first = workload.next_arrival_gap();
                agenda.schedule(first, Event::SessionArrival);
            }
        }
        for (i, p) in raw.phases.iter().enumerate() {
            agenda.schedule(p.at, Event::Phase(i as u32));
        }
        let book = RouterBook::new(
            raw.prefill.count as usize,
            raw.decode.count as usize,
            raw.router.prefix_index_blocks,
            raw.decode.engine.block_size,
        );
        world.insert_resource(agenda);
        world.insert_resource(workload);
        world.insert_non_send(Router::new(router, book));
        world.insert_resource(Flows::new(
            raw.transfer.mode,
            raw.transfer.sharing,
            raw.transfer.latency,
            links,
        ));
        world.insert_resource(index);
        world.insert_resource(Clock::default());
        world.insert_resource(TickEvents::default());
        world.insert_resource(Gateway::default());
        world.insert_resource(Handoffs::default());
        world.insert_resource(PhaseIndex::default());
        world.insert_resource(RunStatus::default());
        world.insert_resource(StepScratch::default());
        world.insert_resource(CurrentScenario(raw.clone()));
        world.insert_resource(Metrics::new(raw.warmup, raw.phases.len() + 1));
        world.insert_resource(Gauges::new(raw.warmup, raw.horizon));

        let mut schedule = Schedule::default();
        schedule.set_executor(SingleThreadedExecutor::new());
        schedule.set_build_settings(ScheduleBuildSettings {
            ambiguity_detection: LogLevel::Error,
            ..Default::default()
        });
        schedule.configure_sets(
            (
                SimSystems::Phases,
                SimSystems::Workload,
                SimSystems::Routing,
                SimSystems::Transfers,
                SimSystems::StepEnd,
                SimSystems::Handoff,
                SimSystems::StepStart,
                SimSystems::Bandwidth,
                SimSystems::Observe,
            )
                .chain(),
        );
        schedule.add_systems((
            phase_system.in_set(SimSystems::Phases),
            workload_system.in_set(SimSystems::Workload),
            routing_system.in_set(SimSystems::Routing),
            transfer_system.in_set(SimSystems::Transfers),
            step_end_system.in_set(SimSystems::StepEnd),
            handoff_system.in_set(SimSystems::Handoff),
            step_start_system.in_set(SimSystems::StepStart),
            bandwidth_system.in_set(SimSystems::Bandwidth),
            observe_system.in_set(SimSystems::Observe),
        ));
        Ok(Sim {
            world,
            schedule,
            horizon: raw.horizon,
        })
    }

    /// Adds user systems to the tick schedule; order them against
    /// [`SimSystems`] (e.g. `my_metric.in_set(SimSystems::Observe)` or
    /// `.after(SimSystems::StepEnd)`).
    pub fn add_systems<M>(
        &mut self,
        systems: impl IntoScheduleConfigs<bevy_ecs::system::ScheduleSystem, M>,
    ) {
        self.schedule.add_systems(systems);
    }

    /// Records every step formed and every finished request (replays,
    /// tests). Steps are recorded one by one: runs of repeated decode steps
    /// are not merged.
    pub fn record(&mut self) {
        self.set_step_repeats(false);
        self.world.insert_resource(StepRecorder::default());
        self.record_requests();
    }

    /// Keeps every finished request (its times, hits, preemptions).
    pub fn record_requests(&mut self) {
        self.world.insert_resource(FinishedRequests::default());
    }

    /// Whether engines may book runs of identical decode steps as one
    /// (an exact shortcut, on by default).
    pub fn set_step_repeats(&mut self, on: bool) {
        for mut e in self.world.query::<&mut Engine>().iter_mut(&mut self.world) {
            e.repeat_steps = on;
        }
    }

    /// Runs ticks until the horizon (or until nothing is left to happen).
    pub fn run(&mut self) -> Result<Report> {
        let wall = Instant::now();
        while let Some(t) = self.world.resource::<Agenda>().next_time() {
            if t > self.horizon {
                break;
            }
            self.tick(t);
            if let Some(e) = self.world.resource_mut::<RunStatus>().error.take() {
                return Err(e);
            }
        }
        self.world.resource_mut::<Gauges>().advance(self.horizon);
        Ok(Report::collect(self, wall.elapsed().as_secs_f64()))
    }

    /// One tick at time `t`: hand over the events due, run the systems.
    fn tick(&mut self, t: f64) {
        self.world.resource_scope(|world, mut agenda: Mut<Agenda>| {
            let mut events = world.resource_mut::<TickEvents>();
            events.clear();
            while let Some(e) = agenda.pop_at(t) {
                events.push(e);
            }
            let mut clock = world.resource_mut::<Clock>();
            clock.now = t;
            clock.ticks += 1;
        });
        // Log lines carry the simulated time of the tick they come from.
        crate::cli::SIM_TIME.store(t.to_bits(), std::sync::atomic::Ordering::Relaxed);
        self.schedule.run(&mut self.world);
    }

    pub fn horizon(&self) -> f64 {
        self.horizon
    }
}
