//! The KV pool of one instance: blocks, reference counts, the prefix cache and
//! its LRU free queue (docs/model.md §5, vLLM's `BlockPool`).
//!
//! * A block is *held* while its reference count is above zero, *free cached*
//!   when it is free but still registered under a content identity, else free.
//! * Free blocks (cached or not) wait in one LRU queue; allocation pops its
//!   front and evicts whatever identity the popped block had.
//! * Requests free their blocks tail first, so the end of a prefix is evicted
//!   before its start.
//! * A hit on a free cached block takes it out of the queue.
//!
//! With [`EngineSemantics::Vllm033`] the pool follows vLLM 0.33's `BlockPool`
//! (v1/core/block_pool.py) where it differs from docs/model.md: block 0 is the
//! null block (one block fewer is usable), blocks without an identity (a
//! request's partial last block) are freed to the *front* of the queue, and
//! several blocks may hold one identity (a lookup finds the oldest).

use bevy_ecs::prelude::*;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::scenario::EngineSemantics;

mod free_queue;
use free_queue::{FreeQueue, Stretch};
pub mod identity;

pub use identity::{BlockKey, BlockPath, KeyHasher, Run, Segment};

/// An instance's KV pool (blocks, prefix cache, LRU), as a component.
#[derive(Component, Debug)]
pub struct KvPool(pub BlockPool);

pub type BlockId = u32;

pub(crate) const NONE: u32 = u32::MAX;

/// 20 bytes (an `Option<BlockKey>` and an `in_queue` flag would make it
/// 40): the pools' blocks are read at random, and the smaller they are the
/// more of them stay in cache.
#[derive(Clone, Debug)]
pub(super) struct Block {
    ref_cnt: u32,
    // Intrusive doubly linked free queue, NONE at its ends. A block is in
    // the queue exactly when no one references it (`ref_cnt` 0, where its
    // fields are its own: `StreamBlocks`), so its links mean nothing while
    // it is held and are not cleared.
    prev: u32,
    next: u32,
    /// Its identity when cached: block `key_index` of the stream in slot
    /// `key_slot` of the index; `key_index` NONE when it has none (and
    /// `key_slot` REPLACED when a newer copy took its identity while it was
    /// held).
    key_index: u32,
    key_slot: u32,
}

/// `key_slot` of a held block whose identity a newer copy took: its count
/// is its own although the index does not name it (a fresh block, whose
/// fields mean nothing, never carries it: [`own_fields`]).
const REPLACED: u32 = NONE - 1;

impl Block {
    fn has_key(&self) -> bool {
        self.key_index != NONE
    }
    fn in_queue(&self) -> bool {
        self.ref_cnt == 0
    }
    /// Drops one reference on this block (`id`); whether it is now free.
    #[inline(always)]
    fn release(&mut self, id: BlockId) -> bool {
        debug_assert!(self.ref_cnt > 0, "double free of block {id}");
        self.ref_cnt -= 1;
        self.ref_cnt == 0
    }
}

const _: () = assert!(std::mem::size_of::<Block>() == 20);

/// The prefix-cache index of one stream: the block holding each of its
/// block indices (NONE where not cached), how many are cached, and how many
/// lead without a gap (the stream's cached prefix, which the router asks
/// for every candidate of every request).
///
/// With the reference semantics a session's turn hits its whole earlier
/// prefix, which the turn before freed as one stretch of the queue; most of
/// the pool's block work was taking those blocks out one by one and freeing
/// them again. So two counts let a prefix move as a whole, the queue left as
/// block-by-block work would leave it:
///
/// * `held`: the first `held` blocks are referenced once, by one table,
///   without their own counts saying so; that table's new blocks join it
///   as they are cached. A second holder, or a newer copy replacing one of
///   them, writes the counts out first.
/// * `queued`: the first `queued` blocks are free and one stretch of the
///   queue, block 0 nearest the back, as a table freed tail first leaves
///   them. Any of them leaving the queue or the index cuts it to below
///   that block.
///
/// Inside such a prefix only the stream's index is kept: a decoder's read
/// caches hundreds of blocks, and writing each one's fields meant a load
/// of a block at random per block. Only its top block (the last) carries
/// its own fields: its identity and a count of 0 (what [`BlockPool::free`]
/// and allocation read), its `prev` while queued; the bottom one (block 0)
/// its `next` while queued. Every other block's count, identity and links
/// mean nothing until the prefix is cut or written out, which writes them
/// ([`cut_queued`], [`write_out_hold`]).
///
/// With the reference semantics allocation writes no block either: a
/// table's blocks past those it has cached are *fresh*, referenced once by
/// it, their fields what they were in the queue. Caching one writes its
/// fields; freeing one, found fresh by not being named by the index at the
/// identity it claims ([`own_fields`]), writes them as a free block's. So
/// a decoder's read, allocated, joined to its held prefix and freed as its
/// stretch, writes only its index and its top block.
#[derive(Clone, Debug, Default)]
struct StreamBlocks {
    stream: u64,
    at: Vec<BlockId>,
    count: u32,
    leading: u32,
    held: u32,
    queued: u32,
}

/// Each stream with a cached block has a slot of the index; the blocks
/// name their stream's slot, so evicting one needs no hash lookup, and an
/// operation on a request's blocks needs one per stream of its path.
type SlotMap = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

// A run's memory is estimated before it starts from this figure.
const _: () = assert!(
    (std::mem::size_of::<Block>() + std::mem::size_of::<BlockId>()) as u64
        <= crate::scenario::validate::KV_BYTES_PER_BLOCK
);

