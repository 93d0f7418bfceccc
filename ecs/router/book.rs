//! The router's own bookkeeping, as llm-d keeps it (its EPP's datastore and plugins): what it
//! sent where, counted from its own decisions, and an approximate prefix
//! index that can be stale where a pod evicted.
//!
//! * In-flight requests and tokens per endpoint: incremented when the router
//!   picks it; the prefill endpoint is released at its answer (first
//!   response), the decode endpoint at the end of the stream.
//! * Prefix index: per pod, an LRU of the block identities of the prompts
//!   the router sent there, bounded to `capacity` blocks (0: off).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use crate::engine::Role;
use crate::engine::kv::{BlockKey, BlockPath, KeyHasher};

#[derive(Default, Clone, Copy, Debug)]
struct InFlight {
    requests: u64,
    tokens: u64,
}

/// What the router sent to one pod over the whole run.
#[derive(Default, Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Routed {
    /// Requests (legs) it sent there.
    pub requests: u64,
    /// Of those, on a decoder: prefilled remotely.
    pub remote: u64,
    pub prompt_tokens: u64,
}

/// A bounded LRU set of block identities (one per pod).
#[derive(Debug, Default)]
struct PrefixLru {
    /// Per stream, the stamp of the last use of each of its block indices
    /// (0: not in the set): a prompt's blocks are one lookup and then an
    /// array, not one lookup each in a map of every block.
    stamps: HashMap<u64, Vec<u64>, BuildHasherDefault<KeyHasher>>,
    /// Blocks in the set.
    len: usize,
    /// (key, stamp) in use order; entries whose stamp is no longer the key's
    /// current one are stale and skipped.
    order: VecDeque<(BlockKey, u64)>,
    clock: u64,
}

impl PrefixLru {
    fn stamp(stamps: &HashMap<u64, Vec<u64>, BuildHasherDefault<KeyHasher>>, key: BlockKey) -> u64 {
        stamps
            .get(&key.stream)
            .and_then(|v| v.get(key.index as usize))
            .copied()
            .unwrap_or(0)
    }

    fn touch(&mut self, key: BlockKey, capacity: usize) {
        self.clock += 1;
        let v = self.stamps.entry(key.stream).or_default();
        let i = key.index as usize;
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        if v[i] == 0 {
            self.len += 1;
        }
        v[i] = self.clock;
        self.order.push_back((key, self.clock));
        while self.len > capacity {
            let (k, s) = self.order.pop_front().expect("entries exist");
            if Self::stamp(&self.stamps, k) == s {
                self.remove(k);
            }
        }
        // Keep stale entries from piling up.
        if self.order.len() > 2 * capacity.max(16) {
            let stamps = &self.stamps;
            self.order.retain(|&(k, s)| Self::stamp(stamps, k) == s);
        }
    }

    fn remove(&mut self, key: BlockKey) {
        let v = self
            .stamps
            .get_mut(&key.stream)
            .expect("a stream in the set");
        v[key.index as usize] = 0;
        self.len -= 1;
        while v.last() == Some(&0) {
            v.pop();
        }
        if v.is_empty() {
            self.stamps.remove(&key.stream);
        }
    }

    /// How many of the first blocks of `path`, at most `max`, are all in
    /// the set.
    fn leading(&self, path: &BlockPath, bs: u32, max: u32) -> u32 {
        let mut hit = 0;
        for run in path.runs(bs, max) {
            let lead = self.stamps.get(&run.stream).map_or(0, |v| {
                v.iter()
                    .take(run.count as usize)
                    .take_while(|&&s| s != 0)
                    .count() as u32
            });
            if lead < run.count {
                return run.first + lead;
            }
            hit = run.first + run.count;
        }
        hit
    }
}

#[derive(Debug)]
pub struct RouterBook {
    prefill: Vec<InFlight>,
    decode: Vec<InFlight>,
    /// Blocks per pod in the approximate prefix index (0: no index).
    capacity: usize,
    block_size: u32,
    prefill_index: Vec<PrefixLru>,
    decode_index: Vec<PrefixLru>,
    role_names: [rhai::ImmutableString; 2],
    /// Per role (prefill, decode), per pod: what it was sent.
    pub routed: [Vec<Routed>; 2],
}

impl RouterBook {
    pub fn new(
        num_prefill: usize,
        num_decode: usize,
        index_blocks: u32,
        block_size: u32,
    ) -> RouterBook {
        RouterBook {
            prefill: vec![InFlight::default(); num_prefill],
            decode: vec![InFlight::default(); num_decode],
            capacity: index_blocks as usize,
            block_size,
            prefill_index: (0..num_prefill).map(|_| PrefixLru::default()).collect(),
            decode_index: (0..num_decode).map(|_| PrefixLru::default()).collect(),
            role_names: [Role::Prefill.name().into(), Role::Decode.name().into()],
            routed: [
                vec![Routed::default(); num_prefill],
                vec![Routed::default(); num_decode],
            ],
        }
    }

