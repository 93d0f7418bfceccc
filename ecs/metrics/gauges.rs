//! Gauges (docs/model.md §9): time averages over [warm-up, horizon] of the
//! engines' state, sampled at every instant by the `Observe` system.

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool};
use crate::metrics::{Counters, InFlightTrend};
use crate::shared::{Clock, EngineIndex};

/// Each gauge's unit and meaning (docs/model.md §9), for the text report.
pub fn describe(name: &str) -> (&'static str, &'static str) {
    match name {
        "running_spread" => ("requests", "decoders' running requests, max − min"),
        "load_spread" => (
            "requests",
            "decoders' active requests (running, parked, queued), max − min",
        ),
        "kv_usage_max" => (
            "fraction",
            "the fullest decoder's KV pool, blocks held ÷ blocks",
        ),
        "kv_usage_mean" => ("fraction", "decoders' KV pools, blocks held ÷ blocks, mean"),
        "prefill_kv_held" => (
            "tokens",
            "KV a prefiller holds (running prefills and leases), mean over prefillers",
        ),
        "prefill_queue" => (
            "requests",
            "prefill legs waiting for admission, mean over prefillers",
        ),
        _ => ("", ""),
    }
}

/// Gauge names, as in docs/model.md §9.
pub const GAUGES: [&str; 6] = [
    "running_spread",
    "load_spread",
    "kv_usage_max",
    "kv_usage_mean",
    "prefill_kv_held",
    "prefill_queue",
];

/// Time integrals of the gauges over [warm-up, horizon]. Each tick's state
/// holds until the next tick, so the value sampled at the end of a tick is
/// integrated over the interval that follows it.
#[derive(Resource, Debug)]
pub struct Gauges {
    pub warmup: f64,
    pub horizon: f64,
    last_time: f64,
    current: [f64; 6],
    integral: [f64; 6],
    /// What each engine's gauges read at this tick's end, prefillers then
    /// decoders in the index's order: filled by [`observe_system`], or by
    /// the loop's fast tick as it forms the steps (on the same look-up).
    pub(crate) engines: Vec<EngineState>,
    /// The sample's parts that one decoder's held blocks leave as they are
    /// ([`Gauges::hold_all_but`]).
    all_but: AllBut,
}

/// What [`observe`] works out of every engine but decoder `k`, and of `k`
/// all but its held blocks: while only those change (the loop's lone
/// lane, a decoder's continued run from block boundary to block boundary)
/// each sample works out that decoder's usage alone, and adds the usages
/// in the same order, so every value is the one [`observe`] would give.
#[derive(Debug, Default)]
struct AllBut {
    k: usize,
    state: EngineState,
    values: [f64; 6],
    /// The other decoders' fullest usage (from 0), the sum of the usages
    /// of those before `k`, and the usages of those after it.
    others_max: f64,
    before: f64,
    after: Vec<f64>,
}

/// What the gauges read of one engine.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct EngineState {
    running: u32,
    active: u32,
    held: u32,
    blocks: u32,
    block_size: u32,
    waiting: u32,
}

/// A decoder's usage: blocks held ÷ blocks.
fn usage(s: &EngineState) -> f64 {
    s.held as f64 / s.blocks as f64
}

impl EngineState {
    pub(crate) fn of(engine: &Engine, kv: &KvPool) -> EngineState {
        EngineState {
            running: engine.running.len() as u32,
            active: engine.active(),
            held: kv.0.num_held(),
            blocks: kv.0.num_blocks(),
            block_size: kv.0.block_size(),
            waiting: engine.waiting.len() as u32,
        }
    }
}

impl Gauges {
    pub fn new(warmup: f64, horizon: f64) -> Gauges {
        Gauges {
            warmup,
            horizon,
            last_time: 0.0,
            current: [0.0; 6],
            integral: [0.0; 6],
            engines: Vec::new(),
            all_but: AllBut::default(),
        }
    }

