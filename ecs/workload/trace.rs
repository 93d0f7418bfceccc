//! Requests given explicitly, each with its arrival time (trace workloads,
//! replays, tests).

/// A request given explicitly (trace workloads, replays, tests).
#[derive(Debug, Clone)]
pub struct TraceRequest {
    pub name: String,
    pub arrival: f64,
    pub prompt: u32,
    pub output: u32,
    /// Requests of one stream share prefixes; `None`: shares nothing.
    pub stream: Option<u64>,
    /// Without a router (direct mode): prefill on prefiller 0?
    pub remote: bool,
}
