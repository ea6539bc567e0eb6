//! Alignment-aware block allocator: the allocation policy across per-CPU partitions (local
//! first, then stealing from the partition with the most of what is needed), each partition's
//! free space being a `free_space::FreeSpace` of aligned extents and holes; and the
//! speculative holdings (blocks handed out that their holders give back on demand, counted as
//! available) with the handler that takes them back under pressure.
#![deny(clippy::cast_possible_truncation)]

use crate::media::free_space::{FreeSpace, coalesce};
use crate::media::layout::BLOCKS_PER_HUGE;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

const H: u64 = BLOCKS_PER_HUGE;
const ALIGNED: fn(&Part) -> &AtomicU64 = |p| &p.aligned_cnt;
const HOLES: fn(&Part) -> &AtomicU64 = |p| &p.hole_blocks;

pub use crate::media::free_space::BlockRun;

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
/// choices.
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

/// Alignment-aware allocator over per-CPU partitions.
pub struct Allocator {
    parts: Vec<Part>,
    total: u64,
    /// Speculative holdings: holder id → blocks (allocated, but given back on demand).
    spec: Mutex<BTreeMap<u64, u64>>,
    /// Sum of `spec`, readable without the lock.
    spec_total: AtomicU64,
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
            spec_total: AtomicU64::new(0),
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
    fn split(&self, s: u64, e: u64) -> Result<Vec<(usize, u64, u64)>, String> {
        let mut out = Vec::new();
        let mut cur = s;
        while cur < e {
            let i = self
                .partition_of(cur)
                .ok_or_else(|| format!("block {cur} of run [{s},{e}) is outside all partitions"))?;
            let pe = self.parts[i].end.min(e);
            out.push((i, cur, pe));
            cur = pe;
        }
        Ok(out)
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
        let order: Vec<usize> = self
            .others_by(local, key)
            .into_iter()
            .filter(|&(_, c)| c >= min)
            .map(|(i, _)| i)
            .collect();
        for &i in &order {
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
        let mut tmp = Vec::new();
        let mut got = self.with(local, |p| p.gather(need, &mut tmp));
        for (i, _) in self.others_by(local, HOLES) {
            if got == need {
                break;
            }
            got += self.with(i, |p| p.gather(need - got, &mut tmp));
        }
        if got < need {
            // Lost a race with another thread; undo so the caller can fall back.
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
            if let Some(s) = self.local_then_most(local, HOLES, r, |p| p.first_fit(r)) {
                out.push(BlockRun { start: s, len: r });
            } else if self.gather_all(local, r, &mut out) {
                // gathered pieces already appended
            } else if let Some(u) = self.local_then_most(local, ALIGNED, 1, |p| p.break_aligned(r))
            {
                out.push(BlockRun { start: u, len: r });
            } else {
                return Err(fail(out));
            }
        }
        Ok(out)
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
        let mut by_part: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
        for run in runs.iter().filter(|r| r.len > 0) {
            let end = run
                .start
                .checked_add(run.len)
                .ok_or_else(|| format!("run {run:?} overflows"))?;
            for (i, s, e) in self.split(run.start, end)? {
                by_part.entry(i).or_default().push((s, e));
            }
        }
        for (&i, pieces) in &by_part {
            let mut sorted = pieces.clone();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[1].0 < w[0].1) {
                return Err(format!(
                    "double free: [{},{}) and [{},{}) of partition {i} freed together",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ));
            }
        }
        let overlap = |i: usize, p: &FreeSpace, pieces: &[(u64, u64)]| {
            pieces.iter().find(|&&(s, e)| p.overlaps_free(s, e)).map(|&(s, e)| {
                format!("double free: [{s},{e}) overlaps free space of partition {i}")
            })
        };
        if by_part.len() > 1 {
            for (&i, pieces) in &by_part {
                if let Some(why) = self.with(i, |p| overlap(i, p, pieces)) {
                    return Err(why);
                }
            }
        }
        for (&i, pieces) in &by_part {
            self.with(i, |p| match overlap(i, p, pieces) {
                Some(why) => Err(why),
                None => {
                    pieces.iter().for_each(|&(s, e)| p.insert_free(s, e));
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

    /// Free blocks, summed from the per-partition counters.
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

    /// Record that `holder` (an inode) holds `blocks` allocated blocks speculatively, blocks it
    /// gives back when asked (0: it holds none). They count as available, not as free.
    pub fn set_speculative(&self, holder: u64, blocks: u64) {
        let mut m = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        let old = if blocks == 0 {
            m.remove(&holder)
        } else {
            m.insert(holder, blocks)
        };
        // Under the lock, so the total always equals the sum of the map.
        let t = self.spec_total.load(Relaxed) + blocks - old.unwrap_or(0);
        self.spec_total.store(t, Relaxed);
    }

    /// Blocks `holder` holds speculatively (0 if none).
    pub fn speculative_of(&self, holder: u64) -> u64 {
        let m = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&holder).copied().unwrap_or(0)
    }

    /// Blocks held speculatively, in all.
    pub fn speculative_blocks(&self) -> u64 {
        self.spec_total.load(Relaxed)
    }

    /// The holders, largest holding first (ties: lower id first).
    pub fn speculative_holders(&self) -> Vec<(u64, u64)> {
        let m = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(u64, u64)> = m.iter().map(|(&h, &n)| (h, n)).collect();
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
                    hole_count: p.holes.len() as u64,
                    largest_hole: p.holes.values().copied().max().unwrap_or(0),
                })
            })
            .collect()
    }

