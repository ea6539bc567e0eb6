//! Inodes: the per-CPU inode tables on media and each file's extent map.
//!
//! A file indexes its data by extents. The records live in slots: eight inside the inode, more in
//! a chain of extent-index blocks. The DRAM `FileMap` (an [`ExtentMap`] by logical block) is
//! rebuilt from the slots at mount and keeps, for each extent, the slot that holds it, so an
//! update writes only the records that changed. Records at logical blocks at or beyond the
//! inode's `map_end` are dead.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::alloc::BlockRun;
use crate::media::checksum;
use crate::media::layout::{
    BLOCK_BYTES, BLOCK_SIZE, EXTENT_BYTES, EXTENT_SIZE, ExtentRecord, Geometry, INDEX_MAGIC,
    INDEX_SLOTS, INLINE_SLOTS, get_u32, get_u64, index_block, ino,
};
use crate::media::journal::Tx;
use crate::media::pool::{Category, Pool};
pub use crate::meta::extent_map::{Extent, ExtentMap, SlotId};
use std::collections::{BTreeMap, BTreeSet};

/// A file's slots: which are free, and the extent-index blocks holding those past the inode's
/// eight. Free slots are bits: the eight inline ones in a byte, each extent-index block's 255 in
/// four words. A new or small file allocates nothing for them, and adding or dropping an index
/// block sets or frees 32 bytes instead of 255 tree entries (a B-tree here cost a churn of small
/// files 12% of its time).
#[derive(Clone, Debug, Default)]
struct Slots {
    /// Bit `s` set: inline slot `s` is free.
    inline: u8,
    /// The extent-index chain. Nearly every file has none, so this is one word in every inode's
    /// map instead of the chain's 64 bytes; it is made with the file's first index block (blocks
    /// stay in the chain while the map lives, so it is dropped with the map).
    chain: Option<Box<IndexChain>>,
}

/// The extent-index blocks of a file and their free slots.
#[derive(Clone, Debug, Default)]
struct IndexChain {
    /// The extent-index block chain, in order (block k holds slots `8 + k*255 ..`).
    index_blocks: Vec<u64>,
    /// Word `s / 64` of entry `k`, bit `s % 64` set: slot `s` of index block `k` is free.
    chained: Vec<[u64; 4]>,
    /// Set bits in `chained`.
    chained_free: usize,
    /// Every entry of `chained` below this one is empty (where `pop_first` starts looking).
    first_nonempty: usize,
}

const _: () = assert!(INLINE_SLOTS == u8::BITS as usize, "one bit per inline slot");
const _: () = assert!(INDEX_SLOTS <= 4 * u64::BITS as usize, "four words per index block");

impl Slots {
    /// Every inline slot free.
    fn all_inline() -> Slots {
        Slots {
            inline: u8::MAX,
            chain: None,
        }
    }

    /// The extent-index blocks, in chain order.
    fn index_blocks(&self) -> &[u64] {
        self.chain.as_deref().map_or(&[], |c| &c.index_blocks)
    }

    /// Append `block` to the chain; its position in it.
    fn push_index_block(&mut self, block: u64) -> usize {
        let c = self.chain.get_or_insert_default();
        c.index_blocks.push(block);
        c.index_blocks.len() - 1
    }

    fn insert(&mut self, slot: SlotId) {
        match u8::try_from(slot) {
            Ok(s) if usize::from(s) < INLINE_SLOTS => self.inline |= 1 << s,
            _ => {
                let i = slot as usize - INLINE_SLOTS;
                let (k, s) = (i / INDEX_SLOTS, i % INDEX_SLOTS);
                // A chained slot is freed only once its index block is in the chain (except in
                // this type's own tests), so this makes no chain for a file that has none.
                let c = self.chain.get_or_insert_default();
                if c.chained.len() <= k {
                    c.chained.resize(k + 1, [0; 4]);
                }
                let (word, bit) = (&mut c.chained[k][s / 64], 1u64 << (s % 64));
                if *word & bit == 0 {
                    *word |= bit;
                    c.chained_free += 1;
                }
                c.first_nonempty = c.first_nonempty.min(k);
            }
        }
    }

