//! Alignment-aware block allocator: the allocation policy across per-CPU partitions (local
//! first, then stealing from the partition with the most of what is needed), each partition's
//! free space being a `free_space::FreeSpace` of aligned extents and holes; and the
//! speculative holdings (blocks handed out that their holders give back on demand, counted as
//! available) with the handler that takes them back under pressure.
#![deny(clippy::cast_possible_truncation)]

use crate::media::free_space::{FreeSpace, Piece, coalesce, first_overlap};
use crate::media::layout::BLOCKS_PER_HUGE;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

const H: u64 = BLOCKS_PER_HUGE;
const ALIGNED: fn(&Part) -> &AtomicU64 = |p| &p.aligned_cnt;
const HOLES: fn(&Part) -> &AtomicU64 = |p| &p.hole_blocks;
/// Most pieces a request of fewer than 512 blocks is split into while an aligned extent is free:
/// past that, breaking one extent costs less than a file in tiny pieces (a slot, a free and a
/// separate copy per piece, and a partition lock held while dozens are gathered).
pub const MAX_SMALL_PIECES: u64 = 4;
/// The least room [`Allocator::alloc_from`] looks for after a growing file's new piece, in
/// blocks (64 KiB): a file that met a block it could not continue into has been growing, and
/// doubling from one or two blocks still left a 64 KiB file of 4 KiB appends in four pieces on
/// an aged pool (1, 2, 5 and 8 blocks), where this leaves two.
pub const GROWTH_ROOM_MIN: u64 = 16;
/// While holes hold more than this share of the free space, a small request that holes cannot
/// give in [`MAX_SMALL_PIECES`] takes them in any number of pieces before it breaks an aligned
/// extent: the space is in the holes, and breaking extents there would leave ever more of it in
/// holes (hole compaction starts at the same share).
pub const HOLES_FIRST_SHARE: f64 = 0.08;
/// While the pool holds fewer hole blocks than this per partition, a small request that the
/// local partition's holes cannot serve (they hold fewer blocks than it needs) breaks a local
/// aligned extent rather than take another partition's holes. On a young pool the holes are
/// the rests of extents just broken for small files, about one per busy CPU: taking another
/// CPU's had every thread allocate, append and free in the same few partitions, waiting for
/// their locks (16 threads of create, append, fsync, unlink spent a third of their time
/// there). Breaking locally costs at most about two extents per partition before holes stop
/// being scarce; on an aged pool they are plentiful and used first, wherever they are.
pub const SCARCE_HOLES_PER_PARTITION: u64 = 2 * H;

pub use crate::media::free_space::BlockRun;

/// Where [`Allocator::alloc_from`] puts a growing file's new blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Goal {
    /// The block after the file's last one: taken first when free.
    pub at: u64,
    /// Blocks the file holds already: what does not fit at `at` goes where this many more
    /// blocks ([`GROWTH_ROOM_MIN`] at least) are free after it, so that the file can grow as
    /// much again in place.
    pub room: u64,
}

/// Allocation failure: not enough free blocks (after the request's partial allocations were undone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSpace {
    /// Blocks asked for.
    pub requested: u64,
    /// Free blocks observed at failure time.
    pub free: u64,
}

impl fmt::Display for NoSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no space: requested {} blocks, {} free",
            self.requested, self.free
        )
    }
}

impl std::error::Error for NoSpace {}

/// Snapshot of one partition's free space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// First block of the partition.
    pub start: u64,
    /// One past the last block of the partition.
    pub end: u64,
    /// Count of free aligned 2 MiB extents.
    pub free_aligned_extents: u64,
    /// Blocks in holes.
    pub free_hole_blocks: u64,
    /// Number of holes.
    pub hole_count: u64,
    /// Largest hole, in blocks.
    pub largest_hole: u64,
}

