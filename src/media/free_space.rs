//! The free space of one partition: a FIFO list of free aligned 2 MiB extents (as in the
//! paper, with an address index beside it) and the free unaligned holes (`media::hole_map`: a
//! bitmap with a segment tree of run lengths), with the merge that promotes every full aligned
//! unit back to the list. The allocator (`media::alloc`) holds one per partition under a mutex
//! and decides which partition serves a request.
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::BLOCKS_PER_HUGE;
use crate::media::hole_map::HoleMap;
use std::collections::{BTreeSet, VecDeque};

const H: u64 = BLOCKS_PER_HUGE;

/// A contiguous run of blocks `[start, start + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockRun {
    /// First block of the run.
    pub start: u64,
    /// Number of blocks in the run.
    pub len: u64,
}

impl BlockRun {
    /// One past the last block of the run.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Free space of one partition; only touched under its mutex.
#[derive(Default)]
pub(crate) struct FreeSpace {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Free aligned extents in list order (pop head, push tail), as in the paper.
    pub(crate) aligned: VecDeque<u64>,
    /// Same extents, indexed by address for O(log n) overlap checks.
    pub(crate) aligned_set: BTreeSet<u64>,
    /// Unaligned free runs: the maximal runs of free blocks outside `aligned`.
    pub(crate) holes: HoleMap,
    pub(crate) hole_blocks: u64,
    /// Wear-aware allocation (`MountOptions::wear_aware`): small allocations take the next
    /// hole at or after this block (next fit, wrapping), so churn spreads over every hole
    /// instead of wearing the lowest ones; None: lowest address first.
    pub(crate) spread_from: Option<u64>,
}

impl FreeSpace {
    /// The free space of partition `[start, end)` before anything is freed into it.
    pub(crate) fn empty(start: u64, end: u64) -> FreeSpace {
        FreeSpace {
            start,
            end,
            holes: HoleMap::new(start, end),
            ..Default::default()
        }
    }

    /// `[s, s + len)` (inside no hole, no aligned extent) becomes hole blocks; it merges with
    /// the holes beside it by itself.
    pub(crate) fn add_hole(&mut self, s: u64, len: u64) {
        if len > 0 {
            self.holes.set(s, s + len, true);
            self.hole_blocks += len;
        }
    }

    /// `[s, s + len)`, hole blocks, are taken.
    fn take_hole_blocks(&mut self, s: u64, len: u64) {
        if len > 0 {
            self.holes.set(s, s + len, false);
            self.hole_blocks -= len;
        }
    }

    /// The length of the hole starting at `s` (0: none starts there).
    fn hole_at(&self, s: u64) -> u64 {
        match s > self.start && self.holes.is_free(s - 1) {
            true => 0,
            false => self.holes.run_from(s, u64::MAX),
        }
    }

    /// The lowest-address hole of at least `r` blocks: (start, length).
    fn lowest_fit(&self, r: u64) -> Option<(u64, u64)> {
        let s = self.holes.find(self.start, r.max(1))?;
        Some((s, self.holes.run_from(s, u64::MAX)))
    }

    pub(crate) fn pop_aligned(&mut self) -> Option<u64> {
        let u = self.aligned.pop_front()?;
        self.aligned_set.remove(&u);
        Some(u)
    }

    /// Whether any block of `[s, e)` is already free here.
    pub(crate) fn overlaps_free(&self, s: u64, e: u64) -> bool {
        if self.holes.any_free(s, e) {
            return true;
        }
        // Any extent starting in [floor512(s), e) covers part of [s, e).
        self.aligned_set.range(s - s % H..e).next().is_some()
    }

    /// Add `[s, e)` as free: it joins the holes beside it, then every aligned unit it made
    /// whole goes to the list (in address order). Units wholly inside `[s, e)` go to the list
    /// without passing through the bitmap, so freeing a large range (a partition at mount) costs
    /// its units, not its blocks.
    pub(crate) fn insert_free(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let (lo, hi) = (s.div_ceil(H) * H, e / H * H);
        if lo >= hi {
            // No whole unit inside: at most the two units the range touches can fill up.
            self.add_hole(s, e - s);
            self.promote_if_full(s - s % H);
            if (e - 1) / H != s / H {
                self.promote_if_full((e - 1) / H * H);
            }
            return;
        }
        self.add_hole(s, lo - s);
        self.add_hole(hi, e - hi);
        if s < lo {
            self.promote_if_full(lo - H);
        }
        let mut u = lo;
        while u < hi {
            self.push_aligned(u);
            u += H;
        }
        if hi < e {
            self.promote_if_full(hi);
        }
    }

    /// The unit at `u` goes to the aligned list if it lies in the partition and its every block
    /// is a free hole block.
    fn promote_if_full(&mut self, u: u64) {
        if u >= self.start && u + H <= self.end && self.holes.unit_full(u) {
            self.take_hole_blocks(u, H);
            self.push_aligned(u);
        }
    }

