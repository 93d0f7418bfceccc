//! A fault from Rust: from a given simulated time on, one decoder's steps
//! take `factor` times as long (a thermally throttled GPU, a noisy
//! neighbour). The scenario's step cost must be `Linear` (the reference's).
//!
//!     SLOW_FROM=1000 SLOW_FACTOR=3 SLOW_POD=0 \
//!         cargo run --release --example slow_decoder -- run scenarios/llmd_nixl_pull.ron
//!
//! Everything after `--` is pdsim's ordinary command line.

use pdsim::ecs::prelude::*;
use pdsim::engine::cost::StepTime;
use pdsim::engine::{Engine, Role};
use pdsim::shared::Clock;
use pdsim::{Sim, SimSystems};

/// When, which decoder, how much slower.
#[derive(Resource, Clone, Copy)]
pub struct Slowdown {
    pub from: f64,
    pub decoder: u32,
    pub factor: f64,
    pub applied: bool,
}

impl Slowdown {
    /// From the environment: `SLOW_FROM` (s, default 1000), `SLOW_POD`
    /// (decoder index, default 0), `SLOW_FACTOR` (default 3).
    pub fn from_env() -> Slowdown {
        let get = |k: &str, d: f64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Slowdown {
            from: get("SLOW_FROM", 1000.0),
            decoder: get("SLOW_POD", 0.0) as u32,
            factor: get("SLOW_FACTOR", 3.0),
            applied: false,
        }
    }
}

/// Between the sidecar's hand-offs and the steps that start: once the time has
/// come and the decoder is between steps, scale its step cost (a step in
/// progress keeps the cost it was booked with, so the change waits for an
/// idle moment).
fn slow_down(clock: Res<Clock>, mut slow: ResMut<Slowdown>, mut engines: Query<&mut Engine>) {
    if slow.applied || clock.now < slow.from {
        return;
    }
    for mut e in &mut engines {
        if e.role == Role::Decode && e.index == slow.decoder && e.is_idle() {
            if let StepTime::Linear(c) = &mut e.cost {
                c.c0 *= slow.factor;
                c.a *= slow.factor;
                c.omega *= slow.factor;
                c.beta *= slow.factor;
            }
            slow.applied = true;
        }
    }
}

/// Adds the fault to a simulation.
pub fn install(sim: &mut Sim, slowdown: Slowdown) {
    sim.world.insert_resource(slowdown);
    sim.add_systems(
        slow_down
            .after(SimSystems::Handoff)
            .before(SimSystems::StepStart),
    );
}

#[allow(dead_code)] // (the test suite includes this file for `install`)
fn main() {
    let slowdown = Slowdown::from_env();
    std::process::exit(pdsim::cli::main_with(move |sim| install(sim, slowdown)));
}