    /// The lowest free slot (inline ones first: they have the lowest numbers), taken.
    fn pop_first(&mut self) -> Option<SlotId> {
        if self.inline != 0 {
            let s = self.inline.trailing_zeros();
            self.inline &= !(1 << s);
            return Some(s);
        }
        let c = self.chain.as_deref_mut().filter(|c| c.chained_free != 0)?;
        for k in c.first_nonempty..c.chained.len() {
            if let Some(w) = c.chained[k].iter().position(|&w| w != 0) {
                c.first_nonempty = k;
                let word = &mut c.chained[k][w];
                let bit = word.trailing_zeros() as usize;
                *word &= !(1u64 << bit);
                c.chained_free -= 1;
                return index_slot(k, w * 64 + bit);
            }
        }
        None
    }

    fn len(&self) -> usize {
        self.inline.count_ones() as usize + self.chain.as_ref().map_or(0, |c| c.chained_free)
    }
}

/// A file's logical-to-physical map.
#[derive(Clone, Debug, Default)]
pub struct FileMap {
    /// Extents by first logical block.
    pub extents: ExtentMap,
    slots: Slots,
}

// One per inode in DRAM: the extents' vector (or boxed B-tree), the inline free-slot bits and
// the boxed index chain.
const _: () = assert!(size_of::<FileMap>() <= 40);

/// Slot id of slot `s` of the `k`-th extent-index block, or None past `SlotId::MAX` (a chain of
/// more than 16.8 million index blocks).
fn index_slot(k: usize, s: usize) -> Option<SlotId> {
    k.checked_mul(INDEX_SLOTS)
        .and_then(|x| x.checked_add(INLINE_SLOTS + s))
        .and_then(|x| SlotId::try_from(x).ok())
}

/// Pool offset of record `i` of the slot array that starts at pool offset `base`.
fn record_offset(base: u64, i: u64) -> u64 {
    base + i * EXTENT_SIZE
}

/// The media changes an extent-map update needs, to be written in one transaction.
#[derive(Debug, Default)]
pub struct MapUpdate {
    /// Slot contents to write (journaled).
    pub slot_writes: BTreeMap<SlotId, ExtentRecord>,
    /// Physical blocks no longer referenced: free them after the transaction commits.
    pub freed: Vec<BlockRun>,
    /// Index-block link writes (pool offset, new `next` value), journaled.
    pub links: Vec<(u64, u64)>,
    /// New value for the inode's `index_block` field, if the first index block was added.
    pub first_index_block: Option<u64>,
    /// Dead slots (beyond a lowered `map_end`): zero them after commit, unjournaled.
    pub dead_slots: Vec<SlotId>,
}

/// A map as [`FileMap::load`] found it on media.
#[derive(Debug)]
pub struct LoadedMap {
    /// The map.
    pub map: FileMap,
    /// Slots holding dead records (at or beyond `map_end`), for mount to zero (none in a block
    /// that fails its checksum).
    pub dead: Vec<SlotId>,
    /// Extent-index blocks of the chain that fail their checksum although every record in
    /// them passed validation (a mount that serves files refuses them; fsck reports them).
    pub bad_checksum: Vec<u64>,
}

impl MapUpdate {
    /// The extent-index blocks this update changes — a slot written or killed (`dead_slots`), or
    /// `next` relinked — whose checksum its transaction must carry (`Tx::seal_index_block`).
    pub fn index_blocks_touched(&self, map: &FileMap) -> BTreeSet<u64> {
        let mut v: BTreeSet<u64> = self
            .slot_writes
            .keys()
            .chain(&self.dead_slots)
            .filter_map(|&s| map.index_block_of(s))
            .collect();
        v.extend(self.links.iter().map(|&(off, _)| off / BLOCK_SIZE));
        v
    }
}

impl FileMap {
    /// The extent-index block holding `slot`, or None for an inline slot (or one past the
    /// chain).
    pub fn index_block_of(&self, slot: SlotId) -> Option<u64> {
        let i = (slot as usize).checked_sub(INLINE_SLOTS)?;
        self.index_blocks().get(i / INDEX_SLOTS).copied()
    }

    /// The extent-index block chain, in order (block k holds slots `8 + k*255 ..`).
    pub fn index_blocks(&self) -> &[u64] {
        self.slots.index_blocks()
    }

    /// Heap bytes the map holds beyond its own size: the extents and, for a file with
    /// extent-index blocks, their chain and its free-slot words.
    pub fn heap_bytes(&self) -> u64 {
        let chain = self.slots.chain.as_deref().map_or(0, |c| {
            std::mem::size_of::<IndexChain>() + c.index_blocks.capacity() * 8 + c.chained.capacity() * 32
        });
        self.extents.heap_bytes() + chain as u64
    }

    /// An empty map with all inline slots free.
    pub fn new() -> FileMap {
        FileMap {
            extents: ExtentMap::new(),
            slots: Slots::all_inline(),
        }
    }

