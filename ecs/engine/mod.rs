//! One vLLM instance's scheduler, one step at a time (docs/model.md §5–§7).
//!
//! Forming a step (the engine is idle and has work), budget
//! `B = max_num_batched_tokens`:
//! 1. running requests first, in admission order: a chunk of the prompt or
//!    one decode token each; when the pool has no block for one, the last
//!    running request is preempted (LIFO), possibly the request itself;
//! 2. unless this step preempted, the waiting queues — ready remote requests
//!    (decoder) before new and preempted ones — while budget and a slot are
//!    left; the first that does not fit stops admissions (head-of-line);
//! 3. the step costs what the pool's step-time model says ([`cost`]; by
//!    default `c0 + max(omega + beta × kv, tokens × a)`).
//!
//! Applying a step (at its end) advances computed tokens, samples a token for
//! every request whose known tokens are all computed, and finishes requests
//! that reached `max_tokens`.
//!
//! **vLLM 0.33 semantics** ([`EngineSemantics::Vllm033`], docs/fidelity.md).
//! Where vLLM 0.33's scheduler differs from docs/model.md on purpose, this option
//! follows vLLM (the KV pool's differences are in [`kv`]):
//! * a parked request whose read is done is promoted only when the waiting
//!   loop reaches it, in parking order (`Scheduler._handle_blocked_waiting_request`),
//!   and its blocks are cached then, up to the whole prompt
//!   (`Scheduler._update_waiting_for_remote_kv`);
//! * the end of a read reaches the scheduler only with its next
//!   `update_from_output` (the NIXL worker's `finished_recving` /
//!   `finished_sending`): at the end of the step in flight, or, for an idle
//!   engine, after a `schedule()` call that scheduled nothing (EngineCore's
//!   loop). So an idle engine first schedules without the news — a request
//!   arriving at that instant may be parked or started before the promotion
//!   or the freed lease is seen — and, if that scheduled nothing, again with it.
//!
//! | file | what |
//! |---|---|
//! | [`request`] | a request: one turn, from the gateway to its last token |
//! | [`kv`] | the KV pool: blocks, reference counts, prefix cache, LRU |
//! | [`scheduler`] | forming a step and applying it |
//! | [`repeat`] | runs of identical decode steps booked as one (exact) |
//! | [`cost`] | the step cost (linear, roofline, measured table) |
//! | [`observe`] | what only the engine sees: every token gap (ITL) |
//! | [`exported`] | what a vLLM engine exports on `/metrics` (when asked for) |
//! | [`systems`] | the tick's step-end and step-start systems |
//! | [`record`] | optional records of every step and finished request |

use bevy_ecs::prelude::*;
use std::collections::VecDeque;

use crate::scenario::{EngineConfig, EngineSemantics};
use crate::stats::Histogram;
use cost::StepTime;
use exported::Exported;
use record::StepSlices;

pub mod cost;
pub mod exported;
pub mod kv;
pub mod observe;
pub mod record;
pub mod repeat;
pub mod request;
pub mod scheduler;
pub mod systems;

pub use kv::{BlockId, BlockKey, BlockPath, BlockPool, KvPool, Segment, reusable};
pub use request::{KvSource, Leg, NextTurn, Request, RequestStore, Status};

/// The two roles of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Prefill = 0,
    Decode = 1,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// What happened while forming or applying a step, for the systems around
/// the scheduler (reused buffers: no allocation per step).
#[derive(Default, Debug)]
pub struct StepLog {
    /// Remote requests admitted and parked while forming (their read starts).
    pub parked: Vec<Entity>,
    /// Requests preempted while forming.
    pub preempted: Vec<Entity>,
    /// Requests that produced their first token at the step's end.
    pub first_tokens: Vec<Entity>,
    /// Requests whose leg finished at the step's end.
    pub finished: Vec<Entity>,
    /// A request at the head of the waiting queue that needs more blocks
    /// than the pool has: it can never be admitted, nor anyone behind it.
    pub never_fits: Option<Entity>,
}

