//! What a user's own systems add to the report: named values (a count, a
//! peak, an average they compute) and observations (histograms of values
//! they record). They appear in the text report, the JSON (`custom`, and
//! `observations`), and the sweep summary's columns (docs/extending.md).

use bevy_ecs::prelude::*;
use std::collections::BTreeMap;

use crate::stats::Histogram;

/// A resource every simulation has; a custom system writes into it.
#[derive(Resource, Default, Debug, Clone)]
pub struct CustomMetrics {
    /// Name → value, reported as it stands at the end of the run.
    pub values: BTreeMap<String, f64>,
    /// Name → histogram, summarised as the built-in observations are
    /// (count, mean, p50, p90, p99, p99.9).
    pub observations: BTreeMap<String, Histogram>,
}

impl CustomMetrics {
    /// Adds `n` to the value `name` (a counter).
    pub fn add(&mut self, name: &str, n: f64) {
        *self.values.entry(name.to_string()).or_insert(0.0) += n;
    }

    /// Sets the value `name` to `v` if it is larger (a peak).
    pub fn max(&mut self, name: &str, v: f64) {
        let e = self.values.entry(name.to_string()).or_insert(v);
        *e = e.max(v);
    }

    /// Sets the value `name`.
    pub fn set(&mut self, name: &str, v: f64) {
        self.values.insert(name.to_string(), v);
    }

    /// Records one value of the observation `name`.
    pub fn observe(&mut self, name: &str, v: f64) {
        self.observations
            .entry(name.to_string())
            .or_default()
            .record(v);
    }
}
