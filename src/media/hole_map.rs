//! The holes of one partition (its free blocks outside free aligned 2 MiB extents) as a bitmap
//! with a segment tree of run summaries over it, after SanGuo's bitmap segment tree
//! (`../shared/papers/sanguo.txt`, FBST), but keeping what a contiguous allocator needs: each
//! node holds the longest run of free blocks in its range and the runs at its two ends, so the
//! lowest run of at least `r` blocks is found in one walk from the root.
//!
//! The tree's leaves are 2 MiB units (512 blocks, eight words of the bitmap). A free or an
//! allocation sets or clears bits and recomputes the summaries of the leaves it touched and of
//! their ancestors: its cost does not grow with the number of holes, as a search tree's does
//! (the B-trees this replaced, one by address and one by size class, took eight searches for a
//! free, each missing the cache on a fragmented pool: docs/BENCHMARKS.md, "Metadata paths on a
//! diet"). A run is a *hole* when it is maximal: the blocks on either side are not free holes.
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::BLOCKS_PER_HUGE;

const H: u64 = BLOCKS_PER_HUGE;
/// Bitmap words per leaf (one 2 MiB unit).
const LEAF_WORDS: usize = (H / 64) as usize;
const _: () = assert!(H.is_multiple_of(64) && LEAF_WORDS >= 1);

/// Free-run lengths of a node's range: from its first block, to its last, and the longest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Runs {
    pre: u64,
    suf: u64,
    max: u64,
}

impl Runs {
    /// The runs of two adjacent ranges of `left_len` and `right_len` blocks, left first.
    fn join(l: Runs, r: Runs, left_len: u64, right_len: u64) -> Runs {
        Runs {
            pre: if l.pre == left_len { left_len + r.pre } else { l.pre },
            suf: if r.suf == right_len { right_len + l.suf } else { r.suf },
            max: l.max.max(r.max).max(l.suf + r.pre),
        }
    }
}

/// Free hole blocks of the partition `[start, end)`.
#[derive(Default)]
pub(crate) struct HoleMap {
    /// Block of bit 0 of word 0: `start` rounded down to a unit, so leaves are units.
    base: u64,
    start: u64,
    end: u64,
    /// Bit `i % 64` of word `i / 64`: block `base + i` is a free hole block.
    words: Vec<u64>,
    /// Leaves in the tree (a power of two).
    leaves: usize,
    /// The tree, heap-ordered: node 1 is the root, node `k`'s children are `2k` and `2k + 1`,
    /// leaf `i` is node `leaves + i`.
    tree: Vec<Runs>,
}

impl HoleMap {
    /// No free block in `[start, end)`.
    pub(crate) fn new(start: u64, end: u64) -> HoleMap {
        let base = start - start % H;
        let units = usize::try_from((end.max(base) - base).div_ceil(H)).unwrap_or(0).max(1);
        let leaves = units.next_power_of_two();
        HoleMap {
            base,
            start,
            end,
            words: vec![0; units * LEAF_WORDS],
            leaves,
            tree: vec![Runs::default(); 2 * leaves],
        }
    }

    /// Bit index of block `b` (inside the map).
    fn bit(&self, b: u64) -> usize {
        usize::try_from(b - self.base).unwrap_or(usize::MAX)
    }

    /// The block of bit index `i`.
    fn block(&self, i: usize) -> u64 {
        self.base + i as u64
    }

    /// Whether block `b` is a free hole block (false outside the partition).
    pub(crate) fn is_free(&self, b: u64) -> bool {
        if b < self.start || b >= self.end {
            return false;
        }
        let i = self.bit(b);
        self.words[i / 64] >> (i % 64) & 1 == 1
    }

    /// Longest hole, in blocks.
    pub(crate) fn largest(&self) -> u64 {
        self.tree[1].max
    }