impl StepLog {
    pub fn clear(&mut self) {
        self.never_fits = None;
        self.parked.clear();
        self.preempted.clear();
        self.first_tokens.clear();
        self.finished.clear();
    }
}

/// The scheduler state of one instance.
#[derive(Component, Debug)]
pub struct Engine {
    pub role: Role,
    pub index: u32,
    pub cfg: EngineConfig,
    pub cost: StepTime,
    /// The costs of the run in progress, step by step (physical models).
    run_costs: Vec<f64>,
    /// When each step of the run in progress ends, worked out once when
    /// the run is booked (`t += cost` step by step, as stepping would).
    run_ends: Vec<f64>,
    /// Running requests in admission order (each holds a slot).
    pub running: Vec<Entity>,
    /// New and preempted requests (preempted ones at the front).
    pub waiting: VecDeque<Entity>,
    /// Remote requests whose KV has arrived: admitted before `waiting`.
    pub ready: VecDeque<Entity>,
    /// Remote requests holding KV while their read is in flight.
    pub parked: u32,
    /// Prompt tokens its running requests have not computed yet (the token
    /// load the router sees), kept up to date as they change.
    backlog: u32,
    /// The step in progress: (request, tokens scheduled).
    pub step: Vec<(Entity, u32)>,
    /// When the step in progress ends (None: idle).
    pub busy_until: Option<f64>,
    /// Something that may let the engine schedule changed since it last
    /// tried (arrival, freed KV, promotion): only then is a step formed.
    pub dirty: bool,
    /// Steps run so far.
    pub steps: u64,
    /// vLLM's prefix-cache counters: tokens looked up at the first admission
    /// of each request (not after a preemption), and tokens found cached.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// The step in progress stands for this many identical decode steps.
    pub repeat: u32,
    /// When the step in progress (the first of a run) started, and its KV
    /// tokens (from which the run's step ends are worked out).
    pub step_start: f64,
    step_kv: u64,
    /// Bumped whenever the booked end of the step in progress changes
    /// (wrapping: it is only compared for equality with the one a pending
    /// step end was booked at, and far fewer than 2^32 steps are formed
    /// before that end is due).
    pub generation: u32,
    /// Whether runs of identical decode steps may be booked as one.
    pub repeat_steps: bool,
    /// Whether such runs may continue past block boundaries without the
    /// requests being looked up ([`repeat`]'s continued runs).
    pub continue_runs: bool,
    /// The step in progress may continue so, and its requests' entries;
    /// whether some of their steps are not applied to them yet.
    continuable: bool,
    run_entries: Vec<repeat::RunEntry>,
    lagging: bool,
    /// Steps formed by continuing a run ([`Engine::continue_run`]).
    pub continued_steps: u64,
    /// docs/model.md's scheduler, or vLLM 0.33's where they differ.
    pub semantics: EngineSemantics,
    /// vLLM 0.33: reads done (decoder) and leases ended (prefiller) that the
    /// scheduler has not been told of yet (see the module docs).
    undelivered_reads: Vec<Entity>,
    undelivered_frees: Vec<Vec<BlockId>>,
    /// When the step being formed is formed (admissions are stamped with it).
    pub(crate) forming_at: f64,
    /// Token gaps (ITL) of the requests that reached the gateway at or after
    /// `observe_from` (the warm-up), per hot-swap phase ([`observe`]).
    pub observe_from: f64,
    pub itl: Vec<Histogram>,
    /// Scratch: requests per phase (counted) and in all in the run being
    /// applied.
    itl_weights: Vec<u64>,
    run_requests: u64,
    /// Scratch: the gaps of the run being recorded.
    run_gaps: Vec<f64>,
    /// What a vLLM engine would export (`--prometheus`), when asked for.
    pub exported: Option<Box<Exported>>,
    /// Its steps, for a timeline, when asked for; and what the step in
    /// progress was formed with (prompt tokens, preemptions).
    pub slices: Option<Box<StepSlices>>,
    step_prompt_tokens: u32,
    step_preempted: u32,
    /// The pod is down (a fault): it holds nothing and accepts nothing.
    pub down: bool,
}