    /// Pool offset of a slot for the inode at `inode_off`.
    pub fn slot_offset(&self, inode_off: u64, slot: SlotId) -> u64 {
        if (slot as usize) < INLINE_SLOTS {
            record_offset(inode_off + ino::SLOTS as u64, u64::from(slot))
        } else {
            let i = slot as usize - INLINE_SLOTS;
            let blk = self.index_blocks()[i / INDEX_SLOTS];
            record_offset(
                blk * BLOCK_SIZE + index_block::SLOTS as u64,
                (i % INDEX_SLOTS) as u64,
            )
        }
    }

    /// Number of blocks mapped.
    pub fn mapped_blocks(&self) -> u64 {
        self.extents.values().map(|e| e.len).sum()
    }

    /// Physical block of logical block `lb`, if mapped, and how many following blocks are
    /// contiguous in the same extent (including `lb`).
    pub fn lookup(&self, lb: u64) -> Option<(u64, u64)> {
        let (&l, e) = self.extents.range(..=lb).next_back()?;
        (lb < l + e.len).then(|| (e.phys + (lb - l), l + e.len - lb))
    }

    /// Next mapped logical block at or after `lb` (for SEEK_DATA and sparse reads).
    pub fn next_mapped(&self, lb: u64) -> Option<u64> {
        if self.lookup(lb).is_some() {
            return Some(lb);
        }
        self.extents.range(lb..).next().map(|(&l, _)| l)
    }

    /// Extents overlapping logical blocks [a, b), clipped, as (logical, phys, len).
    pub fn segments(&self, a: u64, b: u64) -> Vec<(u64, u64, u64)> {
        self.clipped(a, b).collect()
    }

    /// Blocks mapped in logical blocks [a, b), counted without building the segments (every
    /// append recounts the blocks past the end).
    pub fn mapped_blocks_in(&self, a: u64, b: u64) -> u64 {
        self.clipped(a, b).map(|s| s.2).sum()
    }

    /// [`FileMap::segments`] as an iterator.
    fn clipped(&self, a: u64, b: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let start = self
            .extents
            .range(..=a)
            .next_back()
            .map(|(&l, _)| l)
            .unwrap_or(a);
        self.extents.range(start..b).filter_map(move |(&l, e)| {
            let s = l.max(a);
            let t = (l + e.len).min(b);
            (s < t).then(|| (s, e.phys + (s - l), t - s))
        })
    }

    /// Whether logical block `lb` lies in a 2 MiB logical unit that is mapped onto one 2 MiB
    /// aligned physical extent (and so is hugepage-mappable).
    pub fn in_aligned_unit(&self, lb: u64) -> bool {
        let unit = lb / 512 * 512;
        match self.extents.range(..=unit).next_back() {
            Some((&l, e)) => l + e.len >= unit + 512 && (e.phys + (unit - l)).is_multiple_of(512),
            None => false,
        }
    }

    /// Extents overlapping [a, b) in count.
    pub fn extents_in(&self, a: u64, b: u64) -> usize {
        self.clipped(a, b).count()
    }

    /// Slots an update of `new_runs` pieces may need beyond what is free (each piece can take a
    /// slot and one split can need one more).
    pub fn index_blocks_needed(&self, new_runs: usize) -> usize {
        let need = new_runs + 1;
        need.saturating_sub(self.slots.len())
            .div_ceil(INDEX_SLOTS)
    }

    /// Add a fresh, initialised index block (already durable and zeroed) to the chain.
    pub fn add_index_block(&mut self, block: u64, upd: &mut MapUpdate) {
        match self.index_blocks().last() {
            Some(&prev) => upd
                .links
                .push((prev * BLOCK_SIZE + index_block::NEXT as u64, block)),
            None => upd.first_index_block = Some(block),
        }
        let k = self.slots.push_index_block(block);
        for s in 0..INDEX_SLOTS {
            // A file has fewer than 2^32 extents (one per logical block at most) and an index
            // block is added only when fewer slots than one update needs are free.
            let slot = index_slot(k, s).expect("a file's extent slots are numbered within u32");
            self.slots.insert(slot);
        }
    }

    fn take_slot(&mut self) -> SlotId {
        // Callers reserve index blocks first (`index_blocks_needed`), so a slot is always free.
        self.slots
            .pop_first()
            .expect("caller reserved enough extent slots")
    }

