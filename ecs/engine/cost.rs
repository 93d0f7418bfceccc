//! The step cost: how long a step of a given composition takes, under the
//! pool's step-time model (docs/hardware.md).
//!
//! `Linear` needs only the step's tokens and KV tokens, which the
//! scheduler sums anyway; the physical models need its shape
//! ([`StepShape`]), built from the step's requests. For a run of repeated
//! decode steps ([`crate::engine::repeat`]) their costs are computed once,
//! when the run is booked, exactly as step-by-step formation would.

use std::sync::Arc;

use crate::engine::request::RequestStore;
use crate::engine::{Engine, uncomputed_prompt};
use crate::hardware::{Roofline, StepShape, StepTable};
use crate::scenario::{CostPlan, LinearCost, PoolPlan};

/// A pool's step-time model, ready to evaluate.
#[derive(Clone, Debug)]
pub enum StepTime {
    Linear(LinearCost),
    Roofline(Box<Roofline>),
    Table(Arc<StepTable>),
}

impl StepTime {
    pub fn of_plan(plan: &PoolPlan) -> StepTime {
        match &plan.cost {
            CostPlan::Linear(c) => StepTime::Linear(*c),
            CostPlan::Roofline(eff) => StepTime::Roofline(Box::new(Roofline::new(
                plan.pod
                    .as_ref()
                    .expect("a roofline pool has a pod (checked)"),
                *eff,
            ))),
            CostPlan::Table { table, .. } => StepTime::Table(table.clone()),
        }
    }

    /// The sliding window a shape must be built with.
    pub fn window(&self) -> Option<u32> {
        match self {
            StepTime::Roofline(r) => r.window(),
            _ => None,
        }
    }

    pub fn of_shape(&self, s: &StepShape) -> f64 {
        match self {
            StepTime::Linear(c) => linear(c, s.tokens, s.kv_tokens),
            StepTime::Roofline(r) => r.step_time(s),
            StepTime::Table(t) => t.step_time(s),
        }
    }
}

/// `c0 + max(omega + beta × kv, tokens × a)` seconds (docs/model.md §5): a step of
/// `tokens` scheduled tokens whose requests hold `kv_tokens` of KV.
#[inline]
pub fn linear(c: &LinearCost, tokens: u64, kv_tokens: u64) -> f64 {
    linear_of(c, tokens as f64 * c.a, kv_tokens as f64)
}

/// [`linear`] given its compute term `tokens × a` and the KV as a float.
#[inline(always)]
pub(crate) fn linear_of(c: &LinearCost, compute: f64, kv_tokens: f64) -> f64 {
    let memory = c.omega + c.beta * kv_tokens;
    // The larger, by one compare: `f64::max` also handles NaN, which a
    // validated cost never is (the same value; one instruction, not four).
    c.c0 + if memory > compute { memory } else { compute }
}

/// The step ends of a run of a linear model's identical decode steps, one
/// at a time, as step-by-step simulation works them out: step j (from 0)
/// decodes `tokens` tokens over `kv + j × tokens` of KV, and ends its cost
/// after the step before.
pub(crate) struct LinearEnds<'c> {
    c: &'c LinearCost,
    compute: f64,
    step: f64,
    kv: f64,
    t: f64,
}

impl<'c> LinearEnds<'c> {
    pub(crate) fn new(c: &'c LinearCost, tokens: u64, kv: u64, start: f64) -> LinearEnds<'c> {
        // The KV in floating point, a step's tokens added each step: exact
        // (and so `(kv + j × tokens) as f64`) while it is a whole number
        // below 2^53: a run's KV is held in one pool, and validation keeps
        // a pool below 2^32 tokens.
        debug_assert!(kv + tokens * crate::engine::repeat::MAX_RUN as u64 <= 1 << 53);
        LinearEnds {
            c,
            compute: tokens as f64 * c.a,
            step: tokens as f64,
            kv: kv as f64,
            t: start,
        }
    }

    /// The next step's end.
    #[inline(always)]
    pub(crate) fn next(&mut self) -> f64 {
        self.t += linear_of(self.c, self.compute, self.kv);
        self.kv += self.step;
        self.t
    }
}

impl Engine {
    /// The cost of the step just formed (`tokens` over `kv_tokens` of KV).
    pub(crate) fn formed_step_cost(
        &mut self,
        tokens: u64,
        kv_tokens: u64,
        reqs: &mut impl RequestStore,
    ) -> f64 {
        if let StepTime::Linear(c) = &self.cost {
            return linear(c, tokens, kv_tokens);
        }
        let window = self.cost.window();
        let mut shape = StepShape::default();
        for &(id, n) in &self.step {
            let r = reqs.req(id);
            shape.add(r.computed, n, n.min(uncomputed_prompt(r)), window);
        }
        let cost = self.cost.of_shape(&shape);
        self.run_costs.clear();
        self.run_costs.push(cost);
        cost
    }

    /// Books the costs of a run of `repeat` decode steps (physical models):
    /// step `j` decodes one token per request after `computed + j`.
    pub(crate) fn book_run_costs(&mut self, repeat: u32, reqs: &mut impl RequestStore) {
        if matches!(self.cost, StepTime::Linear(_)) {
            return;
        }
        let window = self.cost.window();
        for j in 1..repeat {
            let mut shape = StepShape::default();
            for &(id, _) in &self.step {
                shape.add(reqs.req(id).computed + j, 1, 0, window);
            }
            let cost = self.cost.of_shape(&shape);
            self.run_costs.push(cost);
        }
    }
}
