//! Which inodes the kernel holds: every reply that gives the kernel an entry (lookup, create,
//! mkdir, mknod, symlink, link, a linked readdirplus entry) marks its inode, and the kernel's
//! FORGET, sent when it drops the inode, clears the mark. A READDIRPLUS answers an entry whose
//! inode is marked with its name alone (node ID 0), because linking it again would make the
//! kernel forget the inode's cached ACLs: `ls -l` would then ask the daemon for every file's
//! ACL at every listing.
//!
//! The marks only steer that choice, never correctness: an inode marked but dropped costs its
//! name a LOOKUP when it is next used, one held but unmarked gets a linked entry as before.
//! Both happen when a FORGET and a new entry of the same inode cross.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Inode numbers per chunk of marks (4 KiB of bits), allocated when one of them is first
/// marked: the marks cost DRAM in proportion to the ranges of inode numbers in use.
const CHUNK_INODES: u64 = 1 << 15;
const WORDS_PER_CHUNK: usize = (CHUNK_INODES / 64) as usize;

/// One bit per inode number below the pool's capacity.
pub(crate) struct KernelHeld {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl KernelHeld {
    /// Marks for inode numbers below `capacity` (numbers at or above it are never marked).
    pub(crate) fn new(capacity: u64) -> KernelHeld {
        let chunks = capacity.div_ceil(CHUNK_INODES) as usize;
        KernelHeld { chunks: (0..chunks).map(|_| OnceLock::new()).collect() }
    }

    /// The word and bit of `ino`, with its chunk if it has one (allocated if `make`).
    fn word(&self, ino: u64, make: bool) -> Option<(&AtomicU64, u64)> {
        let chunk = self.chunks.get((ino / CHUNK_INODES) as usize)?;
        let words = match make {
            true => chunk.get_or_init(|| (0..WORDS_PER_CHUNK).map(|_| AtomicU64::new(0)).collect()),
            false => chunk.get()?,
        };
        let bit = ino % CHUNK_INODES;
        Some((&words[(bit / 64) as usize], 1 << (bit % 64)))
    }

    /// The kernel was given an entry of `ino`.
    pub(crate) fn mark(&self, ino: u64) {
        if let Some((w, b)) = self.word(ino, true) {
            // Read first: a listing marks inodes that are mostly marked already, and a plain
            // load leaves the cache line shared among the CPUs that read it.
            if w.load(Ordering::Relaxed) & b == 0 {
                w.fetch_or(b, Ordering::Relaxed);
            }
        }
    }

    /// The kernel dropped `ino` (FORGET).
    pub(crate) fn forget(&self, ino: u64) {
        if let Some((w, b)) = self.word(ino, false) {
            w.fetch_and(!b, Ordering::Relaxed);
        }
    }

    /// Whether `ino` is marked.
    pub(crate) fn holds(&self, ino: u64) -> bool {
        self.word(ino, false).is_some_and(|(w, b)| w.load(Ordering::Relaxed) & b != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_per_inode_and_cleared_by_forget() {
        let h = KernelHeld::new(3 * CHUNK_INODES + 5);
        for ino in [1, 63, 64, CHUNK_INODES, 3 * CHUNK_INODES + 4] {
            assert!(!h.holds(ino));
            h.mark(ino);
            assert!(h.holds(ino), "{ino}");
        }
        assert!(!h.holds(2) && !h.holds(65) && !h.holds(CHUNK_INODES + 1));
        h.forget(64);
        assert!(!h.holds(64) && h.holds(63), "forget clears only its inode");
        h.mark(64);
        assert!(h.holds(64), "marked again after a forget");
    }

    #[test]
    fn numbers_beyond_the_capacity_are_never_marked_and_chunks_come_when_used() {
        let h = KernelHeld::new(CHUNK_INODES * 4);
        h.mark(CHUNK_INODES * 4);
        h.mark(u64::MAX);
        assert!(!h.holds(CHUNK_INODES * 4) && !h.holds(u64::MAX));
        h.forget(u64::MAX);
        h.forget(7); // nothing marked in that chunk: no chunk made
        assert!(h.chunks.iter().all(|c| c.get().is_none()));
        h.mark(CHUNK_INODES * 2 + 1);
        let made: Vec<bool> = h.chunks.iter().map(|c| c.get().is_some()).collect();
        assert_eq!(made, [false, false, true, false]);
    }
}
