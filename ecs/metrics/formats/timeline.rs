//! `--timeline FILE`: the run as Chrome trace-event JSON, which Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open. One process per engine:
//! its steps as slices on one thread (tokens, prompt tokens, requests and
//! preemptions in their args), its NIC's flows as async slices beside them;
//! and one process of requests, an async track per request with its phases
//! nested: queued, prefill, leased, parked, read, decode. Times are
//! simulated seconds, written as microseconds. `--timeline-window A..B`
//! keeps what overlaps [A, B] (simulated seconds), to keep files small.
//! Written as the run goes, to a file renamed into place at the end.

use bevy_ecs::prelude::*;
use serde_json::{Value, json};
use std::path::Path;

use crate::engine::{Engine, Request, Role};
use crate::error::{Error, Result};
use crate::metrics::formats::stream::StreamFile;
use crate::shared::EngineIndex;
use crate::transfer::{Flows, Nic};

/// The process holding the requests' tracks.
const REQUESTS_PID: u64 = 1;
const STEPS_TID: u64 = 1;
const NIC_TID: u64 = 2;

#[derive(Resource)]
pub struct Timeline {
    file: StreamFile,
    window: (f64, f64),
    /// Per NIC link: the pid of its engine.
    link_pid: Vec<u64>,
    first: bool,
    next_id: u64,
}

/// Microseconds. A slice's duration is `us(end) − us(start)`, so that a
/// step that starts where another ends does not overlap it in a viewer.
fn us(t: f64) -> f64 {
    t * 1e6
}

/// Parses `A..B` (seconds; either end may be left out).
pub fn parse_window(text: &str) -> std::result::Result<(f64, f64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("`{text}` is not a window A..B (seconds), e.g. 100..110"))?;
    let end = |s: &str, default: f64| -> std::result::Result<f64, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(default);
        }
        s.parse::<f64>()
            .ok()
            .filter(|v| !v.is_nan())
            .ok_or_else(|| format!("`{s}` is not a number of seconds"))
    };
    let (a, b) = (end(a, 0.0)?, end(b, f64::INFINITY)?);
    if a > b {
        return Err(format!("the window {a}..{b} is empty"));
    }
    Ok((a, b))
}

