//! Forming a step and applying it at its end (docs/model.md §5–§7; the
//! overview is in [`crate::engine`]).

use bevy_ecs::prelude::*;

use crate::engine::cost::StepTime;
use crate::engine::kv::{BlockPool, reusable};
use crate::engine::repeat::{MAX_RUN, RunEntry, run_limit};
use crate::engine::request::{KvSource, Leg, Request, RequestStore, Status};
use crate::engine::{Engine, StepLog, cache_full_blocks, uncomputed_prompt};
use crate::scenario::EngineSemantics;

impl Engine {
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
        self.settle(reqs);
        self.forming_at = now;
        let (duration, repeat) = self.form_step(kv, reqs, log)?;
        self.step_start = now;
        self.repeat = 1;
        let mut end = now + duration;
        if self.repeat_steps && log.preempted.is_empty() && repeat > 1 {
            self.book_run_costs(repeat, reqs);
            self.repeat = repeat;
            end = self.book_run_ends();
        }
        self.continuable &= log.preempted.is_empty();
        self.busy_until = Some(end);
        self.generation = self.generation.wrapping_add(1);
        Some(end)
    }

    /// Forms the next step's composition. Returns one step's duration, and
    /// how many times it could run identically ([`run_limit`]).
    fn form_step(
        &mut self,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut StepLog,
    ) -> Option<(f64, u32)> {
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
        let (mut tokens, mut kv_tokens, mut repeat) = (0u64, 0u64, MAX_RUN);
        let block_size = kv.block_size();
        // A run that may continue past block boundaries keeps its requests'
        // entries (see `repeat`'s continued runs).
        self.run_entries.clear();
        self.continuable = self.continue_runs
            && self.repeat_steps
            && self.semantics == EngineSemantics::Reference
            && matches!(self.cost, StepTime::Linear(_))
            && self.exported.is_none()
            && self.slices.is_none();
        for &(id, n) in &self.step {
            let r = reqs.req(id);
            tokens += n as u64;
            kv_tokens += (r.computed + n) as u64;
            repeat = repeat.min(run_limit(r, n, block_size));
            if self.continuable {
                match RunEntry::of(r, n, block_size, self.observe_from) {
                    Some(e) => self.run_entries.push(e),
                    None => self.continuable = false,
                }
            }
        }
        self.step_kv = kv_tokens;
        if self.slices.is_some() {
            self.step_prompt_tokens = self
                .step
                .iter()
                .map(|&(id, n)| n.min(uncomputed_prompt(reqs.req(id))))
                .sum();
            self.step_preempted = log.preempted.len() as u32;
        }
        Some((self.formed_step_cost(tokens, kv_tokens, reqs), repeat))
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
            // (Looked up again only after a preemption, which needs the
            // store.)
            if !take_blocks(kv, r, n) {
                loop {
                    // No room: preempt the most recently admitted request.
                    let victim = self.running.pop().expect("the request itself is running");
                    self.preempt(victim, kv, reqs, log);
                    preempted = true;
                    if victim == id {
                        scheduled = false;
                        break;
                    }
                    if take_blocks(kv, reqs.req(id), n) {
                        break;
                    }
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
        if let Some(x) = &mut self.exported {
            x.preemptions += 1;
        }
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
        if r.leg_scheduled_at.is_none() {
            r.leg_scheduled_at = Some(self.forming_at);
            if r.computes_prompt() {
                r.first_scheduled_at = Some(self.forming_at);
            }
        }
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
        let hit_blocks = kv.cached_prefix_blocks(&r.path, reusable(known, bs) / bs);
        let new_blocks = kv.blocks_for(known) - hit_blocks;
        // Whole-prompt reservation (scheduler_reserve_full_isl): room for
        // all known tokens beyond the hit, or nobody behind it is admitted.
        if !kv.can_allocate_after_hit(&r.path, hit_blocks, new_blocks) {
            if hit_blocks + new_blocks > kv.num_blocks() {
                log.never_fits = Some(id);
            }
            return false;
        }
        self.waiting.pop_front();
        // The block table's room for the whole leg at once (prompt and
        // every output token, never more than the pool), rather than grown
        // as its blocks come.
        let leg_blocks = kv.blocks_for(r.prompt.saturating_add(r.max_tokens()));
        r.blocks.reserve(leg_blocks.min(kv.num_blocks()) as usize);
        kv.touch_prefix(&r.path, hit_blocks, &mut r.blocks);
        r.cached_blocks = hit_blocks;
        let hit = hit_blocks * bs;
        if r.prefix_hit.is_none() {
            r.prefix_hit = Some(hit);
            self.prefix_queries += known as u64;
            self.prefix_hits += hit as u64;
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
                r.parked_at.get_or_insert(self.forming_at);
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
        self.settle(reqs);
        self.continuable = false;
        self.busy_until = None;
        self.dirty = true;
        let repeat = self.repeat;
        self.steps += repeat as u64;
        self.repeat = 1;
        // A run's first step end: each request's first token gap ends there.
        let first_end = if repeat > 1 {
            self.run_boundary(1)
        } else {
            now
        };
        let mut any_finished = false;
        self.itl_weights.iter_mut().for_each(|w| *w = 0);
        for k in 0..self.step.len() {
            let (id, n) = self.step[k];
            let r = reqs.req(id);
            self.backlog -= uncomputed_prompt(r);
            if repeat > 1 {
                // A run of decode steps: one token computed and one sampled
                // per step; none finished before the last (see run_limit).
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
            self.observe_tokens(r, now, first_end, repeat);
            if r.generated >= r.max_tokens() {
                any_finished = true;
                log.finished.push(id);
                if let Some(x) = &mut self.exported {
                    let first = if r.leg == Leg::Decode {
                        r.first_token_at.unwrap_or(now)
                    } else {
                        now
                    };
                    x.finished(r, first, r.generated, now);
                }
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
        if repeat > 1 {
            self.record_run_gaps(repeat, now);
        }
        if self.slices.is_some() {
            self.record_slices(repeat, now);
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

/// Allocates the blocks running request `r` needs for `n` more tokens and
/// caches those they fill; false, changing nothing, when too few are free.
pub(crate) fn take_blocks(kv: &mut BlockPool, r: &mut Request, n: u32) -> bool {
    let need = kv
        .blocks_for(r.computed + n)
        .saturating_sub(r.blocks.len() as u32);
    // (No block is needed at most steps: a decode step filling its block.)
    if need > 0 && !kv.allocate(need, &mut r.blocks) {
        return false;
    }
    cache_full_blocks(kv, r, r.computed + n);
    true
}
