//! A custom metric from Rust: the most remote requests each decoder held
//! parked at once (admitted, KV allocated, waiting for their read), written
//! into the report — its text, its JSON (`custom`) and a sweep's summary.
//!
//!     cargo run --release --example parked_peak -- run scenarios/llmd_nixl_pull.ron
//!     cargo run --release --example parked_peak -- sweep scenarios/llmd_nixl_pull.ron --seeds 1..4
//!
//! Everything after `--` is pdsim's ordinary command line.

use pdsim::ecs::prelude::*;
use pdsim::engine::{Engine, Role};
use pdsim::metrics::CustomMetrics;
use pdsim::{Sim, SimSystems};

/// After the engines' systems of every tick: each decoder's parked count.
fn parked_peak(engines: Query<&Engine>, mut custom: ResMut<CustomMetrics>) {
    for e in &engines {
        if e.role == Role::Decode {
            custom.max(
                &format!("parked_peak_decode-{}", e.index),
                f64::from(e.parked),
            );
        }
    }
}

/// Adds the metric to a simulation.
pub fn install(sim: &mut Sim) {
    sim.add_systems(parked_peak.in_set(SimSystems::Observe));
}

#[allow(dead_code)] // (the test suite includes this file for `install`)
fn main() {
    std::process::exit(pdsim::cli::main_with(install));
}