impl Engine {
    pub fn new(role: Role, index: u32, cfg: EngineConfig, cost: StepTime) -> Engine {
        let slots = cfg_slots(&cfg);
        Engine {
            role,
            index,
            cfg,
            cost,
            run_costs: Vec::new(),
            run_ends: Vec::new(),
            running: Vec::with_capacity(slots),
            waiting: VecDeque::new(),
            ready: VecDeque::new(),
            parked: 0,
            backlog: 0,
            step: Vec::with_capacity(slots),
            busy_until: None,
            dirty: false,
            steps: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            repeat: 1,
            step_start: 0.0,
            step_kv: 0,
            generation: 0,
            repeat_steps: true,
            continue_runs: true,
            continuable: false,
            run_entries: Vec::with_capacity(slots),
            lagging: false,
            continued_steps: 0,
            semantics: EngineSemantics::Reference,
            undelivered_reads: Vec::new(),
            undelivered_frees: Vec::new(),
            forming_at: 0.0,
            observe_from: 0.0,
            itl: Vec::new(),
            itl_weights: Vec::new(),
            run_requests: 0,
            run_gaps: Vec::new(),
            exported: None,
            slices: None,
            step_prompt_tokens: 0,
            step_preempted: 0,
            down: false,
        }
    }

    pub fn with_semantics(mut self, semantics: EngineSemantics) -> Engine {
        self.semantics = semantics;
        self
    }

    /// Observes the token gaps of requests that reach the gateway at or
    /// after `warmup`.
    pub fn observing_from(mut self, warmup: f64) -> Engine {
        self.observe_from = warmup;
        self
    }

    pub fn is_idle(&self) -> bool {
        self.busy_until.is_none()
    }

    /// Requests it holds or queues (docs/model.md §4's active requests).
    pub fn active(&self) -> u32 {
        // With vLLM's semantics parked requests wait in `ready` (and count
        // in `parked`) until promoted.
        let held = match self.semantics {
            EngineSemantics::Reference => self.parked + self.ready.len() as u32,
            EngineSemantics::Vllm033 => self.ready.len() as u32,
        };
        self.running.len() as u32 + held + self.waiting.len() as u32
    }

    /// Accepts a request into the waiting queue (from the gateway or sidecar).
    pub fn enqueue(&mut self, id: Entity) {
        self.waiting.push_back(id);
        self.dirty = true;
    }

    /// A parked request's read completed (NIXL pull).
    pub fn read_done(&mut self, id: Entity, kv: &mut BlockPool, r: &mut Request) {
        r.kv_source = KvSource::RemoteArrived;
        match self.semantics {
            EngineSemantics::Reference => {
                // The decoder holds prompt − 1 computed tokens: the last
                // prompt token is recomputed for its logits.
                r.computed = r.prompt - 1;
                cache_full_blocks(kv, r, r.prompt - 1);
                r.status = Status::Ready;
                self.promote(id);
            }
            // vLLM 0.33: the worker reports the id (finished_recving) with the
            // next update_from_output, and `_update_from_kv_xfer_finished`
            // only notes it; the request stays parked, in its place in the
            // queue, until the waiting loop reaches it.
            EngineSemantics::Vllm033 => {
                self.undelivered_reads.push(id);
                self.dirty = true;
            }
        }
    }

    /// A prefiller's lease ended (the decoder's read of its blocks completed):
    /// its blocks are freed, tail first; the full ones stay cached.
    pub fn lease_ended(&mut self, blocks: &[BlockId], kv: &mut BlockPool) {
        match self.semantics {
            EngineSemantics::Reference => kv.free(blocks),
            // vLLM 0.33: freed when the worker's finished_sending reaches the
            // scheduler (`_update_from_kv_xfer_finished` → `_free_blocks`).
            EngineSemantics::Vllm033 => self.undelivered_frees.push(blocks.to_vec()),
        }
        self.dirty = true;
    }

    /// vLLM 0.33: blocks of ended leases whose release the scheduler has
    /// not been told of yet (still referenced by the pool).
    pub fn pending_frees(&self) -> impl Iterator<Item = &[BlockId]> {
        self.undelivered_frees.iter().map(Vec::as_slice)
    }

