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
use crate::engine::kv::BlockPool;
use crate::engine::request::RequestStore;

impl Engine {
    /// How many times the step just formed can run identically: 1 unless it
    /// only decodes; then until a request would need a new block (that step
    /// must be formed for real) or finishes (the last step of the run).
    pub(crate) fn repeatable(&self, kv: &BlockPool, reqs: &mut impl RequestStore) -> u32 {
        const MAX_RUN: u32 = 1 << 16;
        let bs = kv.block_size();
        let mut repeat = MAX_RUN;
        for &(id, n) in &self.step {
            let r = reqs.req(id);
            if n != 1 || r.computed + 1 != r.known_tokens() || r.generated == 0 {
                return 1; // a prefill chunk: not a pure decode step
            }
            // Step j (from 0) fits in the blocks held while computed + j + 1
            // fits; the run must not go past the step that finishes it.
            let fit = r.blocks.len() as u32 * bs - r.computed;
            let until_finish = r.max_tokens() - r.generated;
            repeat = repeat.min(fit).min(until_finish);
        }
        repeat
    }

    /// End time of the `k`-th step of the run that started at `step_start`,
    /// computed exactly as step-by-step simulation would.
    pub(crate) fn run_boundary(&self, k: u32) -> f64 {
        let mut t = self.step_start;
        for j in 0..k as u64 {
            t += self.run_step_cost(j);
        }
        t
    }

    /// Something reached the engine at `now` during a run of repeated steps:
    /// cut the run at the first step boundary at or after `now`. Returns the
    /// new end when it changed.
    pub fn cut_run(&mut self, now: f64) -> Option<f64> {
        if self.repeat <= 1 || self.busy_until.is_none() {
            return None;
        }
        let mut t = self.step_start;
        for j in 0..self.repeat as u64 {
            t += self.run_step_cost(j);
            if t >= now {
                let k = j as u32 + 1;
                if k == self.repeat {
                    return None;
                }
                self.repeat = k;
                self.busy_until = Some(t);
                self.generation += 1;
                return Some(t);
            }
        }
        None
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
        let (mut t, mut k) = (self.step_start, 0);
        for j in 0..self.repeat as u64 {
            let next = t + self.run_step_cost(j);
            if next > horizon {
                break;
            }
            t = next;
            k += 1;
        }
        if k == 0 {
            return;
        }
        self.repeat = k;
        self.busy_until = Some(t);
        self.finish_step(t, kv, reqs, log);
    }
}