/// One partition: its free space plus counters mirrored under the lock for lock-free "most free"
/// choices. Aligned to 128 bytes so that partitions do not share cache lines: each CPU locks
/// and republishes its own on every allocation and free, and a neighbour on the same line
/// would take that line from it every time (false sharing).
#[repr(align(128))]
struct Part {
    start: u64,
    end: u64,
    space: Mutex<FreeSpace>,
    aligned_cnt: AtomicU64,
    hole_blocks: AtomicU64,
}

/// Takes speculative holdings back under space pressure: given the blocks wanted, returns the
/// blocks it gave back to the allocator.
pub type PressureHandler = Box<dyn Fn(u64) -> u64 + Send + Sync>;

/// A holder's count of speculative blocks, shared with the allocator's registry
/// ([`Allocator::hold_speculative`]): the holder changes it with a plain store.
#[derive(Debug)]
pub struct SpecHolding(Arc<AtomicU64>);

impl SpecHolding {
    /// The holder now holds `blocks` (more than 0; none: [`Allocator::set_speculative`]).
    pub fn set(&self, blocks: u64) {
        self.0.store(blocks, Relaxed);
    }
}

/// Alignment-aware allocator over per-CPU partitions.
pub struct Allocator {
    parts: Vec<Part>,
    total: u64,
    /// Speculative holdings: holder id → blocks (allocated, but given back on demand). The
    /// lock guards who holds; a holder recounts its own blocks through its [`SpecHolding`].
    spec: Mutex<BTreeMap<u64, Arc<AtomicU64>>>,
    /// Named once by the layer that owns the holdings (the mounted file system).
    pressure: OnceLock<PressureHandler>,
}

impl Allocator {
    /// Build from sorted partition ranges and the free runs (any order; may cross partition boundaries).
    pub fn from_free_runs(
        ranges: &[(u64, u64)],
        free: impl IntoIterator<Item = BlockRun>,
    ) -> Result<Allocator, String> {
        if ranges.is_empty() {
            return Err("no partition ranges".into());
        }
        let mut parts = Vec::with_capacity(ranges.len());
        let mut prev_end = 0;
        for (i, &(start, end)) in ranges.iter().enumerate() {
            if start >= end || start % H != 0 || (i > 0 && start < prev_end) {
                let why = "must be non-empty, start 512-aligned, sorted and non-overlapping";
                return Err(format!("partition {i}: range [{start},{end}) {why}"));
            }
            prev_end = end;
            let space = Mutex::new(FreeSpace::empty(start, end));
            let (aligned_cnt, hole_blocks) = (AtomicU64::new(0), AtomicU64::new(0));
            parts.push(Part {
                start,
                end,
                space,
                aligned_cnt,
                hole_blocks,
            });
        }
        let total = ranges.iter().map(|&(s, e)| e - s).sum();
        let a = Allocator {
            parts,
            total,
            spec: Mutex::new(BTreeMap::new()),
            pressure: OnceLock::new(),
        };
        let mut runs: Vec<BlockRun> = free.into_iter().filter(|r| r.len > 0).collect();
        runs.sort();
        let mut prev: Option<BlockRun> = None;
        for r in runs {
            let end = r
                .start
                .checked_add(r.len)
                .ok_or_else(|| format!("free run {r:?} overflows"))?;
            if let Some(p) = prev
                && p.end() > r.start
            {
                return Err(format!("free runs {p:?} and {r:?} overlap"));
            }
            for (i, s, e) in a.split(r.start, end)? {
                a.with(i, |p| p.insert_free(s, e));
            }
            prev = Some(r);
        }
        Ok(a)
    }

    /// Number of partitions.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// Home partition of a block (by range), None if outside all.
    pub fn partition_of(&self, block: u64) -> Option<usize> {
        let i = self.parts.partition_point(|p| p.start <= block);
        (i > 0 && block < self.parts[i - 1].end).then(|| i - 1)
    }

    /// Lock partition `i`, run `f`, then republish its counters before unlocking.
    fn with<R>(&self, i: usize, f: impl FnOnce(&mut FreeSpace) -> R) -> R {
        let p = &self.parts[i];
        let mut g = crate::spin::spin_then_block(|| p.space.try_lock(), || p.space.lock());
        Self::publish(p, &mut g, f)
    }

