//! Per-request observations (MODEL.md §9): what each finished request (and
//! each turn) contributes, recorded per hot-swap phase, and their summaries.

use bevy_ecs::prelude::*;
use serde::Serialize;

use crate::engine::Request;

/// Observation names, as in MODEL.md §9.
pub const OBSERVATIONS: [&str; 7] = [
    "ttft",
    "response",
    "remote",
    "lease",
    "remote_tokens",
    "local_tokens",
    "too_long",
];
const TTFT: usize = 0;
const RESPONSE: usize = 1;
const REMOTE: usize = 2;
const LEASE: usize = 3;
const REMOTE_TOKENS: usize = 4;
const LOCAL_TOKENS: usize = 5;
const TOO_LONG: usize = 6;

/// The observations of one hot-swap phase (or of the whole run).
#[derive(Clone, Debug, Default)]
pub struct PhaseObservations {
    pub values: [Vec<f64>; 7],
}

impl PhaseObservations {
    pub fn get(&self, name: &str) -> &[f64] {
        let i = OBSERVATIONS
            .iter()
            .position(|n| *n == name)
            .expect("a known observation");
        &self.values[i]
    }
}

/// Observations, recorded per phase in the order they happen.
#[derive(Resource, Debug)]
pub struct Metrics {
    pub warmup: f64,
    pub phases: Vec<PhaseObservations>,
}

impl Metrics {
    pub fn new(warmup: f64, phases: usize) -> Metrics {
        Metrics {
            warmup,
            phases: vec![PhaseObservations::default(); phases.max(1)],
        }
    }

    /// A turn was drawn at or after the warm-up: too long for the model, or not.
    pub fn turn(&mut self, phase: u32, too_long: bool) {
        self.phases[phase as usize].values[TOO_LONG].push(too_long as u32 as f64);
    }

    /// A request finished: record it if it reached the gateway after the warm-up.
    pub fn request_finished(&mut self, r: &Request) {
        if r.t0 < self.warmup {
            return;
        }
        let v = &mut self.phases[r.phase as usize].values;
        let first = r
            .first_token_at
            .expect("a finished request produced a first token");
        let finish = r.finished_at.expect("finished");
        v[TTFT].push(first - r.t0);
        v[RESPONSE].push(finish - r.t0);
        v[REMOTE].push(r.remote() as u32 as f64);
        if r.remote() {
            let t1 = r.t1.expect("a remote request has a prefill answer");
            let done = r.read_done_at.expect("a remote request's KV arrived");
            v[LEASE].push(done - t1);
            v[REMOTE_TOKENS].push(r.remote_tokens as f64);
        } else {
            v[LOCAL_TOKENS].push((r.prompt - r.prefix_hit.unwrap_or(0)) as f64);
        }
    }

    /// All phases together.
    pub fn overall(&self) -> PhaseObservations {
        let mut all = PhaseObservations::default();
        for p in &self.phases {
            for (a, v) in all.values.iter_mut().zip(&p.values) {
                a.extend_from_slice(v);
            }
        }
        all
    }
}

/// count, mean and percentiles of one observation.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Summary {
    pub fn of(values: &[f64]) -> Summary {
        if values.is_empty() {
            return Summary {
                count: 0,
                mean: None,
                p50: None,
                p90: None,
                p99: None,
            };
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Summary {
            count: sorted.len(),
            mean: Some(mean),
            p50: Some(percentile(&sorted, 0.50)),
            p90: Some(percentile(&sorted, 0.90)),
            p99: Some(percentile(&sorted, 0.99)),
        }
    }
}

/// Linear interpolation between the closest ranks (numpy's default):
/// position `q × (n − 1)` in the sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        // Odd count: 1..=5, p50 is the middle value 3; p90 at position 3.6
        // → 4 + 0.6 × (5 − 4) = 4.6.
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.count, 5);
        assert_eq!(s.mean, Some(3.0));
        assert_eq!(s.p50, Some(3.0));
        assert!((s.p90.unwrap() - 4.6).abs() < 1e-12);
        // Even count: 1..=4, p50 at position 1.5 → 2.5.
        let s = Summary::of(&[4.0, 3.0, 2.0, 1.0]);
        assert_eq!(s.p50, Some(2.5));
        assert!((s.p99.unwrap() - 3.97).abs() < 1e-12);
        assert_eq!(Summary::of(&[]).mean, None);
    }
}
