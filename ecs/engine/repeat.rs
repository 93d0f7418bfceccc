//! Runs of identical decode steps, booked as one step (an exact shortcut).
//!
//! When a step only decodes
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
//! A run that ends where one of its requests needs a new block is usually
//! followed by the same step again, with that block: the run continues
//! from entries kept for its requests, looking up only those whose blocks
//! change ([`RunEntry`], continued runs below). The step ends, the ticks
//! and the blocks are the same as the run formed anew would give.

use crate::engine::Engine;
use crate::engine::cost::{LinearEnds, StepTime};
use crate::engine::kv::BlockPool;
use crate::engine::request::{Request, RequestStore};

/// The longest run of identical steps (a bound; runs end well before it).
pub(crate) const MAX_RUN: u32 = 1 << 16;

/// How many times a step that gives request `r` `n` tokens can run
/// identically, as far as `r` decides: 1 unless `r` only decodes; then
/// until it would need a new block (that step must be formed for real) or
/// finishes (the last step of the run). The step's run is the least of
/// its requests' ([`Engine::start_step`] takes it on the look-up of each
/// request that sums the step's KV).
pub(crate) fn run_limit(r: &Request, n: u32, block_size: u32) -> u32 {
    if n != 1 || r.computed + 1 != r.known_tokens() || r.generated == 0 {
        return 1; // a prefill chunk: not a pure decode step
    }
    // Step j (from 0) fits in the blocks held while computed + j + 1
    // fits; the run must not go past the step that finishes it.
    let fit = r.blocks.len() as u32 * block_size - r.computed;
    let until_finish = r.max_tokens() - r.generated;
    fit.min(until_finish)
}

impl Engine {
    /// Works out when each step of the run just booked ends, exactly as
    /// step-by-step simulation would (`t += cost`); returns the run's end.
    pub(crate) fn book_run_ends(&mut self) -> f64 {
        let mut ends = std::mem::take(&mut self.run_ends);
        ends.clear();
        let mut t = self.step_start;
        // Step j (from 0) of a linear model decodes one token per request
        // over `step_kv + j × tokens` of KV; a physical model's costs were
        // booked by `book_run_costs`.
        let n = self.repeat as u64;
        match &self.cost {
            StepTime::Linear(c) => {
                let mut step_ends = LinearEnds::new(c, self.step.len() as u64, self.step_kv, t);
                ends.extend((0..n).map(|_| step_ends.next()));
                t = *ends.last().expect("a run has steps");
            }
            _ => ends.extend(self.run_costs[..n as usize].iter().map(|&cost| {
                t += cost;
                t
            })),
        }
        self.run_ends = ends;
        t
    }

    /// The step ends of the run in progress (its first `repeat` steps).
    pub(crate) fn run_ends(&self) -> &[f64] {
        &self.run_ends[..self.repeat as usize]
    }

    /// End time of the `k`-th step (from 1) of the run in progress.
    pub(crate) fn run_boundary(&self, k: u32) -> f64 {
        self.run_ends[k as usize - 1]
    }

    /// Something reached the engine at `now` during a run of repeated steps:
    /// cut the run at the first step boundary at or after `now`. Returns the
    /// new end when it changed.
    pub fn cut_run(&mut self, now: f64) -> Option<f64> {
        if self.repeat <= 1 || self.busy_until.is_none() {
            return None;
        }
        let k = self.run_ends().iter().position(|&t| t >= now)? as u32 + 1;
        if k == self.repeat {
            return None;
        }
        self.repeat = k;
        let t = self.run_boundary(k);
        self.busy_until = Some(t);
        self.generation = self.generation.wrapping_add(1);
        Some(t)
    }
}