    /// Run `f` on partition `i` if its lock is free now; None (nothing run) if it is held.
    fn try_with<R>(&self, i: usize, f: impl FnOnce(&mut FreeSpace) -> R) -> Option<R> {
        let p = &self.parts[i];
        let mut g = crate::spin::taken(p.space.try_lock())?;
        Some(Self::publish(p, &mut g, f))
    }

    /// Run `f` on a locked partition, then republish its counters.
    fn publish<R>(p: &Part, g: &mut FreeSpace, f: impl FnOnce(&mut FreeSpace) -> R) -> R {
        let r = f(g);
        p.aligned_cnt.store(g.aligned.len() as u64, Relaxed);
        p.hole_blocks.store(g.hole_blocks, Relaxed);
        r
    }

    /// Partitions other than `local`, by descending counter snapshot (ties: lower index first).
    fn others_by(&self, local: usize, key: fn(&Part) -> &AtomicU64) -> Vec<(usize, u64)> {
        let mut v: Vec<(usize, u64)> = (0..self.parts.len())
            .filter(|&i| i != local)
            .map(|i| (i, key(&self.parts[i]).load(Relaxed)))
            .collect();
        v.sort_by_key(|&(i, c)| (Reverse(c), i));
        v
    }

    /// Split `[s, e)` at partition boundaries; Err if any block lies outside every partition.
    fn split(&self, s: u64, e: u64) -> Result<Vec<Piece>, String> {
        let mut out = Vec::new();
        self.split_into(s, e, &mut out).map(|()| out)
    }

    /// [`Allocator::split`], appending the pieces to `out`.
    fn split_into(&self, s: u64, e: u64, out: &mut Vec<Piece>) -> Result<(), String> {
        let mut cur = s;
        while cur < e {
            let i = self
                .partition_of(cur)
                .ok_or_else(|| format!("block {cur} of run [{s},{e}) is outside all partitions"))?;
            let pe = self.parts[i].end.min(e);
            out.push((i, cur, pe));
            cur = pe;
        }
        Ok(())
    }

    /// Try `f` locally, then on other partitions by descending `key` counter (skipping those below `min`).
    fn local_then_most<T>(
        &self,
        local: usize,
        key: fn(&Part) -> &AtomicU64,
        min: u64,
        f: impl Fn(&mut FreeSpace) -> Option<T>,
    ) -> Option<T> {
        // A partition whose lock is held now is passed over at first (its holder may have been
        // preempted; sleeping on it costs more than taking blocks elsewhere) and tried again,
        // waiting, only if no other partition gives the blocks.
        let mut busy = Vec::new();
        match self.try_with(local, &f) {
            Some(Some(x)) => return Some(x),
            Some(None) => {}
            None => busy.push(local),
        }
        let mut order = self.others_by(local, key);
        order.retain(|&(_, c)| c >= min);
        for &(i, _) in &order {
            match self.try_with(i, &f) {
                Some(Some(x)) => return Some(x),
                Some(None) => {}
                None => busy.push(i),
            }
        }
        busy.into_iter().find_map(|i| self.with(i, &f))
    }

    /// Collect exactly `need` blocks from holes across partitions, or take nothing and return false.
    fn gather_all(&self, local: usize, need: u64, out: &mut Vec<BlockRun>) -> bool {
        let avail: u64 = self.parts.iter().map(|p| p.hole_blocks.load(Relaxed)).sum();
        if avail < need {
            return false; // keep aligned extents intact rather than gather a partial amount
        }
        self.gather_across(local, need, 0, out, FreeSpace::gather)
    }

