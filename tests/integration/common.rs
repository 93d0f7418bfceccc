//! Helpers: the tiny scenario with overrides, traces run without a router,
//! and a timeline of engine state recorded by a custom system.

use bevy_ecs::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pdsim::engine::record::{FinishedRequests, StepRecord, StepRecorder};
use pdsim::engine::{Engine, KvPool, Request, Role};
use pdsim::router::RouterMode;
use pdsim::scenario::{self, Scenario};
use pdsim::shared::Clock;
use pdsim::workload::TraceRequest;
use pdsim::{Sim, SimSystems};

pub const EPS: f64 = 1e-9;

pub fn assert_close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() < EPS,
        "{what}: expected {expected}, got {actual}"
    );
}

/// A fresh scratch folder of this test process, named `name`, or a path in
/// it; the folder is removed when this goes out of scope unless the test is
/// failing (its files are then left to look at): a passing suite leaves
/// nothing in the temp folder.
pub struct Scratch {
    folder: PathBuf,
    path: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let folder = std::env::temp_dir().join(format!("pdsim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder).unwrap();
        Scratch {
            path: folder.clone(),
            folder,
        }
    }

    /// `inner` in the folder, not made (for what makes it: a sweep's output).
    pub fn within(mut self, inner: &str) -> Scratch {
        self.path = self.folder.join(inner);
        self
    }

    /// A file `file` holding `text`, in a fresh folder `name`.
    pub fn file(name: &str, file: &str, text: &str) -> Scratch {
        let scratch = Scratch::new(name).within(file);
        std::fs::write(&scratch.path, text).unwrap();
        scratch
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.folder);
        }
    }
}

/// The scenario at `path` with `--set` overrides.
pub fn scenario_with(path: &str, sets: &[&str]) -> Scenario {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    scenario::load(Path::new(path), &sets).unwrap_or_else(|e| panic!("{path} {sets:?}: {e}"))
}

/// The tiny scenario (tests/scenarios/tiny.ron) with `--set` overrides.
pub fn tiny(sets: &[&str]) -> Scenario {
    scenario_with("tests/scenarios/tiny.ron", sets)
}

/// A trace request: (arrival, prompt, output, stream, remote).
pub fn req(
    arrival: f64,
    prompt: u32,
    output: u32,
    stream: Option<u64>,
    remote: bool,
) -> TraceRequest {
    TraceRequest {
        remote,
        ..TraceRequest::at(arrival, prompt, output, stream)
    }
}

/// Engine state at the end of one tick.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub t: f64,
    pub p_held_blocks: u32,
    pub p_waiting: u32,
    pub d_held_blocks: u32,
    pub d_running: u32,
    pub d_parked: u32,
    pub d_ready: u32,
}

#[derive(Resource, Default)]
pub struct Timeline(pub Vec<Snapshot>);

/// A custom system, added from outside the crate as a user would.
fn record_timeline(
    clock: Res<Clock>,
    engines: Query<(&Engine, &KvPool)>,
    mut timeline: ResMut<Timeline>,
) {
    let mut s = Snapshot {
        t: clock.now,
        p_held_blocks: 0,
        p_waiting: 0,
        d_held_blocks: 0,
        d_running: 0,
        d_parked: 0,
        d_ready: 0,
    };
    for (e, kv) in &engines {
        match e.role {
            Role::Prefill => {
                s.p_held_blocks += kv.0.num_held();
                s.p_waiting += e.waiting.len() as u32;
            }
            Role::Decode => {
                s.d_held_blocks += kv.0.num_held();
                s.d_running += e.running.len() as u32;
                s.d_parked += e.parked;
                s.d_ready += e.ready.len() as u32;
            }
        }
    }
    timeline.0.push(s);
}

pub struct Outcome {
    /// Finished requests by trace index.
    pub requests: BTreeMap<u64, Request>,
    /// Steps formed, with the role of the engine.
    pub steps: Vec<(Role, StepRecord)>,
    pub timeline: Vec<Snapshot>,
    pub report: pdsim::Report,
}

impl Outcome {
    pub fn req(&self, i: u64) -> &Request {
        self.requests
            .get(&i)
            .unwrap_or_else(|| panic!("request {i} did not finish"))
    }
    pub fn steps_of(&self, role: Role) -> Vec<&StepRecord> {
        self.steps
            .iter()
            .filter(|(r, _)| *r == role)
            .map(|(_, s)| s)
            .collect()
    }
    /// The last snapshot at or before `t`.
    pub fn at(&self, t: f64) -> Snapshot {
        *self
            .timeline
            .iter()
            .rev()
            .find(|s| s.t <= t + EPS)
            .expect("a snapshot")
    }
}

/// Runs a trace through the tiny deployment without a router.
pub fn run_trace(scenario: &Scenario, trace: Vec<TraceRequest>) -> Outcome {
    let mut sim = Sim::with_trace(scenario, RouterMode::Direct, trace).expect("sim builds");
    sim.record();
    sim.world.insert_resource(Timeline::default());
    sim.add_systems(record_timeline.after(SimSystems::Observe));
    let report = sim.run().expect("run succeeds");
    let finished = sim.world.remove_resource::<FinishedRequests>().unwrap().0;
    let recorded = sim.world.remove_resource::<StepRecorder>().unwrap().steps;
    let steps = recorded
        .into_iter()
        .map(|s| (sim.world.get::<Engine>(s.engine).unwrap().role, s))
        .collect();
    let timeline = sim.world.remove_resource::<Timeline>().unwrap().0;
    Outcome {
        requests: finished.into_iter().map(|r| (r.id, r)).collect(),
        steps,
        timeline,
        report,
    }
}
