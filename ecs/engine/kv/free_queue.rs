//! The LRU queue of free blocks: intrusive and doubly linked through the
//! blocks themselves, so a hit on a free cached block leaves it in O(1).

use crate::engine::kv::{BlockId, BlockPool, NONE, OUT};

/// Blocks taken out of the queue whose neighbours are not linked yet: the
/// stretch between `front_prev` (towards the front) and `back_next`.
pub(super) struct Stretch {
    pub front_prev: BlockId,
    pub back_next: BlockId,
}

impl BlockPool {
    /// Links the two ends of a stretch cut out of the queue.
    pub(super) fn cut(&mut self, s: Stretch) {
        if s.front_prev == NONE {
            self.head = s.back_next;
        } else {
            self.blocks[s.front_prev as usize].next = s.back_next;
        }
        if s.back_next == NONE {
            self.tail = s.front_prev;
        } else {
            self.blocks[s.back_next as usize].prev = s.front_prev;
        }
    }

    pub(super) fn push_front(&mut self, id: BlockId) {
        let head = self.head;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = NONE;
            b.next = head;
        }
        if head == NONE {
            self.tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        self.head = id;
        self.num_free += 1;
    }

    pub(super) fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next)
        };
        if prev == NONE {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = OUT;
        b.next = NONE;
        self.num_free -= 1;
    }

    pub(super) fn push_back(&mut self, id: BlockId) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NONE;
        }
        if tail == NONE {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    /// The free queue from front (next evicted) to back, for tests.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut id = self.head;
        while id != NONE {
            out.push(id);
            id = self.blocks[id as usize].next;
        }
        out
    }
}