    /// Take exactly `need` blocks with `take` (a partition's free space, the blocks still
    /// wanted, where to put them; how many it took), the local partition first, then those with
    /// at least `min_blocks` hole blocks by most hole blocks; or take nothing and return false
    /// (too few there, or lost to another thread).
    fn gather_across(
        &self,
        local: usize,
        need: u64,
        min_blocks: u64,
        out: &mut Vec<BlockRun>,
        take: impl Fn(&mut FreeSpace, u64, &mut Vec<BlockRun>) -> u64,
    ) -> bool {
        let mut tmp = Vec::new();
        let mut got = self.with(local, |p| take(p, need, &mut tmp));
        for (i, blocks) in self.others_by(local, HOLES) {
            if got == need || blocks < min_blocks {
                break;
            }
            got += self.with(i, |p| take(p, need - got, &mut tmp));
        }
        if got < need {
            self.release_all(&tmp);
            return false;
        }
        out.extend(tmp);
        true
    }

    /// Give back runs this allocator just handed out (each lies within one partition).
    fn release_all(&self, runs: &[BlockRun]) {
        for r in runs {
            let i = self
                .partition_of(r.start)
                .expect("allocated run inside a partition");
            self.with(i, |p| p.insert_free(r.start, r.end()));
        }
    }

    /// Allocate `nblocks` blocks (2 MiB pieces first, then the remainder); all-or-nothing.
    pub fn alloc(&self, nblocks: u64, cpu: usize) -> Result<Vec<BlockRun>, NoSpace> {
        let local = cpu % self.parts.len();
        let mut out = Vec::new();
        let fail = |out: Vec<BlockRun>| {
            self.release_all(&out);
            NoSpace {
                requested: nblocks,
                free: self.free_blocks(),
            }
        };
        for _ in 0..nblocks / H {
            if let Some(u) = self.local_then_most(local, ALIGNED, 1, FreeSpace::pop_aligned) {
                out.push(BlockRun { start: u, len: H });
            } else if !self.gather_all(local, H, &mut out) {
                return Err(fail(out));
            }
        }
        let r = nblocks % H;
        if r > 0 {
            if let Some(s) = self.small_run(local, r) {
                out.push(BlockRun { start: s, len: r });
            } else if self.gather_few(local, r, &mut out) {
                // gathered pieces already appended
            } else if self.holes_exceed(HOLES_FIRST_SHARE, 0) && self.gather_all(local, r, &mut out)
            {
                // holes hold much of the free space: used in any pieces, extents kept
            } else if let Some(u) = self.local_then_most(local, ALIGNED, 1, |p| p.break_aligned(r))
            {
                out.push(BlockRun { start: u, len: r });
            } else if self.gather_all(local, r, &mut out) {
                // no aligned extent left anywhere: holes of any size
            } else {
                return Err(fail(out));
            }
        }
        Ok(out)
    }

    /// One run of `r` (< 512) blocks: a hole of the local partition; else, where the local
    /// holes hold fewer than `r` blocks and holes are scarce ([`SCARCE_HOLES_PER_PARTITION`]),
    /// the head of a local aligned extent, broken; else a hole of the partition with the most
    /// hole blocks.
    fn small_run(&self, local: usize, r: u64) -> Option<u64> {
        match self.try_with(local, |p| p.first_fit(r)) {
            Some(Some(s)) => return Some(s),
            // Held: its holder may have been preempted; look elsewhere as below.
            None => return self.local_then_most(local, HOLES, r, |p| p.first_fit(r)),
            Some(None) => {}
        }
        let part = &self.parts[local];
        if part.hole_blocks.load(Relaxed) < r
            && part.aligned_cnt.load(Relaxed) > 0
            && self.hole_blocks() < SCARCE_HOLES_PER_PARTITION * self.parts.len() as u64
            && let Some(Some(u)) = self.try_with(local, |p| p.break_aligned(r))
        {
            return Some(u);
        }
        self.local_then_most(local, HOLES, r, |p| p.first_fit(r))
    }

    /// Collect exactly `need` blocks in at most [`MAX_SMALL_PIECES`] pieces from holes of at
    /// least `need / MAX_SMALL_PIECES` blocks (local partition first, then by most hole blocks),
    /// or take nothing and return false.
    fn gather_few(&self, local: usize, need: u64, out: &mut Vec<BlockRun>) -> bool {
        let min_piece = need.div_ceil(MAX_SMALL_PIECES);
        self.gather_across(local, need, min_piece, out, |p, n, o| p.gather_pieces(n, min_piece, o))
    }

