//! A streaming histogram of non-negative values: exact count, sum, mean,
//! standard deviation, min and max; percentiles from log-linear buckets
//! (as HdrHistogram's), so memory does not grow with the number of values.
//!
//! Each power of two `[2^e, 2^(e+1))` is split into 2048 buckets of equal
//! width; a value is kept as its bucket's lower edge. So a percentile is at
//! most 2^−11 ≈ 0.049 % below the value numpy's linear interpolation would
//! give from every sample, and exact for whole numbers below 4096 (token
//! counts, 0/1 flags) and for the extremes (the minimum and maximum are kept
//! exactly). Zero is a bucket of its own. Two histograms add exactly, so a
//! sweep's pooled distribution is that of its runs together.
//!
//! A count takes two bytes in the dense array of buckets, the rest of the
//! few counts past 65 535 kept aside ([`Counts`]): a histogram spans 2048
//! buckets an octave from its least value to its greatest, and at eight
//! bytes a bucket the reference run's did not fit in a core's cache
//! beside the KV pools, while each finished request records into ten of
//! them at random places (docs/performance.md).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// Sub-buckets per power of two: 2^11.
const SUB_BITS: u32 = 11;
const SUB: u64 = 1 << SUB_BITS;

/// The bucket of a positive finite value: its binary exponent and the top
/// `SUB_BITS` bits of its mantissa, as one ordered index.
fn index(v: f64) -> i64 {
    let bits = v.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let mantissa = bits & ((1u64 << 52) - 1);
    if exp == 0 {
        // Subnormal: below every bucket of interest; keep them together.
        return i64::MIN / 4;
    }
    (exp << SUB_BITS) | (mantissa >> (52 - SUB_BITS)) as i64
}

/// The lower edge of bucket `i`.
fn lower(i: i64) -> f64 {
    if i == i64::MIN / 4 {
        return 0.0;
    }
    let exp = (i >> SUB_BITS) as u64;
    let sub = (i as u64) & (SUB - 1);
    f64::from_bits((exp << 52) | (sub << (52 - SUB_BITS)))
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    count: u64,
    /// Values equal to zero (or below: none expected).
    zeros: u64,
    sum: f64,
    /// Sum of squares, for the std.
    sum_sq: f64,
    min: f64,
    max: f64,
    /// Counts of the buckets from index `first` on.
    first: i64,
    counts: Counts,
}

/// Bucket counts: each one's low 16 bits in a dense array, and for the
/// buckets that reached 2^16, the count ÷ 2^16 aside. So a count is
/// `low[k] + high[k] · 2^16`, one way only: `high` has no zero entries.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counts {
    low: Vec<u16>,
    high: BTreeMap<usize, u64>,
}

impl Counts {
    fn len(&self) -> usize {
        self.low.len()
    }

    /// Adds `n` to bucket `k`; false (nothing added) past the end.
    #[inline(always)]
    fn add(&mut self, k: usize, n: u64) -> bool {
        let Some(low) = self.low.get_mut(k) else {
            return false;
        };
        let sum = *low as u64 + n;
        if sum <= u16::MAX as u64 {
            *low = sum as u16;
        } else {
            self.carry(k, sum);
        }
        true
    }

    /// Bucket `k` now counts `high[k] · 2^16 + sum`, `sum` past 16 bits.
    #[inline(never)]
    fn carry(&mut self, k: usize, sum: u64) {
        self.low[k] = sum as u16;
        *self.high.entry(k).or_default() += sum >> 16;
    }

    /// `by` empty buckets before the first.
    fn grow_front(&mut self, by: usize) {
        self.low.splice(0..0, std::iter::repeat_n(0, by));
        self.high = std::mem::take(&mut self.high)
            .into_iter()
            .map(|(k, h)| (k + by, h))
            .collect();
    }

    /// Empty buckets after the last, up to `len` buckets.
    fn grow_back(&mut self, len: usize) {
        self.low.resize(len, 0);
    }

