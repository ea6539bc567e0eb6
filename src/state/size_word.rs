//! The first word of each size-board entry (docs/DESIGN.md §7b), which the daemon and the
//! direct-path clients that append to a file both change: the file size in the low 48 bits,
//! a sequence number the daemon bumps on every size it publishes in the next 15, and a frozen
//! bit on top. Only `core`: the preload library compiles this same file.
//!
//! A client appending directly stores its bytes into blocks the daemon reserved past the end
//! of the file, then grows the size with one compare-and-swap against the word it read before
//! the copy. The daemon freezes the word (under the inode lock) before any change of its own
//! to the file's size or blocks and publishes a new sequence number after it, so a client's
//! swap succeeds only if nothing the daemon did came between its check and its copy (a failed
//! swap sends the write through FUSE instead, which redoes it).

/// Bits of the size.
pub const SIZE_MASK: u64 = (1 << 48) - 1;
/// Where the sequence number starts.
const SEQ_SHIFT: u32 = 48;
/// Bits of the sequence number (above the size).
const SEQ_MASK: u64 = 0x7fff;
/// Set while the daemon changes the file: no client may grow the size.
pub const FROZEN: u64 = 1 << 63;

/// In the second word of a board entry, the file's layout generation: set by a client after a
/// direct write and taken by the daemon at its next look at the file (`state::appends`), which
/// then gives the file new modification and change times, as the kernel does at a `write(2)`.
/// Generations never reach it.
pub const WRITTEN: u64 = 1 << 63;

/// The layout generation in second word `w` (without [`WRITTEN`]).
pub const fn generation(w: u64) -> u64 {
    w & !WRITTEN
}

/// The size in word `w`.
pub const fn size(w: u64) -> u64 {
    w & SIZE_MASK
}

/// Whether word `w` is frozen.
pub const fn frozen(w: u64) -> bool {
    w & FROZEN != 0
}

/// The word the daemon publishes after word `w`: size `size`, the next sequence number,
/// not frozen.
pub const fn published(w: u64, size: u64) -> u64 {
    let seq = ((w >> SEQ_SHIFT) + 1) & SEQ_MASK;
    (seq << SEQ_SHIFT) | (size & SIZE_MASK)
}

/// The word a client swaps in for `w` after storing bytes up to `end`: the same sequence
/// number, the larger size. None when `w` is frozen.
pub const fn grown(w: u64, end: u64) -> Option<u64> {
    if frozen(w) {
        return None;
    }
    let s = if end & SIZE_MASK > size(w) { end & SIZE_MASK } else { size(w) };
    Some((w & !SIZE_MASK) | s)
}

/// Whether `a` and `b` carry the same sequence number (no daemon publish between them).
pub const fn same_epoch(a: u64, b: u64) -> bool {
    (a >> SEQ_SHIFT) & SEQ_MASK == (b >> SEQ_SHIFT) & SEQ_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_changes_the_word_even_at_the_same_size() {
        let w = published(0, 4096);
        assert_eq!(size(w), 4096);
        let w2 = published(w, 4096);
        assert_ne!(w, w2, "the sequence number moved");
        assert!(!same_epoch(w, w2));
        assert_eq!(size(w2), 4096);
    }

    #[test]
    fn clients_grow_within_an_epoch_and_never_shrink() {
        let w = published(0, 100);
        let g = grown(w, 250).unwrap();
        assert_eq!(size(g), 250);
        assert!(same_epoch(w, g));
        assert_eq!(size(grown(g, 200).unwrap()), 250);
        assert_eq!(grown(w | FROZEN, 300), None);
    }

    #[test]
    fn the_sequence_wraps_without_touching_size_or_frozen() {
        let mut w = published(0, 7);
        for _ in 0..40_000 {
            w = published(w, 7);
            assert!(!frozen(w));
            assert_eq!(size(w), 7);
        }
    }
}