    /// Readies [`Gauges::observe_all_but`] for engine `k` (its position in
    /// `engines`), from the engines' states as the last sample read them
    /// (so its values are the current ones): false when `k` is a
    /// prefiller (whose held blocks are no usage).
    pub(crate) fn hold_all_but(&mut self, index: &EngineIndex, k: usize) -> bool {
        let np = index.prefill.len();
        if k < np {
            return false;
        }
        debug_assert_eq!(
            values(index, &self.engines),
            self.current,
            "the last sample read the engines' states"
        );
        let a = &mut self.all_but;
        (a.k, a.state, a.values) = (k, self.engines[k], self.current);
        (a.others_max, a.before) = (0.0, 0.0);
        a.after.clear();
        for (j, s) in self.engines.iter().enumerate().skip(np) {
            let u = usage(s);
            if j != k {
                a.others_max = a.others_max.max(u);
            }
            if j < k {
                a.before += u;
            } else if j > k {
                a.after.push(u);
            }
        }
        true
    }

    /// [`observe`] after engine `k` of [`Gauges::hold_all_but`] reads `s`
    /// (the other engines as then): when only its held blocks changed, its
    /// usage alone is worked out (the others' as then, added in the same
    /// order); otherwise as [`observe`] does.
    pub(crate) fn observe_all_but(
        &mut self,
        now: f64,
        s: EngineState,
        index: &EngineIndex,
        counters: &Counters,
        trend: &mut InFlightTrend,
    ) {
        let a = &self.all_but;
        self.engines[a.k] = s;
        if (EngineState { held: 0, ..s }) != (EngineState { held: 0, ..a.state }) {
            observe(now, index, self, counters, trend);
            return;
        }
        let u = usage(&s);
        let mut sum = a.before + u;
        for &v in &a.after {
            sum += v;
        }
        let mut values = a.values;
        values[2] = a.others_max.max(u);
        values[3] = sum / index.decode.len().max(1) as f64;
        trend.sample(now, counters.in_flight(), self.warmup, self.horizon);
        self.sample(now, values);
    }

    /// Integrates the values held since the last sample up to `now`, then
    /// takes `values` as the state from `now` on.
    pub fn sample(&mut self, now: f64, values: [f64; 6]) {
        self.advance(now);
        self.current = values;
    }

    pub fn advance(&mut self, now: f64) {
        let from = self.last_time.max(self.warmup);
        let to = now.min(self.horizon);
        if to > from {
            for (acc, v) in self.integral.iter_mut().zip(self.current) {
                *acc += v * (to - from);
            }
        }
        self.last_time = now;
    }

    /// Time averages over [warm-up, horizon] (call after advancing to the horizon).
    pub fn averages(&self) -> [f64; 6] {
        let span = self.horizon - self.warmup;
        self.integral.map(|x| x / span)
    }
}

/// System: integrate the gauges of docs/model.md §9.
pub fn observe_system(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    engines: Query<(&Engine, &KvPool)>,
    mut gauges: ResMut<Gauges>,
    counters: Res<Counters>,
    mut trend: ResMut<InFlightTrend>,
) {
    let states = &mut gauges.engines;
    states.clear();
    states.extend(index.all().map(|&e| {
        let (engine, kv) = engines.get(e).expect("engine");
        EngineState::of(engine, kv)
    }));
    observe(clock.now, &index, &mut gauges, &counters, &mut trend);
}

/// What [`observe_system`] does once the engines' states are in
/// `gauges.engines` (the loop's fast tick calls it too).
pub(crate) fn observe(
    now: f64,
    index: &EngineIndex,
    gauges: &mut Gauges,
    counters: &Counters,
    trend: &mut InFlightTrend,
) {
    trend.sample(now, counters.in_flight(), gauges.warmup, gauges.horizon);
    let values = values(index, &gauges.engines);
    gauges.sample(now, values);
}