    fn push_aligned(&mut self, u: u64) {
        self.aligned.push_back(u);
        self.aligned_set.insert(u);
    }

    /// A hole with at least `r` blocks, its first `r` blocks taken: the lowest-address one, or
    /// with wear-aware allocation the next one at or after the last allocation's end.
    pub(crate) fn first_fit(&mut self, r: u64) -> Option<u64> {
        let Some(c) = self.spread_from else {
            return self.take_lowest(r, r);
        };
        // Next fit: from the cursor inside the hole that holds it, else the next hole that
        // fits, wrapping around.
        let at = match self.holes.is_free(c) && self.holes.run_from(c, r) >= r {
            true => c,
            false => self
                .holes
                .find(c + 1, r)
                .or_else(|| self.holes.find(self.start, r).filter(|&s| s <= c))?,
        };
        self.take_hole_blocks(at, r);
        self.spread_from = Some(at + r);
        Some(at)
    }

    /// The lowest-address hole of at least `len` blocks (`len >= r`), its first `r` blocks
    /// taken: a piece with room after it for a file that grows. None under wear-aware
    /// allocation, whose next fit would not keep the room free anyway.
    pub(crate) fn fit_with_room(&mut self, r: u64, len: u64) -> Option<u64> {
        if self.spread_from.is_some() {
            return None;
        }
        self.take_lowest(r, len)
    }

    /// The first `r` blocks of the lowest-address hole of at least `len.max(r)` blocks, taken.
    fn take_lowest(&mut self, r: u64, len: u64) -> Option<u64> {
        let s = self.holes.find(self.start, len.max(r).max(1))?;
        self.take_hole_blocks(s, r);
        Some(s)
    }

    /// Take up to `max` blocks from `goal` on if a hole starts there (the blocks after a file's
    /// last one); how many were taken. Nothing under wear-aware allocation, which spreads instead.
    pub(crate) fn take_at(&mut self, goal: u64, max: u64) -> u64 {
        if self.spread_from.is_some() || goal < self.start || goal >= self.end {
            return 0;
        }
        let take = self.hole_at(goal).min(max);
        self.take_hole_blocks(goal, take);
        take
    }

    /// Take up to `need` blocks from holes in address order; returns how many were taken.
    pub(crate) fn gather(&mut self, need: u64, out: &mut Vec<BlockRun>) -> u64 {
        self.take_holes(need, out, |f| f.lowest_fit(1))
    }

    /// Take up to `need` blocks from holes of at least `min_piece` blocks, the largest size
    /// class first (so the fewest pieces), lowest address first within a class; returns how
    /// many were taken. Every piece but the last is a whole hole of `min_piece` or more.
    pub(crate) fn gather_pieces(&mut self, need: u64, min_piece: u64, out: &mut Vec<BlockRun>) -> u64 {
        self.take_holes(need, out, |f| f.largest_class_hole(min_piece))
    }

    /// Take up to `need` blocks from the holes `next` picks in turn (each from its start, the
    /// last one possibly in part) into `out`; returns how many were taken.
    fn take_holes(
        &mut self,
        need: u64,
        out: &mut Vec<BlockRun>,
        next: impl Fn(&Self) -> Option<(u64, u64)>,
    ) -> u64 {
        let mut got = 0;
        while got < need {
            let Some((s, l)) = next(self) else {
                break;
            };
            let take = l.min(need - got);
            self.take_hole_blocks(s, take);
            out.push(BlockRun { start: s, len: take });
            got += take;
        }
        got
    }

    /// The lowest-address hole of at least `min` blocks in the largest size class (lengths
    /// `2^k..2^(k+1)`) that has one: every hole of the largest hole's class is long enough for
    /// it, so the lowest hole of at least `2^k` (and of `min`) is the one.
    fn largest_class_hole(&self, min: u64) -> Option<(u64, u64)> {
        let largest = self.holes.largest();
        if largest == 0 || largest < min {
            return None;
        }
        self.lowest_fit((1u64 << largest.ilog2()).max(min))
    }

    /// Move every free block of `[a, b)` out of this pool into `out` (parts of free runs
    /// outside the range stay free).
    pub(crate) fn take_range(&mut self, a: u64, b: u64, out: &mut Vec<BlockRun>) {
        let units: Vec<u64> = self
            .aligned_set
            .range(a - a % H..b)
            .copied()
            .filter(|&u| u + H > a)
            .collect();
        for u in units {
            self.aligned_set.remove(&u);
            self.aligned.retain(|&x| x != u);
            let (s, e) = (u.max(a), (u + H).min(b));
            out.push(BlockRun {
                start: s,
                len: e - s,
            });
            if u < s {
                self.insert_free(u, s);
            }
            if e < u + H {
                self.insert_free(e, u + H);
            }
        }
        // The holes' parts inside the range; what is left of a hole holds no whole unit.
        for (s, len) in self.holes.runs_in(a, b) {
            self.take_hole_blocks(s, len);
            out.push(BlockRun { start: s, len });
        }
    }

