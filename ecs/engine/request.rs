//! A request: one turn of a session, from the gateway to its last token.

use bevy_ecs::prelude::*;

use crate::shared::Lookup;

use crate::engine::kv::{BlockId, BlockPath};

/// Which leg of the request the serving engine is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// On a prefiller: the prompt with `max_tokens = 1` (docs/model.md §6).
    Prefill,
    /// On a decoder: local prefill + decode, or decode after a remote prefill.
    Decode,
}

/// Where the request stands on the engine serving its current leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// In a waiting queue, holding no KV (new, or preempted).
    Waiting,
    /// Remote path: whole prompt allocated, read in flight; no slot (vLLM's
    /// WAITING_FOR_REMOTE_KVS).
    Parked,
    /// Remote path: KV read done, waiting for a slot ahead of new requests.
    Ready,
    /// Holds a slot and is in the running list.
    Running,
    /// Prefill leg done; its blocks are leased until the decoder reads them.
    PrefillDone,
    /// Last token produced.
    Finished,
    /// It failed (a fault): its retirement takes it out of the run.
    Failed,
}

/// How the decode leg gets its prompt's KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// Prefilled on the decoder itself.
    Local,
    /// To be read from a prefiller (NIXL pull): not read yet.
    RemotePending,
    /// Store-and-forward: copied out of the prefiller, comes with the request.
    Delivered,
    /// Read (NIXL) or delivered (store-and-forward): only the last prompt
    /// token remains to compute.
    RemoteArrived,
}

/// What follows a request once it finished (docs/model.md §3; closed-loop traces).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NextTurn {
    /// The synthetic session draws its next turn `after` seconds (its tool call).
    Session { session: Entity, after: f64 },
    /// The trace's request `index` (the session's next turn) arrives `after`
    /// seconds (its think time).
    Trace { index: u32, after: f64 },
}

#[derive(Component, Clone, Debug)]
pub struct Request {
    pub id: u64,
    /// The session (or trace stream) it belongs to, as policies see it.
    pub session: u64,
    /// Identity of its tokens for prefix caching ([`BlockPath`]).
    pub path: BlockPath,
    pub turn: u32,
    /// When the request reached the gateway.
    pub t0: f64,
    /// The hot-swap phase it arrived in.
    pub phase: u32,
    pub prompt: u32,
    pub new_tokens: u32,
    /// Output tokens this request will produce (unknown to the scheduler and
    /// router: only the step that completes it reads it).
    pub output: u32,
    /// What follows it when it finishes (None: its session ends).
    pub next_turn: Option<NextTurn>,

    pub decoder: Option<Entity>,
    pub prefiller: Option<Entity>,
    pub leg: Leg,
    pub kv_source: KvSource,
    pub status: Status,

    // Progress on the engine serving the current leg.
    pub computed: u32,
    pub generated: u32,
    pub blocks: Vec<BlockId>,
    /// Leading blocks of `blocks` registered in the prefix cache.
    pub cached_blocks: u32,
    pub preemptions: u32,
    /// Local prefix hit at the leg's first admission (tokens).
    pub prefix_hit: Option<u32>,

    /// When the current leg reached its engine, and when that engine first
    /// scheduled it (computed tokens for it: for a remote decode leg, after
    /// its KV arrived).
    pub leg_arrived_at: f64,
    pub leg_scheduled_at: Option<f64>,
    /// When the engine that computes its prompt first scheduled it (the
    /// prefiller, or the decoder of a local request).
    pub first_scheduled_at: Option<f64>,
    pub first_token_at: Option<f64>,
    /// When its latest output token was produced (decode leg).
    pub last_token_at: Option<f64>,
    /// When the prefiller answered (remote only).
    pub t1: Option<f64>,
    /// When the decoder admitted it to wait for its KV, when the read's flow
    /// started, when it completed (remote only).
    pub parked_at: Option<f64>,
    pub read_started_at: Option<f64>,
    pub read_done_at: Option<f64>,
    pub finished_at: Option<f64>,
    /// Tokens read over the network (remote only).
    pub remote_tokens: u32,
    pub lease: Option<Entity>,
    /// Trace requests routed without a router: prefill remotely?
    pub trace_remote: bool,
    /// Parallel dispatch: the other leg's entity (the prefill leg points to
    /// the decode leg, which is the request; and back).
    pub twin: Option<Entity>,
    /// Push mode: the decoder's registration of its blocks reached the
    /// prefiller.
    pub registered: bool,
    /// Retries so far: the sidecar's of its prefill leg, the client's.
    pub prefill_retries: u32,
    pub client_retries: u32,
    /// It can never finish: the KV it waits for will not come (an expired
    /// push lease, a lost prefill answer, a prefiller gone in push mode).
    pub stuck: bool,
}

