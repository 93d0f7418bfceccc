//! Block identity by content (docs/model.md §5; vLLM's chained `BlockHash`).
//!
//! A block's identity is the chain of every token up to its end: two
//! requests share block `k` exactly when their first `(k + 1) × block_size`
//! tokens agree. pdsim names contents by *streams*: a stream is a run of
//! tokens that only one chain ever contains from its start on (a session's
//! context, a system prompt, a run of a trace's hash blocks). A request's
//! tokens are a [`BlockPath`]: segments of streams, each from a token
//! position on, so that the requests that share a system prompt or a
//! trace's leading hash blocks share its stream, and diverge into their own.
//!
//! In a pool of block size `bs`, block `k` belongs to the segment holding its
//! last token `(k + 1) × bs − 1` (a block that straddles a segment start has
//! the later segment's chain), and its key is that stream with the index
//! counted from the stream's first block, `⌊start / bs⌋`. The chain being
//! the same, the key is the same in every request on that stream, and
//! different from every other chain's: a key is exactly a chain.

use std::hash::Hasher;

/// Identity of a full block's content: the `index`-th block of `stream`
/// (counted from the stream's first block in the pool's block size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub stream: u64,
    pub index: u32,
}

/// From token `start` on (until the next segment), a request's tokens are
/// those of `stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub stream: u64,
    pub start: u32,
}

/// A request's token stream as segments of streams (the first starts at
/// token 0, starts increase). Synthetic sessions have one segment, their
/// session's stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockPath {
    segments: Vec<Segment>,
}

/// The blocks of one segment among a request's first blocks: `count` blocks
/// from block `first` of the request are blocks `0..count` of `stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub stream: u64,
    pub first: u32,
    pub count: u32,
}

impl BlockPath {
    /// The whole token stream is `stream`'s.
    pub fn stream(stream: u64) -> BlockPath {
        BlockPath {
            segments: vec![Segment { stream, start: 0 }],
        }
    }

    /// Segments in token order; the first must start at token 0.
    pub fn new(segments: Vec<Segment>) -> BlockPath {
        assert!(
            segments.first().is_some_and(|s| s.start == 0),
            "a path starts at token 0"
        );
        assert!(
            segments.windows(2).all(|w| w[0].start < w[1].start),
            "segment starts increase"
        );
        BlockPath { segments }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The stream of the request's last segment (its own tokens).
    pub fn last_stream(&self) -> u64 {
        self.segments.last().expect("a path has a segment").stream
    }

    /// The key of block `k` in a pool of block size `bs`.
    pub fn key(&self, k: u32, bs: u32) -> BlockKey {
        let last_token = (k + 1) * bs - 1;
        let seg = self
            .segments
            .iter()
            .rev()
            .find(|s| s.start <= last_token)
            .expect("the first segment starts at 0");
        BlockKey {
            stream: seg.stream,
            index: k - seg.start / bs,
        }
    }

    /// The runs of the first `n` blocks, segment by segment (segments too
    /// short to end a block of size `bs` have none).
    pub fn runs(&self, bs: u32, n: u32) -> impl Iterator<Item = Run> + '_ {
        let bounds = self.segments.iter().enumerate().map(move |(i, s)| {
            let first = s.start / bs;
            let end = self
                .segments
                .get(i + 1)
                .map_or(n, |next| (next.start / bs).min(n));
            Run {
                stream: s.stream,
                first,
                count: end.saturating_sub(first),
            }
        });
        bounds.filter(|r| r.count > 0)
    }
}

/// Multiplicative hasher for block keys and stream ids: the default SipHash
/// is several times slower and these maps are on the admission path.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    // (A slice key's length: one step, not one per byte.)
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> BlockPath {
        // Tokens 0..40 are stream 7 (a system prompt), from 40 on stream 9.
        BlockPath::new(vec![
            Segment {
                stream: 7,
                start: 0,
            },
            Segment {
                stream: 9,
                start: 40,
            },
        ])
    }

    #[test]
    fn a_block_belongs_to_the_segment_of_its_last_token() {
        // Block size 16: block 0 = tokens 0..16, block 1 = 16..32 are stream
        // 7's; block 2 = 32..48 straddles token 40, so it is stream 9's first
        // block (⌊40 / 16⌋ = 2 → index 0); block 3 is stream 9's index 1.
        let p = path();
        let keys: Vec<(u64, u32)> = (0..4)
            .map(|k| p.key(k, 16))
            .map(|b| (b.stream, b.index))
            .collect();
        assert_eq!(keys, [(7, 0), (7, 1), (9, 0), (9, 1)]);
        // Block size 8: 40 is a block boundary, blocks 0..5 are stream 7's.
        assert_eq!(
            p.key(4, 8),
            BlockKey {
                stream: 7,
                index: 4
            }
        );
        assert_eq!(
            p.key(5, 8),
            BlockKey {
                stream: 9,
                index: 0
            }
        );
    }

    #[test]
    fn runs_split_the_first_blocks_by_segment() {
        let p = path();
        let runs: Vec<Run> = p.runs(16, 5).collect();
        assert_eq!(
            runs,
            [
                Run {
                    stream: 7,
                    first: 0,
                    count: 2
                },
                Run {
                    stream: 9,
                    first: 2,
                    count: 3
                }
            ]
        );
        // Within the first segment only.
        assert_eq!(p.runs(16, 1).count(), 1);
        // Block size 64: tokens 0..40 end no block of stream 7.
        let runs: Vec<Run> = p.runs(64, 2).collect();
        assert_eq!(
            runs,
            [Run {
                stream: 9,
                first: 0,
                count: 2
            }]
        );
    }
}
