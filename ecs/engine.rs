//! One vLLM instance's scheduler, one step at a time (MODEL.md §5–§7).
//!
//! Forming a step (the engine is idle and has work), budget
//! `B = max_num_batched_tokens`:
//! 1. running requests first, in admission order: a chunk of the prompt or
//!    one decode token each; when the pool has no block for one, the last
//!    running request is preempted (LIFO), possibly the request itself;
//! 2. unless this step preempted, the waiting queues — ready remote requests
//!    (decoder) before new and preempted ones — while budget and a slot are
//!    left; the first that does not fit stops admissions (head-of-line);
//! 3. the step costs `c0 + max(omega + beta × kv, tokens × a)`.
//!
//! Applying a step (at its end) advances computed tokens, samples a token for
//! every request whose known tokens are all computed, and finishes requests
//! that reached `max_tokens`.
//!
//! **Repeated decode steps (an exact shortcut).** When a step only decodes
//! and nothing was preempted, the steps that follow are the same step again
//! — same requests, one token each, no admission possible (no KV is freed,
//! no slot frees) — until a request needs a new block or finishes, or
//! something reaches the engine. Such a run is booked as one step of
//! `repeat` identical steps; each step's end time is computed exactly as the
//! step-by-step simulation would (`t += cost(kv)` with kv growing by one
//! token per request per step). If a request reaches the engine during the
//! run, the run is cut at the first step boundary at or after that instant
//! ([`Engine::cut_run`]), so the newcomer is seen exactly when it would
//! have been.
//!
//! **vLLM 0.33 semantics** ([`EngineSemantics::Vllm033`], docs/fidelity.md).
//! Where vLLM 0.33's scheduler differs from MODEL.md on purpose, this option
//! follows vLLM (the KV pool's differences are in [`crate::kv`]):
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

use bevy_ecs::prelude::*;
use std::collections::VecDeque;

use crate::kv::{BlockId, BlockKey, BlockPool, reusable};
use crate::policy::Role;
use crate::request::{KvSource, Leg, Request, RequestStore, Status};
use crate::scenario::{EngineConfig, EngineSemantics, StepCost};

/// An instance's KV pool (blocks, prefix cache, LRU).
#[derive(Component, Debug)]
pub struct KvPool(pub BlockPool);

/// An instance's NIC: the link index flows use in the bandwidth allocation.
#[derive(Component, Debug, Clone, Copy)]
pub struct Nic {
    pub link: u32,
    pub tokens_per_s: f64,
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
}

impl StepLog {
    pub fn clear(&mut self) {
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
    pub cost: StepCost,
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
    /// The step in progress stands for this many identical decode steps.
    pub repeat: u32,
    /// When the step in progress (the first of a run) started, and its KV
    /// tokens (for recomputing the run's step boundaries).
    pub step_start: f64,
    step_kv: u64,
    /// Bumped whenever the booked end of the step in progress changes.
    pub generation: u64,
    /// Whether runs of identical decode steps may be booked as one.
    pub repeat_steps: bool,
    /// MODEL.md's scheduler, or vLLM 0.33's where they differ.
    pub semantics: EngineSemantics,
    /// vLLM 0.33: reads done (decoder) and leases ended (prefiller) that the
    /// scheduler has not been told of yet (see the module docs).
    undelivered_reads: Vec<Entity>,
    undelivered_frees: Vec<Vec<BlockId>>,
}

impl Engine {
    pub fn new(role: Role, index: u32, cfg: EngineConfig, cost: StepCost) -> Engine {
        Engine {
            role,
            index,
            cfg,
            cost,
            running: Vec::with_capacity(cfg_slots(&cfg)),
            waiting: VecDeque::new(),
            ready: VecDeque::new(),
            parked: 0,
            backlog: 0,
            step: Vec::with_capacity(cfg_slots(&cfg)),
            busy_until: None,
            dirty: false,
            steps: 0,
            repeat: 1,
            step_start: 0.0,
            step_kv: 0,
            generation: 0,
            repeat_steps: true,
            semantics: EngineSemantics::Reference,
            undelivered_reads: Vec::new(),
            undelivered_frees: Vec::new(),
        }
    }