impl Timeline {
    /// A timeline of the engines of `index` written to `path`.
    pub fn create(path: &Path, window: (f64, f64), world: &mut World) -> Result<Timeline> {
        let mut t = Timeline {
            file: StreamFile::create(path)?,
            window,
            link_pid: Vec::new(),
            first: true,
            next_id: 0,
        };
        t.file
            .write("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
        t.event(
            json!({"name": "process_name", "ph": "M", "pid": REQUESTS_PID, "tid": 0,
                       "args": {"name": "requests"}}),
        );
        let index = world.resource::<EngineIndex>().clone();
        for (k, &e) in index.all().enumerate() {
            let pid = 2 + k as u64;
            let (engine, nic) = {
                let mut q = world.query::<(&Engine, &Nic)>();
                let (engine, nic) = q.get(world, e).map_err(|_| Error::new("an engine"))?;
                ((engine.role, engine.index), *nic)
            };
            let name = format!("{}-{}", engine.0.name(), engine.1);
            t.event(json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}));
            t.event(
                json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}}),
            );
            t.event(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": STEPS_TID,
                           "args": {"name": "steps"}}),
            );
            t.event(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": NIC_TID,
                           "args": {"name": "NIC flows"}}),
            );
            // All of a pod's NICs draw on its "NIC flows" track.
            let links = nic.first_link as usize..(nic.first_link + nic.links) as usize;
            if t.link_pid.len() < links.end {
                t.link_pid.resize(links.end, 0);
            }
            t.link_pid[links].fill(pid);
            // Each engine keeps the slices of its steps in the window.
            let mut engine = world.get_mut::<Engine>(e).expect("an engine");
            engine.slices = Some(Box::new(crate::engine::record::StepSlices {
                window,
                steps: Vec::new(),
            }));
            debug_assert!(matches!(engine.role, Role::Prefill | Role::Decode));
        }
        world.resource_mut::<Flows>().slices = Some(Vec::new());
        Ok(t)
    }

    fn event(&mut self, e: Value) {
        if !self.first {
            self.file.write(",\n");
        }
        self.first = false;
        self.file.write(&e.to_string());
    }

    fn overlaps(&self, a: f64, b: f64) -> bool {
        b >= self.window.0 && a <= self.window.1
    }

    /// A phase [a, b] on the track of request `id`.
    fn phase(&mut self, id: u64, name: &str, a: f64, b: f64) {
        let id = format!("0x{id:x}");
        self.event(json!({"name": name, "cat": "request", "ph": "b", "id": id, "ts": us(a), "pid": REQUESTS_PID, "tid": 0}));
        self.event(json!({"name": name, "cat": "request", "ph": "e", "id": id, "ts": us(b), "pid": REQUESTS_PID, "tid": 0}));
    }

    /// A request that finished: its track and its phases.
    pub fn request(&mut self, r: &Request) {
        let Some(end) = r.finished_at else { return };
        if !self.overlaps(r.t0, end) {
            return;
        }
        let id = r.id;
        let name = format!("request {id}");
        let args = json!({"session": r.session, "turn": r.turn, "prompt": r.prompt, "output": r.output,
                          "remote": r.remote(), "preemptions": r.preemptions});
        let first = r.first_token_at.unwrap_or(end);
        let scheduled = r.first_scheduled_at.unwrap_or(first);
        self.event(
            json!({"name": name, "cat": "request", "ph": "b", "id": format!("0x{id:x}"),
                          "ts": us(r.t0), "pid": REQUESTS_PID, "tid": 0, "args": args}),
        );
        self.phase(id, "queued", r.t0, scheduled);
        match (r.t1, r.read_done_at) {
            (Some(t1), Some(done)) => {
                self.phase(id, "prefill", scheduled, t1);
                self.phase(id, "leased", t1, done);
                if let Some(parked) = r.parked_at {
                    self.phase(id, "parked", parked, done);
                }
                if let Some(read) = r.read_started_at {
                    self.phase(id, "read", read, done);
                }
            }
            _ => self.phase(id, "prefill", scheduled, first),
        }
        self.phase(id, "decode", first, end);
        self.event(
            json!({"name": name, "cat": "request", "ph": "e", "id": format!("0x{id:x}"),
                          "ts": us(end), "pid": REQUESTS_PID, "tid": 0}),
        );
    }

    /// Takes the steps and flows that ended since the last tick.
    pub fn take(&mut self, world_engines: &mut Query<(&mut Engine, &Nic)>, flows: &mut Flows) {
        for (mut e, nic) in world_engines.iter_mut() {
            let pid = self.link_pid[nic.first_link as usize];
            let Some(s) = e.slices.as_mut() else { continue };
            let steps = std::mem::take(&mut s.steps);
            for st in &steps {
                self.event(
                    json!({"name": "step", "cat": "engine", "ph": "X", "ts": us(st.start),
                                  "dur": us(st.end) - us(st.start), "pid": pid, "tid": STEPS_TID,
                                  "args": {"tokens": st.tokens, "prompt_tokens": st.prompt_tokens,
                                           "requests": st.requests, "preempted": st.preempted}}),
                );
            }
            if let Some(s) = e.slices.as_mut() {
                s.steps = steps;
                s.steps.clear();
            }
        }
        let done = flows
            .slices
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for f in &done {
            if !self.overlaps(f.start, f.end) {
                continue;
            }
            for link in f.links {
                self.next_id += 1;
                let pid = self.link_pid[link as usize];
                let id = format!("0x{:x}", self.next_id);
                let name = format!("read of request {}", f.request);
                self.event(
                    json!({"name": name, "cat": "nic", "ph": "b", "id": id, "ts": us(f.start),
                                  "pid": pid, "tid": NIC_TID, "args": {"tokens": f.tokens}}),
                );
                self.event(
                    json!({"name": name, "cat": "nic", "ph": "e", "id": id, "ts": us(f.end),
                                  "pid": pid, "tid": NIC_TID}),
                );
            }
        }
        if let Some(s) = &mut flows.slices {
            *s = done;
            s.clear();
        }
    }

    pub fn finish(mut self) -> Result<()> {
        self.file.write("\n]}\n");
        self.file.finish()
    }
}

/// System (after `Observe`): the steps and flows that ended in this tick go
/// to the timeline.
pub fn timeline_system(
    mut timeline: ResMut<Timeline>,
    mut engines: Query<(&mut Engine, &Nic)>,
    mut flows: ResMut<Flows>,
) {
    timeline.take(&mut engines, &mut flows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        assert_eq!(parse_window("100..110").unwrap(), (100.0, 110.0));
        assert_eq!(parse_window("..5").unwrap(), (0.0, 5.0));
        assert_eq!(parse_window("5..").unwrap(), (5.0, f64::INFINITY));
        assert!(parse_window("9..3").is_err());
        assert!(parse_window("soon").is_err());
    }
}
