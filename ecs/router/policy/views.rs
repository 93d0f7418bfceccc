//! What a script sees: the request being routed and each candidate pod,
//! as rhai types with read-only properties.

use rhai::{Engine, ImmutableString};

/// What a script sees of the request being routed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReqView {
    pub id: i64,
    pub session: i64,
    pub turn: i64,
    pub prompt_tokens: i64,
    pub new_tokens: i64,
    pub block_size: i64,
    /// When it reached the gateway, and the simulated time now (seconds).
    pub arrival_time: f64,
    pub now: f64,
}

/// The properties a script may read of a request, and of a pod.
pub const REQ_PROPERTIES: [&str; 8] = [
    "id",
    "session",
    "turn",
    "prompt_tokens",
    "new_tokens",
    "block_size",
    "arrival_time",
    "now",
];
pub const POD_PROPERTIES: [&str; 18] = [
    "role",
    "index",
    "active",
    "running",
    "queued",
    "parked",
    "prompt_backlog",
    "kv_capacity",
    "kv_held",
    "kv_free_cached",
    "cached_tokens",
    "max_num_seqs",
    "nic_flows",
    "nic_capacity",
    "nic_rate",
    "router_requests",
    "router_tokens",
    "router_cached_tokens",
];

/// What a script sees of one candidate instance.
#[derive(Clone, Debug, Default)]
pub struct PodView {
    pub role: ImmutableString,
    pub index: i64,
    /// Requests the instance holds or queues: running + parked + ready + waiting.
    pub active: i64,
    pub running: i64,
    /// Waiting for admission (no KV yet), including preempted ones.
    pub queued: i64,
    /// Remote prefills holding KV while their read is in flight.
    pub parked: i64,
    /// Prompt tokens its admitted requests have not computed yet.
    pub prompt_backlog: i64,
    pub kv_capacity: i64,
    pub kv_held: i64,
    pub kv_free_cached: i64,
    /// Longest cached prefix of this request's prompt there, whole blocks,
    /// never the last token: `min(cachedin, reusable(prompt))`.
    pub cached_tokens: i64,
    pub max_num_seqs: i64,
    pub nic_flows: i64,
    /// KV tokens per second its NICs carry at most, and carry now (the
    /// rates of the transfers in progress through them).
    pub nic_capacity: f64,
    pub nic_rate: f64,
    /// The router's own bookkeeping (llm-d): in-flight requests and tokens it
    /// sent there, and its approximate prefix index's estimate of the hit.
    pub router_requests: i64,
    pub router_tokens: i64,
    pub router_cached_tokens: i64,
}

/// Registers the `Request` and `Pod` types and their properties.
pub fn register(engine: &mut Engine) {
    engine
        .register_type_with_name::<ReqView>("Request")
        .register_get("id", |r: &mut ReqView| r.id)
        .register_get("session", |r: &mut ReqView| r.session)
        .register_get("turn", |r: &mut ReqView| r.turn)
        .register_get("prompt_tokens", |r: &mut ReqView| r.prompt_tokens)
        .register_get("new_tokens", |r: &mut ReqView| r.new_tokens)
        .register_get("block_size", |r: &mut ReqView| r.block_size)
        .register_get("arrival_time", |r: &mut ReqView| r.arrival_time)
        .register_get("now", |r: &mut ReqView| r.now);

    engine
        .register_type_with_name::<PodView>("Pod")
        .register_get("role", |p: &mut PodView| p.role.clone())
        .register_get("index", |p: &mut PodView| p.index)
        .register_get("active", |p: &mut PodView| p.active)
        .register_get("running", |p: &mut PodView| p.running)
        .register_get("queued", |p: &mut PodView| p.queued)
        .register_get("parked", |p: &mut PodView| p.parked)
        .register_get("prompt_backlog", |p: &mut PodView| p.prompt_backlog)
        .register_get("kv_capacity", |p: &mut PodView| p.kv_capacity)
        .register_get("kv_held", |p: &mut PodView| p.kv_held)
        .register_get("kv_free_cached", |p: &mut PodView| p.kv_free_cached)
        .register_get("cached_tokens", |p: &mut PodView| p.cached_tokens)
        .register_get("max_num_seqs", |p: &mut PodView| p.max_num_seqs)
        .register_get("nic_flows", |p: &mut PodView| p.nic_flows)
        .register_get("nic_capacity", |p: &mut PodView| p.nic_capacity)
        .register_get("nic_rate", |p: &mut PodView| p.nic_rate)
        .register_get("router_requests", |p: &mut PodView| p.router_requests)
        .register_get("router_tokens", |p: &mut PodView| p.router_tokens)
        .register_get("router_cached_tokens", |p: &mut PodView| {
            p.router_cached_tokens
        });
}