impl Request {
    /// Request `id` of `session`, its tokens identified by `path`.
    pub fn new(
        id: u64,
        session: u64,
        path: BlockPath,
        prompt: u32,
        output: u32,
        t0: f64,
    ) -> Request {
        Request {
            id,
            session,
            path,
            turn: 0,
            t0,
            phase: 0,
            prompt,
            new_tokens: prompt,
            output,
            next_turn: None,
            decoder: None,
            prefiller: None,
            leg: Leg::Decode,
            kv_source: KvSource::Local,
            status: Status::Waiting,
            computed: 0,
            generated: 0,
            blocks: Vec::new(),
            cached_blocks: 0,
            preemptions: 0,
            prefix_hit: None,
            leg_arrived_at: t0,
            leg_scheduled_at: None,
            first_scheduled_at: None,
            first_token_at: None,
            last_token_at: None,
            t1: None,
            parked_at: None,
            read_started_at: None,
            read_done_at: None,
            finished_at: None,
            remote_tokens: 0,
            lease: None,
            trace_remote: false,
            twin: None,
            registered: false,
            prefill_retries: 0,
            client_retries: 0,
            stuck: false,
        }
    }

    /// The prefill leg of a request dispatched in parallel (the request
    /// itself is its decode leg, the twin).
    pub fn is_prefill_twin(&self) -> bool {
        self.leg == Leg::Prefill && self.twin.is_some()
    }

    /// The request failed and its client sends it again: it starts afresh
    /// at the gateway (its arrival time `t0` stays: latencies count from
    /// the first attempt).
    pub fn reset_for_retry(&mut self) {
        debug_assert!(self.blocks.is_empty(), "a failed request holds no KV");
        *self = Request {
            turn: self.turn,
            phase: self.phase,
            new_tokens: self.new_tokens,
            next_turn: self.next_turn,
            preemptions: self.preemptions,
            trace_remote: self.trace_remote,
            prefill_retries: 0,
            client_retries: self.client_retries,
            ..Request::new(
                self.id,
                self.session,
                std::mem::take(&mut self.path),
                self.prompt,
                self.output,
                self.t0,
            )
        };
    }

    /// Tokens the engine knows for this leg: the prompt plus what it sampled
    /// (after a preemption, all of them must be recomputed).
    pub fn known_tokens(&self) -> u32 {
        self.prompt + self.generated
    }

    /// `max_tokens` of the current leg: 1 on the prefiller.
    pub fn max_tokens(&self) -> u32 {
        match self.leg {
            Leg::Prefill => 1,
            Leg::Decode => self.output,
        }
    }

    /// Prefilled remotely (the router sent it to a prefiller).
    pub fn remote(&self) -> bool {
        self.prefiller.is_some()
    }

    /// Whether the current leg computes the prompt (rather than reading it).
    pub fn computes_prompt(&self) -> bool {
        self.leg == Leg::Prefill || self.kv_source == KvSource::Local
    }

    /// Resets per-engine progress when the request moves to its decode leg.
    pub fn start_decode_leg(&mut self, kv_source: KvSource, now: f64) {
        self.leg = Leg::Decode;
        self.leg_arrived_at = now;
        self.leg_scheduled_at = None;
        self.kv_source = kv_source;
        self.status = Status::Waiting;
        self.computed = 0;
        self.generated = 0;
        self.cached_blocks = 0;
        self.prefix_hit = None;
        debug_assert!(
            self.blocks.is_empty(),
            "the prefill leg's blocks belong to the lease"
        );
    }
}

/// Where the systems find requests: the ECS query, or the query and the
/// requests the fast ticks issued ([`crate::shared::WithJoining`]).
pub trait RequestStore: Lookup<Request> {
    /// Request `id`, which must exist (queued, scheduled, transferring).
    fn req(&mut self, id: Entity) -> &mut Request {
        self.find_mut(id).expect("a queued request exists")
    }
}

impl<S: Lookup<Request>> RequestStore for S {}
