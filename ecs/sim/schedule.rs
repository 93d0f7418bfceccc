//! [`Sim`]: the world of a scenario (engines with their pools and NICs, the
//! router, the workload, the shared resources), the tick schedule that
//! chains every module's systems (the ordering contract, [`crate::sim`]),
//! and the next-event loop.

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{LogLevel, ScheduleBuildSettings, SingleThreadedExecutor};
use bevy_ecs::system::{BoxedSystem, RunSystemOnce, SystemState};
use std::sync::Arc;
use std::time::Instant;

use crate::engine::cost::StepTime;
use crate::engine::record::{FinishedRequests, StepRecorder};
use crate::engine::repeat::Boundary;
use crate::engine::systems::{
    StepScratch, end_steps, start_steps, step_end_system, step_start_system,
};
use crate::engine::{BlockPool, Engine, KvPool, Request, RequestStore, Role, StepLog};
use crate::error::Result;
use crate::metrics::backlog::MAX_IN_FLIGHT;
use crate::metrics::figures::{SeriesRecorder, series_system};
use crate::metrics::gauges::{EngineState, observe, observe_system};
use crate::metrics::{Counters, CustomMetrics, Gauges, InFlightTrend, Metrics, Report};
use crate::router::book::RouterBook;
use crate::router::gateway::{route_gateway, routing_system};
use crate::router::policy::Policies;
use crate::router::sidecar::{hand_off, handoff_system};
use crate::router::{Router, RouterMode};
use crate::scenario::{self, Scenario};
use crate::scenario::{Dispatch, TransferMode};
use crate::shared::{
    Agenda, Clock, CurrentScenario, Deadlines, EngineIndex, Event, Failed, FaultQueue, FaultRng,
    Finished, Gateway, Handoffs, Joining, Lookup, Parked, PhaseIndex, RunStatus, TickEvents,
    WithJoining,
};
use crate::sim::faults::faults_system;
use crate::sim::phases::phase_system;
use crate::sim::retire::{Retirement, fail_system, retire, retire_system};
use crate::sim::{SimSystems, set_sim_time};
use crate::transfer::systems::{
    NewFlows, bandwidth_system, finish_flows, post_reads, post_reads_system, share_bandwidth,
    start_reads, transfer_system,
};
use crate::transfer::{Flow, Flows, Lease, Nic};
use crate::workload::trace::TraceReads;
use crate::workload::{
    self, Session, SharedTrace, TraceRequest, WorkloadState, issue_arrivals, workload_system,
};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// A simulation ready to run: the world and the tick schedule.
pub struct Sim {
    pub world: World,
    schedule: Schedule,
    /// The built-in systems run without the schedule while no custom system
    /// is added ([`DirectTick`]).
    direct: Option<DirectTick>,
    horizon: f64,
    /// What the loop itself reads and writes each tick, fetched once.
    loop_state: SystemState<LoopParams>,
    /// Requests in flight past which the run stops early ([`MAX_IN_FLIGHT`]).
    pub max_in_flight: u64,
}

impl Sim {
    /// Builds the world of a scenario: engines with their pools and NICs,
    /// the router with its compiled scripts, the workload (its trace read,
    /// when it names one).
    pub fn new(scenario: &Scenario) -> Result<Sim> {
        Self::from_scenario(scenario, None)
    }

    /// [`Sim::new`], its trace (when it replays one) taken from `reads`,
    /// which reads each file once for all the runs that share it (a sweep).
    pub fn new_sharing(scenario: &Scenario, reads: &TraceReads) -> Result<Sim> {
        Self::from_scenario(scenario, Some(reads))
    }

    fn from_scenario(scenario: &Scenario, reads: Option<&TraceReads>) -> Result<Sim> {
        let raw = &scenario.raw;
        let router = scenario::expand_plugins(&raw.router)?;
        let policies = Policies::load(&router, raw.seed, scenario.lib_dir.as_deref())?;
        // Every phase's policies load now (and are dropped), so a phase's
        // mistake is refused before the run rather than when it starts.
        let mut phased = raw.clone();
        for (i, phase) in raw.phases.iter().enumerate() {
            for (path, value) in &phase.set {
                phased = scenario::apply_override(&phased, &format!("{path}={value}"))
                    .map_err(|e| crate::error::Error::new(format!("phases.{i}: {e}")))?;
            }
            scenario::expand_plugins(&phased.router)
                .and_then(|r| Policies::load(&r, raw.seed, scenario.lib_dir.as_deref()))
                .map_err(|e| {
                    crate::error::Error::new(format!("phases.{i} (at {} s): {e}", phase.at))
                })?;
        }
        let router = RouterMode::Scripts(Box::new(policies));
        match &raw.workload.trace {
            None => Self::build(scenario, router, None),
            Some(source) => {
                let trace = match reads {
                    Some(reads) => reads.load(source)?,
                    None => SharedTrace::from(workload::trace::load(source)?),
                };
                let mut sim = Self::build(scenario, router, Some(trace.requests))?;
                sim.world.insert_resource(trace.summary);
                Ok(sim)
            }
        }
    }

    /// Builds a simulation fed by an explicit trace instead of sessions.
    pub fn with_trace(
        scenario: &Scenario,
        router: RouterMode,
        trace: Vec<TraceRequest>,
    ) -> Result<Sim> {
        Self::build(scenario, router, Some(trace.into()))
    }

