//! The simulation: a bevy_ecs `World`, one `Schedule` run once per tick, and
//! the next-event loop around it. This is the top of the simulation: it
//! assembles every module's systems; the resources they share are in
//! [`crate::shared`], at the bottom.
//!
//! # The ordering contract
//!
//! Time advances from one instant at which something happens to the next.
//! Everything that happens at one instant is one *tick*: the agenda hands
//! over every event due now, then the systems run once, in this order
//! ([`SimSystems`], chained):
//!
//! 1. `Phases` — hot-swap phases that start now change policies/parameters.
//!    `Faults` — faults that start or end now are applied (a pod down or
//!    back, a NIC slowed), and the router learns of earlier ones.
//! 2. `Workload` — new sessions and sessions whose tool call ended issue a
//!    request (sessions in arrival order, turns in agenda order).
//! 3. `Routing` — requests at the gateway are routed, in the order they
//!    arrived; the router's scripts decide; each goes to one engine's queue.
//! 4. `Transfers` — leases whose deadline is now are renewed by heartbeats
//!    or expire; flows whose finish time is now complete (in start order):
//!    the prefiller's lease is released and the decoder's request promoted;
//!    push registrations reach their prefillers; then transfers whose
//!    latency ended start flowing.
//! 5. `StepEnd` — steps that end now are applied (engines in agenda order):
//!    tokens computed, first tokens, finishes (KV freed); then the requests
//!    that finished retire, in that order: observed, released from the
//!    router's bookkeeping, their session's next turn booked, despawned.
//! 6. `Handoff` — the sidecar takes the prefillers' answers: lease, then the
//!    decode leg to its decoder (or the store-and-forward copy starts).
//! 7. `StepStart` — every idle engine whose state changed forms its next step
//!    (prefillers by index, then decoders by index) and books its end;
//!    then the reads of the requests decoders parked are posted, their
//!    start booked `x0` later.
//! 8. `Bandwidth` — if flows started or ended, every flow is brought to now,
//!    the links are re-divided (max-min) and the earliest finish is booked.
//!    `Failures` — requests that failed in this tick are retried (the
//!    sidecar's prefill retries, the client's) or fail for good.
//! 9. `Observe` — gauges integrate the interval just passed and sample the
//!    new state.
//!
//! An event booked for the current instant by a later system (a read with
//! `x0 = 0`) runs in a following tick at the same time. Ties between events
//! at one instant are broken by (rank = the system above, insertion order).
//!
//! Custom systems (a metric, a fault) go in with
//! [`Sim::add_systems`], ordered against these sets. A simulation without
//! any runs the same systems in this order without the schedule's executor
//! (an exact shortcut, see `schedule::DirectTick`); adding one puts every
//! tick through the schedule, with the same results.
//!
//! | file | what |
//! |---|---|
//! | [`schedule`] | [`Sim`]: the world built from a scenario, the schedule, the loop |
//! | [`phases`] | the `Phases` system (hot swap) |
//! | [`retire`] | what happens to a request that finished, or failed |
//! | [`faults`] | the `Faults` system: pods down and up, NICs slowed |
//! | [`outputs`] | a run with its output files (JSON, vLLM bench, AIPerf, Prometheus, timeline, HTML, figures) |

use bevy_ecs::prelude::*;
use std::cell::Cell;
use std::sync::OnceLock;

pub mod faults;
pub mod outputs;
pub mod phases;
pub mod retire;
pub mod schedule;

pub use outputs::Outputs;
pub use schedule::Sim;

/// The tick's systems, in the order they run (see the module docs).
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimSystems {
    Phases,
    Faults,
    Workload,
    Routing,
    Transfers,
    StepEnd,
    Handoff,
    StepStart,
    Bandwidth,
    Failures,
    Observe,
}

thread_local! {
    /// Simulated time of the tick in progress on this thread, for log
    /// timestamps. One per thread: a sweep runs a simulation on each, and
    /// one global written every tick by both moved its cache line between
    /// the cores at every tick.
    static SIM_TIME: Cell<f64> = const { Cell::new(0.0) };
}

/// Marks `t` as the simulated time of this thread's tick in progress.
#[inline]
pub(crate) fn set_sim_time(t: f64) {
    SIM_TIME.set(t);
}

/// The simulated time of this thread's tick in progress (what log lines
/// print).
pub(crate) fn sim_time() -> f64 {
    SIM_TIME.get()
}

/// A function that extends every simulation built in this process with the
/// user's own systems and resources ([`crate::cli::main_with`]): the
/// ordinary command line (`run`, `sweep`, `--plots`, `check`) then runs them.
pub type Extension = dyn Fn(&mut Sim) + Send + Sync;

static EXTENSION: OnceLock<Box<Extension>> = OnceLock::new();

/// Installs the extension (once per process; a second call is refused).
pub fn set_extension(f: Box<Extension>) -> Result<(), crate::error::Error> {
    EXTENSION
        .set(f)
        .map_err(|_| crate::error::Error::new("an extension is already installed"))
}

pub(crate) fn extension() -> Option<&'static Extension> {
    EXTENSION.get().map(|b| b.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_logs_its_own_simulated_time() {
        // A sweep runs one simulation per thread: a log line of one run
        // must not carry the time of the other's tick.
        set_sim_time(5.0);
        std::thread::spawn(|| {
            assert_eq!(sim_time(), 0.0);
            set_sim_time(7.0);
        })
        .join()
        .expect("the other thread ran");
        assert_eq!(sim_time(), 5.0);
    }
}