    /// vLLM 0.33: `update_from_output` hands the scheduler the transfers that
    /// finished since the last one. Returns whether there were any.
    fn deliver_transfers(&mut self, kv: &mut BlockPool, reqs: &mut impl RequestStore) -> bool {
        if self.undelivered_reads.is_empty() && self.undelivered_frees.is_empty() {
            return false;
        }
        for id in self.undelivered_reads.drain(..) {
            reqs.req(id).status = Status::Ready;
        }
        for blocks in self.undelivered_frees.drain(..) {
            kv.free(&blocks);
        }
        true
    }

    /// The pod goes down: every request it held is gone (the caller fails
    /// them), its step in progress never ends, its KV pool and prefix cache
    /// are lost.
    pub fn go_down(&mut self, kv: &mut BlockPool) {
        self.down = true;
        self.running.clear();
        self.waiting.clear();
        self.ready.clear();
        self.parked = 0;
        self.backlog = 0;
        self.step.clear();
        // (Its requests fail: what their continued runs did not apply yet
        // is lost with them.)
        self.continuable = false;
        self.lagging = false;
        self.busy_until = None;
        self.repeat = 1;
        self.generation = self.generation.wrapping_add(1);
        self.dirty = false;
        self.undelivered_reads.clear();
        self.undelivered_frees.clear();
        *kv = kv.emptied();
    }

    /// The pod is back, empty.
    pub fn come_up(&mut self) {
        self.down = false;
        self.dirty = true;
    }

    /// A request waiting in a queue or parked (not running) leaves: it
    /// failed elsewhere. Its blocks are freed.
    pub fn abort_queued(&mut self, id: Entity, kv: &mut BlockPool, r: &mut Request) {
        debug_assert_ne!(
            r.status,
            Status::Running,
            "only queued requests are aborted"
        );
        self.waiting.retain(|&w| w != id);
        let before = self.ready.len();
        self.ready.retain(|&w| w != id);
        let in_ready = self.ready.len() < before;
        // A parked request is counted in `parked` (and with vLLM 0.33 kept in
        // `ready`); a ready one (read done) has left the count.
        let parked = match self.semantics {
            EngineSemantics::Reference => r.status == Status::Parked,
            EngineSemantics::Vllm033 => in_ready,
        };
        if parked {
            self.parked -= 1;
        }
        self.undelivered_reads.retain(|&w| w != id);
        kv.free(&r.blocks);
        r.blocks.clear();
        self.dirty = true;
    }

    /// A parked request's KV has arrived: it waits for a slot ahead of new ones.
    pub fn promote(&mut self, id: Entity) {
        self.parked -= 1;
        self.ready.push_back(id);
        self.dirty = true;
    }

    /// Prompt tokens not yet computed by its running requests (token load).
    pub fn prompt_backlog(&self) -> u32 {
        self.backlog
    }

    /// The backlog counted from scratch (checks the running count in debug
    /// builds).
    fn counted_backlog(&self, reqs: &mut impl RequestStore) -> u32 {
        self.running
            .iter()
            .map(|&id| uncomputed_prompt(reqs.req(id)))
            .sum()
    }
}

fn cfg_slots(cfg: &EngineConfig) -> usize {
    cfg.max_num_seqs.min(1024) as usize
}

/// Registers the request's full blocks up to `tokens` in the prefix cache
/// (vLLM caches blocks as the tokens filling them are scheduled).
pub fn cache_full_blocks(kv: &mut BlockPool, r: &mut Request, tokens: u32) {
    let bs = kv.block_size();
    let full = (tokens.min(r.known_tokens()) / bs).min(r.blocks.len() as u32);
    if full > r.cached_blocks {
        kv.cache_blocks(&r.blocks, &r.path, r.cached_blocks, full);
    }
    r.cached_blocks = r.cached_blocks.max(full);
}

/// Prompt tokens of `r` not computed yet.
fn uncomputed_prompt(r: &Request) -> u32 {
    r.prompt.saturating_sub(r.computed)
}