    fn build(
        scenario: &Scenario,
        router: RouterMode,
        trace: Option<Arc<[TraceRequest]>>,
    ) -> Result<Sim> {
        let raw = &scenario.raw;
        let mut world = World::new();
        let mut index = EngineIndex::default();
        let mut links = Vec::new();
        let mut pod = 0u32;
        for (role, pool, plan) in [
            (Role::Prefill, &raw.prefill, scenario.prefill()),
            (Role::Decode, &raw.decode, scenario.decode()),
        ] {
            for i in 0..pool.count {
                let first_link = links.len() as u32;
                links.extend(std::iter::repeat_n(
                    plan.nic_tokens_per_s,
                    plan.nics as usize,
                ));
                let e = world
                    .spawn((
                        Engine::new(role, i, pool.engine.clone(), StepTime::of_plan(plan))
                            .with_semantics(raw.engine_semantics)
                            .observing_from(raw.warmup),
                        KvPool(BlockPool::for_engine(
                            plan.num_gpu_blocks,
                            pool.engine.block_size,
                            raw.engine_semantics,
                        )),
                        Nic {
                            pod,
                            first_link,
                            links: plan.nics,
                            tp: plan.tp,
                            tokens_per_s: plan.nic_tokens_per_s,
                        },
                    ))
                    .id();
                pod += 1;
                match role {
                    Role::Prefill => index.prefill.push(e),
                    Role::Decode => index.decode.push(e),
                }
            }
        }
        let mut agenda = Agenda::default();
        let mut workload = WorkloadState::new(
            scenario::Sessions::of(&raw.workload),
            raw.decode.engine.max_model_len,
            raw.seed,
            raw.warmup,
        );
        match trace {
            Some(t) => {
                // Closed-loop turns are scheduled when their previous turn
                // ends.
                agenda.book(
                    t.iter().enumerate().filter_map(|(i, r)| {
                        r.arrival.map(|at| (at, Event::TraceArrival(i as u32)))
                    }),
                );
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
        for (i, f) in raw.faults.iter().enumerate() {
            let (at, duration) = f.window();
            let index = i as u32;
            agenda.schedule(at, Event::Fault { index, start: true });
            agenda.schedule(
                at + duration,
                Event::Fault {
                    index,
                    start: false,
                },
            );
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
        world.insert_resource(Flows::new(&raw.transfer, links, pod as usize));
        world.insert_resource(index);
        world.insert_resource(Clock::default());
        world.insert_resource(TickEvents::default());
        world.insert_resource(Gateway::default());
        world.insert_resource(Handoffs::default());
        world.insert_resource(Finished::default());
        world.insert_resource(Parked::default());
        world.insert_resource(PhaseIndex::default());
        world.insert_resource(RunStatus::default());
        world.insert_resource(StepScratch::default());
        world.insert_resource(Joining::<Request>::new(&world));
        world.insert_resource(Joining::<Session>::new(&world));
        world.insert_resource(Joining::<Lease>::new(&world));
        world.insert_resource(CurrentScenario(raw.clone()));
        world.insert_resource(Metrics::new(raw.warmup, raw.phases.len() + 1, raw.slo));
        world.insert_resource(Counters::default());
        world.insert_resource(Gauges::new(raw.warmup, raw.horizon));
        world.insert_resource(InFlightTrend::default());
        world.insert_resource(Deadlines::default());
        world.insert_resource(CustomMetrics::default());
        world.insert_resource(Failed::default());
        world.insert_resource(FaultQueue::default());
        world.insert_resource(FaultRng(Xoshiro256PlusPlus::seed_from_u64(
            raw.seed ^ 0x6661_756c_7473, // "faults"
        )));

        let mut schedule = Schedule::default();
        schedule.set_executor(SingleThreadedExecutor::new());
        schedule.set_build_settings(ScheduleBuildSettings {
            ambiguity_detection: LogLevel::Error,
            ..Default::default()
        });
        schedule.configure_sets(
            (
                SimSystems::Phases,
                SimSystems::Faults,
                SimSystems::Workload,
                SimSystems::Routing,
                SimSystems::Transfers,
                SimSystems::StepEnd,
                SimSystems::Handoff,
                SimSystems::StepStart,
                SimSystems::Bandwidth,
                SimSystems::Failures,
                SimSystems::Observe,
            )
                .chain(),
        );
        // Each system runs only when its input is not empty: most ticks end
        // one engine's step and nothing else (run conditions cost less than
        // fetching a system's parameters).
        schedule.add_systems((
            phase_system
                .run_if(|e: Res<TickEvents>| due::phases(&e))
                .in_set(SimSystems::Phases),
            faults_system
                .run_if(|e: Res<TickEvents>, q: Res<FaultQueue>| due::faults(&e, &q))
                .in_set(SimSystems::Faults),
            workload_system
                .run_if(|e: Res<TickEvents>| due::workload(&e))
                .in_set(SimSystems::Workload),
            routing_system
                .run_if(|e: Res<TickEvents>, g: Res<Gateway>| due::routing(&e, &g))
                .in_set(SimSystems::Routing),
            transfer_system
                .run_if(|e: Res<TickEvents>| due::transfers(&e))
                .in_set(SimSystems::Transfers),
            (
                step_end_system.run_if(|e: Res<TickEvents>| due::step_end(&e)),
                retire_system.run_if(|f: Res<Finished>| due::retire(&f)),
            )
                .chain()
                .in_set(SimSystems::StepEnd),
            handoff_system
                .run_if(|h: Res<Handoffs>| due::handoff(&h))
                .in_set(SimSystems::Handoff),
            (
                step_start_system,
                post_reads_system.run_if(|p: Res<Parked>| due::post_reads(&p)),
            )
                .chain()
                .in_set(SimSystems::StepStart),
            bandwidth_system
                .run_if(|f: Res<Flows>| due::bandwidth(&f))
                .in_set(SimSystems::Bandwidth),
            fail_system
                .run_if(|f: Res<Failed>| due::failures(&f))
                .in_set(SimSystems::Failures),
            observe_system.in_set(SimSystems::Observe),
        ));
        let direct = DirectTick::new(&mut world);
        let loop_state = SystemState::new(&mut world);
        let mut sim = Sim {
            world,
            schedule,
            horizon: raw.horizon,
            direct: Some(direct),
            loop_state,
            max_in_flight: MAX_IN_FLIGHT,
        };
        if let Some(extend) = crate::sim::extension() {
            extend(&mut sim);
        }
        Ok(sim)
    }

    /// Adds user systems to the tick schedule; order them against
    /// [`SimSystems`] (e.g. `my_metric.in_set(SimSystems::Observe)` or
    /// `.after(SimSystems::StepEnd)`).
    pub fn add_systems<M>(
        &mut self,
        systems: impl IntoScheduleConfigs<bevy_ecs::system::ScheduleSystem, M>,
    ) {
        self.schedule.add_systems(systems);
        self.direct = None;
        // A custom system may look at any request between two ticks: the
        // requests' tokens are applied at every step end.
        self.set_continued_runs(false);
    }

    /// Whether runs of repeated decode steps may continue past block
    /// boundaries without the requests being looked up (an exact shortcut,
    /// on by default; off with a custom system, which may look at them).
    pub fn set_continued_runs(&mut self, on: bool) {
        for mut e in self.world.query::<&mut Engine>().iter_mut(&mut self.world) {
            e.continue_runs = on;
        }
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
        // A custom system whose order against the others is not fixed (two
        // systems touching the same data with no `before`/`after` between
        // them) is refused here rather than by a panic mid-run.
        self.schedule.initialize(&mut self.world).map_err(|e| {
            crate::error::Error::new(format!(
                "the tick's systems cannot be ordered: {e} (order a custom system against the sets of SimSystems, docs/extending.md)"
            ))
        })?;
        let wall = Instant::now();
        let mut stopped_early = None;
        while let Some(fast) = self.next_tick()? {
            // A backlog past what memory should hold ends the run here, with
            // a report that says so (checked every 1024 ticks: it grows
            // slowly). A tick may run the ticks after it up to that check.
            self.run_tick(fast);
            if self
                .world
                .resource::<Clock>()
                .ticks
                .is_multiple_of(CHECK_EVERY)
            {
                let n = self.world.resource::<Counters>().in_flight();
                if n > self.max_in_flight {
                    let t = self.world.resource::<Clock>().now;
                    stopped_early = Some(format!(
                        "stopped at t = {t:.1} s with {n} requests in flight (more than {}): \
                         the deployment does not keep up with the workload",
                        self.max_in_flight
                    ));
                    self.horizon = t;
                    break;
                }
            }
        }
        // A run stopped early leaves without another hand-over: its last
        // tick's error is read here (the hand-over reads every other one).
        if let Some(e) = self.world.resource_mut::<RunStatus>().error.take() {
            return Err(e);
        }
        // A trace run with an infinite horizon ends with its last event:
        // that is the horizon it reports over; so does a run stopped early.
        if self.horizon.is_infinite() || stopped_early.is_some() {
            let end = self.world.resource::<Clock>().now;
            self.horizon = end;
            self.world.resource_mut::<Gauges>().horizon = end;
            self.world.resource_mut::<CurrentScenario>().0.horizon = end;
        }
        self.world.resource_mut::<RunStatus>().stopped_early = stopped_early;
        self.end_runs();
        self.world.resource_mut::<Gauges>().advance(self.horizon);
        let (warmup, horizon) = (self.world.resource::<Gauges>().warmup, self.horizon);
        self.world
            .resource_mut::<InFlightTrend>()
            .advance(horizon, warmup, horizon);
        Ok(Report::collect(
            &mut self.world,
            wall.elapsed().as_secs_f64(),
        ))
    }

    /// Runs of repeated decode steps in progress at the horizon: their steps
    /// that ended by then count, as they would step by step.
    fn end_runs(&mut self) {
        self.world
            .run_system_once_with(end_runs_system, self.horizon)
            .expect("engines and requests are plain queries");
    }

    /// Hands over the next tick, when it comes by the horizon (see
    /// [`pop_tick`]): whether a fast tick can take it. The error the last
    /// tick ended in comes first.
    fn next_tick(&mut self) -> Result<Option<bool>> {
        let (mut agenda, mut deadlines, mut events, mut clock, mut status) = self
            .loop_state
            .get_mut(&mut self.world)
            .expect("the loop's resources are in the world");
        if let Some(e) = status.error.take() {
            return Err(e);
        }
        Ok(pop_tick(
            self.horizon,
            &mut agenda,
            &mut deadlines,
            &mut events,
            &mut clock,
        ))
    }

    /// Runs the systems of the tick just handed over, and when they allow,
    /// the ticks after it up to the next backlog check.
    fn run_tick(&mut self, fast: bool) {
        match &mut self.direct {
            Some(direct) => direct.run(&mut self.world, fast, self.horizon),
            None => self.schedule.run(&mut self.world),
        }
        // Despawned entities leave a removal record per component, which an
        // `App` would clear every frame: so does every tick (fast ticks
        // despawn the requests they retired).
        self.world.clear_trackers();
    }

    pub fn horizon(&self) -> f64 {
        self.horizon
    }

    /// Samples the engines' state every `interval` simulated seconds (the
    /// time series of `--plots`), by a system after [`SimSystems::Observe`].
    pub fn record_series(&mut self, interval: f64) {
        let index = self.world.resource::<EngineIndex>().clone();
        let recorder = SeriesRecorder::new(&index, interval, self.horizon);
        self.world.insert_resource(recorder);
        self.add_systems(series_system.after(SimSystems::Observe));
    }

    /// After the run: the recorded time series, complete to the horizon.
    pub fn take_series(&mut self) -> Option<SeriesRecorder> {
        let mut rec = self.world.remove_resource::<SeriesRecorder>()?;
        rec.finish();
        Some(rec)
    }
}

/// The next instant something is due: the earliest event, or `deadline`
/// (the earliest deadline) when that is sooner.
fn next_instant(agenda: &Agenda, deadline: Option<f64>) -> Option<f64> {
    match (agenda.next_time(), deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Ticks between two checks of the backlog ([`Sim::run`]).
const CHECK_EVERY: u64 = 1024;

/// Makes the next instant something happens (an event, or a deadline) the
/// current tick, when it comes by `horizon`: its events due in `events`,
/// the clock set. Returns whether a fast tick can take it ([`fast_ticks`]):
/// its events are all step ends, flow completions, reads' starts and
/// arrivals (sessions, their later turns, trace requests), and no lease's
/// deadline is due (None: nothing comes by the horizon, and nothing was
/// changed).
fn pop_tick(
    horizon: f64,
    agenda: &mut Agenda,
    deadlines: &mut Deadlines,
    events: &mut TickEvents,
    clock: &mut Clock,
) -> Option<bool> {
    let deadline = deadlines.next_time();
    let t = next_instant(agenda, deadline)?;
    if t > horizon {
        return None;
    }
    events.clear();
    let mut fast = true;
    while let Some(e) = agenda.pop_at(t) {
        fast &= matches!(
            e,
            Event::StepEnd(..)
                | Event::FlowDone { .. }
                | Event::ReadStart(..)
                | Event::SessionArrival
                | Event::NextTurn(..)
                | Event::TraceArrival(..)
        );
        events.push(e);
    }
    if deadline == Some(t) {
        fast = false;
        deadlines.pop_at(t, &mut events.lease_deadlines);
    }
    clock.now = t;
    clock.ticks += 1;
    // Log lines carry the simulated time of the tick they come from.
    set_sim_time(t);
    Some(fast)
}

/// Whether each built-in system has work in this tick: its run condition in
/// the schedule, and its gate in [`DirectTick`].
mod due {
    use crate::shared::{Failed, FaultQueue, Finished, Gateway, Handoffs, Parked, TickEvents};
    use crate::transfer::Flows;

    pub fn phases(e: &TickEvents) -> bool {
        !e.phases.is_empty()
    }
    pub fn faults(e: &TickEvents, q: &FaultQueue) -> bool {
        fault_events(e) || fault_commands(q)
    }
    pub fn fault_commands(q: &FaultQueue) -> bool {
        !q.commands.is_empty()
    }
    pub fn fault_events(e: &TickEvents) -> bool {
        !(e.faults.is_empty() && e.router_learns.is_empty())
    }
    pub fn workload(e: &TickEvents) -> bool {
        e.session_arrivals > 0 || !e.next_turns.is_empty() || !e.trace_arrivals.is_empty()
    }
    pub fn routing(e: &TickEvents, g: &Gateway) -> bool {
        retries(e) || queued(g)
    }
    pub fn queued(g: &Gateway) -> bool {
        !g.queue.is_empty()
    }
    pub fn retries(e: &TickEvents) -> bool {
        !(e.client_retries.is_empty() && e.prefill_retries.is_empty())
    }
    pub fn transfers(e: &TickEvents) -> bool {
        !(e.flow_done.is_empty()
            && e.read_starts.is_empty()
            && e.registrations.is_empty()
            && e.lease_deadlines.is_empty())
    }
    pub fn step_end(e: &TickEvents) -> bool {
        !e.step_ends.is_empty()
    }
    pub fn retire(f: &Finished) -> bool {
        !f.queue.is_empty()
    }
    pub fn handoff(h: &Handoffs) -> bool {
        !h.queue.is_empty()
    }
    pub fn post_reads(p: &Parked) -> bool {
        !p.queue.is_empty()
    }
    pub fn bandwidth(f: &Flows) -> bool {
        f.changed
    }
    pub fn failures(f: &Failed) -> bool {
        !f.queue.is_empty()
    }
}

/// A built-in system and whether it has work in this tick (from the
/// tick's events, read once, and the world).
type Gated = (fn(&EventsDue, &World) -> bool, BoxedSystem);

/// What the tick's events ask of the systems, read once a tick: no
/// built-in system changes the events during the tick (they read them as
/// `Res`), so each gate's answer is the one it would read itself.
struct EventsDue {
    phases: bool,
    faults: bool,
    workload: bool,
    retries: bool,
    transfers: bool,
    /// Push registrations or lease deadlines: the transfer events a fast
    /// tick does not take (it takes flow ends and reads' starts).
    registrations_or_deadlines: bool,
    step_end: bool,
}

impl EventsDue {
    fn of(e: &TickEvents) -> EventsDue {
        EventsDue {
            phases: due::phases(e),
            faults: due::fault_events(e),
            workload: due::workload(e),
            retries: due::retries(e),
            transfers: due::transfers(e),
            registrations_or_deadlines: !(e.registrations.is_empty()
                && e.lease_deadlines.is_empty()),
            step_end: due::step_end(e),
        }
    }
}

/// What the loop reads and writes itself each tick ([`Sim::next_tick`]).
type LoopParams = (
    ResMut<'static, Agenda>,
    ResMut<'static, Deadlines>,
    ResMut<'static, TickEvents>,
    ResMut<'static, Clock>,
    ResMut<'static, RunStatus>,
);

/// Positions in [`DirectTick`]'s list (`routing_system`, `retire_system`,
/// `step_start_system`, `fail_system`): where a fast tick hands over, and
/// where the list hands over to the fast ticks.
const ROUTING: usize = 3;
const RETIRE: usize = 6;
const STEP_START: usize = 8;
const FAIL: usize = 11;

/// What a tick that only ends steps and flows reads and writes, fetched
/// once.
type FastTickParams = (
    (
        ResMut<'static, Clock>,
        ResMut<'static, TickEvents>,
        ResMut<'static, Deadlines>,
    ),
    Query<'static, 'static, (&'static mut Engine, &'static mut KvPool)>,
    Query<'static, 'static, &'static mut Request>,
    (
        ResMut<'static, StepScratch>,
        ResMut<'static, Handoffs>,
        ResMut<'static, Finished>,
    ),
    (
        Res<'static, EngineIndex>,
        ResMut<'static, Agenda>,
        ResMut<'static, Parked>,
        Option<ResMut<'static, StepRecorder>>,
        ResMut<'static, RunStatus>,
    ),
    (
        ResMut<'static, Gauges>,
        ResMut<'static, Counters>,
        ResMut<'static, InFlightTrend>,
        Retirement<'static, 'static>,
    ),
    (
        Res<'static, FaultQueue>,
        ResMut<'static, Gateway>,
        ResMut<'static, Flows>,
        Query<'static, 'static, &'static mut Flow>,
        ResMut<'static, Failed>,
        Query<'static, 'static, &'static mut Lease>,
        Query<'static, 'static, &'static Nic>,
        ResMut<'static, FaultRng>,
        Res<'static, CurrentScenario>,
    ),
    (
        ResMut<'static, WorkloadState>,
        Res<'static, PhaseIndex>,
        Query<'static, 'static, &'static mut Session>,
        ResMut<'static, Joining<Request>>,
        ResMut<'static, Joining<Session>>,
        ResMut<'static, Joining<Lease>>,
    ),
);

/// The built-in systems run one after the other, without the schedule's
/// executor, while no custom system is added: the same systems, in the same
/// order, skipped on the same conditions ([`due`]), each one's commands
/// applied as it ends (where the schedule's sync points apply them: every
/// system is ordered after the one before it). An exact shortcut: a run
/// condition is a system of its own, and ten of them each tick cost a tenth
/// of the run.
///
/// Most ticks only end engines' steps (a decode run reaching a block
/// boundary, or a request finishing), end flows (a transfer's KV arrived),
/// start reads or issue requests (a session's turn, a trace's request):
/// those run the bodies of the systems with work — workload, routing, flow
/// ends, reads' starts, step end, retire, hand-off, step start, reads
/// posted, bandwidth, observe — on one fetch of their resources, and so do
/// the ticks after them while they are the same ([`fast_ticks`]); they
/// hand over to the list where another system turns out to have work (a
/// store-and-forward or parallel hand-off, a failure). The list hands back
/// at step start: the systems from there on spawn nothing, so the same
/// fetch runs them (the tail of every tick). It
/// hands back at routing when it can ([`routes_on_fast`]): an arrival's
/// routing then runs on that fetch rather than on one of its own.
struct DirectTick {
    systems: Vec<Gated>,
    fast: SystemState<FastTickParams>,
    new_flows: NewFlows,
}

impl DirectTick {
    fn new(world: &mut World) -> DirectTick {
        fn boxed<M>(s: impl IntoSystem<(), (), M>) -> BoxedSystem {
            Box::new(IntoSystem::into_system(s))
        }
        // (In the schedule's order; RETIRE and POST_READS index into it.)
        let mut systems: Vec<Gated> = vec![
            (|e, _| e.phases, boxed(phase_system)),
            (
                |e, w| e.faults || due::fault_commands(w.resource()),
                boxed(faults_system),
            ),
            (|e, _| e.workload, boxed(workload_system)),
            (
                |e, w| e.retries || due::queued(w.resource()),
                boxed(routing_system),
            ),
            (|e, _| e.transfers, boxed(transfer_system)),
            (|e, _| e.step_end, boxed(step_end_system)),
            (|_, w| due::retire(w.resource()), boxed(retire_system)),
            (|_, w| due::handoff(w.resource()), boxed(handoff_system)),
            (|_, _| true, boxed(step_start_system)),
            (
                |_, w| due::post_reads(w.resource()),
                boxed(post_reads_system),
            ),
            (|_, w| due::bandwidth(w.resource()), boxed(bandwidth_system)),
            (|_, w| due::failures(w.resource()), boxed(fail_system)),
            (|_, _| true, boxed(observe_system)),
        ];
        for (_, system) in &mut systems {
            system.initialize(world);
        }
        let fast = SystemState::new(world);
        DirectTick {
            systems,
            fast,
            new_flows: NewFlows::default(),
        }
    }

    /// One tick; `fast`: a fast tick can take it ([`pop_tick`]). A fast
    /// tick runs the ticks after it while they are fast too, up to the
    /// loop's next backlog check and the horizon. Any other tick runs the
    /// list up to step start, and the fast tick's tail from there (step
    /// start, reads, bandwidth, observe, on its one fetch), which goes on
    /// to the ticks after it in the same way.
    fn run(&mut self, world: &mut World, fast: bool, horizon: f64) {
        if let Some(check) = world.check_change_ticks() {
            for (_, system) in &mut self.systems {
                system.check_change_tick(check);
            }
        }
        let mut from = if fast {
            self.fast(world, horizon, Stage::StepEnd)
        } else {
            Some(0)
        };
        // (Each time, after the fast ticks, which may have handed over
        // another tick.)
        while let Some(at) = from {
            let events = EventsDue::of(world.resource());
            let until = if at <= STEP_START {
                STEP_START
            } else {
                self.systems.len()
            };
            let mut stage = Stage::StepStart;
            for i in at..until {
                let (has_work, system) = &mut self.systems[i];
                if !has_work(&events, world) {
                    continue;
                }
                if i == ROUTING && routes_on_fast(&events, world) {
                    stage = Stage::Routing;
                    break;
                }
                system
                    .run((), world)
                    .expect("the built-in systems' parameters are in the world");
            }
            if until == self.systems.len() {
                return;
            }
            from = self.fast(world, horizon, stage);
        }
    }

    /// The fast ticks from `stage` of the current tick ([`fast_ticks`]).
    fn fast(&mut self, world: &mut World, horizon: f64, stage: Stage) -> Option<usize> {
        let at = fast_ticks(&mut self.fast, &mut self.new_flows, world, horizon, stage);
        // The requests issued join the world and the retired ones leave
        // it, and the leases granted join it, in the order the list would
        // have spawned and despawned them; then the flows started join it,
        // but those that also ended, despawned.
        self.fast.apply(world);
        debug_assert!(
            world.resource::<Joining<Request>>().is_empty()
                && world.resource::<Joining<Session>>().is_empty()
                && world.resource::<Joining<Lease>>().is_empty(),
            "every request, session and lease the fast ticks made joined the world"
        );
        for (id, flow) in self.new_flows.drain() {
            if let Ok(mut e) = world.get_entity_mut(id) {
                e.insert(flow);
            }
        }
        at
    }
}

/// Where [`fast_ticks`] takes up the current tick: at routing (the list ran
/// the systems before it), at its start (a tick the fast ticks take
/// whole: [`pop_tick`]; named for where the ticks without arrivals start),
/// or at step start (the list ran the systems before it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Routing,
    StepEnd,
    StepStart,
}

/// Whether the list may hand a tick whose routing has work over to the
/// fast ticks at routing: what the list runs from routing to step start,
/// the fast tick runs the same — no transfer event but flow ends and
/// reads' starts is due (step ends, retirement and hand-offs it takes as
/// in any fast tick) —
/// and routing spawns nothing (a parallel dispatch spawns decode legs,
/// which step start looks up in the same tick).
fn routes_on_fast(events: &EventsDue, world: &World) -> bool {
    !events.registrations_or_deadlines
        && world.resource::<CurrentScenario>().0.router.dispatch != Dispatch::Parallel
}

/// Whether a fast tick may hand prefills off itself, rather than hand over
/// to the list at retirement: a hand-off then spawns only leases, which
/// the fast ticks' reads and flow ends look up in [`Joining`] until they
/// stop and apply their commands (a lease's expiry is a deadline, a tick
/// of the list). Store-and-forward starts its copy's flows at once,
/// and the link sharing of the same tick reads them; a parallel dispatch
/// despawns the prefill leg.
fn hands_off_on_fast(flows: &Flows, scenario: &CurrentScenario) -> bool {
    flows.mode != TransferMode::StoreAndForward && scenario.0.router.dispatch != Dispatch::Parallel
}

/// Ticks whose events are all step ends, flow completions, reads' starts
/// and arrivals (sessions, their later turns, trace requests), as
/// [`DirectTick`]'s list runs them: of the systems before step end only
/// the workload, routing and the transfers may have work (no other event
/// is due), so each issues the requests that arrive ([`issue_arrivals`]),
/// routes them (a parallel dispatch, which spawns decode legs, hands over
/// to the list), ends the flows that completed (their transfers done:
/// [`finish_flows`]), starts the reads ([`start_reads`]), ends the steps,
/// retires the requests that finished, hands the prefills that ended off
/// (where [`hands_off_on_fast`]; else the list takes the tick over at
/// retirement), forms the next steps, posts the reads of the requests
/// parked, shares the links anew when the flows changed, and when no
/// failure is to be handled, observes. From [`Stage::Routing`] (a tick the
/// list ran up to routing: [`routes_on_fast`]) it routes first, as the list
/// would, and takes the tick up at step end. From [`Stage::Routing`] or
/// [`Stage::StepStart`], after routing, a transfer completed or a hand-off,
/// every engine is looked at, as the list's step start does. (The requests
/// and sessions made, the despawns of the retired requests and of the
/// ended flows and leases, and the leases the hand-offs grant, are applied
/// in the order the list would apply them when the fast ticks stop, so the
/// requests' table has the list's order, and an entity despawned is not
/// reused before then. The requests, sessions and leases made are looked
/// up in [`Joining`] until then, and the flows a read starts in
/// `new_flows`: [`NewFlows`].) Then the
/// next tick is handed over here, as the loop would ([`pop_tick`]), on the
/// same fetch of the resources: that is most of a fast tick's cost. It
/// stops at the loop's next backlog check (a tick count that is a multiple
/// of [`CHECK_EVERY`]), at an error, at the horizon, and at a tick a fast
/// tick cannot take. A tick whose one event ends a continued run, where
/// nothing else has work, is taken by the lone lane ([`lone_lane`]).
/// Returns where the list takes over the last tick (None: that tick is
/// done).
fn fast_ticks(
    state: &mut SystemState<FastTickParams>,
    new_flows: &mut NewFlows,
    world: &mut World,
    horizon: f64,
    mut stage: Stage,
) -> Option<usize> {
    let (
        (mut clock, mut events, mut deadlines),
        mut engines,
        mut reqs,
        (mut scratch, mut handoffs, mut finished),
        (index, mut agenda, mut parked, mut recorder, mut status),
        (mut gauges, mut counters, mut trend, mut retirement),
        (
            faults,
            mut gateway,
            mut flows,
            mut flow_q,
            mut failed,
            mut leases,
            nics,
            mut rng,
            scenario,
        ),
        (mut workload, phase, mut sessions, mut issued, mut begun, mut granted),
    ) = state
        .get_mut(world)
        .expect("the built-in resources are in the world");
    // The requests and sessions made here are looked up among those
    // joining the world too, until they join it.
    let mut reqs = WithJoining {
        table: &mut reqs,
        joining: &mut issued,
    };
    let mut sessions = WithJoining {
        table: &mut sessions,
        joining: &mut begun,
    };
    // So are the leases granted here (reads and flow ends look them up).
    let mut leases = WithJoining {
        table: &mut leases,
        joining: &mut granted,
    };
    // The resources written each tick, marked changed once here rather
    // than on every tick's use (the same change tick: the fetch's).
    let (clock, events, deadlines) = (&mut *clock, &mut *events, &mut *deadlines);
    let (scratch, handoffs, finished) = (&mut *scratch, &mut *handoffs, &mut *finished);
    let (agenda, parked, status) = (&mut *agenda, &mut *parked, &mut *status);
    let (gauges, counters, trend) = (&mut *gauges, &mut *counters, &mut *trend);
    // (Filled engine by engine below, every fast tick.)
    gauges.engines.resize(index.len(), EngineState::default());
    // The first tick looks at every engine (the ticks before were not
    // fast ticks of this fetch); each later one at those still dirty and
    // those whose step it ends, and the gauges' inputs of the others are
    // what the tick before read (nothing else changes an engine here).
    scratch.may_start.clear();
    scratch.may_start.resize(index.len(), true);
    loop {
        let mut lane = Lane::Untouched;
        // Whether the tick routes: one the list ran up to routing, or one
        // whose arrivals (sessions, turns, trace requests) or queue the list
        // would issue and route before its transfers, as here.
        let routed = match stage {
            Stage::Routing => true,
            Stage::StepEnd => {
                if due::faults(events, &faults) {
                    return Some(0);
                }
                let arrivals = due::workload(events);
                if !(arrivals || due::routing(events, &gateway)) {
                    false
                } else if scenario.0.router.dispatch == Dispatch::Parallel {
                    return Some(0); // (`routes_on_fast`)
                } else {
                    if arrivals {
                        let (commands, metrics, aiperf) = retirement.issue();
                        issue_arrivals(
                            clock.now,
                            events,
                            (&mut workload, phase.0, &mut sessions),
                            (agenda, &mut gateway),
                            (metrics, counters, aiperf),
                            commands,
                            reqs.joining,
                        );
                    }
                    true
                }
            }
            Stage::StepStart => false,
        };
        if routed {
            let (router, commands) = retirement.router();
            let parallel = false; // (`routes_on_fast`)
            route_gateway(
                clock.now,
                events,
                &mut gateway,
                router,
                &index,
                (&mut engines, &nics, &mut reqs),
                &flows,
                status,
                &mut failed,
                parallel,
                commands,
            );
            // The requests routed wait on their engines: every engine is
            // looked at, as the list's step start does.
            scratch.may_start.fill(true);
            stage = Stage::StepEnd;
        }
        if stage == Stage::StepEnd {
            // (The list's transfers, its only system before step end with
            // work here.) A flow that ended may have completed a transfer,
            // which changes its decoder and prefiller: every engine is
            // looked at, as the list would.
            if finish_flows(
                clock.now,
                &events.flow_done,
                &mut flows,
                |f| new_flows.get(f, &flow_q),
                &mut leases,
                &mut engines,
                &mut reqs,
                deadlines,
                retirement.commands(),
            ) {
                scratch.may_start.fill(true);
            }
            // (Then, as the list's transfers, the reads whose latency ended
            // start: their flows wait in `new_flows`.)
            if !events.read_starts.is_empty() {
                let commands = retirement.commands();
                start_reads(
                    clock.now,
                    &events.read_starts,
                    &mut flows,
                    (&mut reqs, &mut leases, &nics),
                    |f| {
                        let id = commands.spawn_empty().id();
                        new_flows.push(id, f);
                        id
                    },
                );
            }
            // A continued run's step end alone, in a tick where nothing
            // else has work: the lone lane takes it, and the ticks after it
            // while they are the same.
            let quiet = !(routed
                || due::handoff(handoffs)
                || due::retire(finished)
                || due::post_reads(parked)
                || due::bandwidth(&flows)
                || due::failures(&failed))
                && recorder.is_none();
            if quiet && let Some(k) = lone_step_end(events, &index, &scratch.may_start) {
                lane = lone_lane(
                    k,
                    horizon,
                    (clock, events, deadlines, agenda),
                    (&mut engines, &mut reqs, &index),
                    (gauges, counters, trend),
                );
                if lane == Lane::Done {
                    // (Its engine is not dirty: its step is formed.)
                    scratch.may_start[k] = false;
                    if clock.ticks.is_multiple_of(CHECK_EVERY) {
                        return None;
                    }
                    match pop_tick(horizon, agenda, deadlines, events, clock) {
                        None => return None,
                        Some(false) => return Some(0),
                        Some(true) => continue,
                    }
                }
            }
        }
        let now = clock.now;
        // (After the lane, `Ended`: its step end is applied already.)
        if stage == Stage::StepEnd {
            if lane == Lane::Untouched {
                end_steps(
                    now,
                    events,
                    &mut engines,
                    &mut reqs,
                    scratch,
                    handoffs,
                    finished,
                );
            }
            for &(e, _) in &events.step_ends {
                scratch.may_start[index.position(e).expect("an engine")] = true;
            }
            let hands_off = due::handoff(handoffs);
            if hands_off && !hands_off_on_fast(&flows, &scenario) {
                return Some(RETIRE);
            }
            if due::retire(finished) {
                retire(
                    now,
                    finished,
                    |id| reqs.find(id).expect("a finished request"),
                    |e| engines.get(e).expect("decoder").0.index,
                    counters,
                    agenda,
                    &mut retirement,
                );
            }
            if hands_off {
                let (router, commands) = retirement.router();
                hand_off(
                    now,
                    handoffs,
                    &mut flows,
                    (&mut engines, &nics, &mut reqs),
                    router,
                    (deadlines, agenda, &mut failed),
                    (&mut rng, &scenario.0.faults),
                    (commands, leases.joining),
                );
                // (The decode legs wait on their decoders: every engine is
                // looked at, as the list's step start does.)
                scratch.may_start.fill(true);
            }
        }
        // (The ticks after the first are all taken up at step end.)
        stage = Stage::StepEnd;
        // The gauges read each engine as its step is formed: nothing after
        // that changes an engine in a fast tick (a tick where something
        // does hands over to the list, whose observe reads them itself).
        let states = &mut gauges.engines;
        start_steps(
            now,
            &index,
            &mut engines,
            &mut reqs,
            scratch,
            agenda,
            parked,
            recorder.as_deref_mut(),
            status,
            true,
            |k, engine, kv| states[k] = EngineState::of(engine, kv),
        );
        // (Checked in debug builds: the engines not looked at read as the
        // buffer says.)
        debug_assert!(
            index.all().zip(&gauges.engines).all(|(&e, s)| {
                let (engine, kv) = engines.get(e).expect("engine");
                EngineState::of(engine, kv) == *s
            }),
            "the gauges' buffer is the engines' state"
        );
        if due::post_reads(parked) {
            post_reads(now, &flows, parked, agenda);
        }
        if due::bandwidth(&flows) {
            share_bandwidth(now, &mut flows, (&mut flow_q, new_flows), agenda);
        }
        if due::failures(&failed) {
            return Some(FAIL);
        }
        observe(now, &index, gauges, counters, trend);
        // The tick is done; the loop would hand over the next one now.
        if clock.ticks.is_multiple_of(CHECK_EVERY) || status.error.is_some() {
            return None;
        }
        match pop_tick(horizon, agenda, deadlines, events, clock) {
            None => return None,
            Some(false) => return Some(0),
            Some(true) => {}
        }
    }
}

/// What the lone lane ([`lone_lane`]) left of the tick in hand.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lane {
    /// Its ticks are done and the engine's next step end is booked: the
    /// loop hands over the next tick (or stops at its backlog check).
    Done,
    /// Nothing of the tick in hand is done (its step end is not a
    /// continued run's, or is stale).
    Untouched,
    /// The tick in hand ended a continued run, whose next step is not the
    /// same step again: forming it is left to [`start_steps`].
    Ended,
}

/// The engine (its position in the index) whose step end is the only
/// event of the tick, when no other engine is marked to be looked at.
fn lone_step_end(events: &TickEvents, index: &EngineIndex, may_start: &[bool]) -> Option<usize> {
    let ([(e, _)], []) = (&events.step_ends[..], &events.flow_done[..]) else {
        return None;
    };
    let k = index.position(*e)?;
    let others_idle = may_start.iter().enumerate().all(|(j, &m)| j == k || !m);
    others_idle.then_some(k)
}

/// The lone lane: a tick whose only event ends engine `k`'s continued run
/// at a block boundary (a lone request decoding, most ticks of a light
/// load), run as the fast tick runs it — the run applied, the same step
/// formed again, the engine's gauges read, observed — and so are the ticks
/// after it while each would be that engine's next step end alone: its end
/// comes before anything booked and any deadline (nothing the lane does
/// books another event), by the horizon, and short of the loop's backlog
/// check. Those step ends are handed over here, as [`pop_tick`] would hand
/// them, without being booked: the last is booked as the lane stops, with
/// the sequence number it would have had (nothing was booked in between).
/// An exact shortcut: every other system has nothing to do in such a tick
/// (the caller checked their queues, and nothing here fills them).
fn lone_lane(
    k: usize,
    horizon: f64,
    (clock, events, deadlines, agenda): (&mut Clock, &mut TickEvents, &Deadlines, &mut Agenda),
    (engines, reqs, index): (
        &mut Query<(&mut Engine, &mut KvPool)>,
        &mut impl RequestStore,
        &EngineIndex,
    ),
    (gauges, counters, trend): (&mut Gauges, &Counters, &mut InFlightTrend),
) -> Lane {
    let (e, mut generation) = events.step_ends[0];
    let (mut engine, mut kv) = engines.get_mut(e).expect("engine");
    let first_other = next_instant(agenda, deadlines.next_time()).unwrap_or(f64::INFINITY);
    // (Only this engine changes here: the gauges work the others out once.)
    let decoder = gauges.hold_all_but(index, k);
    loop {
        let now = clock.now;
        // (As `end_steps` and `start_steps` take the step end.)
        if engine.generation != generation {
            return Lane::Untouched;
        }
        let end = match engine.continue_past_boundary(now, &mut kv.0, reqs) {
            Boundary::NotContinued => return Lane::Untouched,
            Boundary::Ended => return Lane::Ended,
            Boundary::Next(end) => end,
        };
        generation = engine.generation;
        let state = EngineState::of(&engine, &kv);
        if decoder {
            gauges.observe_all_but(now, state, index, counters, trend);
        } else {
            gauges.engines[k] = state;
            observe(now, index, gauges, counters, trend);
        }
        if clock.ticks.is_multiple_of(CHECK_EVERY) || end >= first_other || end > horizon {
            agenda.schedule(end, Event::StepEnd(e, generation));
            return Lane::Done;
        }
        // The next tick, as `pop_tick` would hand it over.
        events.step_ends[0] = (e, generation);
        clock.now = end;
        clock.ticks += 1;
        clock.lone_ticks += 1;
        set_sim_time(end);
    }
}

fn end_runs_system(
    In(horizon): In<f64>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    mut reqs: Query<&mut Request>,
) {
    let mut log = StepLog::default();
    for (mut engine, mut kv) in &mut engines {
        log.clear();
        engine.end_run_at(horizon, &mut kv.0, &mut reqs, &mut log);
    }
}
