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

    /// A removal kept inode `ino` for its caller, with a hold.
    pub(crate) fn kept(&self, ino: u64) {
        let mut s = self.lock();
        s.insert(ino);
        self.count.store(s.len(), Ordering::Release);
    }

    /// Take the hold on `ino`: true if it had one (exactly one caller gets true), false if the
    /// hold is gone (let go before, or the inode freed by `MountState::relieve_removed_held`).
    pub(crate) fn take(&self, ino: u64) -> bool {
        let mut s = self.lock();
        let had = s.remove(&ino);
        self.count.store(s.len(), Ordering::Release);
        had
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
    }
}