    /// The counts, bucket by bucket.
    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        // The next bucket with a high part, and that part (one compare a
        // bucket: percentiles walk every bucket).
        let mut high = self.high.iter().map(|(&k, &h)| (k, h));
        let mut next = high.next().unwrap_or((usize::MAX, 0));
        self.low.iter().enumerate().map(move |(k, &low)| {
            if k != next.0 {
                return low as u64;
            }
            let count = low as u64 + (next.1 << 16);
            next = high.next().unwrap_or((usize::MAX, 0));
            count
        })
    }
}

/// Counts are written as (offset, count) pairs of the non-empty buckets.
impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(usize, u64)> = self.iter().enumerate().filter(|&(_, c)| c > 0).collect();
        pairs.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Counts, D::Error> {
        let pairs: Vec<(usize, u64)> = Vec::deserialize(d)?;
        let mut counts = Counts::default();
        counts.grow_back(pairs.iter().map(|p| p.0 + 1).max().unwrap_or(0));
        for (k, c) in pairs {
            counts.add(k, c);
        }
        Ok(counts)
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram::default()
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// The mean (None when empty).
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then_some(self.sum / self.count as f64)
    }

    /// The population standard deviation (numpy's `std`), from the sums of
    /// the values and of their squares.
    pub fn std(&self) -> Option<f64> {
        (self.count > 0).then(|| {
            let n = self.count as f64;
            let mean = self.sum / n;
            (self.sum_sq / n - mean * mean).max(0.0).sqrt()
        })
    }

    pub fn min(&self) -> Option<f64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<f64> {
        (self.count > 0).then_some(self.max)
    }

    // (Inlined by hand: with the carry's branch in `Counts::add` the
    // compiler stopped inlining these into the observers, 6 M more
    // instructions in 2 000 s of the reference.)
    #[inline]
    pub fn record(&mut self, v: f64) {
        self.record_n(v, 1);
    }

    /// Records `n` values equal to `v` (NaN and infinities are not values:
    /// they are refused in debug builds and ignored otherwise).
    #[inline]
    pub fn record_n(&mut self, v: f64, n: u64) {
        debug_assert!(v.is_finite(), "histogram value {v}");
        if n == 0 || !v.is_finite() {
            return;
        }
        self.add_moments(v, n);
        if v <= 0.0 {
            self.zeros += n;
        } else {
            self.add_to_bucket(index(v), n);
        }
    }

    /// `n` more values `v` in the count, extremes and sums (not the buckets).
    fn add_moments(&mut self, v: f64, n: u64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += n;
        let w = n as f64;
        self.sum += v * w;
        self.sum_sq += v * v * w;
    }

    /// Records `n` values equal to each of `values`, in order: what
    /// [`Self::record_n`] value by value does, the sums added in the same
    /// order, with a stretch of values in one bucket counted once.
    pub fn record_each_n(&mut self, values: &[f64], n: u64) {
        if n == 0 {
            return;
        }
        let mut each = self.each_n(n);
        for &v in values {
            each.push(v);
        }
        each.finish();
    }

    /// [`Self::record_each_n`] for values given one at a time (`n` > 0):
    /// [`EachN::push`] each, then [`EachN::finish`].
    #[inline]
    pub fn each_n(&mut self, n: u64) -> EachN<'_> {
        debug_assert!(n > 0, "no values to count");
        EachN {
            w: n as f64,
            n,
            sum: self.sum,
            sum_sq: self.sum_sq,
            lo: f64::INFINITY,
            hi: f64::NEG_INFINITY,
            pushed: 0,
            skipped: 0,
            bucket: 0,
            pending: 0,
            from: f64::INFINITY,
            below: f64::NEG_INFINITY,
            h: self,
        }
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.sum_sq += other.sum_sq;
        self.zeros += other.zeros;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        for (k, c) in other.counts.iter().enumerate() {
            if c > 0 {
                self.add_to_bucket(other.first + k as i64, c);
            }
        }
    }

    /// `n` more values in bucket `i`: most land in a bucket the histogram
    /// has, which is inlined; the others widen it out of line.
    #[inline(always)]
    fn add_to_bucket(&mut self, i: i64, n: u64) {
        // (Below `first` the wrapped difference is past the end too.)
        if !self.counts.add(i.wrapping_sub(self.first) as usize, n) {
            self.widen_to(i, n);
        }
    }

    #[inline(never)]
    fn widen_to(&mut self, i: i64, n: u64) {
        if self.counts.len() == 0 {
            self.first = i;
            self.counts.grow_back(1);
        } else if i < self.first {
            self.counts.grow_front((self.first - i) as usize);
            self.first = i;
        } else {
            self.counts.grow_back((i - self.first) as usize + 1);
        }
        self.counts.add((i - self.first) as usize, n);
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) as numpy's default computes it — linear
    /// interpolation between the values at ranks ⌊q(n−1)⌋ and ⌈q(n−1)⌉ —
    /// with each value read as its bucket's lower edge (the smallest and
    /// largest exactly).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.quantiles([q])[0]
    }

    /// Several quantiles (`qs` ascending), each as [`Self::quantile`]
    /// computes it, in two walks of the buckets (one for the lower ranks,
    /// one for the upper), not two for each: a report's percentiles walk
    /// histograms of thousands of buckets.
    pub fn quantiles<const N: usize>(&self, qs: [f64; N]) -> [Option<f64>; N] {
        if self.count == 0 {
            return [None; N];
        }
        assert!(qs.is_sorted(), "quantiles {qs:?} ascending");
        let pos = qs.map(|q| q.clamp(0.0, 1.0) * (self.count - 1) as f64);
        let lo = pos.map(|p| p.floor() as u64);
        let a = self.values_at(lo);
        let b = self.values_at(pos.map(|p| p.ceil() as u64));
        std::array::from_fn(|i| Some(a[i] + (b[i] - a[i]) * (pos[i] - lo[i] as f64)))
    }

    /// The values of ranks `ranks` (from 0, ascending) in sorted order, in
    /// one walk: each rank's bucket is at or after the one before's.
    fn values_at<const N: usize>(&self, ranks: [u64; N]) -> [f64; N] {
        let mut buckets = self.counts.iter().enumerate();
        // The last bucket walked to, and the values up to its end.
        let mut reached: Option<(usize, u64)> = None;
        let mut seen = self.zeros;
        ranks.map(|r| {
            if r == 0 {
                return self.min;
            }
            if r + 1 == self.count {
                return self.max;
            }
            if r < self.zeros {
                return self.min.min(0.0);
            }
            loop {
                if let Some((k, through)) = reached
                    && r < through
                {
                    return lower(self.first + k as i64).clamp(self.min, self.max);
                }
                let Some((k, c)) = buckets.next() else {
                    return self.max;
                };
                seen += c;
                reached = Some((k, seen));
            }
        })
    }

    /// Values equal to zero.
    pub fn zeros(&self) -> u64 {
        self.zeros
    }

    /// The non-empty buckets, lowest first: (lower edge, count).
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|&(_, c)| c > 0)
            .map(|(k, c)| (lower(self.first + k as i64), c))
    }

    /// The distribution function at the buckets' edges: (x, share of values
    /// below x), from the lowest bucket to 1 at the maximum.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let n = self.count as f64;
        let mut out = Vec::new();
        let mut cum = self.zeros;
        for (k, c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let x = lower(self.first + k as i64).max(self.min);
            out.push((x, cum as f64 / n));
            cum += c;
        }
        if self.count > 0 {
            out.push((self.max, 1.0));
        }
        out
    }
}