    /// Allocate from holes only, in as many pieces as it takes (hole compaction, which must
    /// never break an aligned extent to empty another); all-or-nothing.
    pub fn alloc_in_holes(&self, nblocks: u64, cpu: usize) -> Result<Vec<BlockRun>, NoSpace> {
        let local = cpu % self.parts.len();
        let mut out = Vec::new();
        if nblocks == 0 {
            return Ok(out);
        }
        if nblocks < H
            && let Some(s) = self.local_then_most(local, HOLES, nblocks, |p| p.first_fit(nblocks))
        {
            out.push(BlockRun { start: s, len: nblocks });
        } else if !self.gather_all(local, nblocks, &mut out) {
            return Err(NoSpace { requested: nblocks, free: self.free_blocks() });
        }
        Ok(out)
    }

    /// [`Allocator::alloc`] of fewer than 512 blocks for a file that grows: the free blocks at
    /// `goal.at` first (the block after the file's last one, so that its extent continues),
    /// then, if more are needed, the head of a local hole with room for the file's size again
    /// after them ([`Goal::room`], [`GROWTH_ROOM_MIN`] at least), else the rest as `alloc` takes
    /// them. A file growing by appends past blocks another file holds so takes pieces that at
    /// least double it, where lowest-first took the next hole each time (on an aged pool, one
    /// piece per hole it met: a slot, a free and a separate copy per piece). `goal`'s partition
    /// is passed over if it is held now.
    pub fn alloc_from(&self, nblocks: u64, goal: Goal, cpu: usize) -> Result<Vec<BlockRun>, NoSpace> {
        let first = match self.partition_of(goal.at) {
            Some(i) if nblocks < H => self.try_with(i, |p| p.take_at(goal.at, nblocks)).unwrap_or(0),
            _ => 0,
        };
        let mut out = Vec::with_capacity(2);
        if first > 0 {
            out.push(BlockRun { start: goal.at, len: first });
        }
        let rest = nblocks - first;
        if rest == 0 {
            return Ok(out);
        }
        let room = goal.room.saturating_add(first).max(GROWTH_ROOM_MIN);
        if rest < H {
            let len = rest.saturating_add(room).min(H);
            let local = cpu % self.parts.len();
            if let Some(Some(s)) = self.try_with(local, |p| p.fit_with_room(rest, len)) {
                out.push(BlockRun { start: s, len: rest });
                return Ok(out);
            }
        }
        match self.alloc(rest, cpu) {
            Ok(more) => {
                out.extend(more);
                Ok(out)
            }
            Err(_) => {
                self.release_all(&out);
                Err(NoSpace { requested: nblocks, free: self.free_blocks() })
            }
        }
    }

    /// Wear-aware allocation on or off: small allocations from holes go next fit instead of
    /// lowest address first (free aligned extents are taken as before).
    pub fn set_wear_aware(&self, on: bool) {
        for i in 0..self.parts.len() {
            self.with(i, |p| p.spread_from = on.then_some(p.start));
        }
    }

    /// One free aligned 2 MiB extent (local first, else from the partition with most); never gathers holes.
    pub fn alloc_aligned_extent(&self, cpu: usize) -> Option<u64> {
        self.local_then_most(cpu % self.parts.len(), ALIGNED, 1, FreeSpace::pop_aligned)
    }

    /// Return a run to its home partition(s) ([`Allocator::free_all`] of one run).
    pub fn free(&self, run: BlockRun) -> Result<(), String> {
        self.free_all(std::slice::from_ref(&run))
    }

