//! Per-request observations (docs/model.md §9, named as vLLM's metrics are):
//! what each finished request (and each turn) contributes, recorded per
//! hot-swap phase in streaming histograms, and their summaries; throughput
//! and goodput over [warm-up, horizon].

use bevy_ecs::prelude::*;
use serde::Serialize;

use crate::engine::Request;
use crate::scenario::Slo;
use crate::stats::Histogram;

/// What a run observes of each request (docs/model.md has the definitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Obs {
    /// First token − arrival at the gateway.
    Ttft,
    /// (finish − first token) ÷ (output tokens − 1), outputs of 2 or more.
    Tpot,
    /// Every gap between consecutive output tokens (recorded by the engines).
    Itl,
    /// Finish − arrival at the gateway (end-to-end; `response` is its alias).
    E2e,
    /// Arrival → first scheduled on the engine that computes the prompt.
    QueueTime,
    /// First scheduled → prompt computed, on that engine.
    PrefillTime,
    /// First token → last token.
    DecodeTime,
    /// KV read start → read done (remote only).
    TransferTime,
    /// 1 if prefilled remotely, else 0.
    Remote,
    /// Read done − prefiller's answer (remote only).
    Lease,
    RemoteTokens,
    LocalTokens,
    /// Per turn: 1 if its prompt reached `max_model_len`.
    TooLong,
}

impl Obs {
    pub const ALL: [Obs; 13] = [
        Obs::Ttft,
        Obs::Tpot,
        Obs::Itl,
        Obs::E2e,
        Obs::QueueTime,
        Obs::PrefillTime,
        Obs::DecodeTime,
        Obs::TransferTime,
        Obs::Remote,
        Obs::Lease,
        Obs::RemoteTokens,
        Obs::LocalTokens,
        Obs::TooLong,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Obs::Ttft => "ttft",
            Obs::Tpot => "tpot",
            Obs::Itl => "itl",
            Obs::E2e => "e2e",
            Obs::QueueTime => "queue_time",
            Obs::PrefillTime => "prefill_time",
            Obs::DecodeTime => "decode_time",
            Obs::TransferTime => "transfer_time",
            Obs::Remote => "remote",
            Obs::Lease => "lease",
            Obs::RemoteTokens => "remote_tokens",
            Obs::LocalTokens => "local_tokens",
            Obs::TooLong => "too_long",
        }
    }

    /// Its unit, for the printed report.
    pub fn unit(self) -> &'static str {
        match self {
            Obs::RemoteTokens | Obs::LocalTokens => "tokens",
            Obs::Remote | Obs::TooLong => "fraction",
            _ => "s",
        }
    }

    /// A 0/1 observation: its mean is a fraction, its percentiles say little.
    pub fn is_flag(self) -> bool {
        matches!(self, Obs::Remote | Obs::TooLong)
    }

    pub fn by_name(name: &str) -> Option<Obs> {
        let name = if name == "response" { "e2e" } else { name };
        Obs::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// Observation names in report order (`response` is reported too, as an
/// alias of `e2e`).
pub const OBSERVATIONS: [&str; 13] = [
    "ttft",
    "tpot",
    "itl",
    "e2e",
    "queue_time",
    "prefill_time",
    "decode_time",
    "transfer_time",
    "remote",
    "lease",
    "remote_tokens",
    "local_tokens",
    "too_long",
];

/// The observations of one hot-swap phase (or of the whole run), and what
/// throughput and goodput count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseObservations {
    pub hists: [Histogram; 13],
    pub finished: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Finished requests within every SLO.
    pub good: u64,
}

impl PhaseObservations {
    pub fn get(&self, obs: Obs) -> &Histogram {
        &self.hists[obs as usize]
    }

    fn at(&mut self, obs: Obs) -> &mut Histogram {
        &mut self.hists[obs as usize]
    }

    pub fn merge(&mut self, other: &PhaseObservations) {
        for (a, b) in self.hists.iter_mut().zip(&other.hists) {
            a.merge(b);
        }
        self.finished += other.finished;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.good += other.good;
    }
}

