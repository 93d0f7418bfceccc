//! Block identities from a trace's hash ids (Mooncake's `hash_ids`: one id
//! per `block_tokens` prompt tokens).
//!
//! Hash block `j` of a request is identified by its chain: its id and the
//! ids of every block before it (vLLM's `BlockHash` is chained the same
//! way), so two requests share it exactly when their first `j + 1` ids
//! agree. The chains form a tree, which [`PathBuilder`] keeps as streams
//! ([`crate::engine::kv::identity`]): a chain that goes on past a stream's
//! end extends it, one that leaves a stream in its middle starts a new
//! stream there. A request's path is the streams its chain passes through,
//! then a stream of its own from its last full hash block on (a partial last
//! hash block, and the output, are the request's alone).
//!
//! A stream holds its hash ids in order, so following a chain along a stream
//! compares ids in an array; only a branch point costs a map lookup, and a
//! block costs 8 bytes however many requests share it.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::engine::kv::KeyHasher;
use crate::engine::{BlockPath, Segment};

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

struct Stream {
    /// The hash ids of its blocks, in order.
    ids: Vec<u64>,
    /// The hash-block index of its first block in every request.
    first: u32,
}

/// Interns the hash-id chains of a trace, request by request.
pub struct PathBuilder {
    block_tokens: u32,
    streams: Vec<Stream>,
    /// Streams that start at a request's first hash block, by its id.
    roots: FastMap<u64, u32>,
    /// Streams that branch off a stream after its block `pos`, by (stream,
    /// pos, first id).
    branches: FastMap<(u32, u32, u64), u32>,
}

impl PathBuilder {
    pub fn new(block_tokens: u32) -> PathBuilder {
        PathBuilder {
            block_tokens,
            streams: Vec::new(),
            roots: FastMap::default(),
            branches: FastMap::default(),
        }
    }

    fn new_stream(&mut self, id: u64, first: u32) -> u32 {
        self.streams.push(Stream {
            ids: vec![id],
            first,
        });
        (self.streams.len() - 1) as u32
    }

    /// The path of a request of `input` prompt tokens with these hash ids
    /// (stream `s` of the trace is stream id `s`); its tokens from its last
    /// full hash block on are `tail_stream`'s. Also returns how many of its
    /// prompt tokens lie in hash blocks an earlier request had.
    pub fn path(
        &mut self,
        hash_ids: &[u64],
        input: u32,
        tail_stream: u64,
    ) -> Result<(BlockPath, u32), String> {
        let b = self.block_tokens;
        let expected = input.div_ceil(b) as usize;
        if hash_ids.len() != expected {
            return Err(format!(
                "`hash_ids` has {} ids for {input} input tokens, but at {b} tokens per id it needs {expected} \
                 (is workload.trace.block_tokens right?)",
                hash_ids.len()
            ));
        }
        let full = (input / b) as usize;
        let mut segments = Vec::new();
        let mut seen = 0u32;
        // (stream, position in it) of the block just matched.
        let mut at: Option<(u32, u32)> = None;
        let mut j = 0;
        while j < full {
            let id = hash_ids[j];
            let next = match at {
                None => match self.roots.get(&id) {
                    Some(&s) => {
                        seen += b;
                        (s, 0)
                    }
                    None => {
                        let s = self.new_stream(id, 0);
                        self.roots.insert(id, s);
                        (s, 0)
                    }
                },
                Some((s, p)) => {
                    let ids = &mut self.streams[s as usize].ids;
                    let rest = &hash_ids[j..full];
                    // Along the stream, a slice at a time: the ids that
                    // follow it are known blocks.
                    let along = common_prefix(&ids[p as usize + 1..], rest);
                    if along > 0 {
                        seen += along as u32 * b;
                        j += along;
                        at = Some((s, p + along as u32));
                        continue;
                    }
                    if p as usize + 1 == ids.len() {
                        // At the stream's end (no branch starts there:
                        // streams branch only off their middle), the rest
                        // of the chain is new and extends it.
                        ids.extend_from_slice(rest);
                        break;
                    }
                    match self.branches.get(&(s, p, id)) {
                        Some(&t) => {
                            seen += b;
                            (t, 0)
                        }
                        None => {
                            let t = self.new_stream(id, j as u32);
                            self.branches.insert((s, p, id), t);
                            (t, 0)
                        }
                    }
                }
            };
            // A stream entered at its first block: a segment of the path.
            segments.push(Segment {
                stream: next.0 as u64,
                start: self.streams[next.0 as usize].first * b,
            });
            at = Some(next);
            j += 1;
        }
        segments.push(Segment {
            stream: tail_stream,
            start: full as u32 * b,
        });
        Ok((BlockPath::new(segments), seen))
    }
}

