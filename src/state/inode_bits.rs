//! Sets of inode numbers as bitmaps over a range of the inode table: a partition's free inode
//! numbers, and the in-use inodes a mount left on media to load when first used. An eighth of
//! a byte per inode instead of a B-tree entry (about 12 bytes) per member, and a mount sets
//! bits instead of inserting every number into a tree. Also [`InoList`], the few inodes one
//! transaction touches, kept on the stack.

/// A set of inode numbers within `base..base + 64 * words.len()`. Aligned to 128 bytes: the
/// per-partition free sets sit side by side (`MountState::inode_free`), each locked by its
/// own CPU's creates and unlinks, and must not share cache lines.
#[derive(Clone, Debug, Default)]
#[repr(align(128))]
pub(crate) struct InodeBits {
    /// The inode number of bit 0 of word 0.
    base: u64,
    /// Bit `i % 64` of word `i / 64` set: inode `base + i` is a member.
    words: Vec<u64>,
    /// Set bits.
    len: usize,
    /// Every word below this one is zero (where the lowest free number is looked for).
    first_nonzero: usize,
}

impl InodeBits {
    /// An empty set able to hold `base..base + span`.
    pub fn new(base: u64, span: u64) -> InodeBits {
        InodeBits {
            base,
            words: vec![0; usize::try_from(span.div_ceil(64)).unwrap_or(0)],
            len: 0,
            first_nonzero: 0,
        }
    }

    /// (word, bit) of `ino`, or None outside the range.
    fn place(&self, ino: u64) -> Option<(usize, u64)> {
        let i = ino.checked_sub(self.base)?;
        let w = usize::try_from(i / 64).ok()?;
        (w < self.words.len()).then_some((w, 1u64 << (i % 64)))
    }

    /// Add `ino`; false if it was there already or lies outside the range.
    pub fn insert(&mut self, ino: u64) -> bool {
        let Some((w, bit)) = self.place(ino) else {
            return false;
        };
        if self.words[w] & bit != 0 {
            return false;
        }
        self.words[w] |= bit;
        self.len += 1;
        self.first_nonzero = self.first_nonzero.min(w);
        true
    }

    /// Remove `ino`; false if it was not there.
    pub fn remove(&mut self, ino: u64) -> bool {
        let Some((w, bit)) = self.place(ino) else {
            return false;
        };
        if self.words[w] & bit == 0 {
            return false;
        }
        self.words[w] &= !bit;
        self.len -= 1;
        true
    }

    /// Whether `ino` is in the set.
    pub fn contains(&self, ino: u64) -> bool {
        self.place(ino)
            .is_some_and(|(w, bit)| self.words[w] & bit != 0)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The lowest member at or after `from`.
    pub fn next_from(&self, from: u64) -> Option<u64> {
        let i = from.saturating_sub(self.base);
        let start = usize::try_from(i / 64).ok()?;
        let mut w = start.max(self.first_nonzero);
        let mut mask = if w == start {
            u64::MAX << (i % 64)
        } else {
            u64::MAX
        };
        while w < self.words.len() {
            let word = self.words[w] & mask;
            if word != 0 {
                return Some(self.base + w as u64 * 64 + u64::from(word.trailing_zeros()));
            }
            w += 1;
            mask = u64::MAX;
        }
        None
    }

    /// The lowest member, taken out of the set.
    pub fn pop_first(&mut self) -> Option<u64> {
        let w = (self.first_nonzero..self.words.len()).find(|&w| self.words[w] != 0);
        self.first_nonzero = w.unwrap_or(self.words.len());
        let w = w?;
        let ino = self.base + w as u64 * 64 + u64::from(self.words[w].trailing_zeros());
        self.remove(ino);
        Some(ino)
    }

    /// Every member, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(move |(w, &word)| {
            let at = self.base + w as u64 * 64;
            (0..64u64)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| at + b)
        })
    }

    /// The numbers of `base..base + span` for which `member` holds, set a word at a time.
    pub fn from_fn(base: u64, span: u64, member: impl Fn(u64) -> bool) -> InodeBits {
        let mut s = InodeBits::new(base, span);
        let end = base + span;
        for (w, word) in s.words.iter_mut().enumerate() {
            let at = base + w as u64 * 64;
            for b in (0..64u64).take_while(|b| at + b < end) {
                if member(at + b) {
                    *word |= 1 << b;
                }
            }
        }
        s.len = s.words.iter().map(|w| w.count_ones() as usize).sum();
        s
    }

    /// Heap bytes of the bitmap.
    pub fn heap_bytes(&self) -> u64 {
        (self.words.capacity() * 8) as u64
    }
}

