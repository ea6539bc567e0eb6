//! Inodes a removal kept for its caller (`Fs::unlink_held` and its kin) until the caller lets
//! go of them (`Fs::let_go`).
//!
//! A FUSE mount's kernel lets go of an unlinked file's inode with a FORGET it sends after the
//! `unlink(2)` returned, often at once but sometimes later (after its own pending RELEASE of
//! the file, which can come after the caller's next requests): until then the file's blocks
//! are not free. A program that removes a file to make room and writes at once on a full pool
//! must not be told there is no space because it was faster than the FORGET, so when space runs
//! out, kept regular files that nothing but the hold keeps open are freed at once
//! (`MountState::relieve_removed_held`); their later FORGET lets go of nothing. A process that
//! still held one (an `O_PATH` descriptor) is then told ESTALE, as before such inodes were
//! kept. Directories and other small inodes are never freed early.

use crate::state::inode_state::InodeState;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The inodes a removal kept, each with one hold (one count of its `open`).
#[derive(Debug, Default)]
pub(crate) struct RemovedHeld {
    inodes: Mutex<HashSet<u64>>,
    /// `inodes.len()`, read without the lock when space runs short.
    count: AtomicUsize,
}

impl RemovedHeld {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // A set of numbers: still right after a panic elsewhere.
        self.inodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `n`, which just lost its last name, for the caller of its removal: one more open
    /// (the hold), noted here.
    pub(crate) fn hold(&self, n: &mut InodeState) {
        n.open += 1;
        self.kept(n.ino);
    }

    /// A removal kept inode `ino` for its caller, with a hold.
    fn kept(&self, ino: u64) {
        let mut s = self.lock();
        s.insert(ino);
        self.count.store(s.len(), Ordering::Release);
    }

    /// Take the hold on `ino`: true if it had one (exactly one caller gets true), false if it
    /// has none (never kept, let go before, or freed by `MountState::relieve_removed_held`).
    pub(crate) fn take(&self, ino: u64) -> bool {
        // Most callers (every FORGET of a FUSE mount) ask about inodes never kept.
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut s = self.lock();
        let had = s.remove(&ino);
        self.count.store(s.len(), Ordering::Release);
        had
    }

    /// Take every hold: the inodes that had one.
    pub(crate) fn take_all(&self) -> Vec<u64> {
        let mut s = self.lock();
        self.count.store(0, Ordering::Release);
        s.drain().collect()
    }

    /// The inodes kept now.
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        match self.count.load(Ordering::Acquire) {
            0 => Vec::new(),
            _ => self.lock().iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_taken_once() {
        let r = RemovedHeld::default();
        assert!(r.snapshot().is_empty());
        r.kept(7);
        r.kept(9);
        assert!(!r.take(8), "never kept");
        assert!(r.take(7));
        assert!(!r.take(7), "taken already");
        assert_eq!(r.snapshot(), [9]);
        assert!(r.take(9));
        assert!(r.snapshot().is_empty());
        r.kept(3);
        r.kept(4);
        let mut all = r.take_all();
        all.sort_unstable();
        assert_eq!(all, [3, 4]);
        assert!(!r.take(3) && !r.take(4) && r.take_all().is_empty(), "taken with the rest");
    }

    #[test]
    fn two_takers_racing_get_one_hold() {
        for _ in 0..2_000 {
            let r = std::sync::Arc::new(RemovedHeld::default());
            r.kept(5);
            let other = {
                let r = std::sync::Arc::clone(&r);
                std::thread::spawn(move || r.take(5))
            };
            let mine = r.take(5);
            assert!(mine ^ other.join().expect("taker"), "taken once, by either side");
        }
    }
}
