//! What a run leaves unfinished, and whether the deployment kept up
//! (docs/model.md §9, "Backlog"). Latencies are observed when a request
//! finishes, so a deployment that falls behind shows only the lucky ones:
//! the backlog says how many are still waiting, where, for how long, and
//! whether their number grew over the run.

use bevy_ecs::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

use crate::engine::{Leg, Request, Status};
use crate::metrics::observations::Summary;
use crate::stats::Histogram;

/// Requests in flight past which a run stops early: each costs about a
/// kilobyte, and a deployment with this many waiting has long since
/// stopped keeping up.
pub const MAX_IN_FLIGHT: u64 = 1_000_000;

/// Where a request in flight waits, in the order of its path.
pub const PLACES: [&str; 8] = [
    "gateway",
    "prefill_queue",
    "prefilling",
    "handoff",
    "kv_transfer",
    "decode_queue",
    "decoding",
    "retrying",
];

/// The backlog at the end of a run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Backlog {
    /// Requests in flight at the horizon, and by where they wait.
    pub in_flight: u64,
    pub by_place: BTreeMap<String, u64>,
    /// Requests in flight, time average over [warm-up, horizon], and how much
    /// that number grew over the window (least-squares trend × window).
    pub mean_in_flight: f64,
    pub growth: f64,
    /// How long the requests in flight without a first token have waited
    /// so far (seconds): a lower bound on their TTFT, which no observation
    /// includes.
    pub waiting_for_first_token: Summary,
    /// False when the number in flight grew over the run: the deployment
    /// did not keep up, and latencies understate what requests wait.
    pub kept_up: bool,
    /// Why the run stopped before its horizon, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
}

impl Backlog {
    /// The report's lines: where the requests in flight wait, and a warning
    /// when the deployment did not keep up.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let places: Vec<String> = self
            .by_place
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        let _ = write!(out, "requests in flight at the horizon: {}", self.in_flight);
        if !places.is_empty() {
            let _ = write!(out, " ({})", places.join(", "));
        }
        let w = &self.waiting_for_first_token;
        if let (Some(mean), Some(p99)) = (w.mean, w.p99) {
            let _ = write!(
                out,
                "; waiting for a first token: {}, for {mean:.3} s on average, p99 {p99:.3} s",
                w.count
            );
        }
        out.push('\n');
        if let Some(why) = &self.stopped_early {
            let _ = writeln!(out, "WARNING: the run {why}.");
        }
        if !self.kept_up {
            let _ = writeln!(
                out,
                "WARNING: the deployment did not keep up: requests in flight grew by {:.0} over \
                 [warm-up, horizon] (mean {:.1}); the latencies above are those of the requests that \
                 finished and understate what the others wait.",
                self.growth, self.mean_in_flight
            );
        }
        out
    }
}

/// The number in flight integrated over [warm-up, horizon]: ∫ n dt and
/// ∫ n·t dt, from which its mean and linear trend follow exactly.
#[derive(Resource, Debug, Default, Clone)]
pub struct InFlightTrend {
    current: f64,
    last_time: f64,
    s0: f64,
    s1: f64,
}

impl InFlightTrend {
    /// `n` requests are in flight from `now` on; the window is [warmup, horizon].
    pub fn sample(&mut self, now: f64, n: u64, warmup: f64, horizon: f64) {
        self.advance(now, warmup, horizon);
        self.current = n as f64;
    }

    pub fn advance(&mut self, now: f64, warmup: f64, horizon: f64) {
        let from = self.last_time.max(warmup);
        let to = now.min(horizon);
        if to > from {
            self.s0 += self.current * (to - from);
            self.s1 += self.current * (to * to - from * from) / 2.0;
        }
        self.last_time = now;
    }

