//! Durability for a pool that is a file on a disk file system without DAX.
//!
//! Mapping such a file maps its page cache: a cache-line write-back reaches DRAM, which the
//! kernel writes to the disk when it chooses, so `clwb` + `sfence` make nothing durable. For
//! these pools a fence writes the file's dirty pages to the disk (`fdatasync`) instead, after
//! every write-back noted since the last one; a write-back that reached no fence yet costs
//! nothing. An `fdatasync` that fails leaves the pool failed for the rest of the mount (Linux
//! reports a write-back error once and may drop the pages, so a later success proves nothing),
//! and the pool then takes no more stores: the kernel may still write pages dirtied after the
//! failure back once the disk takes writes again, and a store that follows a lost one (a
//! file's size after its data, a COMMIT after its changes) must never reach the disk without
//! it. What the disk holds is then what a crash at the failed fence leaves.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// What a fence owes the disk, and whether the disk ever refused it.
#[derive(Debug, Default)]
pub(crate) struct DiskSync {
    /// Write-backs noted since open.
    noted: AtomicU64,
    /// `noted` as the last finished sync read it before it started: every write-back counted
    /// up to there is on the disk.
    synced: AtomicU64,
    /// One sync at a time; a fence that waited for another's finds its own covered.
    running: Mutex<()>,
    /// Syncs issued (for `winefs stat` and tests).
    syncs: AtomicU64,
    /// The OS error of the first failed sync.
    failed: OnceLock<i32>,
}

impl DiskSync {
    /// A write-back of some range was issued (its stores are done).
    pub(crate) fn note(&self) {
        self.noted.fetch_add(1, Ordering::SeqCst);
    }

    /// Make every write-back noted before this call durable: sync `file` unless a sync that
    /// started after the last of them has finished.
    pub(crate) fn fence(&self, file: &File) {
        let mine = self.noted.load(Ordering::SeqCst);
        if self.synced.load(Ordering::SeqCst) >= mine {
            return;
        }
        let _one = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // After a failure a later sync proves nothing (the error is reported once), and the
        // pool takes no more stores.
        if self.synced.load(Ordering::SeqCst) >= mine || self.failed.get().is_some() {
            return;
        }
        let upto = self.noted.load(Ordering::SeqCst);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match file.sync_data() {
            Ok(()) => self.synced.store(upto, Ordering::SeqCst),
            Err(e) => {
                let code = e.raw_os_error().unwrap_or(libc::EIO);
                if self.failed.set(code).is_ok() {
                    log::error!("writing the pool to disk failed ({e}): no later write is durable");
                }
            }
        }
    }

    /// Syncs issued since open.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The error of the first failed sync, if one failed.
    pub(crate) fn failure(&self) -> Option<std::io::Error> {
        self.failed
            .get()
            .map(|&code| std::io::Error::from_raw_os_error(code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_syncs_once_for_what_was_noted_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("f")).unwrap();
        let d = DiskSync::default();
        d.fence(&f);
        assert_eq!(d.syncs(), 0, "nothing noted, nothing to sync");
        d.note();
        d.note();
        d.fence(&f);
        assert_eq!(d.syncs(), 1);
        d.fence(&f);
        assert_eq!(d.syncs(), 1, "a second fence owes nothing");
        d.note();
        d.fence(&f);
        assert_eq!(d.syncs(), 2);
        assert!(d.failure().is_none());
    }

    #[test]
    fn a_failed_sync_stays_failed() {
        // A directory opened read-only cannot be synced as data on every file system, so use a
        // pipe: fdatasync on it fails with EINVAL.
        let (r, _w) = std::io::pipe().unwrap();
        let f = File::from(std::os::fd::OwnedFd::from(r));
        let d = DiskSync::default();
        d.note();
        d.fence(&f);
        let e = d.failure().expect("the sync of a pipe fails");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let syncs = d.syncs();
        d.note();
        d.fence(&f);
        assert!(d.failure().is_some(), "a failure is kept");
        assert_eq!(d.syncs(), syncs, "no sync after a failed one: it would prove nothing");
    }
}