    /// Return many runs, locking each partition once for all of its runs (an unlink gives back
    /// every extent of a file; one lock per run made a fragmented file's unlink take dozens).
    /// Within a partition the runs go back in the order given (it decides which free aligned
    /// extents are taken next). Err, and no change, on a double free (a run overlapping free
    /// space or another run of the batch) or blocks outside every partition; runs spanning
    /// several partitions are checked in all of them before any takes its runs back (a racing
    /// double free found after that is refused where it is found).
    pub fn free_all(&self, runs: &[BlockRun]) -> Result<(), String> {
        // Most callers free nothing (a write that replaced no blocks): no work, no allocation.
        if runs.iter().all(|r| r.len == 0) {
            return Ok(());
        }
        // (partition, start, end) of every piece; a stable sort by partition keeps each
        // partition's pieces in the order given.
        let mut pieces: Vec<Piece> = Vec::with_capacity(runs.len() + 1);
        for run in runs.iter().filter(|r| r.len > 0) {
            let end = run
                .start
                .checked_add(run.len)
                .ok_or_else(|| format!("run {run:?} overflows"))?;
            self.split_into(run.start, end, &mut pieces)?;
        }
        pieces.sort_by_key(|p| p.0);
        let groups = || pieces.chunk_by(|a, b| a.0 == b.0);
        for group in groups() {
            if let Some((a, b)) = first_overlap(group) {
                return Err(format!(
                    "double free: [{},{}) and [{},{}) of partition {} freed together",
                    a.1, a.2, b.1, b.2, a.0
                ));
            }
        }
        let overlap = |p: &FreeSpace, group: &[Piece]| {
            group.iter().find(|&&(_, s, e)| p.overlaps_free(s, e)).map(|&(i, s, e)| {
                format!("double free: [{s},{e}) overlaps free space of partition {i}")
            })
        };
        if groups().count() > 1 {
            for group in groups() {
                if let Some(why) = self.with(group[0].0, |p| overlap(p, group)) {
                    return Err(why);
                }
            }
        }
        for group in groups() {
            self.with(group[0].0, |p| match overlap(p, group) {
                Some(why) => Err(why),
                None => {
                    group.iter().for_each(|&(_, s, e)| p.insert_free(s, e));
                    Ok(())
                }
            })?;
        }
        Ok(())
    }

    /// Take every free block of `[s, e)` out of the allocator, so no allocation lands there
    /// (hole compaction empties a 2 MiB unit this way). The blocks stay free on media; give
    /// them back with [`Allocator::free`]. Returns the runs taken.
    pub fn take_free_in(&self, s: u64, e: u64) -> Vec<BlockRun> {
        let mut out = Vec::new();
        if let Ok(pieces) = self.split(s, e) {
            for (i, a, b) in pieces {
                self.with(i, |p| p.take_range(a, b, &mut out));
            }
        }
        out
    }

    /// Whether the aligned 2 MiB extent starting at block `u` is free as a whole.
    pub fn is_free_aligned(&self, u: u64) -> bool {
        self.partition_of(u)
            .is_some_and(|i| self.with(i, |p| p.aligned_set.contains(&u)))
    }

    /// Free blocks in holes (outside free aligned extents), from the counters.
    pub fn hole_blocks(&self) -> u64 {
        self.parts.iter().map(|p| p.hole_blocks.load(Relaxed)).sum()
    }

    /// Free blocks in free aligned 2 MiB extents, from the counters.
    pub fn free_aligned_blocks(&self) -> u64 {
        self.parts.iter().map(|p| p.aligned_cnt.load(Relaxed) * H).sum()
    }

    /// Whether holes hold more than `share` of the free space, on a pool with at least
    /// `min_free` free blocks (what starts and stops hole compaction).
    pub fn holes_exceed(&self, share: f64, min_free: u64) -> bool {
        let free = self.free_blocks();
        free >= min_free && self.hole_blocks() as f64 > share * free as f64
    }