    /// Pop the head aligned extent, keep its first `r` blocks, return the rest as a hole.
    pub(crate) fn break_aligned(&mut self, r: u64) -> Option<u64> {
        let u = self.pop_aligned()?;
        self.insert_free(u + r, u + H);
        Some(u)
    }

    /// Verify this pool's invariants; the message names partition `idx` and the first violation.
    pub(crate) fn check(&self, idx: usize, cnt_aligned: u64, cnt_holes: u64) -> Result<(), String> {
        let fail = |m: String| {
            Err(format!(
                "partition {idx} [{},{}): {m}",
                self.start, self.end
            ))
        };
        self.holes.check_tree().or_else(&fail)?;
        let mut sum = 0;
        for (s, l) in self.holes.holes() {
            let e = s + l;
            let bad = if s < self.start || e > self.end {
                "is outside the partition"
            } else if s.div_ceil(H) * H + H <= e {
                "contains a full aligned unit"
            } else if self.aligned_set.range(s - s % H..e).next().is_some() {
                "overlaps an aligned extent"
            } else {
                ""
            };
            if !bad.is_empty() {
                return fail(format!("hole [{s},{e}) {bad}"));
            }
            sum += l;
        }
        for &u in &self.aligned {
            if u % H != 0 || u < self.start || u + H > self.end || !self.aligned_set.contains(&u) {
                return fail(format!(
                    "aligned extent {u} misaligned, outside or unindexed"
                ));
            }
        }
        let n = self.aligned.len() as u64;
        if self.aligned_set.len() as u64 != n {
            return fail("duplicate aligned extents in the list".into());
        }
        if sum != self.hole_blocks || cnt_holes != sum || cnt_aligned != n {
            let hb = self.hole_blocks;
            return fail(format!(
                "counters: holes {hb}/{cnt_holes} (real {sum}), aligned {cnt_aligned} (real {n})"
            ));
        }
        Ok(())
    }
}

/// The part of a run of blocks inside one partition: (partition, start, end).
pub(crate) type Piece = (usize, u64, u64);

/// Two pieces of one batch of frees that overlap, if any (a double free inside the batch). A
/// batch is short (a file's extents), so small ones are compared pair by pair with no
/// allocation.
pub(crate) fn first_overlap(pieces: &[Piece]) -> Option<(Piece, Piece)> {
    let meet = |a: &Piece, b: &Piece| a.1 < b.2 && b.1 < a.2;
    if pieces.len() <= 16 {
        return pieces.iter().enumerate().find_map(|(i, a)| {
            pieces[i + 1..]
                .iter()
                .find(|b| meet(a, b))
                .map(|b| if a.1 <= b.1 { (*a, *b) } else { (*b, *a) })
        });
    }
    let mut sorted = pieces.to_vec();
    sorted.sort_unstable_by_key(|p| (p.1, p.2));
    sorted.windows(2).find(|w| meet(&w[0], &w[1])).map(|w| (w[0], w[1]))
}

/// Sort runs and merge the physically adjacent ones.
pub(crate) fn coalesce(mut runs: Vec<BlockRun>) -> Vec<BlockRun> {
    runs.sort();
    let mut out: Vec<BlockRun> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if last.end() == r.start => last.len += r.len,
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size-class search finds exactly the hole a walk in address order finds, through a
    /// long run of frees and first-fit allocations; the index stays consistent throughout.
    #[test]
    fn lowest_fit_is_the_first_hole_that_fits_by_address() {
        let mut f = FreeSpace::empty(0, 1 << 20);
        let mut rng = crate::rng::Rng::new(99);
        let mut rnd = |n: u64| rng.below(n);
        let mut found = 0;
        for step in 0..20_000 {
            if step % 3 != 0 {
                let (s, len) = (rnd((1 << 20) - 2048), 1 + rnd(700));
                if !f.overlaps_free(s, s + len) {
                    f.insert_free(s, s + len);
                }
            } else {
                let r = 1 + rnd(600);
                let want = f.holes.holes().into_iter().find(|&(_, l)| l >= r);
                assert_eq!(f.lowest_fit(r), want, "step {step}, {r} blocks");
                if let Some((s, _)) = want {
                    assert_eq!(f.first_fit(r), Some(s));
                    found += 1;
                }
            }
            f.check(0, f.aligned.len() as u64, f.hole_blocks).unwrap();
        }
        assert!(found > 1000, "{found}");
    }
}