/// One instance's KV pool.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: u32,
    blocks: Vec<Block>,
    /// The prefix-cache index: a slot per cached stream, found by its id;
    /// slots of streams no longer cached are reused.
    slot_of: SlotMap,
    slots: Vec<StreamBlocks>,
    free_slots: Vec<u32>,
    /// The LRU queue of free blocks, linked through `blocks`.
    queue: FreeQueue,
    /// vLLM 0.33: unhashed blocks are freed to the front, and an identity may
    /// be held by several blocks (see the module docs).
    vllm: bool,
    /// vLLM 0.33 only: further blocks holding an identity whose first holder
    /// is in the stream index, oldest first (`BlockHashToBlockMap`).
    dups: HashMap<BlockKey, Vec<BlockId>, BuildHasherDefault<KeyHasher>>,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks; the free queue starts in id order.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let blocks = (0..num_blocks)
            .map(|i| Block {
                ref_cnt: 0,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == num_blocks { NONE } else { i + 1 },
                key_index: NONE,
                key_slot: NONE,
            })
            .collect();
        BlockPool {
            block_size,
            blocks,
            slot_of: SlotMap::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            queue: FreeQueue::in_id_order(num_blocks),
            vllm: false,
            dups: HashMap::default(),
        }
    }

    /// The KV pool of an engine of `num_gpu_blocks` blocks of `block_size`
    /// tokens, or with vLLM 0.33's semantics one fewer (`BlockPool.__init__`
    /// pops block 0 as the null block) and its free and duplicate rules.
    pub fn for_engine(num_gpu_blocks: u32, block_size: u32, semantics: EngineSemantics) -> Self {
        match semantics {
            EngineSemantics::Reference => Self::new(num_gpu_blocks, block_size),
            EngineSemantics::Vllm033 => {
                let mut pool = Self::new(num_gpu_blocks.saturating_sub(1), block_size);
                pool.vllm = true;
                pool
            }
        }
    }

    /// The same pool, empty: what a restarted instance starts with.
    pub fn emptied(&self) -> BlockPool {
        let mut pool = BlockPool::new(self.blocks.len() as u32, self.block_size);
        pool.vllm = self.vllm;
        pool
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn num_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }
    /// Whether this is vLLM 0.33's pool, whose null block was taken out.
    pub fn has_null_block(&self) -> bool {
        self.vllm
    }
    /// Blocks in the free queue (free or free cached): what allocation can take.
    pub fn num_free(&self) -> u32 {
        self.queue.num_free
    }
    /// Blocks some request or lease references.
    pub fn num_held(&self) -> u32 {
        self.num_blocks() - self.queue.num_free
    }
    /// Blocks that are free but still findable by the prefix cache.
    pub fn num_free_cached(&self) -> u32 {
        self.queue.num_free_cached
    }
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }
    /// Whether a block currently has identity `key`.
    pub fn is_cached(&self, key: BlockKey) -> bool {
        self.lookup(key).is_some()
    }

    fn lookup(&self, key: BlockKey) -> Option<BlockId> {
        let s = self.stream(key.stream)?;
        s.at.get(key.index as usize).copied().filter(|&b| b != NONE)
    }

    /// The index of `stream`, if it has a cached block.
    fn stream(&self, stream: u64) -> Option<&StreamBlocks> {
        self.slot_of.get(&stream).map(|&s| &self.slots[s as usize])
    }

    /// The slot of `stream`, given one if it has none.
    fn slot_for(&mut self, stream: u64) -> u32 {
        let slots = &mut self.slots;
        let free_slots = &mut self.free_slots;
        *self.slot_of.entry(stream).or_insert_with(|| {
            match free_slots.pop() {
                Some(s) => {
                    // (Given back with nothing cached, its index kept.)
                    slots[s as usize].stream = stream;
                    s
                }
                None => {
                    slots.push(StreamBlocks {
                        stream,
                        ..Default::default()
                    });
                    slots.len() as u32 - 1
                }
            }
        })
    }

    /// The references on block `id` (for checks: it looks at every block).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_counts()[id as usize]
    }

    /// Every block's references, by id: 0 in the free queue, 1 in a
    /// stream's held prefix or fresh in a table ([`StreamBlocks`]), else
    /// its own count.
    pub fn ref_counts(&self) -> Vec<u32> {
        let mut refs: Vec<u32> = (0..)
            .zip(&self.blocks)
            .map(|(id, b)| {
                let own = self.vllm || own_fields(b, id, &self.slots);
                if own { b.ref_cnt } else { 1 }
            })
            .collect();
        for id in self.free_queue() {
            refs[id as usize] = 0;
        }
        for s in &self.slots {
            for &id in &s.at[..s.held as usize] {
                refs[id as usize] = 1;
            }
        }
        refs
    }

    /// The cached blocks of `stream` from its first one, without a gap.
    fn leading(&self, stream: u64) -> u32 {
        self.stream(stream).map_or(0, |s| {
            debug_assert_eq!(
                s.leading as usize,
                s.at.iter().take_while(|&&b| b != NONE).count()
            );
            s.leading
        })
    }

    /// `cachedin`: the number of leading blocks of the request's `path` the
    /// pool has cached (held or free cached), looking at no more than
    /// `max_blocks`.
    pub fn cached_prefix_blocks(&self, path: &BlockPath, max_blocks: u32) -> u32 {
        let mut hit = 0;
        for run in path.runs(self.block_size, max_blocks) {
            let lead = self.leading(run.stream);
            if lead < run.count {
                return run.first + lead;
            }
            hit = run.first + run.count;
        }
        hit
    }

    /// How many of the first `n` blocks of `path` (all cached) sit in the
    /// free queue: a hit on them takes them out of it, so they do not count
    /// as room for new blocks.
    pub fn free_among_prefix(&self, path: &BlockPath, n: u32) -> u32 {
        path.runs(self.block_size, n)
            .map(|run| {
                let s = self.stream(run.stream).expect("a cached stream");
                // (A held prefix is not free, a queued one is: their
                // blocks' own counts are not looked at.)
                let queued = s.queued.min(run.count);
                let from = s.held.max(queued).min(run.count) as usize;
                let rest = s.at[from..run.count as usize]
                    .iter()
                    .filter(|&&id| self.blocks[id as usize].ref_cnt == 0)
                    .count() as u32;
                queued + rest
            })
            .sum()
    }

    /// Whether `new_blocks` fresh blocks can be allocated after a hit on the
    /// first `hit_blocks` cached blocks of `path`.
    pub fn can_allocate_after_hit(
        &self,
        path: &BlockPath,
        hit_blocks: u32,
        new_blocks: u32,
    ) -> bool {
        // At most `hit_blocks` of the hit are free: when even that many
        // leave room, counting them (a look at each block) is not needed.
        new_blocks + hit_blocks <= self.queue.num_free
            || new_blocks + self.free_among_prefix(path, hit_blocks) <= self.queue.num_free
    }

    /// Takes a reference on each of the first `n` blocks of `path` (which
    /// must be cached) and appends them to `table`.
    ///
    /// Free blocks among them leave the queue a stretch at a time: a
    /// request's blocks are freed tail first, so a cached prefix usually
    /// sits in the queue as one stretch, block 0 nearest the back; the
    /// stretch is cut out with one relinking of its two ends instead of one
    /// per block (the queue is the same). With the reference semantics a
    /// stream's prefix that is one free stretch becomes its held prefix
    /// ([`StreamBlocks`]): no block's count is written, and the part known
    /// to be one stretch from its last free is not even looked at.
    pub fn touch_prefix(&mut self, path: &BlockPath, n: u32, table: &mut Vec<BlockId>) {
        table.reserve(n as usize);
        // The stretch being cut out: the blocks between `front_prev` and
        // `back_next` (none yet while `front_prev` is NOT_A_BLOCK, which no
        // block's `prev` is).
        const NOT_A_BLOCK: u32 = NONE - 1;
        let mut s = Stretch {
            front_prev: NOT_A_BLOCK,
            back_next: NONE,
        };
        // Blocks taken out of the queue, subtracted from its counts at the
        // end; all of them are cached (the index names only blocks that
        // hold their identity).
        let mut taken = 0u32;
        for run in path.runs(self.block_size, n) {
            let slot = self.slot_of[&run.stream] as usize;
            let mut held = 0;
            if !self.vllm {
                let stream = &mut self.slots[slot];
                if run.count == 0 {
                    // (Nothing of this stream is touched.)
                } else if stream.held > 0 {
                    // A second holder: every count is written out.
                    write_out_hold(&mut self.blocks, slot as u32, stream);
                } else if stream.queued > 0 || self.blocks[stream.at[0] as usize].ref_cnt == 0 {
                    // (The stretch in progress is cut first: the held
                    // prefix's ends are read from the links it leaves.)
                    if s.front_prev != NOT_A_BLOCK {
                        self.queue.cut(&mut self.blocks, s);
                        s.front_prev = NOT_A_BLOCK;
                    }
                    held = take_held(
                        &mut self.blocks,
                        &mut self.queue,
                        slot as u32,
                        stream,
                        run.count,
                    );
                    taken += held;
                }
                // (A queued prefix always became the held one: its first
                // block is free.)
                debug_assert_eq!(
                    self.slots[slot].queued, 0,
                    "the touched stream is not queued"
                );
            }
            let (queue, blocks) = (&mut self.queue, &mut self.blocks);
            let ids = &self.slots[slot].at[..run.count as usize];
            let mut rest = &ids[held as usize..];
            while let Some((&id, after)) = rest.split_first() {
                if id == s.front_prev {
                    // Just before the stretch's front: it grows, by this
                    // block and those after it that follow it in the queue.
                    let (grown, front_prev) = grow_stretch(blocks, rest, id);
                    taken += grown as u32;
                    s.front_prev = front_prev;
                    rest = &rest[grown..];
                    continue;
                }
                rest = after;
                let b = &mut blocks[id as usize];
                b.ref_cnt += 1;
                if b.ref_cnt > 1 {
                    continue; // held already: not in the queue
                }
                debug_assert!(b.has_key(), "block {id} is in the index");
                taken += 1;
                // A new stretch. The one before is cut first: this block
                // may be one of its ends' neighbours.
                if s.front_prev != NOT_A_BLOCK {
                    queue.cut(blocks, s);
                }
                let b = &blocks[id as usize];
                s = Stretch {
                    front_prev: b.prev,
                    back_next: b.next,
                };
            }
            table.extend_from_slice(ids);
        }
        if s.front_prev != NOT_A_BLOCK {
            self.queue.cut(&mut self.blocks, s);
        }
        self.queue.num_free -= taken;
        self.queue.num_free_cached -= taken;
    }

    /// Allocates `n` blocks from the front of the free queue (evicting their
    /// cached identities) and appends them to `table`. Returns false, changing
    /// nothing, when fewer than `n` blocks are free.
    pub fn allocate(&mut self, n: u32, table: &mut Vec<BlockId>) -> bool {
        if n > self.queue.num_free {
            return false;
        }
        // The first `n` blocks of the queue leave it as one stretch: walked
        // along their links, with the new front linked once (the queue that
        // taking them from the front one by one leaves). They are appended
        // to the table as they are taken, a run of a stream's blocks in one
        // `extend` (no entry filled first and written again, no separate
        // pass clearing the stream's index entries).
        let (id, evicted) = if self.vllm {
            self.take_front_vllm(n, table)
        } else {
            self.take_front(n, table)
        };
        self.queue.head = id;
        if id == NONE {
            self.queue.tail = NONE;
        } else {
            self.blocks[id as usize].prev = NONE;
        }
        self.queue.num_free -= n;
        self.queue.num_free_cached -= evicted;
        true
    }

    /// Takes the first `n` blocks of the queue onto the end of `table`,
    /// fresh ([`StreamBlocks`]), evicting their identities: returns the
    /// block after them and how many were cached.
    ///
    /// A cached block is nearly always followed in the queue by the blocks
    /// of its stream before it, freed with it tail first. So the blocks
    /// that follow are counted first by comparing each one's link with the
    /// stream's index, each found by its id there (walking the links, each
    /// look-up of a cold block would wait for the one before), then taken as
    /// one run: their entries cleared as they are read, the stream's count
    /// and cached prefix updated once, as evicting them one by one
    /// ([`Self::uncache`]) would leave them.
    fn take_front(&mut self, n: u32, table: &mut Vec<BlockId>) -> (BlockId, u32) {
        let BlockPool {
            blocks,
            slots,
            slot_of,
            free_slots,
            queue,
            ..
        } = self;
        let mut id = queue.head;
        let mut evicted = 0u32;
        let mut left = n as usize;
        while left > 0 {
            // (The blocks taken are fresh: no field is written.)
            let b = &blocks[id as usize];
            if !b.has_key() {
                table.push(id);
                left -= 1;
                id = b.next;
                continue;
            }
            let (slot, top) = (b.key_slot, b.key_index as usize);
            let StreamBlocks { at, queued, .. } = &mut slots[slot as usize];
            debug_assert_eq!(at[top], id, "the index names the block");
            let queued = *queued as usize;
            debug_assert!(
                top + 1 >= queued,
                "the front is no inner block of a queued prefix"
            );
            let limit = left.min(top + 1);
            // Within the stream's queued prefix the blocks are known to
            // follow one another (the common case: a session's blocks
            // freed together; their links mean nothing); past it each link
            // is compared, until the walk reaches the queued prefix.
            let mut k = 1;
            while k < limit {
                if top + 1 - k < queued {
                    k = limit;
                } else if blocks[at[top + 1 - k] as usize].next == at[top - k] {
                    k += 1;
                } else {
                    break;
                }
            }
            let lo = top + 1 - k;
            let last = at[lo];
            // (Front to back: the stream's blocks from `top` down.)
            table.extend(
                at[lo..=top]
                    .iter_mut()
                    .rev()
                    .map(|entry| std::mem::replace(entry, NONE)),
            );
            id = if lo > 0 && lo < queued {
                // The queued prefix's new top: the next block, whose own
                // fields are written now (what the next allocation reads).
                let next = at[lo - 1];
                let b = &mut blocks[next as usize];
                (b.ref_cnt, b.key_slot, b.key_index) = (0, slot, lo as u32 - 1);
                next
            } else {
                blocks[last as usize].next
            };
            uncache_run(slots, slot_of, free_slots, slot, k as u32, lo as u32);
            evicted += k as u32;
            left -= k;
        }
        (id, evicted)
    }

    /// [`Self::take_front`] with vLLM 0.33's evictions (an identity may have
    /// further holders).
    fn take_front_vllm(&mut self, n: u32, table: &mut Vec<BlockId>) -> (BlockId, u32) {
        let mut id = self.queue.head;
        let mut evicted = 0u32;
        for _ in 0..n {
            let b = &mut self.blocks[id as usize];
            let next = b.next;
            b.ref_cnt = 1;
            if b.has_key() {
                let (slot, index) = (b.key_slot, b.key_index);
                b.key_index = NONE;
                self.evict_vllm(id, slot, index);
                evicted += 1;
            }
            table.push(id);
            id = next;
        }
        (id, evicted)
    }

    /// Registers block `id` (full and computed) under `key`. A newer block
    /// with the same content replaces the older one in the index, and the
    /// older one loses its identity (it can no longer be found).
    pub fn cache_block(&mut self, id: BlockId, key: BlockKey) {
        let slot = self.slot_for(key.stream);
        self.cache_in_slot(id, slot, key.index);
    }

    /// Registers blocks `from..to` of a request's `table` under their keys
    /// along its `path`, as [`Self::cache_block`] one by one does (one slot
    /// lookup per stream of the path).
    pub fn cache_blocks(&mut self, table: &[BlockId], path: &BlockPath, from: u32, to: u32) {
        for run in path.runs(self.block_size, to) {
            let end = run.first + run.count;
            if end <= from {
                continue;
            }
            let slot = self.slot_for(run.stream);
            // The stream's index is sized for the run once, and its cached
            // prefix lengthened once after it (blocks are only added here:
            // the prefix ends at the first gap at or after where it ended).
            let (lo, hi) = (from.max(run.first) - run.first, end - run.first);
            self.size_index(slot, hi);
            // The new blocks may join the stream's held prefix when this
            // table holds it (only the holder's table has its blocks) or
            // when it starts here.
            let st = &self.slots[slot as usize];
            let holder =
                !self.vllm && st.held == lo && (lo == 0 || table[run.first as usize] == st.at[0]);
            self.cache_run(
                &table[(run.first + lo) as usize..(run.first + hi) as usize],
                slot,
                lo,
                holder,
            );
            // Every index in lo..hi now names a block: a prefix that
            // reached lo runs on to hi at least, without looking at them.
            let s = &mut self.slots[slot as usize];
            if s.leading >= lo {
                s.leading = s.leading.max(hi);
            }
            self.lengthen_prefix(slot);
        }
    }

    fn cache_in_slot(&mut self, id: BlockId, slot: u32, index: u32) {
        self.size_index(slot, index + 1);
        self.cache_run(&[id], slot, index, false);
        self.lengthen_prefix(slot);
    }

    /// Makes the index of the stream in `slot` hold at least `len` blocks.
    fn size_index(&mut self, slot: u32, len: u32) {
        let at = &mut self.slots[slot as usize].at;
        if at.len() < len as usize {
            at.resize(len as usize, NONE);
        }
    }

    /// After blocks were cached in `slot`: its cached prefix runs on to
    /// the first gap (only filling the first gap lengthens it).
    fn lengthen_prefix(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        while (s.leading as usize) < s.at.len() && s.at[s.leading as usize] != NONE {
            s.leading += 1;
        }
    }

    /// Registers blocks `ids` as indices `lo..` of the stream in `slot`
    /// (its index long enough), the cached prefix left to the caller to
    /// lengthen: the stream's index entries walked along the blocks, the
    /// slot and the semantics looked up once, its count added once.
    ///
    /// With `holder` (the table caching them holds the stream's first `lo`
    /// blocks, or `lo` is 0), the blocks join the held prefix while their
    /// entries are free: only the index is written, and the last block's
    /// own fields, as its new top ([`StreamBlocks`]); freeing the table
    /// frees them with it, as one stretch.
    fn cache_run(&mut self, ids: &[BlockId], slot: u32, lo: u32, holder: bool) {
        let (blocks, queue, dups, vllm) =
            (&mut self.blocks, &mut self.queue, &mut self.dups, self.vllm);
        let s = &mut self.slots[slot as usize];
        // Entries from `lo` on may be replaced: a held prefix reaching them
        // is written out, and a queued one cut to end before them.
        if s.held > lo {
            write_out_hold(blocks, slot, s);
        }
        cut_queued(blocks, slot, s, lo);
        let (mut held, count) = (s.held, s.count);
        let at = &mut s.at[lo as usize..lo as usize + ids.len()];
        // The blocks that join come first (nearly all of a read's): the
        // table's blocks past what it has cached are its own new ones
        // (allocated by it, unknown to the index until now, so no one
        // else's), so a block joins while its entry is free; the first
        // whose entry is taken ends the joining, and it and those after it
        // take the loop below, which never joins. (The holder's pool is
        // never vLLM's: no duplicates here.)
        let mut joined = 0;
        if holder {
            debug_assert!(!vllm);
            debug_assert_eq!(held, lo, "the held prefix grows by the next blocks");
            // (When the held prefix is all the stream has cached, every
            // entry past it is free: nothing to look for.)
            joined = if count == held {
                at.len()
            } else {
                at.iter().position(|&e| e != NONE).unwrap_or(at.len())
            };
            debug_assert!(at[..joined].iter().all(|&e| e == NONE));
            if joined > 0 {
                at[..joined].copy_from_slice(&ids[..joined]);
                held += joined as u32;
                let top = &mut blocks[ids[joined - 1] as usize];
                (top.key_slot, top.key_index, top.ref_cnt) = (slot, held - 1, 0);
            }
        }
        let mut added = joined as u32;
        let rest = ids[joined..].iter().zip(&mut at[joined..]);
        for ((&id, entry), index) in rest.zip(lo + joined as u32..) {
            let b = &mut blocks[id as usize];
            if vllm {
                if b.key_index == index && b.key_slot == slot {
                    continue;
                }
                debug_assert!(!b.has_key(), "block {id} already cached");
            } else if *entry == id {
                continue;
            } else {
                // A fresh block: its count is written with its identity.
                b.ref_cnt = 1;
            }
            (b.key_slot, b.key_index) = (slot, index);
            if vllm && *entry != NONE {
                // vLLM 0.33 `BlockHashToBlockMap.insert`: a second block with
                // the same hash joins the first; lookups keep finding the
                // oldest (`get_one_block`), and each keeps its hash until
                // evicted.
                let key = BlockKey {
                    stream: s.stream,
                    index,
                };
                dups.entry(key).or_default().push(id);
                continue;
            }
            // A newer block with this content replaces the older one in
            // the index; the older one loses its identity.
            let old = std::mem::replace(entry, id);
            if old == NONE {
                added += 1;
            } else {
                let b = &mut blocks[old as usize];
                b.key_index = NONE;
                if b.in_queue() {
                    queue.num_free_cached -= 1;
                } else {
                    // Still held: its count stays its own.
                    b.key_slot = REPLACED;
                }
            }
        }
        s.count += added;
        s.held = held;
    }

    /// vLLM 0.33 (`BlockPool._maybe_evict_cached_block` →
    /// `BlockHashToBlockMap.pop`): block `id` loses identity (`slot`,
    /// `index`); if other blocks hold it, the oldest of them becomes the one
    /// lookups find.
    fn evict_vllm(&mut self, id: BlockId, slot: u32, index: u32) {
        let s = &mut self.slots[slot as usize];
        let key = BlockKey {
            stream: s.stream,
            index,
        };
        if let Some(dups) = self.dups.get_mut(&key) {
            let at = &mut s.at[index as usize];
            if *at == id {
                *at = dups.remove(0);
            } else {
                dups.retain(|&b| b != id);
            }
            if dups.is_empty() {
                self.dups.remove(&key);
            }
            return;
        }
        self.uncache(slot, index);
    }

    /// Forgets block `index` of the stream in `slot` (its block is being
    /// reused); a stream left with no cached block gives its slot back.
    /// (The index keeps its length: entries past the last cached block are
    /// NONE, as a look-up past its end reads, and shortening it would not
    /// give memory back.)
    fn uncache(&mut self, slot: u32, index: u32) {
        self.slots[slot as usize].at[index as usize] = NONE;
        uncache_run(
            &mut self.slots,
            &mut self.slot_of,
            &mut self.free_slots,
            slot,
            1,
            index,
        );
    }

    /// Drops one reference on each block of `table`, tail first; blocks that
    /// reach zero join the back of the free queue (keeping their identity).
    pub fn free(&mut self, table: &[BlockId]) {
        if self.vllm {
            return self.free_vllm(table);
        }
        // `push_back` block by block, with the queue's tail and counts kept
        // in locals until the end, and a block's `next` written once: by the
        // block after it, or at the end for the last (the same links, fewer
        // loads and stores). A held prefix (found by its top's own count,
        // 0) joins as one stretch, its inner links never written; a fresh
        // block gets a free block's fields.
        let BlockPool {
            blocks,
            slots,
            queue,
            ..
        } = self;
        let (mut tail, mut freed, mut cached) = (queue.tail, 0u32, 0u32);
        let mut i = table.len();
        while i > 0 {
            i -= 1;
            let id = table[i];
            let block = &mut blocks[id as usize];
            let back = if !own_fields(block, id, slots) {
                // Fresh: its one reference was this table's.
                (block.ref_cnt, block.key_index, block.key_slot) = (0, NONE, NONE);
                freed += 1;
                id
            } else if block.ref_cnt == 0 {
                // The last block of a held prefix (tail first): the whole
                // prefix is freed, in the order block by block would take.
                let s = &mut slots[block.key_slot as usize];
                let n = s.held;
                debug_assert!(
                    block.has_key() && block.key_index + 1 == n,
                    "block {id} is held"
                );
                debug_assert_eq!(&table[i + 1 - n as usize..=i], &s.at[..n as usize]);
                (s.held, s.queued) = (0, n);
                i -= n as usize - 1;
                freed += n;
                cached += n;
                s.at[0]
            } else {
                block.ref_cnt -= 1;
                if block.ref_cnt > 0 {
                    continue;
                }
                cached += block.has_key() as u32;
                if !block.has_key() {
                    // (No free block is marked REPLACED: allocated, it
                    // is fresh.)
                    block.key_slot = NONE;
                }
                freed += 1;
                id
            };
            blocks[id as usize].prev = tail;
            if tail == NONE {
                queue.head = id;
            } else {
                blocks[tail as usize].next = id;
            }
            tail = back;
        }
        if freed > 0 {
            blocks[tail as usize].next = NONE;
        }
        queue.tail = tail;
        queue.num_free += freed;
        queue.num_free_cached += cached;
    }

    /// vLLM 0.33 `BlockPool.free_blocks(reversed(blocks))`: blocks that
    /// reach zero references are taken tail first; those with a hash join the
    /// back of the queue in that order (`append_n`), those without (a partial
    /// last block) the front, the request's last block first (`prepend_n`:
    /// "LIFO reuse of non-cached blocks").
    fn free_vllm(&mut self, table: &[BlockId]) {
        let mut unhashed = false;
        for &id in table.iter().rev() {
            let block = &mut self.blocks[id as usize];
            if block.release(id) {
                if block.has_key() {
                    self.queue.num_free_cached += 1;
                    self.push_back(id);
                } else {
                    unhashed = true;
                }
            }
        }
        if unhashed {
            // Pushing to the front in table order leaves the tail block first.
            for &id in table {
                let b = &self.blocks[id as usize];
                // (Those with a hash were queued above.)
                if b.ref_cnt == 0 && !b.has_key() {
                    self.push_front(id);
                }
            }
        }
    }
}