impl Engine {
    /// The simulation ends at `horizon` during a run of repeated steps:
    /// applies the steps of the run that ended by then, as step-by-step
    /// formation would have (the rest never happen).
    pub fn end_run_at(
        &mut self,
        horizon: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
        log: &mut crate::engine::StepLog,
    ) {
        self.settle(reqs);
        let Some(end) = self.busy_until else { return };
        if self.repeat <= 1 || end <= horizon {
            return;
        }
        let ends = self.run_ends();
        let k = ends.iter().position(|&t| t > horizon).unwrap_or(ends.len()) as u32;
        if k == 0 {
            return;
        }
        self.repeat = k;
        let t = self.run_boundary(k);
        self.busy_until = Some(t);
        self.finish_step(t, kv, reqs, log);
    }
}

/// A request of a run's step, as continuing the run past a block boundary
/// needs it, so that only the requests whose blocks change are looked up
/// ([`Engine::finish_continued`], [`Engine::continue_run`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunEntry {
    /// Steps from the start of the run in progress until the request needs
    /// a new block (`blocks × block_size − computed`, see [`run_limit`]).
    fit: u32,
    /// Steps from the start of the run in progress until it finishes.
    left: u32,
    /// Steps it has run that its request does not show yet, and when the
    /// last of them sampled its token.
    pending: u32,
    last: Option<f64>,
    phase: u32,
    /// Whether its token gaps count (it reached the gateway after warm-up).
    counted: bool,
}

impl RunEntry {
    /// Request `r`'s entry, when it only decodes in this step (else None).
    pub(crate) fn of(r: &Request, n: u32, block_size: u32, observe_from: f64) -> Option<RunEntry> {
        let decode = n == 1
            && r.computed + 1 == r.known_tokens()
            && r.generated > 0
            && r.leg == crate::engine::Leg::Decode;
        decode.then(|| RunEntry {
            fit: r.blocks.len() as u32 * block_size - r.computed,
            left: r.max_tokens() - r.generated,
            pending: 0,
            last: r.last_token_at,
            phase: r.phase,
            counted: r.t0 >= observe_from,
        })
    }

    /// Brings request `r` up to date with the steps it ran.
    fn apply(&mut self, r: &mut Request) {
        if self.pending > 0 {
            r.computed += self.pending;
            r.generated += self.pending;
            r.last_token_at = self.last;
            self.pending = 0;
        }
    }
}

/// What a continued run's end at a block boundary came to
/// ([`Engine::continue_past_boundary`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Boundary {
    /// Not a run that continues: nothing changed (the caller finishes it).
    NotContinued,
    /// The run was applied, but its next step may differ: the caller forms
    /// it.
    Ended,
    /// The run was applied and the same step booked again, ending then.
    Next(f64),
}

/// Continued runs: most run ends are a block boundary of one request of
/// the step, where the step-by-step engine applies the run, caches the
/// block just filled, forms the same step again with one new block for
/// that request, and books the next run. Where nothing else changed (no
/// request finishes, none waits or is ready, the running set is the step's,
/// the new blocks are free), these do exactly that from the run's entries:
/// the same token gaps in the same order, the same blocks cached and
/// allocated in the same order, the same run booked; the other requests'
/// tokens are applied when anything else needs them ([`Engine::settle`]).
/// The reference scheduler with a linear step time only, without exports
/// or a timeline (the rest goes step by step through the scheduler).
impl Engine {
    /// The run in progress ends at `now` at a block boundary: applies it as
    /// [`Engine::finish_step`] would, or returns false (nothing changed)
    /// when it is not a run that continues (the caller finishes it).
    pub(crate) fn finish_continued(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
    ) -> bool {
        let Some(repeat) = self.apply_continued(now, kv, reqs) else {
            return false;
        };
        if repeat > 1 {
            self.record_run_gaps(repeat, now);
        }
        true
    }