/// How many leading ids `a` and `b` have in common. Compared sixteen at a
/// time first (slice equality, which the compiler vectorises), then one by
/// one in the sixteen where they part: a chain followed along a stream
/// matches hundreds of ids.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    const CHUNK: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut k = 0;
    while k + CHUNK <= n && a[k..k + CHUNK] == b[k..k + CHUNK] {
        k += CHUNK;
    }
    k + a[k..]
        .iter()
        .zip(&b[k..])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn the_common_prefix_is_counted_across_chunks() {
        let a: Vec<u64> = (0..40).collect();
        for (b, want) in [
            (a.clone(), 40),
            (a[..17].to_vec(), 17),
            ((0..16).chain([99]).collect(), 16),
            ((0..15).chain([99]).collect(), 15),
            ((0..33).chain([99, 34]).collect(), 33),
            (vec![7], 0),
            (vec![], 0),
        ] {
            assert_eq!(common_prefix(&a, &b), want, "{b:?}");
            assert_eq!(common_prefix(&b, &a), want, "{b:?}");
        }
    }

    /// The chains followed block by block (the builder before it followed
    /// a stream a slice at a time): the reference the builder must match.
    struct BlockByBlock {
        streams: Vec<Vec<u64>>,
        firsts: Vec<u32>,
        roots: FastMap<u64, u32>,
        branches: FastMap<(u32, u32, u64), u32>,
    }

    impl BlockByBlock {
        fn path(&mut self, hash_ids: &[u64], full: usize, b: u32) -> (Vec<(u64, u32)>, u32) {
            let (mut segments, mut seen, mut at) = (Vec::new(), 0, None::<(u32, u32)>);
            for (j, &id) in hash_ids[..full].iter().enumerate() {
                let stream = |this: &mut Self, first: u32| {
                    this.streams.push(vec![id]);
                    this.firsts.push(first);
                    (this.streams.len() - 1) as u32
                };
                let (next, known) = match at {
                    None => match self.roots.get(&id) {
                        Some(&s) => ((s, 0), true),
                        None => {
                            let s = stream(self, 0);
                            self.roots.insert(id, s);
                            ((s, 0), false)
                        }
                    },
                    Some((s, p)) => {
                        let ids = &self.streams[s as usize];
                        if ids.get(p as usize + 1) == Some(&id) {
                            ((s, p + 1), true)
                        } else if let Some(&t) = self.branches.get(&(s, p, id)) {
                            ((t, 0), true)
                        } else if p as usize + 1 == ids.len() {
                            self.streams[s as usize].push(id);
                            ((s, p + 1), false)
                        } else {
                            let t = stream(self, j as u32);
                            self.branches.insert((s, p, id), t);
                            ((t, 0), false)
                        }
                    }
                };
                seen += if known { b } else { 0 };
                if next.1 == 0 {
                    segments.push((next.0 as u64, self.firsts[next.0 as usize] * b));
                }
                at = Some(next);
            }
            (segments, seen)
        }
    }

    #[test]
    fn following_a_stream_a_slice_at_a_time_builds_the_same_paths() {
        // Multi-turn chains (each turn extends an earlier one of its
        // session, or cuts it short and branches), with shared roots.
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(3);
        let b = 16;
        let mut fast = PathBuilder::new(b);
        let mut slow = BlockByBlock {
            streams: Vec::new(),
            firsts: Vec::new(),
            roots: FastMap::default(),
            branches: FastMap::default(),
        };
        let mut chains: Vec<Vec<u64>> = Vec::new();
        let mut next_id = 0u64;
        for r in 0..3000u64 {
            let mut ids: Vec<u64> = match chains.len() {
                0 => Vec::new(),
                n => {
                    let c = &chains[rng.random_range(0..n)];
                    c[..rng.random_range(0..=c.len())].to_vec()
                }
            };
            for _ in 0..rng.random_range(0..40) {
                // Now and then an id seen before (a repeated block).
                ids.push(if rng.random_range(0..8) == 0 {
                    rng.random_range(0..=next_id)
                } else {
                    next_id
                });
                next_id += 1;
            }
            if ids.is_empty() {
                continue;
            }
            let input = ids.len() as u32 * b - rng.random_range(0..b);
            let full = (input / b) as usize;
            let (path, seen) = fast.path(&ids, input, 1 << 40 | r).unwrap();
            let (want, want_seen) = slow.path(&ids, full, b);
            let mut got = segs(&(path, seen));
            got.0.pop(); // the request's own tail stream
            assert_eq!(got, (want, want_seen), "request {r}: {ids:?}");
            chains.push(ids);
        }
        let sizes: Vec<usize> = fast.streams.iter().map(|s| s.ids.len()).collect();
        assert_eq!(sizes, slow.streams.iter().map(Vec::len).collect::<Vec<_>>());
    }

    fn segs(p: &(BlockPath, u32)) -> (Vec<(u64, u32)>, u32) {
        let s = p.0.segments().iter().map(|s| (s.stream, s.start)).collect();
        (s, p.1)
    }

    #[test]
    fn chains_become_streams_that_extend_or_branch() {
        // 4 tokens per id. A: ids 1,2,3 over 12 tokens → one stream (0), and
        // its own tail from token 12. B: ids 1,2,3,4 (16 tokens) extends
        // stream 0 past A's end; its first 3 blocks (12 tokens) were seen.
        // C: ids 1,2,9 leaves stream 0 after 2 ids (8 tokens seen): a new
        // stream 1 from token 8.
        let mut b = PathBuilder::new(4);
        let a = b.path(&[1, 2, 3], 12, 100).unwrap();
        assert_eq!(segs(&a), (vec![(0, 0), (100, 12)], 0));
        let bb = b.path(&[1, 2, 3, 4], 16, 101).unwrap();
        assert_eq!(segs(&bb), (vec![(0, 0), (101, 16)], 12));
        let c = b.path(&[1, 2, 9], 12, 102).unwrap();
        assert_eq!(segs(&c), (vec![(0, 0), (1, 8), (102, 12)], 8));
        // C again follows the branch: all 12 tokens seen.
        let c2 = b.path(&[1, 2, 9], 12, 103).unwrap();
        assert_eq!(segs(&c2), (vec![(0, 0), (1, 8), (103, 12)], 12));
        // The same id after a different prefix is a different chain.
        let d = b.path(&[7, 2], 8, 104).unwrap();
        assert_eq!(segs(&d), (vec![(2, 0), (104, 8)], 0));
    }

    #[test]
    fn a_partial_last_hash_block_is_the_requests_own() {
        // 10 tokens at 4 per id: ids 1, 2 cover 8 tokens in full; id 3 covers
        // tokens 8..10 only, so it is not shared: the tail starts at 8.
        let mut b = PathBuilder::new(4);
        let p = b.path(&[1, 2, 3], 10, 200).unwrap();
        assert_eq!(segs(&p), (vec![(0, 0), (200, 8)], 0));
        let q = b.path(&[1, 2, 3], 10, 201).unwrap();
        assert_eq!(
            segs(&q),
            (vec![(0, 0), (201, 8)], 8),
            "id 3 is never shared"
        );
        // Shorter than one hash block: all its own.
        assert_eq!(segs(&b.path(&[5], 3, 202).unwrap()), (vec![(202, 0)], 0));
    }

    #[test]
    fn the_id_count_must_match_the_prompt() {
        let mut b = PathBuilder::new(512);
        let e = b.path(&[1, 2, 3], 1000, 0).unwrap_err();
        assert!(e.contains("needs 2") && e.contains("block_tokens"), "{e}");
    }
}