/// Whether block `id`'s fields are its own rather than a fresh block's
/// leftovers ([`StreamBlocks`]): the index names it at the identity it
/// claims, or a newer copy took its identity while it was held. (Not for
/// the inner blocks of a held or queued prefix, which nothing reads.)
#[inline(always)]
fn own_fields(b: &Block, id: BlockId, slots: &[StreamBlocks]) -> bool {
    if b.has_key() {
        let named = slots
            .get(b.key_slot as usize)
            .and_then(|s| s.at.get(b.key_index as usize));
        named == Some(&id)
    } else {
        b.key_slot == REPLACED
    }
}

/// The stream in `slot` lost `count` cached blocks, the least at `least`,
/// whose entries are already NONE: its count and cached prefix follow, and
/// a stream left with no cached block gives its slot back. (A function of
/// the index's parts: allocation keeps the stream's entries borrowed.)
#[inline(always)]
fn uncache_run(
    slots: &mut [StreamBlocks],
    slot_of: &mut SlotMap,
    free_slots: &mut Vec<u32>,
    slot: u32,
    count: u32,
    least: u32,
) {
    let s = &mut slots[slot as usize];
    debug_assert!(s.held <= least, "a held block is evicted");
    s.count -= count;
    s.leading = s.leading.min(least);
    s.queued = s.queued.min(least);
    if s.count == 0 {
        slot_of.remove(&s.stream);
        // Its index keeps its length and memory, every entry NONE: the
        // stream that takes the slot next starts with it (no allocation,
        // no fill, where small pools evict whole streams all the time).
        debug_assert!(s.at.iter().all(|&b| b == NONE), "an uncached entry");
        s.leading = 0;
        free_slots.push(slot);
    }
}