    /// [`Engine::finish_continued`] but for the run's later token gaps,
    /// left to the caller: the run's length, or None (nothing changed).
    #[inline(always)]
    fn apply_continued(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
    ) -> Option<u32> {
        let repeat = self.repeat;
        if !self.continuable || self.run_entries.iter().any(|e| e.left <= repeat) {
            return None;
        }
        self.busy_until = None;
        self.dirty = true;
        self.steps += repeat as u64;
        self.repeat = 1;
        self.step_kv += repeat as u64 * self.step.len() as u64;
        let first_end = if repeat > 1 {
            self.run_boundary(1)
        } else {
            now
        };
        self.itl_weights.iter_mut().for_each(|w| *w = 0);
        for k in 0..self.run_entries.len() {
            // (As `observe_tokens` records, request by request.)
            let e = self.run_entries[k];
            if e.counted
                && let Some(last) = e.last
            {
                crate::engine::observe::phase_hist(&mut self.itl, e.phase).record(first_end - last);
            }
            if repeat > 1 {
                if e.counted {
                    crate::engine::observe::count_phase(&mut self.itl_weights, e.phase);
                }
                self.run_requests += 1;
            }
            let e = &mut self.run_entries[k];
            e.last = Some(now);
            e.pending += repeat;
            e.left -= repeat;
            e.fit -= repeat;
            if repeat > 1 && e.fit == 0 {
                // Its last block filled at the run's last step: cached at
                // the run's end, as `finish_step` caches it.
                let r = reqs.req(self.step[k].0);
                e.apply(r);
                crate::engine::cache_full_blocks(kv, r, r.computed);
            }
        }
        self.lagging = true;
        Some(repeat)
    }

    /// Forms the next step at `now` after [`Engine::finish_continued`]:
    /// the same step, as [`Engine::start_step`] would form it, and its end;
    /// or None, changing nothing, when the step could differ (the caller
    /// settles the requests and forms it).
    pub(crate) fn continue_run(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
    ) -> Option<f64> {
        let next = self.take_continued(now, kv, reqs)?;
        Some(self.book_continued(now, next, None))
    }

    /// [`Engine::continue_run`] up to booking: the step's new blocks
    /// taken, and the next run's length; or None, changing nothing.
    #[inline(always)]
    fn take_continued(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
    ) -> Option<u32> {
        let same_step = self.waiting.is_empty()
            && self.ready.is_empty()
            && self.running.len() == self.step.len()
            && self
                .running
                .iter()
                .zip(&self.step)
                .all(|(&a, &(b, _))| a == b);
        let new_blocks = self.run_entries.iter().filter(|e| e.fit == 0).count();
        if !same_step || new_blocks > kv.num_free() as usize {
            return None;
        }
        self.dirty = false;
        self.forming_at = now;
        let bs = kv.block_size();
        let mut repeat = MAX_RUN;
        for k in 0..self.run_entries.len() {
            let e = &mut self.run_entries[k];
            if e.fit <= 1 {
                // A new block (fit 0), or the block this step fills (fit 1):
                // as `schedule_running` takes them.
                let r = reqs.req(self.step[k].0);
                e.apply(r);
                let taken = crate::engine::scheduler::take_blocks(kv, r, 1);
                debug_assert!(taken, "the free blocks were counted");
                e.fit = r.blocks.len() as u32 * bs - r.computed;
            }
            repeat = repeat.min(e.fit.min(e.left));
        }
        Some(repeat)
    }

    /// Books the step formed at `now` again, as a run of `next` steps, and
    /// returns its end. With `gaps` (the ended run's length and its one
    /// request's phase), that run's later token gaps are recorded in the
    /// loop that works out the new run's ends ([`Engine::gaps_and_ends`]).
    #[inline(always)]
    fn book_continued(&mut self, now: f64, next: u32, gaps: Option<(u32, u32)>) -> f64 {
        // (A continued run's step time is linear: `formed_step_cost`'s, and
        // no run costs to book.)
        let StepTime::Linear(c) = &self.cost else {
            unreachable!("a continued run has a linear step time")
        };
        let duration = crate::engine::cost::linear(c, self.step.len() as u64, self.step_kv);
        self.step_start = now;
        self.repeat = 1;
        let mut end = now + duration;
        if next > 1 {
            self.repeat = next;
            end = match gaps {
                Some((old, phase)) => self.gaps_and_ends(old, phase),
                None => self.book_run_ends(),
            };
        }
        self.busy_until = Some(end);
        self.generation = self.generation.wrapping_add(1);
        self.continued_steps += 1;
        end
    }