    /// Set (`free`) or clear the bits of `[a, b)` (inside the partition), then bring the
    /// summaries of the leaves touched, and of their ancestors, up to date.
    pub(crate) fn set(&mut self, a: u64, b: u64, free: bool) {
        if a >= b {
            return;
        }
        let (i, j) = (self.bit(a), self.bit(b));
        let (wa, wb) = (i / 64, (j - 1) / 64);
        for w in wa..=wb {
            let lo = if w == wa { i % 64 } else { 0 };
            let hi = if w == wb { (j - 1) % 64 + 1 } else { 64 };
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            if free {
                self.words[w] |= mask;
            } else {
                self.words[w] &= !mask;
            }
        }
        let (la, lb) = (wa / LEAF_WORDS, wb / LEAF_WORDS);
        for leaf in la..=lb {
            self.tree[self.leaves + leaf] = self.leaf_runs(leaf);
        }
        if la == lb {
            // One leaf (most frees and allocations): up its path, as far as anything changes.
            let (mut k, mut child_len) = ((self.leaves + la) / 2, H);
            while k >= 1 {
                let runs = Runs::join(self.tree[2 * k], self.tree[2 * k + 1], child_len, child_len);
                if self.tree[k] == runs {
                    break;
                }
                self.tree[k] = runs;
                (k, child_len) = (k / 2, child_len * 2);
            }
            return;
        }
        // Parents of the touched leaves, level by level up to the root.
        let (mut lo, mut hi) = ((self.leaves + la) / 2, (self.leaves + lb) / 2);
        let mut child_len = H;
        while lo >= 1 {
            for k in lo..=hi {
                self.tree[k] = Runs::join(self.tree[2 * k], self.tree[2 * k + 1], child_len, child_len);
            }
            (lo, hi, child_len) = (lo / 2, hi / 2, child_len * 2);
        }
    }

    /// The runs of leaf `leaf`, from its words (bit 0 of its first word first).
    fn leaf_runs(&self, leaf: usize) -> Runs {
        let words = &self.words[leaf * LEAF_WORDS..(leaf + 1) * LEAF_WORDS];
        let (mut pre, mut run, mut max) = (0u64, 0u64, 0u64);
        let mut in_prefix = true;
        for &w in words {
            if w == u64::MAX {
                run += 64;
                max = max.max(run);
                if in_prefix {
                    pre += 64;
                }
                continue;
            }
            // The run coming in goes on to this word's first clear bit.
            let lead = w.trailing_ones();
            run += u64::from(lead);
            max = max.max(run);
            if in_prefix {
                pre += u64::from(lead);
                in_prefix = false;
            }
            // The runs after it: wholly inside the word, or reaching its end (and going on).
            let (mut x, mut pos) = (w >> lead, lead);
            run = 0;
            while x != 0 {
                let zeros = x.trailing_zeros();
                x >>= zeros;
                pos += zeros;
                let ones = x.trailing_ones();
                max = max.max(u64::from(ones));
                pos += ones;
                if pos >= 64 {
                    run = u64::from(ones);
                    break;
                }
                x >>= ones;
            }
        }
        Runs { pre, suf: run, max }
    }

    /// The first block of the lowest hole of at least `r` (> 0) blocks that starts at or after
    /// block `from`, counting only its part from `from` on.
    pub(crate) fn find(&self, from: u64, r: u64) -> Option<u64> {
        if r == 0 || self.tree[1].max < r || from >= self.end {
            return None;
        }
        let from = self.bit(from.max(self.start));
        match self.find_in(1, 0, self.leaves * LEAF_WORDS * 64, from, r, 0) {
            Found::At(i) => Some(self.block(i)),
            Found::Carry(_) => None,
        }
    }

    /// [`HoleMap::find`] inside node `k`, which covers bits `lo..lo + len`; bits before `from`
    /// do not count, and `carry` counted free bits end just before `lo`.
    fn find_in(&self, k: usize, lo: usize, len: usize, from: usize, r: u64, carry: u64) -> Found {
        let hi = lo + len;
        if hi <= from {
            return Found::Carry(0);
        }
        let n = self.tree[k];
        if lo >= from {
            if carry + n.pre >= r {
                return Found::At(lo - usize::try_from(carry).unwrap_or(0));
            }
            if n.max < r {
                return Found::Carry(if n.pre == len as u64 { carry + len as u64 } else { n.suf });
            }
        }
        if k >= self.leaves {
            return self.scan(lo.max(from), hi, r, if lo >= from { carry } else { 0 });
        }
        let half = len / 2;
        match self.find_in(2 * k, lo, half, from, r, carry) {
            Found::At(i) => Found::At(i),
            Found::Carry(c) => self.find_in(2 * k + 1, lo + half, half, from, r, c),
        }
    }