/// The gauges' values for the engines' states `engines` (prefillers then
/// decoders, in the index's order).
fn values(index: &EngineIndex, engines: &[EngineState]) -> [f64; 6] {
    let (mut run_min, mut run_max) = (u32::MAX, 0u32);
    let (mut load_min, mut load_max) = (u32::MAX, 0u32);
    let (mut usage_max, mut usage_sum) = (0.0f64, 0.0f64);
    let (prefill, decode) = engines.split_at(index.prefill.len());
    debug_assert_eq!(decode.len(), index.decode.len());
    for s in decode {
        run_min = run_min.min(s.running);
        run_max = run_max.max(s.running);
        load_min = load_min.min(s.active);
        load_max = load_max.max(s.active);
        let usage = usage(s);
        usage_max = usage_max.max(usage);
        usage_sum += usage;
    }
    let (mut held, mut queue) = (0.0f64, 0.0f64);
    for s in prefill {
        held += (s.held * s.block_size) as f64;
        queue += s.waiting as f64;
    }
    let nd = index.decode.len().max(1) as f64;
    let np = index.prefill.len().max(1) as f64;
    [
        (run_max - run_min) as f64,
        (load_max - load_min) as f64,
        usage_max,
        usage_sum / nd,
        held / np,
        queue / np,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_average_over_warmup_to_horizon_only() {
        // Value 2 on [0, 10), 4 on [10, 30), 0 after; window [5, 25]:
        // (2 × 5 + 4 × 15) / 20 = 3.5.
        let mut g = Gauges::new(5.0, 25.0);
        g.sample(0.0, [2.0; 6]);
        g.sample(10.0, [4.0; 6]);
        g.sample(30.0, [0.0; 6]);
        assert_eq!(g.averages()[0], 3.5);
    }

    fn decoder(running: u32, held: u32, blocks: u32) -> EngineState {
        EngineState {
            running,
            active: running,
            held,
            blocks,
            block_size: 16,
            waiting: 0,
        }
    }

    #[test]
    fn one_decoders_samples_are_observes_to_the_bit() {
        // One prefiller, three decoders; the middle one (k = 2) gains
        // blocks. Usages 1/3, 1/7 → 2/7 → 3/7, 1/10: decimals that round,
        // so a sum in another order would show.
        let mut world = World::new();
        let mut spawn = || world.spawn_empty().id();
        let index = EngineIndex {
            prefill: vec![spawn()],
            decode: vec![spawn(), spawn(), spawn()],
        };
        let counters = Counters::default();
        let prefiller = EngineState {
            held: 5,
            block_size: 16,
            waiting: 2,
            ..EngineState::default()
        };
        let states = vec![
            prefiller,
            decoder(1, 1, 3),
            decoder(2, 1, 7),
            decoder(1, 1, 10),
        ];
        let (mut fast, mut plain) = (Gauges::new(0.0, 100.0), Gauges::new(0.0, 100.0));
        let (mut fast_trend, mut plain_trend) =
            (InFlightTrend::default(), InFlightTrend::default());
        for g in [&mut fast, &mut plain] {
            g.engines = states.clone();
        }
        observe(1.0, &index, &mut fast, &counters, &mut fast_trend);
        observe(1.0, &index, &mut plain, &counters, &mut plain_trend);
        assert!(fast.hold_all_but(&index, 2));
        // (A prefiller's held blocks are no usage: it takes observe's way.)
        assert!(!Gauges::new(0.0, 100.0).hold_all_but(&index, 0));
        // Its blocks grow (the sum's order kept), then its running count
        // changes too (a look at every engine, as observe's).
        let later = [
            (2.0, decoder(2, 2, 7)),
            (3.0, decoder(2, 3, 7)),
            (4.0, decoder(3, 3, 7)),
        ];
        for (now, s) in later {
            fast.observe_all_but(now, s, &index, &counters, &mut fast_trend);
            plain.engines[2] = s;
            observe(now, &index, &mut plain, &counters, &mut plain_trend);
            assert_eq!(fast.current, plain.current, "t = {now}");
            assert_eq!(fast.integral, plain.integral, "t = {now}");
        }
        // At t = 3: usages 1/3, 3/7, 1/10 → max 3/7, mean (1/3 + 3/7 +
        // 1/10) / 3; spreads 2 − 1 = 1; the prefiller 5 × 16 = 80 tokens,
        // 2 waiting.
        let mean = (1.0f64 / 3.0 + 3.0 / 7.0 + 1.0 / 10.0) / 3.0;
        let at3 = [1.0, 1.0, 3.0 / 7.0, mean, 80.0, 2.0];
        let mut check = Gauges::new(0.0, 100.0);
        check.engines = vec![
            prefiller,
            decoder(1, 1, 3),
            decoder(2, 3, 7),
            decoder(1, 1, 10),
        ];
        observe(
            3.0,
            &index,
            &mut check,
            &counters,
            &mut InFlightTrend::default(),
        );
        assert_eq!(check.current, at3);
    }
}
