//! Counters over the whole run (from t = 0, warm-up included, as vLLM's
//! Prometheus counters are): what arrived, finished, failed or was refused,
//! and the tokens involved. Every request is accounted for:
//! `requests_arrived = requests_finished + requests_too_long +
//! requests_failed + requests_in_flight`.

use bevy_ecs::prelude::*;

/// The counters the workload and the retirement keep (the engines and the
/// transfers keep theirs, read at the end: [`crate::metrics::Report`]).
#[derive(Resource, Default, Debug, Clone)]
pub struct Counters {
    /// Turns that reached the gateway (too-long ones included).
    pub requests_arrived: u64,
    /// Turns refused: prompt ≥ `max_model_len` (docs/model.md §3).
    pub requests_too_long: u64,
    pub requests_finished: u64,
    /// Prompt tokens of the requests that went on to be served.
    pub prompt_tokens: u64,
    /// Tokens generated for the requests that finished.
    pub generated_tokens: u64,
    /// Requests that failed for good (after the client's retries), by reason.
    pub requests_failed: u64,
    pub failed_by_reason: std::collections::BTreeMap<&'static str, u64>,
    /// Retries: the sidecar's of a prefill leg, the client's of a request.
    pub prefill_retries: u64,
    pub client_retries: u64,
    /// Failed turns whose session had a next turn it will not issue.
    pub sessions_ended_by_failure: u64,
}

impl Counters {
    /// A turn arrived with a prompt of `prompt` tokens.
    pub fn arrived(&mut self, prompt: u64, too_long: bool) {
        self.requests_arrived += 1;
        if too_long {
            self.requests_too_long += 1;
        } else {
            self.prompt_tokens += prompt;
        }
    }

    /// A request failed for good.
    pub fn failed(&mut self, reason: &'static str) {
        self.requests_failed += 1;
        *self.failed_by_reason.entry(reason).or_default() += 1;
    }

    /// Requests that arrived and have neither finished nor failed for good.
    pub fn in_flight(&self) -> u64 {
        self.requests_arrived
            .saturating_sub(self.requests_too_long + self.requests_finished + self.requests_failed)
    }

    /// A request produced its last token: `output` tokens in all.
    pub fn finished(&mut self, output: u32) {
        self.requests_finished += 1;
        self.generated_tokens += output as u64;
    }
}