    /// All free space as sorted, maximally merged runs.
    pub fn free_runs(&self) -> Vec<BlockRun> {
        let mut runs = Vec::new();
        for i in 0..self.parts.len() {
            self.with(i, |p| {
                runs.extend(p.holes.iter().map(|(&s, &l)| BlockRun { start: s, len: l }));
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
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        /// An index below `n` (the same draw as `below`).
        fn pick(&mut self, n: usize) -> usize {
            usize::try_from(self.below(n as u64)).expect("below n, a usize")
        }
    }

    fn br(start: u64, len: u64) -> BlockRun {
        BlockRun { start, len }
    }

    fn fresh(ranges: &[(u64, u64)]) -> Allocator {
        Allocator::from_free_runs(ranges, ranges.iter().map(|&(s, e)| br(s, e - s))).unwrap()
    }

    #[test]
    fn many_runs_go_back_at_once_in_order_and_a_double_free_changes_nothing_there() {
        let a = fresh(&[(0, 1024), (1024, 2048)]);
        a.alloc(2048, 0).unwrap();
        assert_eq!(a.free_blocks(), 0);
        // Units 512 and 0 of partition 0 in pieces, then unit 1536 of partition 1: whole units
        // come back to the aligned list in the order their last piece went back.
        let back = [br(512, 100), br(612, 412), br(0, 512), br(1536, 512)];
        a.free_all(&back).unwrap();
        assert_eq!(a.free_blocks(), 1536);
        a.check_consistency().unwrap();
        assert_eq!(a.alloc(512, 0).unwrap(), vec![br(512, 512)]);
        assert_eq!(a.alloc(512, 0).unwrap(), vec![br(0, 512)]);
        // A batch that frees a block twice, or a free block, is refused where it is found:
        // partition 1 is left as it was.
        let before = a.free_blocks();
        let twice = a.free_all(&[br(1024, 8), br(1030, 4)]).unwrap_err();
        assert!(twice.contains("double free"), "{twice}");
        let free_already = a.free_all(&[br(1024, 8), br(1536, 8)]).unwrap_err();
        assert!(free_already.contains("overlaps free space"), "{free_already}");
        assert_eq!(a.free_blocks(), before);
        assert!(a.free_all(&[br(4096, 1)]).is_err(), "outside every partition");
        a.check_consistency().unwrap();
    }

    #[test]
    fn an_allocation_passes_over_a_partition_whose_lock_is_held_and_a_free_waits_for_it() {
        // Partition 1 has a hole and an aligned extent free; partition 0 is all free.
        let free = [br(0, 1024), br(1030, 70), br(1536, 512)];
        let a = Arc::new(Allocator::from_free_runs(&[(0, 1024), (1024, 2048)], free).unwrap());
        let held = a.parts[0].space.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let a2 = Arc::clone(&a);
        let t = std::thread::spawn(move || {
            // CPU 0's partition is held: a small run and an aligned extent come from partition 1
            // at once instead of waiting.
            let small = a2.alloc(8, 0).unwrap();
            let big = a2.alloc(512, 0).unwrap();
            tx.send((small, big)).unwrap();
            // A free of blocks of partition 0 has nowhere else to go: it waits for the lock.
            a2.free(br(0, 8)).unwrap_err();
        });
        let (small, big) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the allocations did not wait for the held partition");
        assert!(small.iter().chain(&big).all(|r| r.start >= 1024), "{small:?} {big:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!t.is_finished(), "the free waits for partition 0");
        drop(held);
        t.join().unwrap();
        // Partition 0 untouched: its two aligned extents are still there for CPU 0.
        assert_eq!(a.alloc(1024, 0).unwrap(), vec![br(0, 512), br(512, 512)]);
        a.check_consistency().unwrap();
    }

    fn aligned_total(a: &Allocator) -> u64 {
        a.stats().iter().map(|s| s.free_aligned_extents).sum()
    }

    fn merged(ranges: &[(u64, u64)]) -> Vec<BlockRun> {
        coalesce(ranges.iter().map(|&(s, e)| br(s, e - s)).collect())
    }

    /// Allocated runs and free space must be pairwise disjoint and inside the partitions.
    fn assert_disjoint(a: &Allocator, held: &[BlockRun]) {
        let mut all: Vec<BlockRun> = held.iter().copied().chain(a.free_runs()).collect();
        all.sort();
        for w in all.windows(2) {
            assert!(w[0].end() <= w[1].start, "overlap {:?} {:?}", w[0], w[1]);
        }
        for r in &all {
            let i = a.partition_of(r.start).expect("inside");
            assert!(a.partition_of(r.end() - 1).is_some_and(|j| j >= i));
        }
    }

    #[test]
    fn fresh_single_partition_policy() {
        let a = fresh(&[(0, 4096)]);
        let v = a.alloc(3 * H, 0).unwrap();
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|r| r.len == H && r.start % H == 0));
        assert_eq!(aligned_total(&a), 5);
        // No hole exists: must break exactly one aligned extent.
        assert_eq!(a.stats()[0].hole_count, 0);
        let one = a.alloc(1, 0).unwrap();
        assert_eq!(one, vec![br(3 * H, 1)]);
        let st = &a.stats()[0];
        assert_eq!(
            (st.free_aligned_extents, st.hole_count, st.free_hole_blocks),
            (4, 1, H - 1)
        );
        // A hole now exists: served from it, contiguous, nothing else broken.
        let two = a.alloc(1, 0).unwrap();
        assert_eq!(two, vec![br(3 * H + 1, 1)]);
        assert_eq!(aligned_total(&a), 4);
        a.check_consistency().unwrap();
    }

    #[test]
    fn n_huge_gets_n_aligned_extents() {
        let ranges = [(0, 4 * H), (4 * H, 8 * H), (8 * H, 12 * H)];
        // Aligned extents spread across partitions plus many small holes everywhere else.
        let mut free = vec![br(H, H), br(5 * H, H), br(6 * H, H), br(11 * H, H)];
        for u in [0u64, 2, 3, 4, 7, 8, 9, 10] {
            for k in 0..20 {
                free.push(br(u * H + 1 + k * 20, 7));
            }
        }
        let a = Allocator::from_free_runs(&ranges, free).unwrap();
        assert_eq!(aligned_total(&a), 4);
        let holes_before: u64 = a.stats().iter().map(|s| s.free_hole_blocks).sum();
        let v = a.alloc(4 * H, 0).unwrap();
        assert_eq!(v.len(), 4);
        assert!(v.iter().all(|r| r.len == H && r.start % H == 0));
        let mut starts: Vec<u64> = v.iter().map(|r| r.start).collect();
        starts.sort();
        assert_eq!(starts, vec![H, 5 * H, 6 * H, 11 * H]);
        assert_eq!(
            a.stats().iter().map(|s| s.free_hole_blocks).sum::<u64>(),
            holes_before
        );
        a.check_consistency().unwrap();
    }

    #[test]
    fn frees_merge_back_to_aligned() {
        let ranges = [(0, 6 * H), (6 * H, 16 * H)];
        let a = fresh(&ranges);
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut held = Vec::new();
        while a.free_blocks() > 0 {
            let n = 1 + rng.below(a.free_blocks().min(1500));
            held.extend(a.alloc(n, rng.pick(4)).unwrap());
        }
        assert_eq!(a.free_runs(), vec![]);
        // Split some runs into pieces, then free everything in random order.
        let mut pieces = Vec::new();
        for r in held {
            if r.len > 2 {
                let cut = 1 + rng.below(r.len - 1);
                pieces.push(br(r.start, cut));
                pieces.push(br(r.start + cut, r.len - cut));
            } else {
                pieces.push(r);
            }
        }
        while !pieces.is_empty() {
            let i = rng.pick(pieces.len());
            a.free(pieces.swap_remove(i)).unwrap();
            a.check_consistency().unwrap();
        }
        assert_eq!(a.free_runs(), vec![br(0, 16 * H)]);
        let st = a.stats();
        assert_eq!(
            (st[0].free_aligned_extents, st[1].free_aligned_extents),
            (6, 10)
        );
        assert!(st.iter().all(|s| s.hole_count == 0));
    }

    #[test]
    fn stealing_picks_most_free_partition() {
        let ranges = [(0, 2 * H), (2 * H, 6 * H), (6 * H, 12 * H)];
        // P0 empty; P1: 1 aligned + 10-block hole; P2: 3 aligned + 100-block hole.
        let free = [
            br(2 * H, H),
            br(3 * H + 5, 10),
            br(6 * H, 3 * H),
            br(10 * H + 7, 100),
        ];
        let a = Allocator::from_free_runs(&ranges, free).unwrap();
        let v = a.alloc(H, 0).unwrap();
        assert_eq!(a.partition_of(v[0].start), Some(2));
        assert_eq!(v[0].start % H, 0);
        let s = a.alloc(5, 0).unwrap();
        assert_eq!(s, vec![br(10 * H + 7, 5)]);
        assert_eq!(
            a.alloc_aligned_extent(0).map(|u| a.partition_of(u)),
            Some(Some(2))
        );
        a.check_consistency().unwrap();
    }

    #[test]
    fn small_requests_prefer_holes() {
        let ranges = [(0, 8 * H), (8 * H, 16 * H)];
        let mut free = vec![br(0, 4 * H), br(12 * H, 2 * H)];
        for u in [4u64, 5, 6, 7, 8, 9, 10, 11, 14, 15] {
            free.push(br(u * H + 3, 300));
            free.push(br(u * H + 320, 150));
        }
        let a = Allocator::from_free_runs(&ranges, free).unwrap();
        let aligned = aligned_total(&a);
        assert_eq!(aligned, 6);
        let mut rng = Rng(42);
        loop {
            let r = 1 + rng.below(H - 1);
            let holes: u64 = a.stats().iter().map(|s| s.free_hole_blocks).sum();
            if holes < r {
                break;
            }
            let v = a.alloc(r, rng.pick(2)).unwrap();
            assert_eq!(v.iter().map(|x| x.len).sum::<u64>(), r);
            assert_eq!(aligned_total(&a), aligned, "alloc({r}) broke an extent");
        }
        a.check_consistency().unwrap();
    }

    #[test]
    fn no_space_is_all_or_nothing() {
        let ranges = [(0, 4 * H), (4 * H, 8 * H)];
        let a = Allocator::from_free_runs(&ranges, [br(H, H), br(5 * H, H), br(7 * H + 1, 100)])
            .unwrap();
        let before = a.free_runs();
        let fb = a.free_blocks();
        // Two aligned pieces succeed, then the third cannot be served: must roll back.
        let e = a.alloc(3 * H, 0).unwrap_err();
        assert_eq!((e.requested, e.free), (3 * H, fb));
        assert_eq!(a.free_runs(), before);
        let e = a.alloc(fb + 1, 1).unwrap_err();
        assert_eq!(e.requested, fb + 1);
        assert_eq!(a.free_blocks(), fb);
        assert_eq!(a.free_runs(), before);
        assert!(e.to_string().contains("no space"));
        a.check_consistency().unwrap();
    }

    #[test]
    fn take_free_in_holds_a_unit_back_until_freed() {
        // Unit 1 (blocks 512..1024) has a used block at 600; the rest of 0..2048 is free.
        let a = Allocator::from_free_runs(&[(0, 2048)], [br(0, 600), br(601, 1447)]).unwrap();
        let before = a.free_blocks();
        let taken = a.take_free_in(512, 1024);
        assert_eq!(taken.iter().map(|r| r.len).sum::<u64>(), 511);
        assert!(taken.iter().all(|r| r.start >= 512 && r.end() <= 1024));
        assert_eq!(a.free_blocks(), before - 511);
        // Nothing is allocated inside the unit while it is held.
        let got = a.alloc(100, 0).unwrap();
        assert!(
            got.iter().all(|r| r.end() <= 512 || r.start >= 1024),
            "{got:?}"
        );
        for r in got {
            a.free(r).unwrap();
        }
        // Freeing the used block and the taken runs makes the unit an aligned extent again.
        a.free(br(600, 1)).unwrap();
        for r in taken {
            a.free(r).unwrap();
        }
        assert_eq!(aligned_total(&a), 4);
        a.check_consistency().unwrap();
    }

    #[test]
    fn speculative_holdings_count_as_available() {
        let a = fresh(&[(0, 4 * H)]);
        let free = a.free_blocks();
        assert_eq!(a.available_blocks(), free);
        a.set_speculative(7, 100);
        a.set_speculative(9, 300);
        a.set_speculative(7, 40);
        assert_eq!(a.speculative_blocks(), 340);
        assert_eq!(a.available_blocks(), free + 340);
        assert_eq!(a.speculative_holders(), vec![(9, 300), (7, 40)]);
        assert_eq!(a.speculative_of(7), 40);
        // No handler yet: nothing is relieved.
        assert_eq!(a.relieve(10), 0);
        let asked = std::sync::Arc::new(AtomicU64::new(0));
        let seen = asked.clone();
        a.set_pressure_handler(Box::new(move |n| {
            seen.store(n, Relaxed);
            5
        }));
        assert_eq!(a.relieve(10), 5);
        assert_eq!(asked.load(Relaxed), 10);
        a.set_speculative(9, 0);
        a.set_speculative(7, 0);
        assert_eq!((a.speculative_blocks(), a.speculative_of(9)), (0, 0));
        assert!(a.speculative_holders().is_empty());
        // Nothing held: the handler is not asked.
        assert_eq!(a.relieve(10), 0);
    }

    #[test]
    fn double_free_rejected_without_change() {
        let ranges = [(0, 4 * H), (4 * H, 8 * H)];
        let a = fresh(&ranges);
        let v = a.alloc(3 * H + 10, 0).unwrap();
        let before = a.free_runs();
        // Overlaps an aligned extent.
        assert!(
            a.free(br(3 * H - 5, 20))
                .unwrap_err()
                .contains("double free")
        );
        // Overlaps the hole left by the remainder.
        assert!(a.free(br(3 * H + 5, 10)).is_err());
        assert_eq!(a.free_runs(), before);
        // Fill partition 0, then free a run crossing into partition 1 whose second half is free:
        // the (allocated) first half must not be freed either.
        assert_eq!(a.alloc(H - 10, 0).unwrap(), vec![br(3 * H + 10, H - 10)]);
        let before = a.free_runs();
        assert!(a.free(br(4 * H - 10, 20)).is_err());
        assert_eq!(a.free_runs(), before);
        a.free(v[0]).unwrap();
        assert!(a.free(v[0]).is_err());
        assert!(a.free(br(8 * H, 1)).is_err());
        a.check_consistency().unwrap();
    }

    #[test]
    fn from_free_runs_validation() {
        let ranges = [(0, 2 * H), (2 * H, 4 * H + 7)];
        assert!(Allocator::from_free_runs(&ranges, [br(4 * H, 8)]).is_err());
        assert!(Allocator::from_free_runs(&ranges, [br(0, 10), br(9, 3)]).is_err());
        assert!(Allocator::from_free_runs(&[(0, H), (H - 1, 2 * H)], []).is_err());
        assert!(Allocator::from_free_runs(&[(0, H), (2 * H, 3 * H)], [br(H - 1, 2)]).is_err());
        let a = Allocator::from_free_runs(&ranges, [br(H + 100, 2 * H)]).unwrap();
        let st: Vec<_> = a
            .stats()
            .iter()
            .map(|s| (s.free_hole_blocks, s.free_aligned_extents))
            .collect();
        assert_eq!(st, vec![(H - 100, 0), (100, 1)]);
        assert_eq!(a.free_runs(), vec![br(H + 100, 2 * H)]);
        assert_eq!(a.total_blocks(), 4 * H + 7);
        assert_eq!(a.partition_of(4 * H + 7), None);
        assert_eq!(a.partition_of(2 * H), Some(1));
        a.check_consistency().unwrap();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64, usize),
        Free(u64, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..3000, 0usize..8).prop_map(|(n, c)| Op::Alloc(n, c)),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(i, a, b)| Op::Free(i, a, b)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        #[test]
        fn random_alloc_free(units in prop::collection::vec(1u64..5, 2..=4), tail in 1u64..512,
                             ops in prop::collection::vec(op(), 200..400)) {
            let mut ranges = Vec::new();
            let mut s = 0;
            for (i, u) in units.iter().enumerate() {
                let len = u * H + if i + 1 == units.len() { tail } else { 0 };
                ranges.push((s, s + len));
                s += len;
            }
            let a = fresh(&ranges);
            let mut held: Vec<BlockRun> = Vec::new();
            for o in ops {
                match o {
                    Op::Free(i, x, y) if !held.is_empty() => {
                        let r = held.swap_remove(usize::try_from(i % held.len() as u64).unwrap());
                        let (lo, hi) = if y % 3 == 0 { (0, r.len) } else {
                            let lo = x % r.len;
                            (lo, lo + 1 + y % (r.len - lo))
                        };
                        a.free(br(r.start + lo, hi - lo)).unwrap();
                        held.extend([br(r.start, lo), br(r.start + hi, r.len - hi)].into_iter().filter(|p| p.len > 0));
                    }
                    Op::Free(..) => {}
                    Op::Alloc(n, cpu) => {
                        let before = a.free_runs();
                        match a.alloc(n, cpu) {
                            Ok(v) => {
                                prop_assert_eq!(v.iter().map(|r| r.len).sum::<u64>(), n);
                                held.extend(v);
                            }
                            Err(e) => {
                                prop_assert_eq!(e.requested, n);
                                prop_assert_eq!(a.free_runs(), before);
                            }
                        }
                    }
                }
                if let Err(e) = a.check_consistency() { prop_assert!(false, "{}", e); }
                prop_assert_eq!(a.free_blocks() + held.iter().map(|r| r.len).sum::<u64>(), a.total_blocks());
                assert_disjoint(&a, &held);
            }
            for r in held { a.free(r).unwrap(); }
            prop_assert_eq!(a.free_runs(), merged(&ranges));
            for (st, &(s, e)) in a.stats().iter().zip(&ranges) {
                prop_assert_eq!(st.free_aligned_extents, (e - s) / H);
                prop_assert_eq!(st.free_hole_blocks, (e - s) % H);
            }
            a.check_consistency().unwrap();
        }
    }

    #[test]
    fn concurrent_smoke() {
        let ranges = [
            (0, 8 * H),
            (8 * H, 16 * H),
            (16 * H, 24 * H),
            (24 * H, 32 * H + 100),
        ];
        let a = Arc::new(fresh(&ranges));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || {
                    let mut rng = Rng(0x1234_5678 + t as u64 * 7919);
                    let mut held: Vec<BlockRun> = Vec::new();
                    for _ in 0..3000 {
                        if held.is_empty() || rng.below(2) == 0 {
                            if let Ok(v) = a.alloc(1 + rng.below(2000), t) {
                                held.extend(v);
                            }
                        } else {
                            let i = rng.pick(held.len());
                            a.free(held.swap_remove(i)).unwrap();
                        }
                    }
                    held
                })
            })
            .collect();
        let held: Vec<BlockRun> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        a.check_consistency().unwrap();
        assert_eq!(
            a.free_blocks() + held.iter().map(|r| r.len).sum::<u64>(),
            a.total_blocks()
        );
        assert_disjoint(&a, &held);
        for r in held {
            a.free(r).unwrap();
        }
        assert_eq!(a.free_runs(), merged(&ranges));
    }
}
