//! Which inodes the kernel holds, and how many times: every reply that gives the kernel an
//! entry (lookup, create, mkdir, mknod, symlink, link, a linked readdirplus entry) counts one
//! for its inode before it is sent, and the kernel's FORGET, sent when it drops the inode,
//! takes back the number of entries it had (its `nlookup`). The kernel counts the same way,
//! so the two agree: an inode with a count above zero may still be asked for by number.
//!
//! Two things follow from the counts. A READDIRPLUS answers an entry whose inode is held with
//! its name alone (node ID 0), because linking it again would make the kernel forget the
//! inode's cached ACLs: `ls -l` would then ask the daemon for every file's ACL at every
//! listing. And an inode that loses its last name while the kernel holds it (a process's
//! working directory, an `O_PATH` descriptor, a file open only through `/proc/PID/fd`) stays
//! alive, as on ext4, until the kernel forgets it: the core keeps it as if opened once more
//! (`Fs::unlink_held`), its number is noted here as *kept*, and the FORGET that brings its
//! count to zero (or the end of the session) releases it.
//!
//! A count can only be too high (an entry counted whose reply the kernel never took): such an
//! inode, if it loses its last name, is released at the end of the session instead of at its
//! FORGET, or freed as an orphan by the next mount after a crash.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Inode numbers per chunk of counts (32 KiB of counters), allocated when one of them is first
/// counted: the counts cost DRAM in proportion to the ranges of inode numbers in use.
const CHUNK_INODES: u64 = 1 << 12;

/// A lookup count per inode number below the pool's capacity.
pub(crate) struct KernelHeld {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl KernelHeld {
    /// Counts for inode numbers below `capacity` (numbers at or above it are never counted).
    pub(crate) fn new(capacity: u64) -> KernelHeld {
        let chunks = capacity.div_ceil(CHUNK_INODES) as usize;
        KernelHeld { chunks: (0..chunks).map(|_| OnceLock::new()).collect() }
    }

    /// The count of `ino`, with its chunk if it has one (allocated if `make`).
    fn count(&self, ino: u64, make: bool) -> Option<&AtomicU64> {
        let chunk = self.chunks.get((ino / CHUNK_INODES) as usize)?;
        let counts = match make {
            true => chunk.get_or_init(|| (0..CHUNK_INODES).map(|_| AtomicU64::new(0)).collect()),
            false => chunk.get()?,
        };
        Some(&counts[(ino % CHUNK_INODES) as usize])
    }

    /// The kernel is about to be given an entry of `ino` (counted before the reply goes, so
    /// that a FORGET of it can never be taken before the entry it takes back).
    pub(crate) fn mark(&self, ino: u64) {
        if let Some(c) = self.count(ino, true) {
            c.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The kernel dropped `n` entries of `ino` (FORGET; or an entry counted whose reply was
    /// never sent). True when that leaves it none: the kernel no longer holds the inode.
    #[must_use]
    pub(crate) fn forget(&self, ino: u64, n: u64) -> bool {
        let Some(c) = self.count(ino, false) else {
            return false;
        };
        let before = c
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)))
            .unwrap_or_else(|v| v);
        before <= n
    }

    /// Whether the kernel holds `ino`.
    pub(crate) fn holds(&self, ino: u64) -> bool {
        self.count(ino, false).is_some_and(|c| c.load(Ordering::Acquire) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_per_inode_and_taken_back_by_forget() {
        let h = KernelHeld::new(3 * CHUNK_INODES + 5);
        for ino in [1, 63, 64, CHUNK_INODES, 3 * CHUNK_INODES + 4] {
            assert!(!h.holds(ino));
            h.mark(ino);
            assert!(h.holds(ino), "{ino}");
        }
        assert!(!h.holds(2) && !h.holds(65) && !h.holds(CHUNK_INODES + 1));
        h.mark(64);
        assert!(!h.forget(64, 1));
        assert!(h.holds(64), "one entry of two taken back");
        assert!(h.forget(64, 1), "the last one");
        assert!(!h.holds(64) && h.holds(63), "forget takes back only its inode's entries");
        h.mark(64);
        assert!(h.holds(64), "counted again after a forget");
        assert!(h.forget(64, 5));
        assert!(!h.holds(64), "a count never goes below zero");
        h.mark(64);
        assert!(h.holds(64));
    }

    #[test]
    fn numbers_beyond_the_capacity_are_never_counted_and_chunks_come_when_used() {
        let h = KernelHeld::new(CHUNK_INODES * 4);
        h.mark(CHUNK_INODES * 4);
        h.mark(u64::MAX);
        assert!(!h.holds(CHUNK_INODES * 4) && !h.holds(u64::MAX));
        assert!(!h.forget(u64::MAX, 1));
        assert!(!h.forget(7, 1)); // nothing counted in that chunk: no chunk made
        assert!(h.chunks.iter().all(|c| c.get().is_none()));
        h.mark(CHUNK_INODES * 2 + 1);
        let made: Vec<bool> = h.chunks.iter().map(|c| c.get().is_some()).collect();
        assert_eq!(made, [false, false, true, false]);
    }

    #[test]
    fn forget_says_when_the_kernel_holds_an_inode_no_more() {
        let h = KernelHeld::new(100);
        h.mark(9);
        h.mark(9);
        assert!(!h.forget(9, 1), "one entry left");
        h.mark(9); // a lookup by number (a file handle) crossing the forget
        assert!(!h.forget(9, 1));
        assert!(h.forget(9, 1), "the last entry taken back");
        assert!(h.forget(9, 1), "still none (a count never goes below zero)");
        assert!(h.forget(50, 1), "never counted in a chunk that is made: not held");
        let far = KernelHeld::new(2 * CHUNK_INODES);
        assert!(!far.forget(CHUNK_INODES + 1, 1), "no chunk made: nothing was ever counted");
    }
}