    /// Bits `a..b` of one leaf, in order, for the first run of `r` with `run` counted free bits
    /// just before `a`.
    fn scan(&self, a: usize, b: usize, r: u64, mut run: u64) -> Found {
        let mut i = a;
        while i < b {
            let w = self.words[i / 64] >> (i % 64);
            let room = (64 - i % 64).min(b - i);
            if w & 1 == 1 {
                let ones = (w.trailing_ones() as usize).min(room);
                if run + ones as u64 >= r {
                    // The window starts where the run did.
                    return Found::At(i - usize::try_from(run).unwrap_or(0));
                }
                run += ones as u64;
                i += ones;
            } else {
                run = 0;
                i += if w == 0 { room } else { (w.trailing_zeros() as usize).min(room) };
            }
        }
        Found::Carry(run)
    }

    /// Free blocks from `b` on, up to `max` of them.
    pub(crate) fn run_from(&self, b: u64, max: u64) -> u64 {
        let mut n = 0;
        let mut i = self.bit(b);
        let limit = self.bit(self.end.min(b.saturating_add(max)));
        while i < limit {
            let w = self.words[i / 64] >> (i % 64);
            let room = (64 - i % 64).min(limit - i);
            let ones = (w.trailing_ones() as usize).min(room);
            n += ones as u64;
            if ones < room {
                break;
            }
            i += ones;
        }
        n
    }

    /// Whether any block of `[a, b)` is a free hole block.
    pub(crate) fn any_free(&self, a: u64, b: u64) -> bool {
        let (a, b) = (a.max(self.start), b.min(self.end));
        if a >= b {
            return false;
        }
        let (i, j) = (self.bit(a), self.bit(b));
        (i / 64..=(j - 1) / 64).any(|w| {
            let lo = if w == i / 64 { i % 64 } else { 0 };
            let hi = if w == (j - 1) / 64 { (j - 1) % 64 + 1 } else { 64 };
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            self.words[w] & mask != 0
        })
    }

    /// Whether every block of the unit at `u` (inside the partition) is a free hole block.
    pub(crate) fn unit_full(&self, u: u64) -> bool {
        let w = self.bit(u) / 64;
        self.words[w..w + LEAF_WORDS].iter().all(|&x| x == u64::MAX)
    }

    /// The holes in `[a, b)`, clipped to it, in address order: (start, length).
    pub(crate) fn runs_in(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let (mut x, b) = (a.max(self.start), b.min(self.end));
        while x < b {
            let Some(s) = self.find(x, 1).filter(|&s| s < b) else {
                break;
            };
            let l = self.run_from(s, b - s);
            out.push((s, l));
            x = s + l;
        }
        out
    }

    /// Every hole, whole, in address order: (start, length).
    pub(crate) fn holes(&self) -> Vec<(u64, u64)> {
        self.runs_in(self.start, self.end)
    }

    /// Number of holes.
    pub(crate) fn count(&self) -> u64 {
        let mut carry = 0u64;
        let mut n = 0u64;
        for &w in &self.words {
            // Run starts: set bits whose lower neighbour (the word's previous bit, or the last
            // bit of the previous word) is clear.
            n += u64::from((w & !((w << 1) | carry)).count_ones());
            carry = w >> 63;
        }
        n
    }