    fn release_slot(&mut self, slot: SlotId, upd: &mut MapUpdate) {
        self.slots.insert(slot);
        upd.slot_writes.insert(slot, ExtentRecord::default());
    }

    /// Replace the mapping of logical blocks [l, l+n) with `runs` (laid end to end from `l`; their
    /// total must be `n`, or zero to punch the range out). The caller must have reserved index
    /// blocks (see `index_blocks_needed`), so this cannot fail.
    pub fn remap(&mut self, l: u64, n: u64, runs: &[BlockRun], upd: &mut MapUpdate) {
        let end = l + n;
        let overlapping: Vec<u64> = {
            let start = self
                .extents
                .range(..l)
                .next_back()
                .map(|(&k, _)| k)
                .unwrap_or(l);
            self.extents
                .range(start..end)
                .filter(|(k, e)| **k + e.len > l)
                .map(|(&k, _)| k)
                .collect()
        };
        for k in overlapping {
            let e = self.extents.remove(&k).expect("listed above");
            let e_end = k + e.len;
            let mid_s = k.max(l);
            let mid_e = e_end.min(end);
            upd.freed.push(BlockRun {
                start: e.phys + (mid_s - k),
                len: mid_e - mid_s,
            });
            let mut slot = Some(e.slot);
            if k < l {
                let head = Extent {
                    phys: e.phys,
                    len: l - k,
                    slot: e.slot,
                };
                upd.slot_writes.insert(e.slot, record(k, &head));
                self.extents.insert(k, head);
                slot = None;
            }
            if e_end > end {
                let s = slot.take().unwrap_or_else(|| self.take_slot());
                let tail = Extent {
                    phys: e.phys + (end - k),
                    len: e_end - end,
                    slot: s,
                };
                upd.slot_writes.insert(s, record(end, &tail));
                self.extents.insert(end, tail);
            }
            if let Some(s) = slot {
                self.release_slot(s, upd);
            }
        }
        let mut cur = l;
        for r in runs {
            // Extend the previous extent when the new run continues it both logically and physically.
            let prev = self.extents.range(..cur).next_back().map(|(&k, e)| (k, *e));
            match prev {
                Some((k, mut e))
                    if k + e.len == cur
                        && e.phys + e.len == r.start
                        && e.len + r.len <= u64::from(u32::MAX) =>
                {
                    e.len += r.len;
                    upd.slot_writes.insert(e.slot, record(k, &e));
                    self.extents.insert(k, e);
                }
                _ => {
                    let s = self.take_slot();
                    let e = Extent {
                        phys: r.start,
                        len: r.len,
                        slot: s,
                    };
                    upd.slot_writes.insert(s, record(cur, &e));
                    self.extents.insert(cur, e);
                }
            }
            cur += r.len;
        }
    }

    /// Drop everything at or beyond logical block `end`. The extent straddling `end` is rewritten
    /// (journaled); wholly dead extents' slots become free without a journaled write because the
    /// inode's lowered `map_end` kills them; they are zeroed after commit (`dead_slots`).
    pub fn truncate(&mut self, end: u64, upd: &mut MapUpdate) {
        if let Some((&k, e)) = self.extents.range(..end).next_back()
            && k + e.len > end
        {
            let mut e = *e;
            upd.freed.push(BlockRun {
                start: e.phys + (end - k),
                len: k + e.len - end,
            });
            e.len = end - k;
            upd.slot_writes.insert(e.slot, record(k, &e));
            self.extents.insert(k, e);
        }
        let dead: Vec<u64> = self.extents.range(end..).map(|(&k, _)| k).collect();
        for k in dead {
            let e = self.extents.remove(&k).expect("listed above");
            upd.freed.push(BlockRun {
                start: e.phys,
                len: e.len,
            });
            upd.dead_slots.push(e.slot);
            self.slots.insert(e.slot);
        }
    }

    /// Distinct extent-index blocks holding the records of extents that overlap logical blocks
    /// [a, b) (each a slot write and a checksum in a transaction that changes them).
    pub fn index_blocks_in(&self, a: u64, b: u64) -> usize {
        let start = self
            .extents
            .range(..=a)
            .next_back()
            .map_or(a, |(&l, _)| l);
        self.extents
            .range(start..b)
            .filter(|(l, e)| **l + e.len > a)
            .filter_map(|(_, e)| self.index_block_of(e.slot))
            .collect::<BTreeSet<u64>>()
            .len()
    }