    /// Free blocks in all partitions (aligned extents and holes).
    pub fn free_blocks(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.aligned_cnt.load(Relaxed) * H + p.hole_blocks.load(Relaxed))
            .sum()
    }

    /// Sum of partition range lengths.
    pub fn total_blocks(&self) -> u64 {
        self.total
    }

    fn spec_lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<AtomicU64>>> {
        self.spec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record that `holder` (an inode) holds `blocks` allocated blocks speculatively, blocks it
    /// gives back when asked (0: it holds none). They count as available, not as free.
    pub fn set_speculative(&self, holder: u64, blocks: u64) {
        let mut m = self.spec_lock();
        if blocks == 0 {
            m.remove(&holder);
        } else {
            m.entry(holder).or_default().store(blocks, Relaxed);
        }
    }

    /// Register `holder` as holding `blocks` (more than 0) speculatively, and hand it the count
    /// to keep up to date itself: a file recounts its blocks past the end at every append, and
    /// the registry's lock there would be a locked instruction right after the append's fence,
    /// which waits for the fence's write-backs. Holding nothing any more goes through
    /// [`Allocator::set_speculative`] with 0.
    pub fn hold_speculative(&self, holder: u64, blocks: u64) -> SpecHolding {
        let mut m = self.spec_lock();
        let cell = m.entry(holder).or_default();
        cell.store(blocks, Relaxed);
        SpecHolding(cell.clone())
    }

    /// Blocks `holder` holds speculatively (0 if none).
    pub fn speculative_of(&self, holder: u64) -> u64 {
        self.spec_lock().get(&holder).map_or(0, |c| c.load(Relaxed))
    }

    /// Blocks held speculatively, in all (summed over the holders: asked for by statfs and
    /// when space runs short, not per allocation).
    pub fn speculative_blocks(&self) -> u64 {
        self.spec_lock().values().map(|c| c.load(Relaxed)).sum()
    }

    /// The holders, largest holding first (ties: lower id first).
    pub fn speculative_holders(&self) -> Vec<(u64, u64)> {
        let m = self.spec_lock();
        let mut v: Vec<(u64, u64)> = m
            .iter()
            .map(|(&h, c)| (h, c.load(Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        v.sort_by_key(|&(h, n)| (Reverse(n), h));
        v
    }

    /// Free blocks plus blocks held speculatively: what allocations can get.
    pub fn available_blocks(&self) -> u64 {
        self.free_blocks() + self.speculative_blocks()
    }

    /// Name the handler that takes speculative holdings back (once; later calls are ignored).
    pub fn set_pressure_handler(&self, h: PressureHandler) {
        let _ = self.pressure.set(h);
    }

    /// Ask the pressure handler for `need` blocks back; returns the blocks it freed (0 when
    /// there is no handler or nothing to give).
    pub fn relieve(&self, need: u64) -> u64 {
        match self.pressure.get() {
            Some(h) if self.speculative_blocks() > 0 => h(need),
            _ => 0,
        }
    }

    /// Per-partition free-space statistics.
    pub fn stats(&self) -> Vec<PartitionStats> {
        (0..self.parts.len())
            .map(|i| {
                self.with(i, |p| PartitionStats {
                    start: p.start,
                    end: p.end,
                    free_aligned_extents: p.aligned.len() as u64,
                    free_hole_blocks: p.hole_blocks,
                    hole_count: p.holes.count(),
                    largest_hole: p.holes.largest(),
                })
            })
            .collect()
    }

    /// All free space as sorted, maximally merged runs.
    pub fn free_runs(&self) -> Vec<BlockRun> {
        let mut runs = Vec::new();
        for i in 0..self.parts.len() {
            self.with(i, |p| {
                runs.extend(p.holes.holes().into_iter().map(|(s, l)| BlockRun { start: s, len: l }));
                runs.extend(p.aligned.iter().map(|&u| BlockRun { start: u, len: H }));
            });
        }
        coalesce(runs)
    }

    /// Check internal invariants; Err names the first violation.
    pub fn check_consistency(&self) -> Result<(), String> {
        for i in 0..self.parts.len() {
            let part = &self.parts[i];
            self.with(i, |p| {
                p.check(
                    i,
                    part.aligned_cnt.load(Relaxed),
                    part.hole_blocks.load(Relaxed),
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
