//! What a run reports (docs/model.md §9): per-request observations, time-averaged
//! gauges, the report (text and JSON) and figures.
//!
//! | file | what |
//! |---|---|
//! | [`observations`] | per-request observations per phase; count, mean, percentiles |
//! | [`gauges`] | time averages of the engines' state; the `Observe` system |
//! | [`counters`] | whole-run counts: requests arrived, finished, refused; tokens |
//! | [`backlog`] | what is still in flight at the horizon, and whether the deployment kept up |
//! | [`custom`] | what a user's own systems add to the report |
//! | [`report`] | the report of a run, printed and as JSON; atomic writes |
//! | [`figures`] | SVG figures: CDFs from log histograms, time series |
//! | [`formats`] | vLLM bench, AIPerf, Prometheus, trace-event timeline, HTML |

pub mod backlog;
pub mod counters;
pub mod custom;
pub mod figures;
pub mod formats;
pub mod gauges;
pub mod observations;
pub mod report;

pub use backlog::{Backlog, InFlightTrend};
pub use counters::Counters;
pub use custom::CustomMetrics;
pub use gauges::{GAUGES, Gauges};
pub use observations::{Metrics, OBSERVATIONS, Obs, PhaseObservations, Summary};
pub use report::{Report, TraceSummary, write_atomic};
