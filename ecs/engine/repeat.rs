//! Runs of identical decode steps, booked as one step (an exact shortcut).
//!
//! When a step only decodes
//! and nothing was preempted, the steps that follow are the same step again
//! — same requests, one token each, no admission possible (no KV is freed,
//! no slot frees) — until a request needs a new block or finishes, or
//! something reaches the engine. Such a run is booked as one step of
//! `repeat` identical steps; each step's end time is computed exactly as the
//! step-by-step simulation would (`t += cost(kv)` with kv growing by one
//! token per request per step). If a request reaches the engine during the
//! run, the run is cut at the first step boundary at or after that instant
//! ([`Engine::cut_run`]), so the newcomer is seen exactly when it would
//! have been.

use crate::engine::Engine;
use crate::engine::cost::{StepTime, linear_of};
use crate::engine::kv::BlockPool;
use crate::engine::request::{Request, RequestStore};

/// The longest run of identical steps (a bound; runs end well before it).
pub(crate) const MAX_RUN: u32 = 1 << 16;

/// How many times a step that gives request `r` `n` tokens can run
/// identically, as far as `r` decides: 1 unless `r` only decodes; then
/// until it would need a new block (that step must be formed for real) or
/// finishes (the last step of the run). The step's run is the least of
/// its requests' ([`Engine::start_step`] takes it on the look-up of each
/// request that sums the step's KV).
pub(crate) fn run_limit(r: &Request, n: u32, block_size: u32) -> u32 {
    if n != 1 || r.computed + 1 != r.known_tokens() || r.generated == 0 {
        return 1; // a prefill chunk: not a pure decode step
    }
    // Step j (from 0) fits in the blocks held while computed + j + 1
    // fits; the run must not go past the step that finishes it.
    let fit = r.blocks.len() as u32 * block_size - r.computed;
    let until_finish = r.max_tokens() - r.generated;
    fit.min(until_finish)
}

impl Engine {
    /// Works out when each step of the run just booked ends, exactly as
    /// step-by-step simulation would (`t += cost`); returns the run's end.
    pub(crate) fn book_run_ends(&mut self) -> f64 {
        let mut ends = std::mem::take(&mut self.run_ends);
        ends.clear();
        let mut t = self.step_start;
        // Step j (from 0) of a linear model decodes one token per request
        // over `step_kv + j × tokens` of KV; a physical model's costs were
        // booked by `book_run_costs`.
        let n = self.repeat as u64;
        match &self.cost {
            StepTime::Linear(c) => {
                let (tokens, kv) = (self.step.len() as u64, self.step_kv);
                // The KV in floating point, a step's tokens added each
                // step: exact (and so `(kv + j × tokens) as f64`) while it
                // is a whole number below 2^53: a run's KV is held in one
                // pool, and validation keeps a pool below 2^32 tokens.
                debug_assert!(kv + n * tokens < 1 << 53);
                let (compute, step, mut kv) = (tokens as f64 * c.a, tokens as f64, kv as f64);
                ends.extend((0..n).map(|_| {
                    t += linear_of(c, compute, kv);
                    kv += step;
                    t
                }));
            }
            _ => ends.extend(self.run_costs[..n as usize].iter().map(|&cost| {
                t += cost;
                t
            })),
        }
        self.run_ends = ends;
        t
    }

    /// The step ends of the run in progress (its first `repeat` steps).
    pub(crate) fn run_ends(&self) -> &[f64] {
        &self.run_ends[..self.repeat as usize]
    }

    /// End time of the `k`-th step (from 1) of the run in progress.
    pub(crate) fn run_boundary(&self, k: u32) -> f64 {
        self.run_ends[k as usize - 1]
    }

    /// Something reached the engine at `now` during a run of repeated steps:
    /// cut the run at the first step boundary at or after `now`. Returns the
    /// new end when it changed.
    pub fn cut_run(&mut self, now: f64) -> Option<f64> {
        if self.repeat <= 1 || self.busy_until.is_none() {
            return None;
        }
        let k = self.run_ends().iter().position(|&t| t >= now)? as u32 + 1;
        if k == self.repeat {
            return None;
        }
        self.repeat = k;
        let t = self.run_boundary(k);
        self.busy_until = Some(t);
        self.generation += 1;
        Some(t)
    }
}

impl Engine {
    /// The simulation ends at `horizon` during a run of repeated steps:
    /// applies the steps of the run that ended by then, as step-by-step
    /// formation would have (the rest never happen).
    pub fn end_run_at(
        &mut self,
        horizon: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut crate::engine::StepLog,
    ) {
        let Some(end) = self.busy_until else { return };
        if self.repeat <= 1 || end <= horizon {
            return;
        }
        let ends = self.run_ends();
        let k = ends.iter().position(|&t| t > horizon).unwrap_or(ends.len()) as u32;
        if k == 0 {
            return;
        }
        self.repeat = k;
        let t = self.run_boundary(k);
        self.busy_until = Some(t);
        self.finish_step(t, kv, reqs, log);
    }
}