/// Takes a reference on the leading blocks of `ids` while each is the block
/// just before the stretch's front in the free queue, from `ids[0]`, which
/// is (so each is free: a block in the queue has no references). Returns
/// how many, and the block before the grown stretch's front. A function of
/// its own, since inside `touch_prefix` its state would not stay in
/// registers: a cached prefix is usually one stretch, so this is most of
/// its blocks.
#[inline(never)]
fn grow_stretch(blocks: &mut [Block], ids: &[BlockId], first: BlockId) -> (usize, BlockId) {
    let mut front_prev = first;
    for (i, &id) in ids.iter().enumerate() {
        // The block is found by its id in `ids`, and only then compared:
        // found by `front_prev` (the same number when it grows), each look-up
        // would wait for the one before, a cache miss each.
        let b = &mut blocks[id as usize];
        if id != front_prev {
            return (i, front_prev);
        }
        debug_assert!(b.in_queue() && b.has_key(), "block {id} is free cached");
        b.ref_cnt = 1;
        front_prev = b.prev;
    }
    (ids.len(), front_prev)
}

/// Makes the first blocks of `stream` (in `slot`; its first one free, or
/// its first `queued` one free stretch) its held prefix: the leading ones
/// of its first `count` that are one stretch of the queue, cut out of it at
/// its two ends. Returns how many. Only the blocks past `queued` are looked
/// at, each found by its id in the index (not by the link before it, which
/// would make each look-up wait for the last).
fn take_held(
    blocks: &mut [Block],
    queue: &mut FreeQueue,
    slot: u32,
    stream: &mut StreamBlocks,
    count: u32,
) -> u32 {
    // (A queued prefix longer than the hit leaves its blocks past it in the
    // queue, as blocks of their own.)
    cut_queued(blocks, slot, stream, count);
    let at = &stream.at[..count as usize];
    let mut k = (stream.queued as usize).clamp(1, at.len());
    while k < at.len() && at[k] == blocks[at[k - 1] as usize].prev {
        k += 1;
    }
    let s = Stretch {
        front_prev: blocks[at[k - 1] as usize].prev,
        back_next: blocks[at[0] as usize].next,
    };
    queue.cut(blocks, s);
    // Its top's own fields: those of a free cached block already.
    debug_assert!({
        let top = &blocks[at[k - 1] as usize];
        (top.ref_cnt, top.key_slot, top.key_index) == (0, slot, k as u32 - 1)
    });
    stream.held = k as u32;
    stream.queued = 0;
    k as u32
}

/// The held prefix of `stream` (in `slot`) becomes blocks of their own,
/// counts of one: a second holder or a change of its index needs them.
#[cold]
fn write_out_hold(blocks: &mut [Block], slot: u32, stream: &mut StreamBlocks) {
    for (index, &id) in (0..).zip(&stream.at[..stream.held as usize]) {
        let b = &mut blocks[id as usize];
        (b.ref_cnt, b.key_slot, b.key_index) = (1, slot, index);
    }
    stream.held = 0;
}

/// Cuts the queued prefix of `stream` (in `slot`) to its first `to`
/// blocks: those past it stay in the queue as blocks of their own, and
/// they and the prefix's new top get their own fields ([`StreamBlocks`]):
/// a count of 0, their identity, and their links (block `i`'s `next` is
/// block `i − 1`, its `prev` block `i + 1`; the old top's `prev` and block
/// 0's `next` are already right).
#[inline]
fn cut_queued(blocks: &mut [Block], slot: u32, stream: &mut StreamBlocks, to: u32) {
    if to < stream.queued {
        write_out_queued(blocks, slot, stream, to);
    }
}

#[cold]
fn write_out_queued(blocks: &mut [Block], slot: u32, stream: &mut StreamBlocks, to: u32) {
    let (queued, at) = (stream.queued as usize, &stream.at);
    for i in (to as usize).saturating_sub(1)..queued {
        let b = &mut blocks[at[i] as usize];
        (b.ref_cnt, b.key_slot, b.key_index) = (0, slot, i as u32);
        if i > 0 {
            b.next = at[i - 1];
        }
        if i + 1 < queued {
            b.prev = at[i + 1];
        }
    }
    stream.queued = to;
}

