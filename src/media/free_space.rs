//! The free space of one partition: a FIFO list of free aligned 2 MiB extents (as in the
//! paper, with an address index beside it) and a tree of free unaligned holes, with the merge
//! that promotes every full aligned unit back to the list. The allocator (`media::alloc`) holds
//! one per partition under a mutex and decides which partition serves a request.
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::BLOCKS_PER_HUGE;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

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
    /// Unaligned free runs: start -> len.
    pub(crate) holes: BTreeMap<u64, u64>,
    /// The same holes' starts by size class (entry `k`: lengths in `[2^k, 2^(k+1))`), so that
    /// the lowest hole that fits is found without walking the smaller ones below it.
    by_class: Vec<BTreeSet<u64>>,
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
            ..Default::default()
        }
    }

    pub(crate) fn add_hole(&mut self, s: u64, len: u64) {
        if len > 0 {
            self.holes.insert(s, len);
            self.hole_blocks += len;
            let k = size_class(len);
            if self.by_class.len() <= k {
                self.by_class.resize_with(k + 1, BTreeSet::new);
            }
            self.by_class[k].insert(s);
        }
    }

    pub(crate) fn remove_hole(&mut self, s: u64) -> u64 {
        let l = self.holes.remove(&s).expect("hole exists");
        self.hole_blocks -= l;
        self.by_class[size_class(l)].remove(&s);
        l
    }

    /// The lowest-address hole of at least `r` blocks: the lowest of the larger size classes'
    /// first holes, or a lower one of `r`'s own class that is long enough.
    fn lowest_fit(&self, r: u64) -> Option<(u64, u64)> {
        let c = size_class(r.max(1));
        let mut best = self
            .by_class
            .iter()
            .skip(c + 1)
            .filter_map(|set| set.first().copied())
            .min();
        if let Some(own) = self.by_class.get(c) {
            for &s in own.range(..best.unwrap_or(u64::MAX)) {
                if self.holes.get(&s).is_some_and(|&l| l >= r) {
                    best = Some(s);
                    break;
                }
            }
        }
        best.and_then(|s| self.holes.get(&s).map(|&l| (s, l)))
    }

    pub(crate) fn pop_aligned(&mut self) -> Option<u64> {
        let u = self.aligned.pop_front()?;
        self.aligned_set.remove(&u);
        Some(u)
    }

    /// Whether any block of `[s, e)` is already free here.
    pub(crate) fn overlaps_free(&self, s: u64, e: u64) -> bool {
        if let Some((&hs, &hl)) = self.holes.range(..e).next_back()
            && hs + hl > s
        {
            return true;
        }
        // Any extent starting in [floor512(s), e) covers part of [s, e).
        self.aligned_set.range(s - s % H..e).next().is_some()
    }

    /// Add `[s, e)` as free: merge with neighbouring holes, then promote every full aligned unit.
    pub(crate) fn insert_free(&mut self, mut s: u64, mut e: u64) {
        if let Some((&ps, &pl)) = self.holes.range(..s).next_back()
            && ps + pl == s
        {
            self.remove_hole(ps);
            s = ps;
        }
        if self.holes.contains_key(&e) {
            e += self.remove_hole(e);
        }
        let mut u = s.div_ceil(H) * H;
        if u + H > e {
            self.add_hole(s, e - s);
            return;
        }
        self.add_hole(s, u - s);
        while u + H <= e {
            self.aligned.push_back(u);
            self.aligned_set.insert(u);
            u += H;
        }
        self.add_hole(u, e - u);
    }

    /// A hole with at least `r` blocks, its first `r` blocks taken: the lowest-address one, or
    /// with wear-aware allocation the next one at or after the last allocation's end.
    pub(crate) fn first_fit(&mut self, r: u64) -> Option<u64> {
        let fits = |(&s, &l): (&u64, &u64)| (l >= r).then_some((s, l));
        let Some(c) = self.spread_from else {
            return self.take_lowest(r, r);
        };
        // Next fit: from the cursor inside the hole that holds it, else the next hole that
        // fits, wrapping around.
        let at = match self.holes.range(..=c).next_back() {
            Some((&s, &l)) if s + l >= c + r => Some((s, l, c)),
            _ => None,
        };
        let (s, l, at) = match at {
            Some(x) => x,
            None => {
                let (s, l) = self
                    .holes
                    .range(c + 1..)
                    .find_map(fits)
                    .or_else(|| self.holes.range(..=c).find_map(fits))?;
                (s, l, s)
            }
        };
        self.remove_hole(s);
        self.add_hole(s, at - s);
        self.add_hole(at + r, s + l - at - r);
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
        let (s, l) = self.lowest_fit(len.max(r))?;
        self.remove_hole(s);
        self.add_hole(s + r, l - r);
        Some(s)
    }

    /// Take up to `max` blocks from `goal` on if a hole starts there (the blocks after a file's
    /// last one); how many were taken. Nothing under wear-aware allocation, which spreads instead.
    pub(crate) fn take_at(&mut self, goal: u64, max: u64) -> u64 {
        let Some(&l) = self.holes.get(&goal) else {
            return 0;
        };
        if self.spread_from.is_some() {
            return 0;
        }
        let take = l.min(max);
        self.remove_hole(goal);
        self.add_hole(goal + take, l - take);
        take
    }

    /// Take up to `need` blocks from holes in address order; returns how many were taken.
    pub(crate) fn gather(&mut self, need: u64, out: &mut Vec<BlockRun>) -> u64 {
        self.take_holes(need, out, |f| f.holes.iter().next().map(|(&s, &l)| (s, l)))
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
            self.remove_hole(s);
            self.add_hole(s + take, l - take);
            out.push(BlockRun { start: s, len: take });
            got += take;
        }
        got
    }

    /// The lowest-address hole of at least `min` blocks in the largest size class that has one.
    fn largest_class_hole(&self, min: u64) -> Option<(u64, u64)> {
        let lowest = size_class(min.max(1));
        // Every hole of a class above `min`'s own is long enough; in that class some may not be.
        (lowest..self.by_class.len()).rev().find_map(|c| {
            self.by_class[c]
                .iter()
                .find_map(|s| self.holes.get(s).filter(|&&l| l >= min).map(|&l| (*s, l)))
        })
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
        let holes: Vec<(u64, u64)> = {
            let first = self
                .holes
                .range(..a)
                .next_back()
                .map(|(&s, _)| s)
                .unwrap_or(a);
            self.holes
                .range(first..b)
                .filter(|&(&s, &l)| s + l > a)
                .map(|(&s, &l)| (s, l))
                .collect()
        };
        for (hs, hl) in holes {
            self.remove_hole(hs);
            let (s, e) = (hs.max(a), (hs + hl).min(b));
            out.push(BlockRun {
                start: s,
                len: e - s,
            });
            // What is left of a hole holds no whole aligned unit: it stays a hole.
            self.add_hole(hs, s - hs);
            self.add_hole(e, hs + hl - e);
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
        let (mut prev_end, mut sum) = (None, 0);
        for (&s, &l) in &self.holes {
            let e = s + l;
            let bad = if l == 0 || s < self.start || e > self.end {
                "is empty or outside the partition"
            } else if prev_end.is_some_and(|pe| s < pe) {
                "overlaps the previous hole"
            } else if prev_end == Some(s) {
                "is adjacent to the previous hole (not merged)"
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
            (prev_end, sum) = (Some(e), sum + l);
        }
        for &u in &self.aligned {
            if u % H != 0 || u < self.start || u + H > self.end || !self.aligned_set.contains(&u) {
                return fail(format!(
                    "aligned extent {u} misaligned, outside or unindexed"
                ));
            }
        }
        let classed: usize = self.by_class.iter().map(BTreeSet::len).sum();
        let misfiled = self.by_class.iter().enumerate().find_map(|(k, set)| {
            set.iter()
                .find(|s| self.holes.get(s).is_none_or(|&l| size_class(l) != k))
                .copied()
        });
        if let Some(s) = misfiled {
            return fail(format!("the size index has hole {s} in the wrong class or none"));
        }
        if classed != self.holes.len() {
            return fail(format!(
                "the size index has {classed} holes, the tree {}",
                self.holes.len()
            ));
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

/// Size class of a hole of `len` (> 0) blocks: floor(log2(len)).
fn size_class(len: u64) -> usize {
    len.ilog2() as usize
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
        let mut f = FreeSpace {
            start: 0,
            end: 1 << 20,
            ..Default::default()
        };
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
                let want = f.holes.iter().find(|&(_, &l)| l >= r).map(|(&s, &l)| (s, l));
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
