//! Faulting the pool in ahead of use. A pool in memory (tmpfs, hugetlbfs, device DAX) is mapped
//! lazily by the kernel: the first store to each page takes a page fault, which on a 4 KiB-page
//! tmpfs costs about 1.5 µs — more than the 4 KiB store itself, and twice per 4 KiB append into
//! a fresh unit (its data, then its neighbours as the unit is zeroed). A kernel file system on
//! persistent memory has the whole device in its direct map and pays none of it. So after
//! mount one low-priority thread populates the pool's mapping, a chunk at a time, holding the
//! mount only while it populates a chunk; it stops at unmount. Nothing changes on media.

use crate::state::mount_state::MountState;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Bytes populated per step (a step holds the mount; unmount waits for at most one).
const CHUNK: u64 = 16 << 20;

/// Start populating `state`'s pool in the background, if it is a shared mapping of memory.
pub(crate) fn start(state: &Arc<MountState>) {
    if !state.pool.prefault_useful() || state.read_only {
        return;
    }
    let weak = Arc::downgrade(state);
    let spawned = std::thread::Builder::new()
        .name("winefs-prefault".into())
        .spawn(move || run(&weak));
    if let Err(e) = spawned {
        log::debug!("no prefault thread: {e}");
    }
}

fn run(state: &Weak<MountState>) {
    crate::sys::lower_thread_priority();
    let mut off = 0u64;
    loop {
        let Some(s) = state.upgrade() else { return };
        let len = s.pool.len();
        if off >= len || s.unmounted.load(Ordering::Relaxed) {
            return;
        }
        let n = CHUNK.min(len - off);
        if let Err(e) = s.pool.populate(off, n) {
            // Only speed is lost: every page still faults in on first touch.
            log::debug!("prefault of pool bytes {off}.. stopped: {e}");
            return;
        }
        off += n;
        s.prefaulted.store(off, Ordering::Relaxed);
    }
}