/// Values recorded `n` times each, in order, into a histogram
/// ([`Histogram::each_n`]). The sums are kept here, added value by value in
/// order (as [`Histogram::record_n`] would: floating-point sums depend on
/// it); the extremes and the count, which do not, are written once at the
/// end. A stretch of values in one bucket is told by the bucket's edges
/// (two compares, no index) and counted once; bucket counts are whole
/// numbers, so the order they are added in does not matter.
pub struct EachN<'h> {
    h: &'h mut Histogram,
    w: f64,
    n: u64,
    sum: f64,
    sum_sq: f64,
    lo: f64,
    hi: f64,
    pushed: u64,
    skipped: u64,
    /// The current bucket, its edges (none yet: no value is in it), and
    /// how many values it has waiting.
    bucket: i64,
    pending: u64,
    from: f64,
    below: f64,
}

impl EachN<'_> {
    /// A finite value's sums and extremes (a compare is min and max),
    /// taken on each of the two paths of [`Self::push`]: one path behind a
    /// flag (the bucket tested once) took 0.9 % more instructions for the
    /// whole reference run.
    #[inline(always)]
    fn moments(&mut self, v: f64) {
        self.sum += v * self.w;
        self.sum_sq += v * v * self.w;
        self.lo = if v < self.lo { v } else { self.lo };
        self.hi = if v > self.hi { v } else { self.hi };
    }

    /// The next value.
    #[inline(always)]
    pub fn push(&mut self, v: f64) {
        self.pushed += 1;
        if v >= self.from && v < self.below {
            // In the current bucket, so positive, normal and finite (as
            // its edges are): the common case, told first.
            self.moments(v);
            self.pending += self.n;
            return;
        }
        self.push_elsewhere(v);
    }

    /// Another bucket's value, zero or below, subnormal, or not finite.
    #[inline(always)]
    fn push_elsewhere(&mut self, v: f64) {
        debug_assert!(v.is_finite(), "histogram value {v}");
        if !v.is_finite() {
            self.skipped += 1;
            return;
        }
        self.moments(v);
        if v <= 0.0 {
            self.h.zeros += self.n;
            return;
        }
        let i = index(v);
        if v < f64::MIN_POSITIVE {
            // Subnormal: its bucket has no upper edge of its own.
            self.h.add_to_bucket(i, self.n);
            return;
        }
        if self.pending > 0 {
            self.h.add_to_bucket(self.bucket, self.pending);
        }
        (self.bucket, self.pending) = (i, self.n);
        (self.from, self.below) = (lower(i), lower(i + 1));
    }

    /// Writes what was pushed into the histogram.
    #[inline]
    pub fn finish(self) {
        let h = self.h;
        if self.pending > 0 {
            h.add_to_bucket(self.bucket, self.pending);
        }
        let seen = self.pushed - self.skipped;
        if seen == 0 {
            return;
        }
        if h.count == 0 {
            (h.min, h.max) = (self.lo, self.hi);
        } else {
            h.min = h.min.min(self.lo);
            h.max = h.max.max(self.hi);
        }
        h.count += seen * self.n;
        (h.sum, h.sum_sq) = (self.sum, self.sum_sq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(values: &[f64]) -> Histogram {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        h
    }

    #[test]
    fn a_series_recorded_at_once_is_the_series_recorded_value_by_value() {
        // Stretches in one bucket (0.0101, 0.01011), a bucket below the
        // first, zeros, one far above, and a histogram that was not empty.
        let values = [0.0101, 0.01011, 0.0101, 0.002, 0.0, 0.0, 7.5, 0.01011, 0.3];
        let (mut one_by_one, mut at_once) = (of(&[0.05]), of(&[0.05]));
        for &v in &values {
            one_by_one.record_n(v, 3);
        }
        at_once.record_each_n(&values, 3);
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.count(), 1 + 3 * values.len() as u64);
        let mut empty = Histogram::new();
        empty.record_each_n(&values, 0);
        assert_eq!(empty, Histogram::new());
        // From empty: the first value sets the extremes.
        let (mut one_by_one, mut at_once) = (Histogram::new(), Histogram::new());
        for &v in &values[3..] {
            one_by_one.record_n(v, 2);
        }
        at_once.record_each_n(&values[3..], 2);
        assert_eq!(at_once, one_by_one);
        // Subnormals (their own bucket, off the main path) and a zero.
        let tiny = [1e-310, 2e-310, 0.0, 1e-310];
        let (mut one_by_one, mut at_once) = (Histogram::new(), Histogram::new());
        for &v in &tiny {
            one_by_one.record_n(v, 2);
        }
        at_once.record_each_n(&tiny, 2);
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.zeros(), 2);
    }

    #[test]
    fn small_whole_numbers_give_numpys_percentiles_exactly() {
        // 1..=5: p50 at rank 2 → 3; p90 at position 3.6 → 4 + 0.6 × (5 − 4) = 4.6.
        let h = of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(h.count(), 5);
        assert_eq!(h.mean(), Some(3.0));
        assert_eq!(h.quantile(0.5), Some(3.0));
        assert!((h.quantile(0.9).unwrap() - 4.6).abs() < 1e-12);
        // 1..=4: p50 at position 1.5 → 2.5; p99 at 2.97 → 3 + 0.97 = 3.97.
        let h = of(&[4.0, 3.0, 2.0, 1.0]);
        assert_eq!(h.quantile(0.5), Some(2.5));
        assert!((h.quantile(0.99).unwrap() - 3.97).abs() < 1e-12);
        // Population std of 1..=4: sqrt(1.25).
        assert!((h.std().unwrap() - 1.25f64.sqrt()).abs() < 1e-12);
        // 0/1 flags: three 0s and one 1 → p50 = 0, mean 0.25.
        let h = of(&[0.0, 1.0, 0.0, 0.0]);
        assert_eq!((h.quantile(0.5), h.mean()), (Some(0.0), Some(0.25)));
        assert_eq!(Histogram::new().quantile(0.5), None);
    }

    /// The value of rank `r`, walked for from the first bucket (as each
    /// quantile was read before they were read together): kept apart from
    /// `values_at` on purpose, so the test below holds the shared walk to
    /// an independent one.
    fn value_at_plainly(h: &Histogram, r: u64) -> f64 {
        if r == 0 {
            return h.min;
        }
        if r + 1 == h.count {
            return h.max;
        }
        if r < h.zeros {
            return h.min.min(0.0);
        }
        let mut seen = h.zeros;
        for (k, c) in h.counts.iter().enumerate() {
            seen += c;
            if r < seen {
                return lower(h.first + k as i64).clamp(h.min, h.max);
            }
        }
        h.max
    }

    #[test]
    fn quantiles_read_together_are_each_read_alone() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        let qs = [0.0, 0.25, 0.5, 0.5, 0.9, 0.99, 0.999, 1.0];
        for case in 0..200 {
            // Few or many values, some zeros, some repeated (a bucket past
            // 65 535), over a few decades.
            let mut h = Histogram::new();
            for _ in 0..rng.random_range(1..60) {
                let v = match rng.random_range(0..4) {
                    0 => 0.0,
                    _ => 10f64.powf(rng.random_range(-4.0..2.0)),
                };
                h.record_n(
                    v,
                    rng.random_range(1..=if case % 7 == 0 { 100_000 } else { 3 }),
                );
            }
            let together = h.quantiles(qs);
            for (q, got) in qs.into_iter().zip(together) {
                let pos = q * (h.count - 1) as f64;
                let (lo, hi) = (pos.floor() as u64, pos.ceil() as u64);
                let (a, b) = (value_at_plainly(&h, lo), value_at_plainly(&h, hi));
                let alone = a + (b - a) * (pos - lo as f64);
                assert_eq!(
                    got.map(f64::to_bits),
                    Some(alone.to_bits()),
                    "case {case}, q {q}"
                );
            }
        }
        assert_eq!(Histogram::new().quantiles(qs), [None; 8]);
    }

    #[test]
    fn percentiles_are_within_the_bucket_width_of_the_exact_ones() {
        // 10 000 times spread over five decades.
        let values: Vec<f64> = (1..=10_000).map(|i| 1e-4 * (1.0013f64).powi(i)).collect();
        let h = of(&values);
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        for q in [0.01, 0.25, 0.5, 0.9, 0.99, 0.999] {
            let pos = q * (sorted.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            let exact = sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64);
            let got = h.quantile(q).unwrap();
            assert!(
                got <= exact * (1.0 + 1e-12) && got >= exact * (1.0 - 1.0 / 2048.0),
                "q {q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.min(), Some(sorted[0]));
        assert_eq!(h.max(), Some(*sorted.last().unwrap()));
    }

    #[test]
    fn histograms_add_exactly_and_survive_json() {
        let a = of(&[0.5, 2.0, 7.25, 0.0]);
        let b = of(&[1e-3, 300.0]);
        let mut ab = a.clone();
        ab.merge(&b);
        let all = of(&[0.5, 2.0, 7.25, 0.0, 1e-3, 300.0]);
        assert_eq!(ab.count(), 6);
        assert_eq!(ab.cdf(), all.cdf());
        for q in [0.0, 0.2, 0.5, 0.8, 1.0] {
            assert_eq!(ab.quantile(q), all.quantile(q));
        }
        assert!((ab.std().unwrap() - all.std().unwrap()).abs() < 1e-9);
        let text = serde_json::to_string(&ab).unwrap();
        let back: Histogram = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ab);
    }

    #[test]
    fn counts_past_two_bytes_carry_exactly() {
        // 2.0's bucket: 65 535 values fill its two bytes, the 65 536th
        // carries (low 0, high 1); 70 000 more make 135 536 = 2 · 65 536 +
        // 4 464.
        let mut a = Histogram::new();
        a.record_n(2.0, 65_535);
        assert!(a.counts.high.is_empty());
        a.record(2.0);
        assert_eq!((a.counts.low[0], a.counts.high[&0]), (0, 1));
        a.record_n(2.0, 70_000);
        assert_eq!((a.counts.low[0], a.counts.high[&0]), (4_464, 2));
        // 1.0 is an octave below, 2048 buckets: the front grows by them
        // and the carried count moves with its bucket.
        a.record(1.0);
        assert_eq!(a.counts.high, BTreeMap::from([(2048, 2)]));
        assert_eq!(a.buckets().collect::<Vec<_>>(), [(1.0, 1), (2.0, 135_536)]);
        assert_eq!((a.quantile(0.0), a.quantile(0.5)), (Some(1.0), Some(2.0)));
        assert_eq!(a.cdf(), [(1.0, 0.0), (2.0, 1.0 / 135_537.0), (2.0, 1.0)]);
        // Counts are kept one way only: the same values recorded in other
        // pieces (sums of whole numbers, exact) are the same histogram.
        let mut b = Histogram::new();
        b.record(1.0);
        b.record_n(2.0, 135_536);
        assert_eq!(a, b);
        let back: Histogram = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
        // 2 × 135 536 = 271 072 = 4 · 65 536 + 8 928.
        a.merge(&b);
        assert_eq!((a.counts.low[2048], a.counts.high[&2048]), (8_928, 4));
        assert_eq!(a.buckets().collect::<Vec<_>>(), [(1.0, 2), (2.0, 271_072)]);
    }

    #[test]
    fn n_equal_values_at_once_are_n_records() {
        let mut a = Histogram::new();
        a.record_n(0.01, 3);
        a.record_n(0.02, 2);
        let b = of(&[0.01, 0.01, 0.01, 0.02, 0.02]);
        assert_eq!(a.count(), b.count());
        assert_eq!(a.cdf(), b.cdf());
        assert_eq!(a.quantile(0.5), b.quantile(0.5));
        assert!((a.std().unwrap() - b.std().unwrap()).abs() < 1e-15);
        assert!((a.mean().unwrap() - b.mean().unwrap()).abs() < 1e-15);
    }
}
