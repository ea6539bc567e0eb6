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
//! kept. Directories and other small inodes are freed early only when inode numbers run short
//! (a directory removed while a process's working directory then answers ESTALE there).
//!
//! A file removed while open handles still held it is freed at their RELEASE, which the kernel
//! sends in the background when the last descriptor closes: a program that closes a file,
//! removes it and at once allocates its space can find the RELEASE still in another thread's
//! hands. So for a short while after such a removal (`removed_open_within`) an allocation that
//! finds no space waits for the RELEASE instead of refusing (`MountState::alloc_blocks`). It
//! waits as well while a hold given up is being released (`take_to_release`): the kernel's
//! FORGET, served by another thread, frees the file then, its blocks not back yet.

use crate::state::inode_state::InodeState;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long an allocation (of blocks or of an inode number) that finds none waits for a
/// removed file another thread is freeing (`MountState::wait_for_closing`): the kernel sends a
/// RELEASE in the background as the last descriptor closes, and another thread serves it, or a
/// FORGET, in microseconds, but on a loaded machine either thread can be off a CPU for hundreds
/// of milliseconds (measured: a sleeping thread woke 0.5 s late on two CPUs running four
/// spinning programs). The while runs from the removal: a removed file that stays open delays
/// the allocations short of space within it, none after.
const CLOSING_WAIT: Duration = Duration::from_millis(500);

/// The inodes a removal kept, each with one hold (one count of its `open`).
#[derive(Debug)]
pub(crate) struct RemovedHeld {
    inodes: Mutex<HashSet<u64>>,
    /// `inodes.len()`, read without the lock when space runs short.
    count: AtomicUsize,
    /// Nanoseconds from `epoch` to the last removal that kept an inode open handles held too
    /// (0: none yet).
    last_open_removal: AtomicU64,
    epoch: Instant,
    /// Holds taken by [`RemovedHeld::take_to_release`] whose release has not ended.
    releasing: AtomicUsize,
    /// [`CLOSING_WAIT`] in milliseconds (longer in tests that a loaded machine must not fail).
    closing_wait_ms: AtomicU64,
}

/// A hold given up and being released: counted by [`RemovedHeld::releasing`] until dropped.
#[derive(Debug)]
pub(crate) struct Releasing<'a>(&'a RemovedHeld);

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.releasing.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Default for RemovedHeld {
    fn default() -> Self {
        RemovedHeld {
            inodes: Mutex::default(),
            count: AtomicUsize::new(0),
            last_open_removal: AtomicU64::new(0),
            epoch: Instant::now(),
            releasing: AtomicUsize::new(0),
            closing_wait_ms: AtomicU64::new(CLOSING_WAIT.as_millis() as u64),
        }
    }
}

impl RemovedHeld {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // A set of numbers: still right after a panic elsewhere.
        self.inodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `n`, which just lost its last name, for the caller of its removal: one more open
    /// (the hold), noted here.
    pub(crate) fn hold(&self, n: &mut InodeState) {
        if n.open > 0 {
            // Open handles hold it too: their RELEASE frees it, and may be on its way.
            let since = u64::try_from(self.epoch.elapsed().as_nanos().max(1)).unwrap_or(u64::MAX);
            self.last_open_removal.store(since, Ordering::Release);
        }
        n.open += 1;
        self.kept(n.ino);
    }

    /// How long an allocation that finds no space waits for a free another thread is making
    /// ([`CLOSING_WAIT`]).
    pub(crate) fn closing_wait(&self) -> Duration {
        Duration::from_millis(self.closing_wait_ms.load(Ordering::Relaxed))
    }

    /// Wait `wait` instead of [`CLOSING_WAIT`]: a test that stands for a kernel sending its
    /// RELEASE late must not fail when the machine running it stalls its threads for longer.
    #[cfg(test)]
    pub(crate) fn set_closing_wait(&self, wait: Duration) {
        self.closing_wait_ms.store(wait.as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether a removal kept, within the last `window`, an inode that open handles held too.
    pub(crate) fn removed_open_within(&self, window: Duration) -> bool {
        match self.last_open_removal.load(Ordering::Acquire) {
            0 => false,
            at => {
                let now = self.epoch.elapsed().as_nanos();
                now.saturating_sub(u128::from(at)) <= window.as_nanos()
            }
        }
    }

    /// A removal kept inode `ino` for its caller, with a hold.
    fn kept(&self, ino: u64) {
        let mut s = self.lock();
        s.insert(ino);
        self.count.store(s.len(), Ordering::Release);
    }

    /// Take the hold on `ino`: true if it had one (exactly one caller gets true), false if it
    /// has none (never kept, let go before, or freed by `MountState::relieve_removed_held`).
    /// The caller frees the inode at once, under its lock (`MountState::relieve_removed_held`).
    pub(crate) fn take(&self, ino: u64) -> bool {
        self.take_to_release(ino).is_some()
    }

    /// [`RemovedHeld::take`] for a caller about to release the inode: while the returned guard
    /// lives, [`RemovedHeld::releasing`] says so (counted before the hold leaves the set, so a
    /// thread short of space sees the inode either kept or being released).
    pub(crate) fn take_to_release(&self, ino: u64) -> Option<Releasing<'_>> {
        // Most callers (every FORGET of a FUSE mount) ask about inodes never kept.
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut s = self.lock();
        if !s.contains(&ino) {
            return None;
        }
        self.releasing.fetch_add(1, Ordering::AcqRel);
        s.remove(&ino);
        self.count.store(s.len(), Ordering::Release);
        Some(Releasing(self))
    }

    /// Whether a hold given up is being released now ([`RemovedHeld::take_to_release`]).
    pub(crate) fn releasing(&self) -> bool {
        self.releasing.load(Ordering::Acquire) > 0
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

    fn fresh(ino: u64) -> InodeState {
        use crate::media::layout::InodeHeader;
        use crate::meta::inode::FileMap;
        InodeState::new(ino, InodeHeader::default(), FileMap::new(), None)
    }

    #[test]
    fn a_removal_of_an_open_file_is_recent_for_a_while() {
        let r = RemovedHeld::default();
        let window = Duration::from_millis(30);
        assert!(!r.removed_open_within(window), "nothing removed yet");
        let mut closed = fresh(11);
        r.hold(&mut closed);
        assert_eq!(closed.open, 1);
        assert!(!r.removed_open_within(window), "no handle held it: no RELEASE to wait for");
        let mut open = fresh(12);
        open.open = 1;
        r.hold(&mut open);
        assert_eq!(open.open, 2);
        assert!(r.removed_open_within(window));
        std::thread::sleep(window + Duration::from_millis(10));
        assert!(!r.removed_open_within(window), "the window is over");
    }

    #[test]
    fn a_hold_being_released_is_counted_until_its_guard_goes() {
        let r = RemovedHeld::default();
        r.kept(5);
        assert!(r.take_to_release(6).is_none(), "never kept");
        assert!(!r.releasing());
        let g = r.take_to_release(5).expect("kept");
        assert!(r.releasing());
        assert!(!r.take(5) && r.take_to_release(5).is_none(), "taken once");
        assert!(r.snapshot().is_empty());
        drop(g);
        assert!(!r.releasing());
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
