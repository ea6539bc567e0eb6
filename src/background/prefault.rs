//! Faulting the pool in ahead of use. A pool in memory (tmpfs, hugetlbfs, device DAX) is mapped
//! lazily by the kernel: the first store to each page takes a page fault, which on a 4 KiB-page
//! tmpfs costs about 1.5 µs — more than the 4 KiB store itself, and twice per 4 KiB append into
//! a fresh unit (its data, then its neighbours as the unit is zeroed). A kernel file system on
//! persistent memory has the whole device in its direct map and pays none of it. So after
//! mount one low-priority thread populates the pool's mapping, a chunk at a time, until it is
//! done, the pool is unmounted, or the facade stops it (dropping an `Fs` does, and waits, so
//! the mount is never let go of on this thread). Nothing changes on media.

use crate::state::locks::lock;
use crate::state::mount_state::MountState;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Bytes populated per step: the thread stops between steps, and one step of 512 small pages
/// is short even at nice 19 on a busy machine, so stopping it never waits long.
const CHUNK: u64 = 2 << 20;

/// Start populating `state`'s pool in the background (once), if it is a shared mapping of
/// memory. The thread holds the mount until it ends; [`stop`] ends it.
pub(crate) fn start(state: &Arc<MountState>) {
    if !state.pool.prefault_useful() || state.is_read_only() {
        return;
    }
    let mut slot = lock(&state.prefault_thread);
    if slot.is_some() {
        return;
    }
    let s = Arc::clone(state);
    match std::thread::Builder::new()
        .name("winefs-prefault".into())
        .spawn(move || run(&s))
    {
        Ok(h) => *slot = Some(h),
        Err(e) => log::debug!("no prefault thread: {e}"),
    }
}

/// Stop the prefault thread, if any, and wait for it (at most one chunk).
pub(crate) fn stop(state: &MountState) {
    state.prefault_stop.store(true, Ordering::Relaxed);
    let handle = lock(&state.prefault_thread).take();
    if let Some(h) = handle
        && h.thread().id() != std::thread::current().id()
    {
        let _ = h.join();
    }
}

/// Wait until the prefault thread, if any, has populated the whole pool (or was stopped).
pub(crate) fn wait(state: &MountState) {
    let handle = lock(&state.prefault_thread).take();
    if let Some(h) = handle
        && h.thread().id() != std::thread::current().id()
    {
        let _ = h.join();
    }
}

fn run(s: &MountState) {
    crate::sys::lower_thread_priority();
    let len = s.pool.len();
    let mut off = 0u64;
    while off < len
        && !s.prefault_stop.load(Ordering::Relaxed)
        && !s.unmounted.load(Ordering::Relaxed)
    {
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