    /// The role's name as scripts see it (allocated once).
    pub fn role_name(&self, role: Role) -> rhai::ImmutableString {
        self.role_names[role as usize].clone()
    }

    /// (requests, tokens) the router believes are in flight on a pod.
    pub fn in_flight(&self, role: Role, index: u32) -> (u64, u64) {
        let f = match role {
            Role::Prefill => self.prefill[index as usize],
            Role::Decode => self.decode[index as usize],
        };
        (f.requests, f.tokens)
    }

    /// The index's estimate of the request's cached prefix on a pod, in
    /// tokens, at most `max_tokens`.
    pub fn cached_tokens(
        &self,
        role: Role,
        index: u32,
        path: &BlockPath,
        max_tokens: u32,
        bs: u32,
    ) -> u32 {
        if self.capacity == 0 {
            return 0;
        }
        let lru = match role {
            Role::Prefill => &self.prefill_index[index as usize],
            Role::Decode => &self.decode_index[index as usize],
        };
        lru.leading(path, bs, max_tokens / bs) * bs
    }

    /// The router picked decoder `d` (and prefiller `p`) for a prompt.
    pub fn routed(&mut self, d: u32, p: Option<u32>, prompt: u32, path: &BlockPath) {
        let f = &mut self.decode[d as usize];
        f.requests += 1;
        f.tokens += prompt as u64;
        let c = &mut self.routed[Role::Decode as usize][d as usize];
        c.requests += 1;
        c.remote += p.is_some() as u64;
        c.prompt_tokens += prompt as u64;
        if let Some(p) = p {
            let f = &mut self.prefill[p as usize];
            f.requests += 1;
            f.tokens += prompt as u64;
            let c = &mut self.routed[Role::Prefill as usize][p as usize];
            c.requests += 1;
            c.remote += 1;
            c.prompt_tokens += prompt as u64;
        }
        if self.capacity > 0 {
            let blocks = prompt / self.block_size;
            for k in 0..blocks {
                let key = path.key(k, self.block_size);
                self.decode_index[d as usize].touch(key, self.capacity);
                if let Some(p) = p {
                    self.prefill_index[p as usize].touch(key, self.capacity);
                }
            }
        }
    }

    /// The prefiller answered: its in-flight request is released.
    pub fn prefill_answered(&mut self, p: u32, prompt: u32) {
        let f = &mut self.prefill[p as usize];
        f.requests -= 1;
        f.tokens -= prompt as u64;
    }

    /// The decode stream ended.
    pub fn decode_finished(&mut self, d: u32, prompt: u32) {
        let f = &mut self.decode[d as usize];
        f.requests -= 1;
        f.tokens -= prompt as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_counts_follow_the_routers_own_decisions() {
        let mut b = RouterBook::new(2, 2, 0, 16);
        b.routed(1, Some(0), 100, &BlockPath::stream(7));
        b.routed(1, None, 50, &BlockPath::stream(8));
        assert_eq!(b.in_flight(Role::Decode, 1), (2, 150));
        assert_eq!(b.in_flight(Role::Prefill, 0), (1, 100));
        b.prefill_answered(0, 100);
        assert_eq!(b.in_flight(Role::Prefill, 0), (0, 0));
        b.decode_finished(1, 100);
        assert_eq!(b.in_flight(Role::Decode, 1), (1, 50));
    }

    #[test]
    fn the_prefix_index_is_bounded_and_forgets_least_recently_sent_blocks() {
        // Capacity 4 blocks of 16 tokens.
        let mut b = RouterBook::new(1, 1, 4, 16);
        b.routed(0, None, 50, &BlockPath::stream(1)); // blocks (1,0..3): 3 full blocks
        assert_eq!(
            b.cached_tokens(Role::Decode, 0, &BlockPath::stream(1), 1000, 16),
            48
        );
        assert_eq!(
            b.cached_tokens(Role::Decode, 0, &BlockPath::stream(1), 40, 16),
            32,
            "capped by the request's reusable prefix"
        );
        b.routed(0, None, 32, &BlockPath::stream(2)); // 2 blocks of stream 2: evicts (1,0)
        assert_eq!(
            b.cached_tokens(Role::Decode, 0, &BlockPath::stream(1), 1000, 16),
            0,
            "prefix start forgotten"
        );
        assert_eq!(
            b.cached_tokens(Role::Decode, 0, &BlockPath::stream(2), 1000, 16),
            32
        );
        assert_eq!(
            b.cached_tokens(Role::Prefill, 0, &BlockPath::stream(2), 1000, 16),
            0,
            "never sent to the prefiller"
        );
    }
}
