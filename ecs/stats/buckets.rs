//! A histogram over fixed bounds, as Prometheus keeps one: exact counts of
//! the values at most each bound (the `le` buckets), their sum and count.

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Buckets {
    /// Upper bounds, increasing (`+Inf` is implied).
    pub bounds: &'static [f64],
    /// Values in (bounds[i−1], bounds[i]]; the last entry is above every bound.
    counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Buckets {
    pub fn new(bounds: &'static [f64]) -> Buckets {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Buckets {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn record_n(&mut self, v: f64, n: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += n;
        self.sum += v * n as f64;
        self.count += n;
    }

    pub fn record(&mut self, v: f64) {
        self.record_n(v, 1);
    }

    /// (bound, values ≤ bound) for every bound, then (+∞, count).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut cum = 0;
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(b, &c)| {
                cum += c;
                (b, cum)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_inclusive() {
        // Bounds 1, 2, 5: values 0.5, 1 (≤ 1), 1.5 (≤ 2), 7 (above all).
        let mut b = Buckets::new(&[1.0, 2.0, 5.0]);
        for v in [0.5, 1.0, 1.5, 7.0] {
            b.record(v);
        }
        assert_eq!(
            b.cumulative(),
            vec![(1.0, 2), (2.0, 3), (5.0, 3), (f64::INFINITY, 4)]
        );
        assert_eq!((b.count, b.sum), (4, 10.0));
    }
}