/// Observations, recorded per phase as they happen.
#[derive(Resource, Debug)]
pub struct Metrics {
    pub warmup: f64,
    pub slo: Slo,
    pub phases: Vec<PhaseObservations>,
}

impl Metrics {
    pub fn new(warmup: f64, phases: usize, slo: Slo) -> Metrics {
        Metrics {
            warmup,
            slo,
            phases: vec![PhaseObservations::default(); phases.max(1)],
        }
    }

    /// A turn was drawn at or after the warm-up: too long for the model, or not.
    pub fn turn(&mut self, phase: u32, too_long: bool) {
        self.phases[phase as usize]
            .at(Obs::TooLong)
            .record(too_long as u32 as f64);
    }

    /// A request finished: record it if it reached the gateway after the warm-up.
    pub fn request_finished(&mut self, r: &Request) {
        if r.t0 < self.warmup {
            return;
        }
        let first = r
            .first_token_at
            .expect("a finished request produced a first token");
        let finish = r.finished_at.expect("finished");
        let scheduled = r
            .first_scheduled_at
            .expect("a finished request was scheduled");
        let tpot = (r.output >= 2).then(|| (finish - first) / (r.output - 1) as f64);
        let good = self.slo.ttft.is_none_or(|s| first - r.t0 <= s)
            && self.slo.tpot.is_none_or(|s| tpot.unwrap_or(0.0) <= s)
            && self.slo.e2e.is_none_or(|s| finish - r.t0 <= s);
        let p = &mut self.phases[r.phase as usize];
        p.at(Obs::Ttft).record(first - r.t0);
        p.at(Obs::E2e).record(finish - r.t0);
        if let Some(t) = tpot {
            p.at(Obs::Tpot).record(t);
        }
        p.at(Obs::QueueTime).record(scheduled - r.t0);
        p.at(Obs::DecodeTime).record(finish - first);
        p.at(Obs::Remote).record(r.remote() as u32 as f64);
        if r.remote() {
            let t1 = r.t1.expect("a remote request has a prefill answer");
            let done = r.read_done_at.expect("a remote request's KV arrived");
            let read = r.read_started_at.expect("a remote request's read started");
            p.at(Obs::PrefillTime).record(t1 - scheduled);
            p.at(Obs::Lease).record(done - t1);
            p.at(Obs::TransferTime).record(done - read);
            p.at(Obs::RemoteTokens).record(r.remote_tokens as f64);
        } else {
            p.at(Obs::PrefillTime).record(first - scheduled);
            p.at(Obs::LocalTokens)
                .record((r.prompt - r.prefix_hit.unwrap_or(0)) as f64);
        }
        p.finished += 1;
        p.input_tokens += r.prompt as u64;
        p.output_tokens += r.output as u64;
        p.good += good as u64;
    }

    /// All phases together.
    pub fn overall(&self) -> PhaseObservations {
        let mut all = PhaseObservations::default();
        for p in &self.phases {
            all.merge(p);
        }
        all
    }
}

/// count, mean and percentiles of one observation.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    #[serde(rename = "p99.9")]
    pub p999: Option<f64>,
}

impl Summary {
    pub fn of(h: &Histogram) -> Summary {
        let [p50, p90, p99, p999] = h.quantiles([0.50, 0.90, 0.99, 0.999]);
        Summary {
            count: h.count(),
            mean: h.mean(),
            p50,
            p90,
            p99,
            p999,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_interpolate_between_ranks() {
        // 1..=5: p50 is 3; p90 at position 3.6 → 4 + 0.6 × (5 − 4) = 4.6.
        let mut h = Histogram::new();
        for v in [5.0, 1.0, 3.0, 2.0, 4.0] {
            h.record(v);
        }
        let s = Summary::of(&h);
        assert_eq!((s.count, s.mean, s.p50), (5, Some(3.0), Some(3.0)));
        assert!((s.p90.unwrap() - 4.6).abs() < 1e-12);
        assert_eq!(Summary::of(&Histogram::new()).mean, None);
    }
}
