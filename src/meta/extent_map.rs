//! A file's extents in DRAM by first logical block: a sorted vector while the file has few, a
//! B-tree when it has many.
//!
//! Most files have one to eight extents. A `BTreeMap` allocates a whole leaf node (room for 11
//! entries, 368 bytes) for the first one; a vector sized to its length takes 32 bytes an extent.
//! But inserting into a sorted vector moves every entry after it, and a fragmented file can have
//! 100,000 extents, so past `LARGE_ABOVE` (32) entries the map is a B-tree.
//!
//! `Extent` and `SlotId` are defined here rather than in `inode.rs` (which re-exports them) so
//! that this file imports nothing from the one that uses it.
#![deny(clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::ops::{Bound, Index, RangeBounds};

/// A slot: 0..8 are inline in the inode; `8 + k*255 + s` is slot `s` of the k-th index block.
pub type SlotId = u32;

/// One extent of a file in DRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First pool block.
    pub phys: u64,
    /// Length in blocks.
    pub len: u64,
    /// The slot holding its record on media.
    pub slot: SlotId,
}

/// Above this many entries the map is a B-tree. A sorted-vector insert moves up to 32 entries
/// (1 KiB, a few dozen nanoseconds) and a lookup is five halvings, no slower than the B-tree;
/// much beyond that the O(n) moves start to cost, and files this fragmented are rare enough
/// that the B-tree's larger nodes do not matter.
const LARGE_ABOVE: usize = 32;

/// A B-tree shrunk to this many entries goes back to a vector. Well below [`LARGE_ABOVE`], so a
/// file whose extent count hovers around the threshold does not convert (copying every entry)
/// back and forth.
const SMALL_AT: usize = 8;

/// Up to this many entries a vector grows one entry at a time, with no spare room: most files
/// stay this small. Beyond, it doubles, so growing to [`LARGE_ABOVE`] stays amortized O(1) an
/// insert; a vector this large that shrinks to a quarter of its room gives half of it back.
const EXACT_UP_TO: usize = 8;

const _: () = assert!(SMALL_AT < LARGE_ABOVE && EXACT_UP_TO <= LARGE_ABOVE);
// One extent costs 32 bytes of heap, and the map itself one vector's three words inline (the
// B-tree is boxed so that the enum needs no tag word).
const _: () = assert!(size_of::<(u64, Extent)>() == 32);
const _: () = assert!(size_of::<ExtentMap>() == 24);

/// A file's extents by first logical block: the subset of `BTreeMap<u64, Extent>` the file
/// system uses, in less memory for the small maps nearly every file has.
#[derive(Clone)]
pub struct ExtentMap(Repr);

#[derive(Clone)]
enum Repr {
    /// Sorted by key, keys distinct; at most [`LARGE_ABOVE`] entries.
    Small(Vec<(u64, Extent)>),
    /// More than [`SMALL_AT`] entries. Boxed so that the enum fits in three words: an inline
    /// B-tree (three words, no spare bit pattern) would add a tag word to every file's map.
    #[expect(clippy::box_collection, reason = "keeps ExtentMap at 24 bytes")]
    Large(Box<BTreeMap<u64, Extent>>),
}

impl Default for ExtentMap {
    fn default() -> ExtentMap {
        ExtentMap::new()
    }
}

/// Panic as `BTreeMap::range` does on a range that is not one, so that the two representations
/// behave alike. (A `BTreeMap` that never held an entry does not check; an empty `ExtentMap` does
/// not either, so no caller that passed before panics now.)
fn check_range(r: &impl RangeBounds<u64>) {
    match (r.start_bound(), r.end_bound()) {
        (Bound::Excluded(s), Bound::Excluded(e)) if s == e => {
            panic!("range start and end are equal and excluded in ExtentMap")
        }
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e))
            if s > e =>
        {
            panic!("range start is greater than range end in ExtentMap")
        }
        _ => {}
    }
}

impl ExtentMap {
    /// An empty map (allocates nothing).
    pub const fn new() -> ExtentMap {
        ExtentMap(Repr::Small(Vec::new()))
    }