    /// A continued run's end at a block boundary, where nothing else is
    /// due on this engine (the loop's lone lane): [`Engine::finish_continued`]
    /// then [`Engine::continue_run`]. For a step of one request whose gaps
    /// count (a request decoding alone, most such ends), the ended run's
    /// later gaps are recorded in the loop that books the next run's ends:
    /// each is a chain of dependent additions (the histogram's sums, the
    /// step's end time), and side by side they take the time of one. The
    /// gaps go to the engine's own histograms, which taking blocks does not
    /// touch, so recording them after it changes nothing.
    pub(crate) fn continue_past_boundary(
        &mut self,
        now: f64,
        kv: &mut BlockPool,
        reqs: &mut impl RequestStore,
    ) -> Boundary {
        let Some(old) = self.apply_continued(now, kv, reqs) else {
            return Boundary::NotContinued;
        };
        let alone = old > 1 && self.step.len() == 1 && self.run_entries[0].counted;
        let Some(next) = self.take_continued(now, kv, reqs) else {
            if old > 1 {
                self.record_run_gaps(old, now);
            }
            return Boundary::Ended;
        };
        let side_by_side = alone && next > 1;
        if old > 1 && !side_by_side {
            self.record_run_gaps(old, now);
        }
        let gaps = side_by_side.then(|| (old, self.run_entries[0].phase));
        Boundary::Next(self.book_continued(now, next, gaps))
    }

    /// The gaps between the `old` step ends of the run that just ended
    /// into the histogram of `phase` (one request's: weight 1), as
    /// [`Engine::record_run_gaps`] records them, and the ends of the run
    /// just booked (`self.repeat` steps of one request from
    /// `self.step_start`), as [`Engine::book_run_ends`] works them out, in
    /// one loop: each old end is read as a gap before it is overwritten.
    /// Returns the new run's end.
    fn gaps_and_ends(&mut self, old: u32, phase: u32) -> f64 {
        let StepTime::Linear(c) = &self.cost else {
            unreachable!("a continued run has a linear step time")
        };
        let (old, next) = (old as usize, self.repeat as usize);
        let mut step_ends = LinearEnds::new(c, 1, self.step_kv, self.step_start);
        let ends = &mut self.run_ends;
        debug_assert_eq!(ends[old - 1], self.step_start, "the run ended as booked");
        if ends.len() < next {
            ends.resize(next, 0.0);
        }
        let mut gaps = crate::engine::observe::phase_hist(&mut self.itl, phase).each_n(1);
        let both = (old - 1).min(next);
        // Step by step along pairs of old ends, the later not yet
        // overwritten (as cells: one slice read and written, no index
        // checked).
        let cells = std::cell::Cell::from_mut(&mut ends[..=both]).as_slice_of_cells();
        for [end, later] in cells.array_windows() {
            gaps.push(later.get() - end.get());
            end.set(step_ends.next());
        }
        for j in both..old - 1 {
            gaps.push(ends[j + 1] - ends[j]);
        }
        for end in &mut ends[both..next] {
            *end = step_ends.next();
        }
        gaps.finish();
        ends.truncate(next);
        // (As `record_run_gaps` leaves the exports' count.)
        self.run_requests = 0;
        ends[next - 1]
    }

    /// Whether the step that just ended was a continued run's (its next
    /// step may be the same, [`Engine::continue_run`]).
    pub(crate) fn continues(&self) -> bool {
        self.lagging && self.continuable
    }

    /// Applies to the requests of the step the steps they ran in continued
    /// runs (before anything else looks at them).
    pub(crate) fn settle(&mut self, reqs: &mut impl RequestStore) {
        if !self.lagging {
            return;
        }
        for (e, &(id, _)) in self.run_entries.iter_mut().zip(&self.step) {
            if e.pending > 0 {
                e.apply(reqs.req(id));
            }
        }
        self.lagging = false;
    }
}
