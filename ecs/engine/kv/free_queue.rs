//! The LRU queue of free blocks: intrusive and doubly linked through the
//! blocks themselves, so a hit on a free cached block leaves it in O(1).

use crate::engine::kv::{Block, BlockId, BlockPool, NONE};

/// Blocks taken out of the queue whose neighbours are not linked yet: the
/// stretch between `front_prev` (towards the front) and `back_next`.
#[derive(Clone, Copy)]
pub(super) struct Stretch {
    pub front_prev: BlockId,
    pub back_next: BlockId,
}

/// The ends of the queue and what it holds.
#[derive(Clone, Debug)]
pub(super) struct FreeQueue {
    pub head: BlockId,
    pub tail: BlockId,
    /// Blocks in the queue (free or free cached): what allocation can take.
    pub num_free: u32,
    /// Free blocks that still carry an identity (evictable cache).
    pub num_free_cached: u32,
}

impl FreeQueue {
    /// A queue of blocks `0..n` in id order.
    pub fn in_id_order(n: u32) -> FreeQueue {
        FreeQueue {
            head: if n == 0 { NONE } else { 0 },
            tail: if n == 0 { NONE } else { n - 1 },
            num_free: n,
            num_free_cached: 0,
        }
    }

    /// Links the two ends of a stretch cut out of the queue (a method of
    /// the queue, not the pool, so a loop over the pool's index can call it).
    pub fn cut(&mut self, blocks: &mut [Block], s: Stretch) {
        if s.front_prev == NONE {
            self.head = s.back_next;
        } else {
            blocks[s.front_prev as usize].next = s.back_next;
        }
        if s.back_next == NONE {
            self.tail = s.front_prev;
        } else {
            blocks[s.back_next as usize].prev = s.front_prev;
        }
    }
}

impl BlockPool {
    pub(super) fn push_front(&mut self, id: BlockId) {
        let head = self.queue.head;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = NONE;
            b.next = head;
        }
        if head == NONE {
            self.queue.tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        self.queue.head = id;
        self.queue.num_free += 1;
    }

    pub(super) fn push_back(&mut self, id: BlockId) {
        let tail = self.queue.tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NONE;
        }
        if tail == NONE {
            self.queue.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.queue.tail = id;
        self.queue.num_free += 1;
    }

    /// The free queue from front (next evicted) to back, for tests.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut id = self.queue.head;
        while id != NONE {
            assert!(out.len() < self.blocks.len(), "the free queue has a cycle");
            let b = &self.blocks[id as usize];
            let s = b.has_key().then(|| &self.slots[b.key_slot as usize]);
            match s {
                // The top of a stream's queued prefix: the prefix follows,
                // down to block 0, its inner links meaning nothing.
                Some(s) if s.queued == b.key_index + 1 && s.at[b.key_index as usize] == id => {
                    out.extend(s.at[..s.queued as usize].iter().rev());
                    id = self.blocks[s.at[0] as usize].next;
                }
                _ => {
                    out.push(id);
                    id = b.next;
                }
            }
        }
        out
    }
}
