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
        }
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
    let (mut run_min, mut run_max) = (u32::MAX, 0u32);
    let (mut load_min, mut load_max) = (u32::MAX, 0u32);
    let (mut usage_max, mut usage_sum) = (0.0f64, 0.0f64);
    let (prefill, decode) = gauges.engines.split_at(index.prefill.len());
    debug_assert_eq!(decode.len(), index.decode.len());
    for s in decode {
        run_min = run_min.min(s.running);
        run_max = run_max.max(s.running);
        load_min = load_min.min(s.active);
        load_max = load_max.max(s.active);
        let usage = s.held as f64 / s.blocks as f64;
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
    gauges.sample(
        now,
        [
            (run_max - run_min) as f64,
            (load_max - load_min) as f64,
            usage_max,
            usage_sum / nd,
            held / np,
            queue / np,
        ],
    );
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
}