/// Inode numbers, the first eight inline: the inodes one transaction touches.
#[derive(Default)]
pub(crate) struct InoList {
    inline: [u64; 8],
    len: usize,
    more: Vec<u64>,
}

impl InoList {
    pub(crate) fn push(&mut self, ino: u64) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = ino;
                self.len += 1;
            }
            None => self.more.push(ino),
        }
    }

    /// The numbers in ascending order, each once.
    pub(crate) fn sorted_unique(&mut self) -> &[u64] {
        if self.more.is_empty() {
            let v = &mut self.inline[..self.len];
            v.sort_unstable();
            let mut kept = 0;
            for k in 0..v.len() {
                if kept == 0 || v[kept - 1] != v[k] {
                    v[kept] = v[k];
                    kept += 1;
                }
            }
            return &self.inline[..kept];
        }
        self.more.extend_from_slice(&self.inline[..self.len]);
        self.len = 0;
        self.more.sort_unstable();
        self.more.dedup();
        &self.more
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ino_lists_come_back_sorted_and_once_inline_or_not() {
        for n in [0u64, 1, 5, 8, 9, 30] {
            let mut l = InoList::default();
            let mut want: Vec<u64> = Vec::new();
            for i in 0..n {
                let ino = (i * 7919) % 13 + 2;
                l.push(ino);
                l.push(ino); // every one twice
                want.push(ino);
            }
            want.sort_unstable();
            want.dedup();
            assert_eq!(l.sorted_unique(), &want[..], "{n} pushed twice each");
        }
    }
    use std::collections::BTreeSet;

    #[test]
    fn behaves_as_an_ordered_set_of_its_range() {
        let (base, span) = (1001u64, 700u64);
        let mut f = InodeBits::new(base, span);
        let mut want = BTreeSet::new();
        let mut rng = crate::rng::Rng::new(12345);
        for round in 0..5000 {
            let ino = base + rng.below(span);
            match round % 5 {
                0 | 1 => assert_eq!(f.insert(ino), want.insert(ino)),
                2 => assert_eq!(f.remove(ino), want.remove(&ino)),
                3 => assert_eq!(f.pop_first(), want.pop_first()),
                _ => assert_eq!(f.next_from(ino), want.range(ino..).next().copied()),
            }
            assert_eq!(f.len(), want.len());
            assert_eq!(f.contains(ino), want.contains(&ino));
        }
        assert!(f.iter().eq(want.iter().copied()));
        assert_eq!(f.next_from(0), want.first().copied(), "below the range");
        assert!(!f.insert(base - 1) && !f.insert(base + 64 * 11) && !f.contains(base - 1));
        let mut built = InodeBits::from_fn(base, span, |ino| want.contains(&ino));
        assert!(built.iter().eq(want.iter().copied()));
        assert_eq!(built.len(), want.len());
        assert_eq!(built.pop_first(), want.pop_first());
        let odd = InodeBits::from_fn(base, span, |ino| ino % 2 == 1);
        assert_eq!(odd.len(), 350, "every odd number of the range, none past its end");
        assert_eq!(odd.iter().last(), Some(base + span - 2));
    }
}