    /// Where to cut first when a truncate to `end` would kill records in more than `max_blocks`
    /// extent-index blocks (each one a checksum write in the truncate's transaction): the end
    /// of the highest extent whose cut would stay within that bound, so that truncating to it
    /// kills records in at most `max_blocks` index blocks. None when truncating to `end` at
    /// once stays within the bound.
    pub fn truncate_step(&self, end: u64, max_blocks: usize) -> Option<u64> {
        let mut blocks = BTreeSet::new();
        for (&l, e) in self.extents.range(end..).rev() {
            if let Some(b) = self.index_block_of(e.slot)
                && blocks.insert(b)
                && blocks.len() > max_blocks
            {
                return Some(l + e.len);
            }
        }
        None
    }

    /// Split the extent straddling logical block `at` (if any) into two at `at`: the head keeps
    /// its slot, the tail takes a free one (reserve one slot first, see `index_blocks_needed`).
    pub fn split_at(&mut self, at: u64, upd: &mut MapUpdate) {
        let Some((&k, &e)) = self.extents.range(..at).next_back() else {
            return;
        };
        if k + e.len <= at {
            return;
        }
        let head = Extent { len: at - k, ..e };
        upd.slot_writes.insert(e.slot, record(k, &head));
        self.extents.insert(k, head);
        let s = self.take_slot();
        let tail = Extent {
            phys: e.phys + (at - k),
            len: k + e.len - at,
            slot: s,
        };
        upd.slot_writes.insert(s, record(at, &tail));
        self.extents.insert(at, tail);
    }

    /// Move every extent at or beyond logical block `from` so that `from` lands on `to`: down
    /// for a collapse (the caller emptied [to, from) first), up for an insert (the caller split
    /// the extent straddling `from` first, see [`FileMap::split_at`]). Each extent keeps its
    /// physical blocks and its slot; only the logical block of its record changes, so the
    /// records to rewrite are the extents moved.
    pub fn shift(&mut self, from: u64, to: u64, upd: &mut MapUpdate) {
        let moved: Vec<(u64, Extent)> = self.extents.range(from..).map(|(&k, &e)| (k, e)).collect();
        for (k, _) in &moved {
            self.extents.remove(k);
        }
        for (k, e) in moved {
            let nk = k - from + to;
            upd.slot_writes.insert(e.slot, record(nk, &e));
            self.extents.insert(nk, e);
        }
    }

    /// Every physical block the map owns: data extents and index blocks.
    pub fn owned_runs(&self) -> Vec<BlockRun> {
        let mut v: Vec<BlockRun> = self
            .extents
            .values()
            .map(|e| BlockRun {
                start: e.phys,
                len: e.len,
            })
            .collect();
        v.extend(
            self.index_blocks()
                .iter()
                .map(|&b| BlockRun { start: b, len: 1 }),
        );
        v
    }