    /// The mean over [a, b] and the growth over it: the least-squares slope
    /// of n(t), (∫ n·t − t̄ ∫ n) / (L³/12), times L.
    pub fn mean_and_growth(&self, a: f64, b: f64) -> (f64, f64) {
        let l = b - a;
        if l <= 0.0 {
            return (0.0, 0.0);
        }
        let mid = (a + b) / 2.0;
        let slope = (self.s1 - mid * self.s0) / (l * l * l / 12.0);
        (self.s0 / l, slope * l)
    }
}

/// Whether a growth of `growth` requests over the window, around a mean of
/// `mean`, is a backlog building up rather than noise: more than 10
/// requests, three standard deviations of a Poisson count of that mean,
/// and a quarter of the mean (a queue growing from empty grows by twice
/// its mean).
pub fn grew(mean: f64, growth: f64) -> bool {
    growth > 10.0 + 3.0 * mean.sqrt() && growth > 0.25 * mean
}

/// Where request `r` waits (None: a prefill twin, counted with its request).
pub fn place(r: &Request) -> Option<&'static str> {
    if r.is_prefill_twin() {
        return None;
    }
    Some(match (r.leg, r.status) {
        (_, Status::Failed) => "retrying",
        (Leg::Prefill, Status::Waiting) if r.prefiller.is_none() => "gateway",
        (Leg::Prefill, Status::Waiting) => "prefill_queue",
        (Leg::Prefill, Status::PrefillDone) => "handoff",
        (Leg::Prefill, _) => "prefilling",
        (Leg::Decode, _) if r.decoder.is_none() => "gateway",
        (Leg::Decode, Status::Parked) => "kv_transfer",
        (Leg::Decode, Status::Waiting | Status::Ready) => "decode_queue",
        (Leg::Decode, Status::PrefillDone) => "handoff",
        (Leg::Decode, _) => "decoding",
    })
}

/// The backlog of the run `world` holds, at `now`.
pub fn collect(
    world: &mut World,
    now: f64,
    window: (f64, f64),
    stopped_early: Option<String>,
) -> Backlog {
    let mut by_place: BTreeMap<String, u64> = PLACES.iter().map(|p| (p.to_string(), 0)).collect();
    let mut waited = Histogram::new();
    let mut in_flight = 0;
    for r in world.query::<&Request>().iter(world) {
        let Some(p) = place(r) else { continue };
        in_flight += 1;
        *by_place.get_mut(p).expect("a place") += 1;
        if r.first_token_at.is_none() {
            waited.record(now - r.t0);
        }
    }
    let (mean, growth) = world
        .get_resource::<InFlightTrend>()
        .map_or((0.0, 0.0), |t| t.mean_and_growth(window.0, window.1));
    Backlog {
        in_flight,
        by_place,
        mean_in_flight: mean,
        growth,
        waiting_for_first_token: Summary::of(&waited),
        kept_up: stopped_early.is_none() && !grew(mean, growth),
        stopped_early,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_count_has_no_trend_and_a_ramp_grows_by_its_rise() {
        // 5 in flight all along [0, 100]: mean 5, no growth.
        let mut t = InFlightTrend::default();
        t.sample(0.0, 5, 0.0, 100.0);
        t.advance(100.0, 0.0, 100.0);
        let (m, g) = t.mean_and_growth(0.0, 100.0);
        assert!((m - 5.0).abs() < 1e-12 && g.abs() < 1e-9, "{m} {g}");
        // n = t (one more each second, sampled each second) over [0, 100]:
        // mean ≈ 49.5, growth ≈ 100 (the slope 1 over 100 s).
        let mut t = InFlightTrend::default();
        for s in 0..100 {
            t.sample(s as f64, s, 0.0, 100.0);
        }
        t.advance(100.0, 0.0, 100.0);
        let (m, g) = t.mean_and_growth(0.0, 100.0);
        assert!((m - 49.5).abs() < 1e-9, "{m}");
        assert!((g - 99.99).abs() < 1e-6, "{g}"); // a staircase: slope 0.9999
        assert!(grew(m, g));
        assert!(!grew(5.0, 0.0) && !grew(5.0, 9.0));
    }
}