/// `reusable(x) = ⌊(x − 1) / block_size⌋ × block_size`: a prefix hit covers
/// whole blocks only and never the last token (its logits must be computed).
pub fn reusable(tokens: u32, block_size: u32) -> u32 {
    if tokens == 0 {
        return 0;
    }
    (tokens - 1) / block_size * block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(stream: u64, index: u32) -> BlockKey {
        BlockKey { stream, index }
    }

    #[test]
    fn reusable_never_covers_the_last_token_or_a_partial_block() {
        // block 16: 32 tokens -> the last token must be computed, so one block.
        assert_eq!(reusable(32, 16), 16);
        assert_eq!(reusable(33, 16), 32);
        assert_eq!(reusable(16, 16), 0);
        assert_eq!(reusable(1, 16), 0);
        assert_eq!(reusable(0, 16), 0);
        assert_eq!(reusable(47, 16), 32);
    }

    #[test]
    fn allocation_pops_the_front_and_free_is_tail_first() {
        let mut pool = BlockPool::new(4, 16);
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        assert_eq!(a, vec![0, 1, 2]);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.num_held(), 3);
        // Freed in reverse: 2 first, then 1, then 0 join the back after 3.
        pool.free(&a);
        assert_eq!(pool.free_queue(), vec![3, 2, 1, 0]);
        assert!(!pool.allocate(5, &mut Vec::new()), "only 4 blocks exist");
        assert_eq!(pool.num_free(), 4);
    }

    #[test]
    fn freeing_into_an_empty_queue_starts_it_at_the_first_block_to_reach_zero() {
        // 3 blocks, all held (the queue is empty); block 2 is held twice.
        // Freeing [0, 1, 2] tail first: 2 stays held, 1 is the new head,
        // then 0 joins behind it. Then 2's last holder frees it: 1, 0, 2.
        let mut pool = BlockPool::new(3, 16);
        let mut t = Vec::new();
        pool.allocate(3, &mut t);
        pool.cache_block(t[2], key(5, 0));
        let mut other = Vec::new();
        pool.touch_prefix(&BlockPath::stream(5), 1, &mut other);
        assert_eq!((pool.num_free(), pool.ref_count(2)), (0, 2));
        pool.free(&t);
        assert_eq!(pool.free_queue(), vec![1, 0]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (2, 0));
        pool.free(&other);
        assert_eq!(pool.free_queue(), vec![1, 0, 2]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 1));
        // Nothing held: freeing an empty table changes nothing.
        pool.free(&[]);
        assert_eq!(pool.free_queue(), vec![1, 0, 2]);
    }

    #[test]
    fn eviction_takes_the_tail_of_a_prefix_first() {
        // 3 blocks, a session caches blocks (s,0),(s,1),(s,2), then frees them.
        let mut pool = BlockPool::new(3, 16);
        let mut t = Vec::new();
        pool.allocate(3, &mut t);
        for (i, &b) in t.iter().enumerate() {
            pool.cache_block(b, key(7, i as u32));
        }
        pool.free(&t);
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(7), 10), 3);
        assert_eq!(pool.num_free_cached(), 3);
        // One new block evicts (7,2): the prefix shrinks to 2 blocks, not 0.
        let mut u = Vec::new();
        pool.allocate(1, &mut u);
        assert_eq!(u, vec![2]);
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(7), 10), 2);
        assert!(!pool.is_cached(key(7, 2)));
    }

    #[test]
    fn a_hit_on_a_free_cached_block_takes_it_out_of_the_queue() {
        let mut pool = BlockPool::new(4, 16);
        let mut t = Vec::new();
        pool.allocate(2, &mut t);
        pool.cache_block(t[0], key(1, 0));
        pool.cache_block(t[1], key(1, 1));
        pool.free(&t);
        // Queue: 2, 3, 1, 0. Hitting both cached blocks leaves 2 free blocks,
        // so 2 more fit but 3 do not.
        assert!(pool.can_allocate_after_hit(&BlockPath::stream(1), 2, 2));
        assert!(!pool.can_allocate_after_hit(&BlockPath::stream(1), 2, 3));
        let mut table = Vec::new();
        pool.touch_prefix(&BlockPath::stream(1), 2, &mut table);
        assert_eq!(table, vec![0, 1]);
        assert_eq!(pool.free_queue(), vec![2, 3]);
        assert_eq!(pool.ref_count(0), 1);
        // A second holder shares the blocks: reference counts go to 2.
        let mut other = Vec::new();
        pool.touch_prefix(&BlockPath::stream(1), 1, &mut other);
        assert_eq!(pool.ref_count(0), 2);
        pool.free(&other);
        assert_eq!(pool.ref_count(0), 1);
        assert_eq!(pool.num_free(), 2, "still held by the first table");
    }

    #[test]
    fn a_hit_cuts_the_prefix_out_of_the_queue_stretch_by_stretch() {
        // 6 blocks; A caches (1,0),(1,1),(1,2) in blocks 0, 1, 2 and frees
        // them tail first: queue 3, 4, 5, 2, 1, 0.
        let mut pool = BlockPool::new(6, 16);
        let mut a = Vec::new();
        pool.allocate(3, &mut a);
        for (i, &b) in a.iter().enumerate() {
            pool.cache_block(b, key(1, i as u32));
        }
        pool.free(&a);
        // E hits block 0 alone (queue 3, 4, 5, 2, 1); G takes block 3 and
        // frees it (4, 5, 2, 1, 3); E frees block 0 (4, 5, 2, 1, 3, 0).
        let (mut e, mut g) = (Vec::new(), Vec::new());
        pool.touch_prefix(&BlockPath::stream(1), 1, &mut e);
        pool.allocate(1, &mut g);
        pool.free(&g);
        pool.free(&e);
        assert_eq!(pool.free_queue(), vec![4, 5, 2, 1, 3, 0]);
        // A hit on all three: block 0 is a stretch of its own (3 is
        // between it and block 1), blocks 1 and 2 another.
        let mut hit = Vec::new();
        pool.touch_prefix(&BlockPath::stream(1), 3, &mut hit);
        assert_eq!(hit, vec![0, 1, 2]);
        assert_eq!(pool.free_queue(), vec![4, 5, 3]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 0));
        // Freed again tail first, they join the back; a second holder of
        // block 0 (held, not in the queue) leaves the queue alone.
        pool.free(&hit);
        assert_eq!(pool.free_queue(), vec![4, 5, 3, 2, 1, 0]);
        let (mut h1, mut h2) = (Vec::new(), Vec::new());
        pool.touch_prefix(&BlockPath::stream(1), 1, &mut h1);
        pool.touch_prefix(&BlockPath::stream(1), 2, &mut h2);
        assert_eq!(pool.free_queue(), vec![4, 5, 3, 2]);
        assert_eq!((pool.ref_count(0), pool.ref_count(1)), (2, 1));
        assert_eq!((pool.num_free(), pool.num_free_cached()), (4, 1));
    }

    /// The stream's counts, for the tests: (held, queued).
    fn held_queued(pool: &BlockPool, stream: u64) -> (u32, u32) {
        pool.stream(stream).map_or((0, 0), |s| (s.held, s.queued))
    }

    /// A new table of `n` blocks, cached as the first `n` of `stream`.
    fn cached_table(pool: &mut BlockPool, n: u32, stream: u64) -> Vec<BlockId> {
        let mut table = Vec::new();
        assert!(pool.allocate(n, &mut table));
        pool.cache_blocks(&table, &BlockPath::stream(stream), 0, n);
        table
    }

    #[test]
    fn a_turn_holds_its_prefix_whole_and_frees_it_as_the_stretch_it_was() {
        // 8 blocks; turn 1 of stream 1 caches 4 blocks in 0..4 and frees
        // them tail first: queue 4, 5, 6, 7, 3, 2, 1, 0.
        let mut pool = BlockPool::new(8, 16);
        let path = BlockPath::stream(1);
        let t1 = cached_table(&mut pool, 4, 1);
        pool.free(&t1);
        assert_eq!(pool.free_queue(), vec![4, 5, 6, 7, 3, 2, 1, 0]);
        // Turn 2 hits 3 blocks: 2, 1, 0 are one stretch (block 0 at the
        // back, each one's link before it the next block), held as a whole:
        // no block's own count is written (the top's, block 2, stays 0),
        // the references are 1.
        let mut t2 = Vec::new();
        pool.touch_prefix(&path, 3, &mut t2);
        assert_eq!(t2, vec![0, 1, 2]);
        assert_eq!(pool.free_queue(), vec![4, 5, 6, 7, 3]);
        assert_eq!(held_queued(&pool, 1), (3, 0));
        assert_eq!(pool.blocks[2].ref_cnt, 0);
        assert_eq!(
            (0..4).map(|b| pool.ref_count(b)).collect::<Vec<_>>(),
            [1, 1, 1, 0]
        );
        assert_eq!((pool.num_free(), pool.num_free_cached()), (5, 1));
        // It takes 2 new blocks, 4 and 5 (block 4 had no identity), as
        // blocks 3 and 4 of the stream: block 3's old one (block 3, free)
        // loses its identity.
        pool.allocate(2, &mut t2);
        pool.cache_blocks(&t2, &path, 3, 5);
        assert_eq!(t2, vec![0, 1, 2, 4, 5]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 0));
        // Freed tail first: 5, 4 one by one, then 2, 1, 0 as the stretch
        // they left (queue 6, 7, 3, 5, 4, 2, 1, 0), the first 3 blocks
        // known to be one stretch of the queue.
        pool.free(&t2);
        assert_eq!(pool.free_queue(), vec![6, 7, 3, 5, 4, 2, 1, 0]);
        assert_eq!(held_queued(&pool, 1), (0, 3));
        assert_eq!((pool.num_free(), pool.num_free_cached()), (8, 5));
        check_consistent(&pool);
        // Turn 3 hits all 5: the 3 known ones are not looked at, blocks 4
        // and 5 are checked (each is the link before the last) and held too.
        let mut t3 = Vec::new();
        pool.touch_prefix(&path, 5, &mut t3);
        assert_eq!(held_queued(&pool, 1), (5, 0));
        assert_eq!(pool.free_queue(), vec![6, 7, 3]);
        // A second holder of the first 2: the counts are written out (1
        // each), then its own reference added.
        let mut other = Vec::new();
        pool.touch_prefix(&path, 2, &mut other);
        assert_eq!(held_queued(&pool, 1), (0, 0));
        assert_eq!(
            (0..6).map(|b| pool.ref_count(b)).collect::<Vec<_>>(),
            [2, 2, 1, 0, 1, 1]
        );
        check_consistent(&pool);
        // Freed one by one now, as before holds: 5, 4, 2 reach zero (queue
        // 6, 7, 3, 5, 4, 2), then the other holder's 1, 0.
        pool.free(&t3);
        pool.free(&other);
        assert_eq!(pool.free_queue(), vec![6, 7, 3, 5, 4, 2, 1, 0]);
        check_consistent(&pool);
    }

    #[test]
    fn a_tables_new_blocks_join_its_held_prefix_as_they_are_cached() {
        // 8 blocks; A takes 0, 1, 2 and caches its 2 full blocks: stream 1
        // starts there, so they are its held prefix (A alone holds them).
        let mut pool = BlockPool::new(8, 16);
        let path = BlockPath::stream(1);
        let mut a = Vec::new();
        pool.allocate(3, &mut a);
        pool.cache_blocks(&a, &path, 0, 2);
        assert_eq!(held_queued(&pool, 1), (2, 0));
        assert_eq!((pool.blocks[1].ref_cnt, pool.ref_count(1)), (0, 1));
        // Block 2 fills (a decode): A holds the first 2, so it joins them.
        pool.cache_blocks(&a, &path, 2, 3);
        assert_eq!(held_queued(&pool, 1), (3, 0));
        // B, another table, takes 3..7 and caches its block 3 as the
        // stream's block 3 (block 6): B does not hold the prefix, so block
        // 6 keeps its own count; A's own block 3 (block 7, taken next)
        // replaces it and does not join either (the index named a block).
        let mut b = Vec::new();
        pool.allocate(4, &mut b);
        pool.cache_blocks(&b, &path, 3, 4);
        pool.allocate(1, &mut a);
        pool.cache_blocks(&a, &path, 3, 4);
        assert_eq!(a, vec![0, 1, 2, 7]);
        assert_eq!(held_queued(&pool, 1), (3, 0));
        assert_eq!(
            (0..8).map(|b| pool.ref_count(b)).collect::<Vec<_>>(),
            [1; 8]
        );
        check_consistent(&pool);
        // A freed tail first: block 7 by itself, then 2, 1, 0 as the one
        // stretch they were linked as (queue 7, 2, 1, 0); B's 6, 5, 4, 3.
        pool.free(&a);
        assert_eq!(pool.free_queue(), vec![7, 2, 1, 0]);
        assert_eq!(held_queued(&pool, 1), (0, 3));
        pool.free(&b);
        assert_eq!(pool.free_queue(), vec![7, 2, 1, 0, 6, 5, 4, 3]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (8, 4));
        check_consistent(&pool);
    }

    #[test]
    fn allocation_takes_a_streams_blocks_freed_together_as_one_run() {
        // Stream 1 in blocks 0..3, stream 2 in 3..6, freed in that order:
        // queue 6, 7, 2, 1, 0, 5, 4, 3.
        let mut pool = BlockPool::new(8, 16);
        let a = cached_table(&mut pool, 3, 1);
        let b = cached_table(&mut pool, 3, 2);
        pool.free(&a);
        pool.free(&b);
        assert_eq!(pool.free_queue(), vec![6, 7, 2, 1, 0, 5, 4, 3]);
        // A hit on stream 2's block 0 (block 3) and a block taken (6) and
        // freed before it: queue 7, 2, 1, 0, 5, 4, 6, 3.
        let (mut hit, mut c) = (Vec::new(), Vec::new());
        pool.touch_prefix(&BlockPath::stream(2), 1, &mut hit);
        pool.allocate(1, &mut c);
        pool.free(&c);
        pool.free(&hit);
        assert_eq!(pool.free_queue(), vec![7, 2, 1, 0, 5, 4, 6, 3]);
        // 7 blocks: 7 (no identity); stream 1's 2, 1, 0 as one run (its
        // blocks 2, 1, 0 in the index follow one another in the queue):
        // nothing of it is cached after; stream 2's 5, 4, where the run
        // stops (6, not its block 0, follows 4); 6. Stream 2 keeps block 0.
        c.clear();
        assert!(pool.allocate(7, &mut c));
        assert_eq!(c, vec![7, 2, 1, 0, 5, 4, 6]);
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(1), 3), 0);
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(2), 3), 1);
        assert_eq!(pool.free_queue(), vec![3]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (1, 1));
        check_consistent(&pool);
    }

    // The next four follow a queued prefix, whose blocks but its top keep
    // no fields of their own (`StreamBlocks`), through what leaves it:
    // allocation part way into it, a shorter hit, a newer copy, and a walk
    // from blocks queued before it.

    #[test]
    fn allocation_part_way_into_a_queued_prefix_leaves_the_rest_queued() {
        // 6 blocks; stream 1 caches 4 in 0..4 and frees them: queue 4, 5,
        // 3, 2, 1, 0, the last four its queued prefix.
        let mut pool = BlockPool::new(6, 16);
        let path = BlockPath::stream(1);
        let t = cached_table(&mut pool, 4, 1);
        pool.free(&t);
        assert_eq!(held_queued(&pool, 1), (0, 4));
        // 3 blocks: 4, 5 (no identity), then block 3, evicting (1, 3):
        // stream 1 keeps 3 blocks, queued, block 2 now its top.
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        assert_eq!(a, vec![4, 5, 3]);
        assert_eq!(held_queued(&pool, 1), (0, 3));
        assert_eq!(pool.cached_prefix_blocks(&path, 4), 3);
        assert_eq!(pool.free_queue(), vec![2, 1, 0]);
        check_consistent(&pool);
        // The next block taken is that top, block 2, evicting (1, 2).
        let mut b = Vec::new();
        assert!(pool.allocate(1, &mut b));
        assert_eq!(b, vec![2]);
        assert_eq!(pool.cached_prefix_blocks(&path, 4), 2);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (2, 2));
        check_consistent(&pool);
        // A hit on the two left takes the stretch 1, 0 whole.
        let mut hit = Vec::new();
        pool.touch_prefix(&path, 2, &mut hit);
        assert_eq!(hit, vec![0, 1]);
        assert_eq!(held_queued(&pool, 1), (2, 0));
        assert!(pool.free_queue().is_empty());
        check_consistent(&pool);
    }

    #[test]
    fn a_hit_shorter_than_the_queued_prefix_leaves_its_tail_free_cached() {
        // 6 blocks; stream 1's 4 blocks 0..4 freed: queue 4, 5, 3, 2, 1, 0.
        let mut pool = BlockPool::new(6, 16);
        let path = BlockPath::stream(1);
        let t = cached_table(&mut pool, 4, 1);
        pool.free(&t);
        // A hit on 2: blocks 1, 0 are cut out and held; blocks 3 and 2 stay
        // in the queue, free cached, as blocks of their own.
        let mut hit = Vec::new();
        pool.touch_prefix(&path, 2, &mut hit);
        assert_eq!(hit, vec![0, 1]);
        assert_eq!(held_queued(&pool, 1), (2, 0));
        assert_eq!(pool.free_queue(), vec![4, 5, 3, 2]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (4, 2));
        check_consistent(&pool);
        // Allocating all 4 evicts (1, 3) and (1, 2); the held 2 remain.
        let mut a = Vec::new();
        assert!(pool.allocate(4, &mut a));
        assert_eq!(a, vec![4, 5, 3, 2]);
        assert_eq!(pool.cached_prefix_blocks(&path, 4), 2);
        check_consistent(&pool);
        // Freed, the held prefix joins the queue as its stretch: 1, 0.
        pool.free(&hit);
        assert_eq!(pool.free_queue(), vec![1, 0]);
        assert_eq!(held_queued(&pool, 1), (0, 2));
        check_consistent(&pool);
    }

    #[test]
    fn a_newer_copy_of_queued_blocks_cuts_the_queued_prefix() {
        // 6 blocks; stream 1's blocks 0..3 freed: queue 3, 4, 5, 2, 1, 0.
        let mut pool = BlockPool::new(6, 16);
        let path = BlockPath::stream(1);
        let t = cached_table(&mut pool, 3, 1);
        pool.free(&t);
        // A table of 3 new blocks (3, 4, 5) caches stream 1's blocks 1 and
        // 2 again: blocks 4 and 5 replace blocks 1 and 2 in the index, which
        // stay in the queue without an identity; the queued prefix is
        // block 0 alone.
        let mut b = Vec::new();
        assert!(pool.allocate(3, &mut b));
        pool.cache_blocks(&b, &path, 1, 3);
        assert_eq!(held_queued(&pool, 1), (0, 1));
        assert_eq!(pool.free_queue(), vec![2, 1, 0]);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 1));
        assert_eq!(pool.cached_prefix_blocks(&path, 3), 3);
        check_consistent(&pool);
        // Taking 2 evicts nothing (2 and 1 have no identity); a hit on
        // block 0 of the stream then takes block 0.
        let mut c = Vec::new();
        assert!(pool.allocate(2, &mut c));
        assert_eq!(c, vec![2, 1]);
        assert_eq!(pool.num_free_cached(), 1);
        let mut hit = Vec::new();
        pool.touch_prefix(&path, 1, &mut hit);
        assert_eq!(hit, vec![0]);
        assert!(pool.free_queue().is_empty());
        check_consistent(&pool);
    }

    #[test]
    fn allocation_walks_from_a_block_queued_before_a_prefix_into_it() {
        // 8 blocks. Table b (blocks 0..4) caches stream 1's block 3 in
        // block 3; table a (4..8) caches blocks 0..4 of it: 4, 5, 6 join
        // its held prefix, 7 replaces 3 as block 3 (its entry was taken),
        // referenced on its own.
        let mut pool = BlockPool::new(8, 16);
        let path = BlockPath::stream(1);
        let mut b = Vec::new();
        assert!(pool.allocate(4, &mut b));
        pool.cache_blocks(&b, &path, 3, 4);
        let a = cached_table(&mut pool, 4, 1);
        assert_eq!(a, vec![4, 5, 6, 7]);
        assert_eq!(held_queued(&pool, 1), (3, 0));
        // Freed, b then a: queue 3, 2, 1, 0, then 7 on its own, then the
        // prefix 6, 5, 4 as one stretch.
        pool.free(&b);
        pool.free(&a);
        assert_eq!(pool.free_queue(), vec![3, 2, 1, 0, 7, 6, 5, 4]);
        assert_eq!(held_queued(&pool, 1), (0, 3));
        assert_eq!((pool.num_free(), pool.num_free_cached()), (8, 4));
        check_consistent(&pool);
        // All 8: 3, 2, 1, 0 (no identity), then block 7, the stream's
        // block 3, whose link leads into the queued prefix: taken with it
        // as one run (the prefix's inner links are not read).
        let mut c = Vec::new();
        assert!(pool.allocate(8, &mut c));
        assert_eq!(c, vec![3, 2, 1, 0, 7, 6, 5, 4]);
        assert_eq!(pool.cached_prefix_blocks(&path, 4), 0);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (0, 0));
        check_consistent(&pool);
    }

    #[test]
    fn a_hit_on_blocks_queued_front_to_back_cuts_each_stretch_after_the_last() {
        // Blocks 0 and 1 cache (5,0) and (5,1) in two tables freed in that
        // order: queue 2, 3, 0, 1 (block 0 before block 1, not behind it).
        let mut pool = BlockPool::new(4, 16);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.allocate(1, &mut a);
        pool.allocate(1, &mut b);
        pool.cache_block(a[0], key(5, 0));
        pool.cache_block(b[0], key(5, 1));
        pool.free(&a);
        pool.free(&b);
        assert_eq!(pool.free_queue(), vec![2, 3, 0, 1]);
        // Block 0 is a stretch, block 1 (its back neighbour) a second one:
        // cutting the first relinks block 1, whose new front neighbour (3)
        // the second cut must use.
        let mut hit = Vec::new();
        pool.touch_prefix(&BlockPath::stream(5), 2, &mut hit);
        assert_eq!(hit, vec![0, 1]);
        assert_eq!(pool.free_queue(), vec![2, 3]);
        let mut c = Vec::new();
        assert!(pool.allocate(2, &mut c));
        assert_eq!(c, vec![2, 3]);
        assert!(pool.free_queue().is_empty());
    }

    #[test]
    fn a_newer_copy_replaces_the_index_entry_and_eviction_of_the_old_keeps_it() {
        let mut pool = BlockPool::new(2, 4);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.allocate(1, &mut a);
        pool.allocate(1, &mut b);
        pool.cache_block(a[0], key(3, 0));
        pool.cache_block(b[0], key(3, 0));
        pool.free(&a);
        // Reallocating block a evicts its identity but the index names b.
        let mut c = Vec::new();
        pool.allocate(1, &mut c);
        assert_eq!(c, a);
        assert!(pool.is_cached(key(3, 0)));
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(3), 5), 1);
        assert_eq!(pool.num_free_cached(), 0);
        pool.free(&b);
        assert_eq!(pool.num_free_cached(), 1);
    }

    #[test]
    fn a_block_held_twice_keeps_its_count_when_a_newer_copy_takes_its_identity() {
        // 4 blocks. Table a caches stream 1's block 0 in block 0, which b
        // hits: two references (the held prefix written out for the second
        // holder).
        let mut pool = BlockPool::new(4, 16);
        let path = BlockPath::stream(1);
        let a = cached_table(&mut pool, 1, 1);
        let mut b = Vec::new();
        pool.touch_prefix(&path, 1, &mut b);
        assert_eq!((a[0], b[0]), (0, 0));
        assert_eq!(pool.ref_count(0), 2);
        // Table c caches the same content in block 1: the index now names
        // block 1, and block 0, still held by a and b, keeps its 2.
        let c = cached_table(&mut pool, 1, 1);
        assert_eq!(c, vec![1]);
        assert_eq!(pool.ref_counts(), vec![2, 1, 0, 0]);
        check_consistent(&pool);
        // Freeing a leaves it held by b (not queued); freeing b frees it,
        // without identity: 3 free blocks, none cached.
        pool.free(&a);
        assert_eq!((pool.num_free(), pool.ref_count(0)), (2, 1));
        check_consistent(&pool);
        pool.free(&b);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 0));
        assert_eq!(pool.free_queue(), vec![2, 3, 0]);
        check_consistent(&pool);
        // Allocated again, block 0 is fresh; freed uncached, it is free.
        let mut d = Vec::new();
        assert!(pool.allocate(3, &mut d));
        assert_eq!(d, vec![2, 3, 0]);
        pool.free(&d);
        assert_eq!((pool.num_free(), pool.num_free_cached()), (3, 0));
        assert_eq!(pool.free_queue(), vec![0, 3, 2]);
        check_consistent(&pool);
    }

    fn vllm_pool(num_gpu_blocks: u32, block_size: u32) -> BlockPool {
        BlockPool::for_engine(num_gpu_blocks, block_size, EngineSemantics::Vllm033)
    }

    #[test]
    fn vllm_has_a_null_block() {
        assert_eq!(vllm_pool(11, 4).num_blocks(), 10);
    }

    #[test]
    fn vllm_frees_the_partial_last_block_to_the_front() {
        // 5 blocks; a request holds 3: two full (cached) and a partial one.
        let mut pool = vllm_pool(6, 4);
        let mut t = Vec::new();
        pool.allocate(3, &mut t);
        pool.cache_block(t[0], key(1, 0));
        pool.cache_block(t[1], key(1, 1));
        pool.free(&t);
        // Queue: the partial block first, then the never-used ones, then the
        // cached blocks tail first (block 1 is evicted before block 0).
        assert_eq!(pool.free_queue(), vec![2, 3, 4, 1, 0]);
        assert_eq!(pool.num_free_cached(), 2);
        // The reference frees everything to the back.
        let mut r = BlockPool::new(5, 4);
        let mut t = Vec::new();
        r.allocate(3, &mut t);
        r.cache_block(t[0], key(1, 0));
        r.cache_block(t[1], key(1, 1));
        r.free(&t);
        assert_eq!(r.free_queue(), vec![3, 4, 2, 1, 0]);
    }

    #[test]
    fn vllm_keeps_duplicate_blocks_and_finds_the_oldest() {
        let mut pool = vllm_pool(4, 4);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.allocate(1, &mut a);
        pool.allocate(1, &mut b);
        pool.cache_block(a[0], key(3, 0));
        pool.cache_block(b[0], key(3, 0));
        // Lookups find the first holder; both keep the identity.
        let mut hit = Vec::new();
        pool.touch_prefix(&BlockPath::stream(3), 1, &mut hit);
        assert_eq!(hit, a);
        pool.free(&hit);
        pool.free(&a);
        pool.free(&b);
        assert_eq!(pool.num_free_cached(), 2);
        // Queue: [2, a, b]. Allocating two evicts 2 (uncached) and a: the
        // identity survives in b, which lookups now find.
        let mut c = Vec::new();
        pool.allocate(2, &mut c);
        assert_eq!(c, vec![2, a[0]]);
        assert_eq!(pool.cached_prefix_blocks(&BlockPath::stream(3), 1), 1);
        let mut hit = Vec::new();
        pool.touch_prefix(&BlockPath::stream(3), 1, &mut hit);
        assert_eq!(hit, b);
        assert_eq!(pool.num_free_cached(), 0);
    }

    /// Every structure of the pool agrees with every other: the queue
    /// walked from its head is linked both ways and holds exactly the blocks
    /// no one references, its counts are right, and the index names each
    /// cached block where the block says it is.
    fn check_consistent(pool: &BlockPool) {
        let queue = pool.free_queue();
        assert_eq!(queue.len() as u32, pool.num_free());
        let refs = pool.ref_counts();
        // The blocks of a held or queued prefix but its top: their own
        // fields mean nothing (block 0 of a queued one keeps its `next`,
        // which the walk of the queue follows).
        let mut inner = vec![false; pool.blocks.len()];
        for s in &pool.slots {
            let n = s.held.max(s.queued).saturating_sub(1) as usize;
            for &id in &s.at[..n] {
                inner[id as usize] = true;
            }
        }
        let mut prev = NONE;
        for &id in &queue {
            assert_eq!(refs[id as usize], 0, "block {id} in the queue");
            if !inner[id as usize] {
                assert_eq!(pool.blocks[id as usize].prev, prev, "block {id}'s prev");
            }
            prev = id;
        }
        assert_eq!(pool.queue.tail, prev);
        let unreferenced = refs.iter().filter(|&&r| r == 0).count();
        assert_eq!(
            unreferenced,
            queue.len(),
            "the unreferenced blocks are the queue"
        );
        let cached = queue
            .iter()
            .filter(|&&id| inner[id as usize] || pool.blocks[id as usize].has_key());
        assert_eq!(cached.count() as u32, pool.num_free_cached());
        for (&stream, &slot) in &pool.slot_of {
            let s = &pool.slots[slot as usize];
            assert_eq!(s.stream, stream);
            assert_eq!(
                s.count as usize,
                s.at.iter().filter(|&&b| b != NONE).count()
            );
            assert_eq!(
                s.leading as usize,
                s.at.iter().take_while(|&&b| b != NONE).count()
            );
            for (i, &id) in s.at.iter().enumerate().filter(|(_, b)| **b != NONE) {
                if !inner[id as usize] {
                    let b = &pool.blocks[id as usize];
                    assert_eq!((b.key_slot, b.key_index), (slot, i as u32), "block {id}");
                }
            }
            // A held prefix: out of the queue, its top's own count 0. A
            // queued one: free, one stretch, block 0 nearest the back.
            assert!(
                s.held == 0 || s.queued == 0,
                "stream {stream} held and queued"
            );
            if s.held > 0 {
                let top = s.at[s.held as usize - 1];
                assert_eq!(pool.blocks[top as usize].ref_cnt, 0, "held top {top}");
                assert!(
                    s.at[..s.held as usize]
                        .iter()
                        .all(|b| refs[*b as usize] == 1)
                );
            }
            if s.queued > 0 {
                let q = s.queued as usize;
                let top = s.at[q - 1];
                let from = queue.iter().position(|&b| b == top).expect("queued");
                let stretch: Vec<BlockId> = s.at[..q].iter().rev().copied().collect();
                assert_eq!(&queue[from..from + q], &stretch[..], "stream {stream}");
                assert_eq!(pool.blocks[top as usize].ref_cnt, 0, "queued top {top}");
            }
        }
        // A block's identity is the index's, for every block whose fields
        // are its own: a free one (but the inner blocks of a queued
        // prefix) with the reference semantics, any with vLLM's (fresh
        // blocks' fields are leftovers).
        // (No free block of its own fields is marked REPLACED: allocated,
        // it would be fresh.)
        let mut free_own = vec![false; pool.blocks.len()];
        for &id in &queue {
            free_own[id as usize] = !inner[id as usize];
            let b = &pool.blocks[id as usize];
            assert!(
                !free_own[id as usize] || b.key_slot != REPLACED,
                "free block {id} marked replaced"
            );
        }
        let own = |id: usize| pool.vllm || free_own[id];
        for (id, b) in (pool.blocks.iter().enumerate()).filter(|&(id, b)| b.has_key() && own(id)) {
            let at = pool.slots[b.key_slot as usize].at[b.key_index as usize];
            let key = BlockKey {
                stream: pool.slots[b.key_slot as usize].stream,
                index: b.key_index,
            };
            let dup = pool
                .dups
                .get(&key)
                .is_some_and(|d| d.contains(&(id as u32)));
            assert!(
                at == id as u32 || dup,
                "block {id} is found by its identity"
            );
        }
    }

    /// The reference semantics written plainly (a queue of ids, an identity
    /// map), to hold the pool's shortcuts against.
    struct Plain {
        queue: std::collections::VecDeque<BlockId>,
        refs: Vec<u32>,
        key_of: Vec<Option<BlockKey>>,
        holder: HashMap<BlockKey, BlockId>,
    }

    impl Plain {
        fn new(n: u32) -> Plain {
            Plain {
                queue: (0..n).collect(),
                refs: vec![0; n as usize],
                key_of: vec![None; n as usize],
                holder: HashMap::new(),
            }
        }
        fn leading(&self, stream: u64) -> u32 {
            (0..)
                .take_while(|&index| self.holder.contains_key(&key(stream, index)))
                .count() as u32
        }
        fn touch(&mut self, stream: u64, n: u32, table: &mut Vec<BlockId>) {
            for index in 0..n {
                let id = self.holder[&key(stream, index)];
                if self.refs[id as usize] == 0 {
                    self.queue.retain(|&b| b != id);
                }
                self.refs[id as usize] += 1;
                table.push(id);
            }
        }
        fn allocate(&mut self, n: u32, table: &mut Vec<BlockId>) {
            for _ in 0..n {
                let id = self.queue.pop_front().expect("checked");
                if let Some(k) = self.key_of[id as usize].take() {
                    self.holder.remove(&k);
                }
                self.refs[id as usize] = 1;
                table.push(id);
            }
        }
        fn cache(&mut self, table: &[BlockId], stream: u64, from: u32, to: u32) {
            for k in from..to {
                let (id, key) = (table[k as usize], key(stream, k));
                if self.key_of[id as usize] == Some(key) {
                    continue;
                }
                if let Some(old) = self.holder.insert(key, id) {
                    self.key_of[old as usize] = None;
                }
                self.key_of[id as usize] = Some(key);
            }
        }
        fn free(&mut self, table: &[BlockId]) {
            for &id in table.iter().rev() {
                self.refs[id as usize] -= 1;
                if self.refs[id as usize] == 0 {
                    self.queue.push_back(id);
                }
            }
        }
    }

    /// A request of the random workload: its stream, its tokens so far and
    /// its block table.
    struct Holder {
        stream: u64,
        tokens: u32,
        table: Vec<BlockId>,
    }

    /// Requests on four streams arrive, grow a block at a time (decode)
    /// and end, at random, in a pool small enough that they evict one
    /// another's prefixes; after every operation the pool is consistent,
    /// and with the reference semantics it is, block for block, the plain
    /// model's (the same queue order, identities and reference counts).
    #[test]
    fn a_random_workload_keeps_the_pool_consistent_and_as_the_plain_model() {
        use rand::{RngExt, SeedableRng};
        for semantics in [EngineSemantics::Reference, EngineSemantics::Vllm033] {
            let (n, bs) = (24, 4);
            let mut pool = BlockPool::for_engine(n, bs, semantics);
            let reference = semantics == EngineSemantics::Reference;
            let mut plain = Plain::new(n);
            let mut live: Vec<Holder> = Vec::new();
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
            let (mut hits, mut evictions) = (0u32, 0u32);
            for _ in 0..20_000 {
                let op = rng.random_range(0..3);
                if op == 0 || live.is_empty() {
                    let stream = rng.random_range(0..4u64);
                    let tokens = rng.random_range(1..=12 * bs);
                    let path = BlockPath::stream(stream);
                    let hit = pool.cached_prefix_blocks(&path, reusable(tokens, bs) / bs);
                    let new = pool.blocks_for(tokens) - hit;
                    if !pool.can_allocate_after_hit(&path, hit, new) {
                        continue;
                    }
                    // Free cached blocks that neither the hit took nor
                    // allocation left: evicted.
                    let kept = pool.num_free_cached() - pool.free_among_prefix(&path, hit);
                    let mut table = Vec::new();
                    pool.touch_prefix(&path, hit, &mut table);
                    pool.allocate(new, &mut table);
                    evictions += kept - pool.num_free_cached();
                    pool.cache_blocks(&table, &path, hit, tokens / bs);
                    hits += hit;
                    if reference {
                        assert_eq!(plain.leading(stream).min(reusable(tokens, bs) / bs), hit);
                        let mut t = Vec::new();
                        plain.touch(stream, hit, &mut t);
                        plain.allocate(new, &mut t);
                        plain.cache(&t, stream, hit, tokens / bs);
                        assert_eq!(t, table);
                    }
                    live.push(Holder {
                        stream,
                        tokens,
                        table,
                    });
                } else if op == 1 {
                    // A decode of `bs` tokens: the full blocks are cached.
                    let h = rng.random_range(0..live.len());
                    let h = &mut live[h];
                    let tokens = h.tokens + bs;
                    let need = pool.blocks_for(tokens) - h.table.len() as u32;
                    if need > pool.num_free() {
                        continue;
                    }
                    let path = BlockPath::stream(h.stream);
                    let from = h.tokens / bs;
                    let at = h.table.len();
                    pool.allocate(need, &mut h.table);
                    pool.cache_blocks(&h.table, &path, from, tokens / bs);
                    if reference {
                        let mut t = h.table[..at].to_vec();
                        plain.allocate(need, &mut t);
                        assert_eq!(t, h.table);
                        plain.cache(&h.table, h.stream, from, tokens / bs);
                    }
                    h.tokens = tokens;
                } else {
                    let h = live.swap_remove(rng.random_range(0..live.len()));
                    pool.free(&h.table);
                    if reference {
                        plain.free(&h.table);
                    }
                }
                check_consistent(&pool);
                if reference {
                    assert_eq!(pool.free_queue(), Vec::from(plain.queue.clone()));
                    assert_eq!(pool.ref_counts(), plain.refs);
                    for stream in 0..4 {
                        let all = BlockPath::stream(stream);
                        assert_eq!(pool.cached_prefix_blocks(&all, 64), plain.leading(stream));
                    }
                }
            }
            // The workload did what it is for: hits, sharing, eviction.
            assert!(
                hits > 10_000 && evictions > 1_000,
                "{hits} hits, {evictions} evictions"
            );
        }
    }
}