    /// Rebuild from media. Validates every record and every extent-index block's magic and
    /// checksum; records at or beyond `map_end` are returned as dead slots so mount can zero
    /// them. An index block failing its checksum whose records all pass validation is listed
    /// in `bad_checksum` (the caller decides: mount refuses, fsck reports); one whose records
    /// do not is the error "fails its checksum", the precise cause.
    pub fn load(
        pool: &Pool,
        g: &Geometry,
        ino: u64,
        inode: &[u8],
        index_block: u64,
        map_end: u64,
    ) -> Result<LoadedMap> {
        let mut m = FileMap::default();
        let mut dead = Vec::new();
        let mut bad_checksum = Vec::new();
        let mut add = |m: &mut FileMap, slot: SlotId, raw: &[u8]| -> Result<()> {
            let r = ExtentRecord::decode(raw);
            if r.len == 0 {
                m.slots.insert(slot);
                return Ok(());
            }
            let (l, len) = (u64::from(r.logical), u64::from(r.len));
            if l >= map_end {
                m.slots.insert(slot);
                dead.push(slot);
                return Ok(());
            }
            if l + len > map_end {
                return Err(corrupt!(
                    "inode {ino}: extent at logical block {l} (+{len}) runs past map end {map_end}"
                ));
            }
            if !g.is_data_block(r.phys) || !g.is_data_block(r.phys + len - 1) {
                return Err(corrupt!(
                    "inode {ino}: extent {l}+{len} points outside the data area (block {})",
                    r.phys
                ));
            }
            if let Some((&pl, pe)) = m.extents.range(..l + len).next_back()
                && pl + pe.len > l
            {
                return Err(corrupt!(
                    "inode {ino}: extents at logical blocks {pl} and {l} overlap"
                ));
            }
            m.extents.insert(
                l,
                Extent {
                    phys: r.phys,
                    len,
                    slot,
                },
            );
            Ok(())
        };
        let inline = &inode[ino::SLOTS..ino::SLOTS + INLINE_SLOTS * EXTENT_BYTES];
        for (slot, raw) in (0..).zip(inline.chunks_exact(EXTENT_BYTES)) {
            add(&mut m, slot, raw)?;
        }
        let mut next = index_block;
        let mut seen = BTreeSet::new();
        while next != 0 {
            if !g.is_data_block(next) || !seen.insert(next) {
                return Err(corrupt!(
                    "inode {ino}: extent index chain points at block {next} (outside data area or a loop)"
                ));
            }
            let mut blk = vec![0u8; BLOCK_BYTES];
            pool.read(next * BLOCK_SIZE, &mut blk)?;
            if get_u32(&blk, index_block::MAGIC) != INDEX_MAGIC {
                return Err(corrupt!(
                    "inode {ino}: block {next} in its extent index chain has no index magic"
                ));
            }
            let crc_ok = checksum::index_block_checksum_ok(next, &blk, map_end);
            let k = m.slots.push_index_block(next);
            let slots = &blk[index_block::SLOTS..index_block::SLOTS + INDEX_SLOTS * EXTENT_BYTES];
            for (s, raw) in slots.chunks_exact(EXTENT_BYTES).enumerate() {
                let slot = index_slot(k, s).ok_or_else(|| {
                    corrupt!("inode {ino}: extent index chain of more than {k} blocks")
                })?;
                add(&mut m, slot, raw).map_err(|e| {
                    if crc_ok {
                        e
                    } else {
                        corrupt!("inode {ino}: extent-index block {next} fails its checksum")
                    }
                })?;
            }
            if !crc_ok {
                bad_checksum.push(next);
            }
            next = get_u64(&blk, index_block::NEXT);
        }
        // A block that fails its checksum is left as it is: what reads as dead there may be a
        // damaged live record.
        dead.retain(|&s| m.index_block_of(s).is_none_or(|b| !bad_checksum.contains(&b)));
        Ok(LoadedMap {
            map: m,
            dead,
            bad_checksum,
        })
    }
}

/// The media record of extent `e` at logical block `logical`. Every extent of a map starts below
/// 2^32 blocks and is shorter than 2^32 blocks: loaded ones come from the u32 fields, new ones
/// from `remap`, whose callers keep files within `MAX_FILE_SIZE` (2^32−1 blocks) and which merges
/// only up to `u32::MAX` blocks.
fn record(logical: u64, e: &Extent) -> ExtentRecord {
    ExtentRecord {
        logical: u32::try_from(logical).expect("extents start below 2^32 blocks"),
        len: u32::try_from(e.len).expect("extents are shorter than 2^32 blocks"),
        phys: e.phys,
    }
}

/// Add a map update's slot writes to `tx` as pool writes, merging the writes that land in one
/// index block (or the inode) into one range so a transaction needs few journal entries; then
/// its link writes.
pub(crate) fn slot_pool_writes(
    pool: &Pool,
    map: &FileMap,
    inode_off: u64,
    upd: &MapUpdate,
    tx: &mut Tx<'_>,
) -> Result<()> {
    let meta = Category::Metadata;
    if upd.slot_writes.len() == 1 {
        // One record (an append that grew its extent): nothing to merge.
        for (&slot, rec) in &upd.slot_writes {
            tx.write_copy(map.slot_offset(inode_off, slot), &rec.encode(), meta);
        }
    } else {
        let mut groups: BTreeMap<u64, Vec<(u64, [u8; EXTENT_BYTES])>> = BTreeMap::new();
        for (&slot, rec) in &upd.slot_writes {
            let off = map.slot_offset(inode_off, slot);
            groups
                .entry(off / BLOCK_SIZE * 2 + ((slot as usize) < INLINE_SLOTS) as u64)
                .or_default()
                .push((off, rec.encode()));
        }
        for (_, mut ws) in groups {
            ws.sort_by_key(|w| w.0);
            if ws.len() == 1 {
                tx.write_copy(ws[0].0, &ws[0].1, meta);
                continue;
            }
            let lo = ws[0].0;
            let hi = ws.last().expect("non-empty").0 + EXTENT_SIZE;
            // The writes of one group lie in one block (the group key above), so every
            // distance below is less than BLOCK_SIZE.
            let in_group = |o: u64| usize::try_from(o - lo).expect("within one block");
            let mut buf = vec![0u8; in_group(hi)];
            pool.read(lo, &mut buf)?;
            for (o, r) in ws {
                let i = in_group(o);
                buf[i..i + EXTENT_BYTES].copy_from_slice(&r);
            }
            tx.write(lo, buf, meta);
        }
    }
    for &(off, v) in &upd.links {
        tx.write_copy(off, &v.to_le_bytes(), meta);
    }
    Ok(())
}