    /// Number of extents.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Small(v) => v.len(),
            Repr::Large(b) => b.len(),
        }
    }

    /// Heap bytes the map holds: the vector at its capacity, or the boxed B-tree's leaves
    /// (eleven entries each, about two thirds full).
    pub fn heap_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(u64, Extent)>();
        match &self.0 {
            Repr::Small(v) => (v.capacity() * entry) as u64,
            Repr::Large(b) => (b.len().div_ceil(7) * (11 * entry + 16) + 24) as u64,
        }
    }

    /// Whether the map has no extents.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The extent starting at logical block `k`.
    pub fn get(&self, k: &u64) -> Option<&Extent> {
        match &self.0 {
            Repr::Small(v) => v.binary_search_by_key(k, |x| x.0).ok().map(|i| &v[i].1),
            Repr::Large(b) => b.get(k),
        }
    }

    /// Map logical block `k` to `e`; the extent it replaces, if any.
    pub fn insert(&mut self, k: u64, e: Extent) -> Option<Extent> {
        let v = match &mut self.0 {
            Repr::Large(b) => return b.insert(k, e),
            Repr::Small(v) => v,
        };
        let i = match v.binary_search_by_key(&k, |x| x.0) {
            Ok(i) => return Some(std::mem::replace(&mut v[i].1, e)),
            Err(i) => i,
        };
        if v.len() == LARGE_ABOVE {
            let mut b: BTreeMap<u64, Extent> = std::mem::take(v).into_iter().collect();
            b.insert(k, e);
            self.0 = Repr::Large(Box::new(b));
            return None;
        }
        if v.len() == v.capacity() {
            if v.len() < EXACT_UP_TO {
                v.reserve_exact(1);
            } else {
                v.reserve(1);
            }
        }
        v.insert(i, (k, e));
        None
    }

    /// Remove the extent starting at logical block `k`, returning it.
    pub fn remove(&mut self, k: &u64) -> Option<Extent> {
        match &mut self.0 {
            Repr::Small(v) => {
                let i = v.binary_search_by_key(k, |x| x.0).ok()?;
                let (_, e) = v.remove(i);
                if v.capacity() > EXACT_UP_TO && v.len() * 4 <= v.capacity() {
                    v.shrink_to((2 * v.len()).max(EXACT_UP_TO));
                }
                Some(e)
            }
            Repr::Large(b) => {
                let e = b.remove(k)?;
                if b.len() <= SMALL_AT {
                    let mut v = Vec::with_capacity(b.len());
                    v.extend(std::mem::take(&mut **b));
                    self.0 = Repr::Small(v);
                }
                Some(e)
            }
        }
    }

    /// The extents whose first logical block lies in `r`, in order; panics where
    /// `BTreeMap::range` does (a start above the end, or equal bounds both excluded) unless the
    /// map is empty.
    pub fn range<R: RangeBounds<u64>>(&self, r: R) -> Iter<'_> {
        match &self.0 {
            Repr::Small(v) => {
                if !v.is_empty() {
                    check_range(&r);
                }
                let a = match r.start_bound() {
                    Bound::Included(s) => v.partition_point(|x| x.0 < *s),
                    Bound::Excluded(s) => v.partition_point(|x| x.0 <= *s),
                    Bound::Unbounded => 0,
                };
                let b = match r.end_bound() {
                    Bound::Included(e) => v.partition_point(|x| x.0 <= *e),
                    Bound::Excluded(e) => v.partition_point(|x| x.0 < *e),
                    Bound::Unbounded => v.len(),
                };
                Iter(IterRepr::Small(v[a..b].iter()))
            }
            Repr::Large(b) => Iter(IterRepr::Large(b.range(r))),
        }
    }

    /// Every extent, in order of logical block.
    pub fn iter(&self) -> Iter<'_> {
        self.range(..)
    }

    /// Every extent without its logical block, in order of logical block.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Extent> {
        self.iter().map(|(_, e)| e)
    }

    /// The vector's capacity, or None for a B-tree.
    #[cfg(test)]
    fn small_capacity(&self) -> Option<usize> {
        match &self.0 {
            Repr::Small(v) => Some(v.capacity()),
            Repr::Large(_) => None,
        }
    }
}

impl Index<&u64> for ExtentMap {
    type Output = Extent;

    /// The extent starting at logical block `k`; panics if there is none.
    fn index(&self, k: &u64) -> &Extent {
        self.get(k).expect("no extent starts at that logical block")
    }
}

/// Equal when the extents are, whichever representation each map has.
impl PartialEq for ExtentMap {
    fn eq(&self, other: &ExtentMap) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for ExtentMap {}

/// As a `BTreeMap` prints: `{logical: Extent { .. }, ..}`.
impl std::fmt::Debug for ExtentMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// An iterator over extents of an [`ExtentMap`] in order of logical block, from either end.
#[derive(Clone, Debug)]
pub struct Iter<'a>(IterRepr<'a>);