    pub fn with_semantics(mut self, semantics: EngineSemantics) -> Engine {
        self.semantics = semantics;
        self
    }

    pub fn is_idle(&self) -> bool {
        self.busy_until.is_none()
    }

    /// Requests it holds or queues (MODEL.md §4's active requests).
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

    /// Forms the next step at `now`. Returns when it ends (the end of the
    /// whole run, when it repeats), or None when nothing can be computed now
    /// (the engine stays idle until something changes).
    pub fn start_step(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) -> Option<f64> {
        let duration = self.form_step(kv, reqs, log)?;
        self.step_start = now;
        self.repeat = 1;
        let mut end = now + duration;
        if self.repeat_steps && log.preempted.is_empty() {
            let repeat = self.repeatable(kv, reqs);
            if repeat > 1 {
                self.repeat = repeat;
                end = self.run_boundary(repeat);
            }
        }
        self.busy_until = Some(end);
        self.generation += 1;
        Some(end)
    }

    /// The cost of one step of `tokens` tokens over `kv_tokens` of KV.
    fn cost_of(&self, tokens: u64, kv_tokens: u64) -> f64 {
        let c = &self.cost;
        c.c0 + (c.omega + c.beta * kv_tokens as f64).max(tokens as f64 * c.a)
    }

    /// How many times the step just formed can run identically: 1 unless it
    /// only decodes; then until a request would need a new block (that step
    /// must be formed for real) or finishes (the last step of the run).
    fn repeatable(&self, kv: &BlockPool, reqs: &mut impl RequestStore) -> u32 {
        const MAX_RUN: u32 = 1 << 16;
        let bs = kv.block_size();
        let mut repeat = MAX_RUN;
        for &(id, n) in &self.step {
            let r = reqs.req(id);
            if n != 1 || r.computed + 1 != r.known_tokens() || r.generated == 0 {
                return 1; // a prefill chunk: not a pure decode step
            }
            // Step j (from 0) fits in the blocks held while computed + j + 1
            // fits; the run must not go past the step that finishes it.
            let fit = r.blocks.len() as u32 * bs - r.computed;
            let until_finish = r.max_tokens() - r.generated;
            repeat = repeat.min(fit).min(until_finish);
        }
        repeat
    }

    /// End time of the `k`-th step of the run that started at `step_start`,
    /// computed exactly as step-by-step simulation would.
    fn run_boundary(&self, k: u32) -> f64 {
        let tokens = self.step.len() as u64;
        let mut t = self.step_start;
        for j in 0..k as u64 {
            t += self.cost_of(tokens, self.step_kv + j * tokens);
        }
        t
    }

    /// Something reached the engine at `now` during a run of repeated steps:
    /// cut the run at the first step boundary at or after `now`. Returns the
    /// new end when it changed.
    pub fn cut_run(&mut self, now: f64) -> Option<f64> {
        if self.repeat <= 1 || self.busy_until.is_none() {
            return None;
        }
        let tokens = self.step.len() as u64;
        let mut t = self.step_start;
        for j in 0..self.repeat as u64 {
            t += self.cost_of(tokens, self.step_kv + j * tokens);
            if t >= now {
                let k = j as u32 + 1;
                if k == self.repeat {
                    return None;
                }
                self.repeat = k;
                self.busy_until = Some(t);
                self.generation += 1;
                return Some(t);
            }
        }
        None
    }