/// Initialise a fresh index block: zeroed, stamped, and sealed with the checksum of an empty
/// block (unreachable until linked, so no journaling is needed).
pub(crate) fn init_index_block(pool: &Pool, block: u64) -> Result<()> {
    let off = block * BLOCK_SIZE;
    pool.zero_flush(off, BLOCK_SIZE, Category::Metadata)?;
    let mut head = [0u8; index_block::NEXT];
    head[index_block::MAGIC..index_block::MAGIC + 4].copy_from_slice(&INDEX_MAGIC.to_le_bytes());
    let mut empty = [0u8; BLOCK_BYTES];
    empty[..head.len()].copy_from_slice(&head);
    let crc = checksum::index_block_checksum(block, &empty, 0);
    head[index_block::CRC..index_block::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    pool.write_flush(off, &head, Category::Metadata)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, len: u64) -> BlockRun {
        BlockRun { start, len }
    }

    /// Free slots come back lowest first, inline before chained, whatever order they were
    /// freed in; the count covers both kinds.
    #[test]
    fn free_slots_are_taken_lowest_first() {
        let mut f = Slots::all_inline();
        assert_eq!(f.len(), INLINE_SLOTS);
        let taken: Vec<SlotId> = std::iter::from_fn(|| f.pop_first()).collect();
        assert_eq!(taken, (0..8).collect::<Vec<SlotId>>());
        assert_eq!(f.len(), 0);
        for s in [300, 9, 5, 8, 2, 7, 263] {
            f.insert(s);
        }
        assert_eq!(f.len(), 7);
        let taken: Vec<SlotId> = std::iter::from_fn(|| f.pop_first()).collect();
        assert_eq!(taken, vec![2, 5, 7, 8, 9, 263, 300]);
        // The same as a plain ordered set, on a longer mixed sequence.
        let mut want = BTreeSet::new();
        let mut x = 7u32;
        for i in 0..2000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let slot = (x >> 8) % 600;
            if i % 3 == 2 {
                assert_eq!(f.pop_first(), want.pop_first());
            } else {
                f.insert(slot);
                want.insert(slot);
            }
            assert_eq!(f.len(), want.len());
        }
    }

    #[test]
    fn remap_splits_and_frees_the_middle() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(0, 10, &[run(1000, 10)], &mut u);
        assert_eq!(m.extents.len(), 1);
        let mut u = MapUpdate::default();
        m.remap(4, 2, &[run(5000, 2)], &mut u);
        assert_eq!(u.freed, vec![run(1004, 2)]);
        assert_eq!(m.lookup(3), Some((1003, 1)));
        assert_eq!(m.lookup(4), Some((5000, 2)));
        assert_eq!(m.lookup(6), Some((1006, 4)));
        assert_eq!(m.extents.len(), 3);
        assert_eq!(m.mapped_blocks(), 10);
        // Three slots written: the shortened head, the tail, the new extent.
        assert_eq!(u.slot_writes.len(), 3);
    }

    /// The count agrees with the segments it does not build, for ranges starting before,
    /// inside and past extents and holes.
    #[test]
    fn mapped_blocks_in_counts_what_segments_list() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(2, 5, &[run(100, 5)], &mut u);
        m.remap(10, 3, &[run(300, 3)], &mut u);
        m.remap(20, 600, &[run(1024, 600)], &mut u);
        for a in 0..40 {
            for b in [a, a + 1, a + 3, a + 9, 25, 619, 620, 700, u64::MAX] {
                let want: u64 = m.segments(a, b).iter().map(|s| s.2).sum();
                assert_eq!(m.mapped_blocks_in(a, b), want, "[{a}, {b})");
            }
        }
        assert_eq!(m.mapped_blocks_in(0, u64::MAX), 608);
        assert_eq!(m.mapped_blocks_in(4, 11), 4);
    }

    #[test]
    fn contiguous_appends_extend_one_extent() {
        let mut m = FileMap::new();
        for i in 0..20 {
            let mut u = MapUpdate::default();
            m.remap(i, 1, &[run(700 + i, 1)], &mut u);
        }
        assert_eq!(m.extents.len(), 1);
        assert_eq!(m.lookup(0), Some((700, 20)));
    }

    #[test]
    fn truncate_keeps_the_straddler_and_kills_the_rest() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(0, 4, &[run(100, 4)], &mut u);
        m.remap(10, 4, &[run(200, 4)], &mut u);
        let mut u = MapUpdate::default();
        m.truncate(2, &mut u);
        assert_eq!(u.freed, vec![run(102, 2), run(200, 4)]);
        assert_eq!(u.dead_slots.len(), 1);
        assert_eq!(m.mapped_blocks(), 2);
    }

    #[test]
    fn punch_frees_and_releases_slots() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(0, 8, &[run(100, 8)], &mut u);
        let mut u = MapUpdate::default();
        m.remap(0, 8, &[], &mut u);
        assert!(m.extents.is_empty());
        assert_eq!(u.freed, vec![run(100, 8)]);
        assert_eq!(u.slot_writes.values().next().unwrap().len, 0);
    }

    #[test]
    fn split_and_shift_move_logical_blocks_only() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(0, 10, &[run(1000, 10)], &mut u);
        m.remap(20, 5, &[run(3000, 5)], &mut u);
        // Insert 512 blocks at 4: split there, move everything from 4 up.
        let mut u = MapUpdate::default();
        m.split_at(4, &mut u);
        m.shift(4, 4 + 512, &mut u);
        assert_eq!(m.lookup(3), Some((1003, 1)));
        assert_eq!(m.lookup(4), None);
        assert_eq!(m.lookup(516), Some((1004, 6)));
        assert_eq!(m.lookup(532), Some((3000, 5)));
        assert_eq!(m.mapped_blocks(), 15);
        assert!(u.freed.is_empty(), "a shift frees nothing");
        // Head, tail (new slot) and the moved extent: three records rewritten.
        assert_eq!(u.slot_writes.len(), 3);
        assert_eq!(u.slot_writes[&m.extents[&532].slot].logical, 532);
        // Collapse it again: empty [4, 516), move 516.. down to 4.
        let mut u = MapUpdate::default();
        m.remap(4, 512, &[], &mut u);
        m.shift(516, 4, &mut u);
        assert_eq!(m.lookup(4), Some((1004, 6)));
        assert_eq!(m.lookup(20), Some((3000, 5)));
        // Splitting where no extent straddles changes nothing.
        let mut u = MapUpdate::default();
        m.split_at(4, &mut u);
        m.split_at(15, &mut u);
        assert!(u.slot_writes.is_empty());
    }

    #[test]
    fn a_truncate_killing_records_in_many_index_blocks_is_cut_in_steps() {
        let mut m = FileMap::new();
        // 8 inline slots, then four index blocks: 1028 one-block extents, two blocks apart.
        let mut u = MapUpdate::default();
        for k in 0..4 {
            m.add_index_block(100 + k, &mut u);
        }
        for i in 0..1028u64 {
            m.remap(2 * i, 1, &[run(10_000 + i, 1)], &mut u);
        }
        assert_eq!(m.truncate_step(0, 4), None, "four blocks fit a bound of four");
        assert_eq!(m.index_blocks_in(0, 2 * 1028), 4);
        assert_eq!(m.index_blocks_in(0, 16), 0, "the first eight extents are inline");
        assert_eq!(m.index_blocks_in(16, 18), 1);
        let step = m.truncate_step(0, 2).unwrap();
        let mut u = MapUpdate::default();
        m.truncate(step, &mut u);
        assert!(u.index_blocks_touched(&m).len() <= 2);
        assert!(!u.dead_slots.is_empty(), "each step makes progress");
        let mut steps = 1;
        while let Some(s) = m.truncate_step(0, 2) {
            let mut u = MapUpdate::default();
            m.truncate(s, &mut u);
            assert!(u.index_blocks_touched(&m).len() <= 2);
            steps += 1;
        }
        assert_eq!(steps, 1, "the rest fits one step");
        let mut u = MapUpdate::default();
        m.truncate(0, &mut u);
        assert!(u.index_blocks_touched(&m).len() <= 2);
        assert!(m.extents.is_empty());
    }

    #[test]
    fn aligned_unit_detection() {
        let mut m = FileMap::new();
        let mut u = MapUpdate::default();
        m.remap(512, 512, &[run(4096, 512)], &mut u);
        m.remap(0, 512, &[run(4097 + 512, 512)], &mut u);
        assert!(m.in_aligned_unit(700));
        assert!(!m.in_aligned_unit(3));
    }
}
