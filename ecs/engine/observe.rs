//! What only the engine sees: the gap between consecutive output tokens of
//! every request (ITL), one sample per token gap, kept in a streaming
//! histogram per hot-swap phase.
//!
//! A run of `k` identical decode steps gives each of its requests `k`
//! tokens, at the run's step ends `t_0 … t_{k−1}` computed exactly as the
//! step-by-step simulation computes them: each request's first gap ends at
//! `t_0` (it began at the request's previous token), and the `k − 1` gaps
//! `t_j − t_{j−1}` are the same for every request of the run, so they are
//! recorded once each, weighted by the number of requests.
//!
//! When asked, it also keeps its steps' slices for a timeline, each step of
//! a run at its exact times.

use crate::engine::record::StepSlice;
use crate::engine::{Engine, Leg, Request};
use crate::stats::Histogram;

/// The histogram of `phase` among per-phase histograms.
pub(crate) fn phase_hist(hists: &mut Vec<Histogram>, phase: u32) -> &mut Histogram {
    let p = phase as usize;
    if hists.len() <= p {
        hists.resize_with(p + 1, Histogram::new);
    }
    &mut hists[p]
}

/// One more request of `phase` among per-phase counts.
pub(crate) fn count_phase(counts: &mut Vec<u64>, phase: u32) {
    let p = phase as usize;
    if counts.len() <= p {
        counts.resize(p + 1, 0);
    }
    counts[p] += 1;
}

impl Engine {
    /// Request `r` sampled its tokens of the step (or run of `repeat`
    /// steps) that ends at `now`, its first at `first_end`: its first token
    /// gap, and its share of the run's later gaps.
    pub(crate) fn observe_tokens(
        &mut self,
        r: &mut Request,
        now: f64,
        first_end: f64,
        repeat: u32,
    ) {
        if let Some(x) = &mut self.exported {
            x.generation_tokens += repeat as u64;
            if r.generated == 1 {
                x.first_token(r, now);
            }
        }
        if r.leg != Leg::Decode {
            return;
        }
        let counted = r.t0 >= self.observe_from;
        if let Some(last) = r.last_token_at {
            if counted {
                phase_hist(&mut self.itl, r.phase).record(first_end - last);
            }
            if let Some(x) = &mut self.exported {
                x.itl.record(first_end - last);
            }
        }
        if repeat > 1 {
            if counted {
                count_phase(&mut self.itl_weights, r.phase);
            }
            self.run_requests += 1;
        }
        r.last_token_at = Some(now);
    }

    /// The gaps between the run's step ends after the first, weighted by
    /// the requests of each phase in it (the run ends at `end`). The gaps
    /// are worked out once, then each histogram takes them in order.
    pub(crate) fn record_run_gaps(&mut self, repeat: u32, end: f64) {
        let mut gaps = std::mem::take(&mut self.run_gaps);
        gaps.clear();
        // (`repeat` is the run's: finish_step has reset the engine's.)
        let ends = &self.run_ends[..repeat as usize];
        gaps.extend(ends.windows(2).map(|w| w[1] - w[0]));
        debug_assert_eq!(
            ends.last(),
            Some(&end),
            "the run ends where it was booked to"
        );
        for (p, &w) in self.itl_weights.iter().enumerate() {
            if w > 0 {
                phase_hist(&mut self.itl, p as u32).record_each_n(&gaps, w);
            }
        }
        if let Some(x) = &mut self.exported {
            for &gap in &gaps {
                x.itl.record_n(gap, self.run_requests);
            }
        }
        self.run_requests = 0;
        self.run_gaps = gaps;
    }

    /// The step (or the run of `repeat` steps) that ended at `end`, as
    /// slices of the timeline's window.
    pub(crate) fn record_slices(&mut self, repeat: u32, end: f64) {
        let total: u32 = self.step.iter().map(|s| s.1).sum();
        let mut t = self.step_start;
        for j in 0..repeat as usize {
            let next = if repeat == 1 { end } else { self.run_ends[j] };
            let slices = self.slices.as_mut().expect("asked for");
            let (a, b) = slices.window;
            if next >= a && t <= b {
                slices.steps.push(StepSlice {
                    start: t,
                    end: next,
                    tokens: total,
                    prompt_tokens: if j == 0 { self.step_prompt_tokens } else { 0 },
                    requests: self.step.len() as u32,
                    preempted: if j == 0 { self.step_preempted } else { 0 },
                });
            }
            t = next;
        }
    }
}
