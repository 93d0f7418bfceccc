//! Streaming statistics, at the bottom of every room: a log-linear histogram
//! with exact count, mean and extremes and percentiles to 0.05 %
//! ([`Histogram`]), and fixed-bound cumulative buckets as Prometheus keeps
//! them ([`Buckets`]). Memory does not grow with the number of values.

pub mod buckets;
pub mod histogram;

pub use buckets::Buckets;
pub use histogram::{EachN, Histogram};