    /// Forms the next step's composition. Returns one step's duration.
    fn form_step(
        &mut self,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) -> Option<f64> {
        self.dirty = false;
        self.step.clear();
        loop {
            let parked_before = log.parked.len();
            let preempted = self.schedule_running(kv, reqs, log);
            if !preempted {
                match self.semantics {
                    EngineSemantics::Reference => self.admit_waiting(kv, reqs, log),
                    EngineSemantics::Vllm033 => self.admit_waiting_vllm(kv, reqs, log),
                }
            }
            if !self.step.is_empty() {
                break;
            }
            // A step that only preempted computes nothing: vLLM's next
            // schedule() call runs at once and may admit. With vLLM's
            // semantics, so does one after a call that parked or that was
            // followed by news of finished transfers (EngineCore's loop).
            let delivered = match self.semantics {
                EngineSemantics::Reference => false,
                EngineSemantics::Vllm033 => self.deliver_transfers(kv, reqs),
            };
            let parked =
                self.semantics == EngineSemantics::Vllm033 && log.parked.len() > parked_before;
            if !(preempted || delivered || parked) {
                break;
            }
        }
        debug_assert_eq!(self.backlog, self.counted_backlog(reqs));
        if self.step.is_empty() {
            return None;
        }
        let (mut tokens, mut kv_tokens) = (0u64, 0u64);
        for &(id, n) in &self.step {
            tokens += n as u64;
            kv_tokens += (reqs.req(id).computed + n) as u64;
        }
        self.step_kv = kv_tokens;
        Some(self.cost_of(tokens, kv_tokens))
    }

    /// Step 1: running requests in admission order. Returns whether anyone
    /// was preempted.
    fn schedule_running(
        &mut self,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) -> bool {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let r = reqs.req(id);
            let n = (r.known_tokens() - r.computed).min(budget);
            let mut scheduled = true;
            loop {
                let r = reqs.req(id);
                let need = kv
                    .blocks_for(r.computed + n)
                    .saturating_sub(r.blocks.len() as u32);
                if kv.allocate(need, &mut r.blocks) {
                    cache_full_blocks(kv, r, r.computed + n);
                    break;
                }
                // No room: preempt the most recently admitted request.
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim, kv, reqs, log);
                preempted = true;
                if victim == id {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                break;
            }
            self.step.push((id, n));
            budget -= n;
            i += 1;
        }
        preempted
    }

    fn preempt(
        &mut self,
        id: Entity,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) {
        let r = reqs.req(id);
        self.backlog -= uncomputed_prompt(r);
        kv.free(&r.blocks);
        r.blocks.clear();
        r.computed = 0;
        r.cached_blocks = 0;
        r.preemptions += 1;
        r.status = Status::Waiting;
        // A remote request (KV arrived) recomputes locally: no second read.
        self.waiting.push_front(id);
        log.preempted.push(id);
    }

    /// Admits `id` into the running set, computing `n` tokens in this step.
    /// (The one place a request starts running: it keeps the backlog.)
    fn start_running(&mut self, id: Entity, r: &mut Request, n: u32) {
        r.status = Status::Running;
        self.running.push(id);
        self.backlog += uncomputed_prompt(r);
        self.step.push((id, n));
    }

    /// Token budget the running requests left for admissions in this step.
    fn budget_left(&self) -> u32 {
        self.cfg.max_num_batched_tokens - self.step.iter().map(|s| s.1).sum::<u32>()
    }

    /// Step 2: ready remote requests, then waiting ones, head-of-line.
    fn admit_waiting(
        &mut self,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) {
        let mut budget = self.budget_left();
        let slots = self.cfg.max_num_seqs as usize;
        while budget > 0 {
            if let Some(&id) = self.ready.front() {
                // KV read: needs a slot and one token of budget.
                if self.running.len() >= slots {
                    return;
                }
                self.ready.pop_front();
                let r = reqs.req(id);
                let n = (r.known_tokens() - r.computed).min(budget);
                let need = kv
                    .blocks_for(r.computed + n)
                    .saturating_sub(r.blocks.len() as u32);
                let ok = kv.allocate(need, &mut r.blocks);
                debug_assert!(
                    ok && need == 0,
                    "a read request's whole prompt is allocated"
                );
                cache_full_blocks(kv, r, r.computed + n);
                self.start_running(id, r, n);
                budget -= n;
                continue;
            }
            if self.waiting.is_empty() || self.running.len() >= slots {
                return;
            }
            if !self.admit_next_waiting(&mut budget, kv, reqs, log) {
                return;
            }
        }
    }

