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

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Inode numbers per chunk of counts (32 KiB of counters), allocated when one of them is first
/// counted: the counts cost DRAM in proportion to the ranges of inode numbers in use.
const CHUNK_INODES: u64 = 1 << 12;

/// A lookup count per inode number below the pool's capacity, and the inodes kept for the
/// kernel after their last name went.
pub(crate) struct KernelHeld {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
    kept: Mutex<HashSet<u64>>,
}

impl KernelHeld {
    /// Counts for inode numbers below `capacity` (numbers at or above it are never counted).
    pub(crate) fn new(capacity: u64) -> KernelHeld {
        let chunks = capacity.div_ceil(CHUNK_INODES) as usize;
        KernelHeld {
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
            kept: Mutex::new(HashSet::new()),
        }
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
    /// never sent). True when the inode was kept for the kernel and is now to be released.
    #[must_use]
    pub(crate) fn forget(&self, ino: u64, n: u64) -> bool {
        let Some(c) = self.count(ino, false) else {
            return false;
        };
        let before = c
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)))
            .unwrap_or_else(|v| v);
        before <= n && self.take_kept(ino)
    }

    /// Whether the kernel holds `ino`.
    pub(crate) fn holds(&self, ino: u64) -> bool {
        self.count(ino, false).is_some_and(|c| c.load(Ordering::Acquire) > 0)
    }

    /// `ino` lost its last name and the core keeps it until the kernel forgets it. True when the
    /// kernel already has (it is then to be released at once).
    #[must_use]
    pub(crate) fn keep(&self, ino: u64) -> bool {
        self.kept_set().insert(ino);
        // A FORGET that brought the count to zero before the insert found nothing to take.
        !self.holds(ino) && self.take_kept(ino)
    }

    /// Every inode still kept for the kernel, no longer noted as kept (the session ends: the
    /// kernel sends no FORGET then).
    pub(crate) fn take_all_kept(&self) -> Vec<u64> {
        self.kept_set().drain().collect()
    }

    /// Whether `ino` was kept, no longer noted as kept. Exactly one caller gets true.
    fn take_kept(&self, ino: u64) -> bool {
        self.kept_set().remove(&ino)
    }

    fn kept_set(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // A panic elsewhere while holding it leaves a set still worth using.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
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
        assert!(!h.forget(64, 1));
        assert!(!h.holds(64) && h.holds(63), "forget takes back only its inode's entries");
        h.mark(64);
        assert!(h.holds(64), "counted again after a forget");
        assert!(!h.forget(64, 5));
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
    fn a_kept_inode_is_released_once_at_the_forget_that_ends_its_count() {
        let h = KernelHeld::new(100);
        h.mark(9);
        h.mark(9);
        assert!(!h.keep(9), "held: kept");
        assert!(!h.forget(9, 1), "one entry left");
        h.mark(9); // a lookup by number (a file handle) crossing the forget
        assert!(!h.forget(9, 1));
        assert!(h.forget(9, 1), "the last entry taken back releases it");
        assert!(!h.forget(9, 1), "and only once");
        // Kept after the kernel let go (its FORGET came first): released at once.
        assert!(h.keep(9));
        assert!(h.take_all_kept().is_empty());
        // Kept at the end of the session: handed back by `take_all_kept`, then never again.
        h.mark(3);
        h.mark(4);
        assert!(!h.keep(3) && !h.keep(4));
        let mut all = h.take_all_kept();
        all.sort_unstable();
        assert_eq!(all, [3, 4]);
        assert!(!h.forget(3, 1) && !h.forget(4, 1));
    }

    #[test]
    fn a_forget_racing_a_keep_releases_the_inode_exactly_once() {
        for _ in 0..2_000 {
            let h = std::sync::Arc::new(KernelHeld::new(10));
            h.mark(5);
            let f = {
                let h = std::sync::Arc::clone(&h);
                std::thread::spawn(move || h.forget(5, 1))
            };
            let kept_released = h.keep(5);
            let forget_released = f.join().expect("forget thread");
            assert!(kept_released ^ forget_released, "released once, by either side");
        }
    }
}