    /// Every summary equals the one its bits give; Err names the first node that does not.
    pub(crate) fn check_tree(&self) -> Result<(), String> {
        let units = self.words.len() / LEAF_WORDS;
        for leaf in 0..self.leaves {
            let want = if leaf < units { self.leaf_runs(leaf) } else { Runs::default() };
            if self.tree[self.leaves + leaf] != want {
                return Err(format!("hole map leaf {leaf} summary disagrees with its bits"));
            }
        }
        let mut child_len = H;
        let mut level = self.leaves / 2;
        while level >= 1 {
            for k in level..2 * level {
                let want = Runs::join(self.tree[2 * k], self.tree[2 * k + 1], child_len, child_len);
                if self.tree[k] != want {
                    return Err(format!("hole map node {k} summary disagrees with its children"));
                }
            }
            (level, child_len) = (level / 2, child_len * 2);
        }
        let outside = |i: usize, j: usize| (i..j).any(|k| self.words[k / 64] >> (k % 64) & 1 == 1);
        if outside(0, self.bit(self.start)) || outside(self.bit(self.end), self.words.len() * 64) {
            return Err("hole map has free bits outside the partition".into());
        }
        Ok(())
    }
}

/// What a search of a node found: the bit a window starts at, or the free run its range ends
/// with (counted bits only).
enum Found {
    At(usize),
    Carry(u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A model: the set of free blocks.
    fn model_find(free: &BTreeSet<u64>, from: u64, r: u64, end: u64) -> Option<u64> {
        let mut run_start = None;
        for b in from..end {
            if free.contains(&b) {
                let s = *run_start.get_or_insert(b);
                if b + 1 - s >= r {
                    return Some(s);
                }
            } else {
                run_start = None;
            }
        }
        None
    }

    #[test]
    fn searches_and_counts_agree_with_a_set_of_blocks() {
        // A partition that starts and ends off unit boundaries, over more than one leaf level.
        let (start, end) = (3 * H + 100, 11 * H + 37);
        let mut m = HoleMap::new(start, end);
        let mut free = BTreeSet::new();
        let mut rng = crate::rng::Rng::new(7);
        for step in 0..4000 {
            let a = start + rng.below(end - start);
            let len = 1 + rng.below(if step % 7 == 0 { 2000 } else { 40 });
            let b = (a + len).min(end);
            let on = rng.below(3) != 0;
            m.set(a, b, on);
            for x in a..b {
                if on {
                    free.insert(x);
                } else {
                    free.remove(&x);
                }
            }
            m.check_tree().unwrap();
            let from = start + rng.below(end - start);
            let r = 1 + rng.below(if step % 5 == 0 { 1500 } else { 30 });
            assert_eq!(m.find(from, r), model_find(&free, from, r, end), "step {step}: find({from}, {r})");
            assert_eq!(m.find(start, r), model_find(&free, start, r, end), "step {step}: lowest {r}");
            let b0 = start + rng.below(end - start);
            let want_run = (b0..end).take_while(|x| free.contains(x)).count() as u64;
            assert_eq!(m.run_from(b0, u64::MAX), want_run, "step {step}: run from {b0}");
            let (c, d) = (a.min(from), a.max(from) + 1);
            assert_eq!(m.any_free(c, d), free.range(c..d).next().is_some(), "step {step}: any in {c}..{d}");
        }
        let holes = m.holes();
        assert_eq!(holes.len() as u64, m.count());
        let total: u64 = holes.iter().map(|h| h.1).sum();
        assert_eq!(total, free.len() as u64);
        assert_eq!(m.largest(), holes.iter().map(|h| h.1).max().unwrap_or(0));
        for (s, l) in holes {
            assert!(!free.contains(&(s.wrapping_sub(1))) && !free.contains(&(s + l)), "maximal");
        }
    }

    #[test]
    fn whole_units_show_full_and_a_fresh_map_is_empty() {
        let mut m = HoleMap::new(0, 4 * H);
        assert_eq!((m.largest(), m.count(), m.find(0, 1)), (0, 0, None));
        m.set(H, 2 * H, true);
        assert!(m.unit_full(H) && !m.unit_full(0));
        assert_eq!((m.largest(), m.find(0, H), m.find(H + 1, 1)), (H, Some(H), Some(H + 1)));
        m.set(H + 5, H + 6, false);
        assert!(!m.unit_full(H));
        assert_eq!(m.runs_in(H, H + 10), vec![(H, 5), (H + 6, 4)]);
    }
}