    /// Step 2 with vLLM 0.33's semantics (`Scheduler.schedule`, the loop over
    /// `kv_holding_waiting`, then `waiting`). Parked requests stay in `ready`
    /// (vLLM's `kv_holding_waiting`) in parking order, counted in `parked`,
    /// until the loop reaches one whose read is done.
    fn admit_waiting_vllm(
        &mut self,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) {
        let mut budget = self.budget_left();
        let slots = self.cfg.max_num_seqs as usize;
        let mut h = 0;
        while budget > 0 {
            // The slot check comes before the queues are looked at: with
            // every slot taken nothing is promoted, nor parked.
            if self.running.len() >= slots {
                return;
            }
            if h < self.ready.len() {
                let id = self.ready[h];
                let r = reqs.req(id);
                if r.status != Status::Ready {
                    // Its read is not done (or not yet reported): skipped,
                    // keeping its place (`skip_request`, then
                    // `prepend_requests` at the end of the loop).
                    h += 1;
                    continue;
                }
                // `_handle_blocked_waiting_request` → `_update_waiting_for_remote_kv`
                // caches the blocks up to the whole prompt and leaves the last
                // prompt token to recompute; the admission that follows always
                // succeeds (every block is allocated) and takes one token.
                self.ready.remove(h);
                self.parked -= 1;
                cache_full_blocks(kv, r, r.prompt);
                r.computed = r.prompt - 1;
                self.start_running(id, r, 1);
                budget -= 1;
                continue;
            }
            if self.waiting.is_empty() || !self.admit_next_waiting(&mut budget, kv, reqs, log) {
                return;
            }
        }
    }

    /// Admits the request at the head of `waiting` (a slot is free and budget
    /// left): room for all its known tokens beyond its prefix hit, or it and
    /// everyone behind it wait (head-of-line); then it is parked (remote,
    /// read pending), or computes its last prompt token (store-and-forward),
    /// or its first chunk. Returns false when it did not fit.
    ///
    /// vLLM 0.33 (`allocate_slots(full_sequence_must_fit=True)`) checks the
    /// same room; for a request it parks it also keeps
    /// `_inflight_prefill_reserved_blocks()` free, which is always 0 here: a
    /// request still prefilling after this step took the whole budget, and
    /// then no request is parked in this step (docs/fidelity.md).
    fn admit_next_waiting(
        &mut self,
        budget: &mut u32,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) -> bool {
        let bs = kv.block_size();
        let id = self.waiting[0];
        let r = reqs.req(id);
        let known = r.known_tokens();
        let hit_blocks = kv.cached_prefix_blocks(r.stream, reusable(known, bs) / bs);
        let new_blocks = kv.blocks_for(known) - hit_blocks;
        // Whole-prompt reservation (scheduler_reserve_full_isl): room for
        // all known tokens beyond the hit, or nobody behind it is admitted.
        if !kv.can_allocate_after_hit(r.stream, hit_blocks, new_blocks) {
            return false;
        }
        self.waiting.pop_front();
        kv.touch_prefix(r.stream, hit_blocks, &mut r.blocks);
        r.cached_blocks = hit_blocks;
        let hit = hit_blocks * bs;
        if r.prefix_hit.is_none() {
            r.prefix_hit = Some(hit);
        }
        match r.kv_source {
            KvSource::RemotePending => {
                // Park: whole prompt allocated, no slot, no budget (vLLM:
                // WAITING_FOR_REMOTE_KVS, nothing cached until the read is
                // done, `delay_cache_blocks`).
                kv.allocate(new_blocks, &mut r.blocks);
                r.computed = hit;
                r.remote_tokens = r.prompt - hit;
                r.status = Status::Parked;
                self.parked += 1;
                if self.semantics == EngineSemantics::Vllm033 {
                    self.ready.push_back(id);
                }
                log.parked.push(id);
            }
            KvSource::Delivered => {
                // Store-and-forward: the KV comes with the request; only
                // the last prompt token is computed here.
                kv.allocate(new_blocks, &mut r.blocks);
                r.kv_source = KvSource::RemoteArrived;
                r.computed = known - 1;
                cache_full_blocks(kv, r, known);
                self.start_running(id, r, 1);
                *budget -= 1;
            }
            _ => {
                let chunk = (known - hit).min(*budget);
                let need = kv.blocks_for(hit + chunk) - hit_blocks;
                let ok = kv.allocate(need, &mut r.blocks);
                debug_assert!(ok, "reserved above");
                r.computed = hit;
                cache_full_blocks(kv, r, hit + chunk);
                self.start_running(id, r, chunk);
                *budget -= chunk;
            }
        }
        true
    }