#[derive(Clone, Debug)]
enum IterRepr<'a> {
    Small(std::slice::Iter<'a, (u64, Extent)>),
    Large(btree_map::Range<'a, u64, Extent>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a u64, &'a Extent);

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            IterRepr::Small(i) => i.next().map(|(k, e)| (k, e)),
            IterRepr::Large(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            IterRepr::Small(i) => i.size_hint(),
            IterRepr::Large(i) => i.size_hint(),
        }
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            IterRepr::Small(i) => i.next_back().map(|(k, e)| (k, e)),
            IterRepr::Large(i) => i.next_back(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use std::panic::catch_unwind;

    fn ext(x: u64) -> Extent {
        Extent {
            phys: x * 7,
            len: x % 5 + 1,
            slot: SlotId::try_from(x % 300).unwrap(),
        }
    }

    /// A bound at `x` of a kind drawn from `rng`: included, excluded or none.
    fn bound(rng: &mut Rng, x: u64) -> Bound<u64> {
        match rng.below(3) {
            0 => Bound::Included(x),
            1 => Bound::Excluded(x),
            _ => Bound::Unbounded,
        }
    }

    /// Every read of `m` agrees with the B-tree `want`, ranges from both ends with every kind
    /// of bound included.
    fn agree(m: &ExtentMap, want: &BTreeMap<u64, Extent>, rng: &mut Rng) {
        assert_eq!(m.len(), want.len());
        assert_eq!(m.is_empty(), want.is_empty());
        assert!(m.iter().eq(want.iter()));
        assert!(m.iter().rev().eq(want.iter().rev()));
        assert!(m.values().eq(want.values()));
        for (k, e) in want {
            assert_eq!(&m[k], e);
        }
        for _ in 0..8 {
            let (x, y) = (rng.below(260), rng.below(260));
            let (lo, hi) = (x.min(y), x.max(y));
            let r = (bound(rng, lo), bound(rng, hi));
            if matches!(r, (Bound::Excluded(a), Bound::Excluded(b)) if a == b) {
                continue;
            }
            assert!(m.range(r).eq(want.range(r)), "{r:?}");
            assert!(m.range(r).rev().eq(want.range(r).rev()), "{r:?}");
            assert_eq!(m.range(r).next_back(), want.range(r).next_back(), "{r:?}");
            // Both ends at once.
            let (mut a, mut b) = (m.range(r), want.range(r));
            loop {
                let (x, y) = if rng.below(2) == 0 {
                    (a.next(), b.next())
                } else {
                    (a.next_back(), b.next_back())
                };
                assert_eq!(x, y, "{r:?}");
                if x.is_none() {
                    break;
                }
            }
            let k = rng.below(260);
            assert_eq!(m.get(&k), want.get(&k));
        }
    }

    /// Random inserts and removes agree with a `BTreeMap` after every step: phases over 250 keys
    /// grow the map far past the threshold and shrink it to nothing; phases over 44 keys keep
    /// it near the threshold (about 33 entries while growing, 11 while shrinking), so it
    /// converts back and forth in the middle of random work.
    #[test]
    fn agrees_with_a_btree_across_the_threshold_both_ways() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut m, mut want) = (ExtentMap::new(), BTreeMap::new());
        let (mut went_large, mut went_small) = (0, 0);
        let mut was_large = false;
        let mut check = |m: &ExtentMap, want: &BTreeMap<u64, Extent>, rng: &mut Rng| {
            let large = m.small_capacity().is_none();
            went_large += usize::from(large && !was_large);
            went_small += usize::from(!large && was_large);
            was_large = large;
            match m.small_capacity() {
                Some(c) => assert!(m.len() <= LARGE_ABOVE && c <= LARGE_ABOVE, "{c}"),
                None => assert!(m.len() > SMALL_AT),
            }
            agree(m, want, rng);
        };
        for phase in 0..16 {
            let grow = phase % 2 == 0;
            let keys = if phase % 4 < 2 { 250 } else { 44 };
            for _ in 0..400 {
                let k = rng.below(keys);
                if rng.below(4) < if grow { 3 } else { 1 } {
                    let e = ext(rng.below(1000));
                    assert_eq!(m.insert(k, e), want.insert(k, e));
                } else {
                    assert_eq!(m.remove(&k), want.remove(&k));
                }
                check(&m, &want, &mut rng);
            }
            if !grow {
                // Empty it: every remaining key, in random order.
                while !want.is_empty() {
                    let i = rng.below(u64::try_from(want.len()).unwrap());
                    let k = *want.keys().nth(usize::try_from(i).unwrap()).unwrap();
                    assert_eq!(m.remove(&k), want.remove(&k));
                    check(&m, &want, &mut rng);
                }
            }
        }
        assert!(
            went_large >= 8 && went_small >= 8,
            "{went_large} {went_small}"
        );
    }

    /// A one-extent map holds 32 bytes of heap; a few extents, no spare room; a map shrunk
    /// from large gives its room back.
    #[test]
    fn small_maps_are_tight() {
        let mut m = ExtentMap::new();
        assert_eq!(m.small_capacity(), Some(0));
        m.insert(10, ext(1));
        let bytes = m.small_capacity().unwrap() * size_of::<(u64, Extent)>();
        assert!(bytes <= 32, "{bytes} bytes for one extent");
        for k in 0..EXACT_UP_TO as u64 - 1 {
            m.insert(k, ext(k));
            assert_eq!(m.small_capacity(), Some(m.len()));
        }
        assert_eq!(m.clone().small_capacity(), Some(m.len()));
        for k in 100..100 + LARGE_ABOVE as u64 {
            m.insert(k, ext(k));
        }
        assert_eq!(m.small_capacity(), None, "{} extents", m.len());
        let keys: Vec<u64> = m.iter().map(|(&k, _)| k).collect();
        for k in &keys[..keys.len() - 1] {
            m.remove(k);
        }
        assert_eq!(m.len(), 1);
        assert!(m.small_capacity().unwrap() <= SMALL_AT);
        // Staying small, a vector grown by doubling gives back room as it empties.
        let mut m = ExtentMap::new();
        for k in 0..LARGE_ABOVE as u64 {
            m.insert(k, ext(k));
        }
        assert_eq!(m.small_capacity(), Some(LARGE_ABOVE));
        for k in 1..LARGE_ABOVE as u64 {
            m.remove(&k);
        }
        assert_eq!(m.small_capacity(), Some(EXACT_UP_TO));
    }

    /// Equality and the debug form do not depend on the representation.
    #[test]
    fn equal_and_printed_alike_either_way() {
        let mut large = ExtentMap::new();
        for k in 0..40 {
            large.insert(k, ext(k));
        }
        for k in 10..40 {
            large.remove(&k);
        }
        assert_eq!(
            large.small_capacity(),
            None,
            "still a B-tree above SMALL_AT"
        );
        let mut small = ExtentMap::new();
        let mut want = BTreeMap::new();
        for k in (0..10).rev() {
            small.insert(k, ext(k));
            want.insert(k, ext(k));
        }
        assert_eq!(large, small);
        assert_eq!(format!("{large:?}"), format!("{want:?}"));
        assert_eq!(format!("{small:?}"), format!("{want:?}"));
        small.insert(3, ext(4));
        assert_ne!(large, small);
        small.remove(&9);
        assert_ne!(large, small);
        assert_eq!(ExtentMap::default(), ExtentMap::new());
    }

    /// A range that is not one panics in either representation, as `BTreeMap::range` does; on
    /// an empty map it does not, as on a `BTreeMap` that never held an entry.
    #[test]
    fn bad_ranges_panic_like_a_btree() {
        let (mut small, mut large) = (ExtentMap::new(), ExtentMap::new());
        for k in 0..40 {
            large.insert(k, ext(k));
        }
        let empty = ExtentMap::new();
        small.insert(5, ext(5));
        let want = BTreeMap::from([(5, ext(5))]);
        let never_held: BTreeMap<u64, Extent> = BTreeMap::new();
        let cases = [
            (Bound::Included(5), Bound::Included(4)),
            (Bound::Excluded(5), Bound::Excluded(5)),
            (Bound::Excluded(5), Bound::Included(5)),
            (Bound::Included(5), Bound::Excluded(5)),
            (Bound::Included(5), Bound::Included(5)),
            (Bound::Excluded(6), Bound::Excluded(5)),
            (Bound::Unbounded, Bound::Excluded(0)),
        ];
        let mut panicked = 0;
        for r in cases {
            let panics = catch_unwind(|| want.range(r).count()).is_err();
            panicked += usize::from(panics);
            assert_eq!(
                catch_unwind(|| small.range(r).count()).is_err(),
                panics,
                "{r:?}"
            );
            assert_eq!(
                catch_unwind(|| large.range(r).count()).is_err(),
                panics,
                "{r:?}"
            );
            assert!(catch_unwind(|| never_held.range(r).count()).is_ok());
            assert_eq!(empty.range(r).count(), 0);
        }
        assert_eq!(panicked, 3);
    }
}