    /// Applies the step in progress at its end: tokens computed, tokens
    /// sampled, legs finished. Finished decode legs free their blocks; a
    /// finished prefill leg keeps them (its lease).
    pub fn finish_step(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) {
        self.busy_until = None;
        self.dirty = true;
        let repeat = self.repeat;
        self.steps += repeat as u64;
        self.repeat = 1;
        let mut any_finished = false;
        for &(id, n) in &self.step {
            let r = reqs.req(id);
            self.backlog -= uncomputed_prompt(r);
            if repeat > 1 {
                // A run of decode steps: one token computed and one sampled
                // per step; none finished before the last (see repeatable).
                // Blocks filled during the run are cached as the steps'
                // formations would have cached them.
                r.computed += repeat - 1;
                r.generated += repeat - 1;
                cache_full_blocks(kv, r, r.computed + n);
            }
            r.computed += n;
            self.backlog += uncomputed_prompt(r);
            if r.computed < r.known_tokens() {
                continue; // a prefill chunk that did not complete the prompt
            }
            r.generated += 1;
            if r.generated == 1 {
                log.first_tokens.push(id);
                if r.leg == Leg::Decode {
                    r.first_token_at = Some(now);
                }
            }
            if r.generated >= r.max_tokens() {
                any_finished = true;
                log.finished.push(id);
                match r.leg {
                    Leg::Prefill => r.status = Status::PrefillDone,
                    Leg::Decode => {
                        r.status = Status::Finished;
                        r.finished_at = Some(now);
                        kv.free(&r.blocks);
                        r.blocks.clear();
                    }
                }
            }
        }
        if any_finished {
            // (Finished requests computed their whole prompt: no backlog.)
            self.running
                .retain(|&id| reqs.req(id).status == Status::Running);
        }
        debug_assert_eq!(self.backlog, self.counted_backlog(reqs));
        if self.semantics == EngineSemantics::Vllm033 {
            self.deliver_transfers(kv, reqs);
        }
    }
}

fn cfg_slots(cfg: &EngineConfig) -> usize {
    cfg.max_num_seqs.min(1024) as usize
}

/// Registers the request's full blocks up to `tokens` in the prefix cache
/// (vLLM caches blocks as the tokens filling them are scheduled).
pub fn cache_full_blocks(kv: &mut BlockPool, r: &mut Request, tokens: u32) {
    let full = (tokens.min(r.known_tokens()) / kv.block_size()).min(r.blocks.len() as u32);
    for k in r.cached_blocks..full {
        kv.cache_block(
            r.blocks[k as usize],
            BlockKey {
                stream: r.stream,
                index: k,
            },
        );
    }
    r.cached_blocks = r.cached_blocks.max(full);
}

/// Prompt tokens of `r` not computed yet.
fn uncomputed_prompt(r: &Request) -> u32 {
    r.prompt.saturating_sub(r.computed)
}
