//! Requests for background work: the write-back of alternate slots, the reactive rewrite of
//! fragmented files and hole compaction.
//!
//! This is the mailbox between the foreground and the worker thread. The data path, the
//! namespace and the allocator's frees post requests here (cheaply, under one mutex); the worker
//! in `background::worker`, started on the first request, takes them one at a time. The worker
//! waits here without holding the mount, so an unmount never waits for it to notice.

use crate::media::alloc::Allocator;
use crate::state::locks::lock;
use crate::types::{CompactStats, RewriteStats};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Background compaction is asked for when holes hold more than this share of free space...
pub(crate) const TRIGGER_SHARE: f64 = 0.08;
/// ... and only on pools with at least this much free space (blocks; a smaller pool has no
/// hole problem worth a scan).
pub(crate) const MIN_FREE: u64 = 16 * 512;
/// After a compaction pass that emptied nothing, requests wait for this many 2 MiB units to
/// be freed (or 1/32 of the free space, if more) before another pass can find something new.
const COMPACT_QUIET_UNITS: u64 = 4;
/// How often a waiting worker checks whether its mount is gone.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// One piece of background work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Job {
    /// Rewrite this inode's fragmented 2 MiB units onto aligned extents.
    Rewrite(u64),
    /// Run one hole-compaction pass.
    Compact,
    /// Write the oldest alternate slots (CLOCK order) back home until the zones have room.
    WriteBack,
    /// Copy home the slots a writer handed over (`slots::copy_handed_off`).
    CopySlots,
}

/// Starts the worker thread for a mount (given the mailbox it drains).
pub(crate) type Starter = Box<dyn Fn(Arc<Background>) -> std::io::Result<()> + Send + Sync>;

/// The mailbox of one mount.
pub(crate) struct Background {
    /// Rewrite requests are taken (false: `MountOptions::no_background_rewrite`).
    rewrite: bool,
    /// Compaction requests are taken (also false on a private mount).
    compact: bool,
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Set once the mount is in service; until then requests are dropped.
    starter: OnceLock<Starter>,
}

#[derive(Default)]
struct Queue {
    /// The worker thread is running.
    started: bool,
    order: VecDeque<u64>,
    queued: HashSet<u64>,
    /// A job is being done right now.
    busy: bool,
    /// Slot write-back asked for (a zone ran low on free slots).
    write_back: bool,
    /// A writer handed over slots to copy home.
    copy: bool,
    /// Hole compaction asked for (free space in holes passed the trigger).
    compact: bool,
    /// After a pass that emptied nothing, requests are ignored until this many more blocks
    /// have been freed: otherwise, with holes above the trigger and no unit worth emptying,
    /// every free would start another scan of every inode.
    compact_quiet_blocks: u64,
    rewritten: RewriteStats,
    compacted: CompactStats,
}

impl Background {
    /// A mailbox taking rewrite and/or compaction requests.
    pub fn new(rewrite: bool, compact: bool) -> Background {
        Background {
            rewrite,
            compact,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            starter: OnceLock::new(),
        }
    }

    /// Name the function that starts the worker on the first request.
    pub fn set_starter(&self, starter: Starter) {
        let _ = self.starter.set(starter);
    }

    /// Start the worker if it is not running; false if it cannot run.
    fn ensure_started(self: &Arc<Self>, q: &mut Queue) -> bool {
        if q.started {
            return true;
        }
        let Some(start) = self.starter.get() else {
            return false;
        };
        match start(self.clone()) {
            Ok(()) => {
                q.started = true;
                true
            }
            Err(e) => {
                log::error!("cannot start the background thread: {e}");
                false
            }
        }
    }

    /// Whether slot write-back requests are taken ([`Background::queue_write_back`]): the mount
    /// has background work and is in service.
    pub fn writes_back(&self) -> bool {
        self.rewrite && self.starter.get().is_some()
    }

    /// Queue `ino` for a rewrite onto aligned extents.
    pub fn queue_rewrite(self: &Arc<Self>, ino: u64) {
        if !self.rewrite {
            return;
        }
        let mut q = lock(&self.queue);
        if !self.ensure_started(&mut q) {
            return;
        }
        if q.queued.insert(ino) {
            q.order.push_back(ino);
            self.changed.notify_all();
        }
    }

    /// A zone runs low on free alternate slots: write the oldest back (before any other job).
    /// Taken with rewrites (not by mounts without background work, which write back when a
    /// zone is empty).
    pub fn queue_write_back(self: &Arc<Self>) {
        self.queue_slot_job(|q| &mut q.write_back);
    }

    /// A writer handed over alternate slots to copy home (before any other job).
    pub fn queue_copy(self: &Arc<Self>) {
        self.queue_slot_job(|q| &mut q.copy);
    }

    /// Set the request flag `flag` picks for the worker, once (slot jobs are taken with
    /// rewrites).
    fn queue_slot_job(self: &Arc<Self>, flag: fn(&mut Queue) -> &mut bool) {
        if !self.rewrite {
            return;
        }
        let mut q = lock(&self.queue);
        if *flag(&mut q) || !self.ensure_started(&mut q) {
            return;
        }
        *flag(&mut q) = true;
        self.changed.notify_all();
    }

    /// `freed_blocks` went back to `alloc`: ask for compaction once holes pass the trigger.
    /// Cheap when they have not: two counter sums.
    pub fn note_freed(self: &Arc<Self>, alloc: &Allocator, freed_blocks: u64) {
        if !self.compact || !alloc.holes_exceed(TRIGGER_SHARE, MIN_FREE) {
            return;
        }
        let mut q = lock(&self.queue);
        if !self.ensure_started(&mut q) {
            return;
        }
        if q.compact_quiet_blocks > 0 {
            q.compact_quiet_blocks = q.compact_quiet_blocks.saturating_sub(freed_blocks);
            return;
        }
        if !q.compact {
            q.compact = true;
            self.changed.notify_all();
        }
    }

    /// The worker's next job, waiting for one; None once `mount_gone()` says to stop.
    /// Queued rewrites go before compaction.
    pub fn next_job(&self, mount_gone: impl Fn() -> bool) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            if mount_gone() {
                return None;
            }
            if q.copy {
                q.copy = false;
                q.busy = true;
                return Some(Job::CopySlots);
            }
            if q.write_back {
                q.write_back = false;
                q.busy = true;
                return Some(Job::WriteBack);
            }
            if let Some(ino) = q.order.pop_front() {
                q.queued.remove(&ino);
                q.busy = true;
                return Some(Job::Rewrite(ino));
            }
            if q.compact {
                q.compact = false;
                q.busy = true;
                return Some(Job::Compact);
            }
            q = self
                .changed
                .wait_timeout(q, IDLE_POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A rewrite job finished with `done`.
    pub fn rewrite_done(&self, done: RewriteStats) {
        let mut q = lock(&self.queue);
        q.busy = false;
        q.rewritten.units_rewritten += done.units_rewritten;
        q.rewritten.units_seen += done.units_seen;
        self.changed.notify_all();
    }

    /// A compaction pass finished with `done`; `full` if it stopped at its unit budget (so
    /// there may be more to do: go on after anything queued meanwhile). Requests made during
    /// the pass (its own moves free blocks) are covered by it; a pass that emptied nothing
    /// quiets requests until a few more units (or 1/32 of `free_blocks`) have been freed.
    pub fn compact_done(&self, done: CompactStats, full: bool, free_blocks: u64) {
        let mut q = lock(&self.queue);
        q.busy = false;
        q.compacted.units_freed += done.units_freed;
        q.compacted.blocks_moved += done.blocks_moved;
        q.compact = full;
        if done.units_freed == 0 {
            q.compact_quiet_blocks = COMPACT_QUIET_UNITS.max(free_blocks / 32 / 512) * 512;
        }
        self.changed.notify_all();
    }

    /// A write-back job finished.
    pub fn write_back_done(&self) {
        lock(&self.queue).busy = false;
        self.changed.notify_all();
    }

    /// A job failed; the worker goes on with the next one.
    pub fn job_failed(&self) {
        lock(&self.queue).busy = false;
        self.changed.notify_all();
    }

    /// Wait until nothing is queued or running (or `timeout` passes); returns the rewrite
    /// totals so far, or None on timeout.
    pub fn settle(&self, timeout: Duration) -> Option<RewriteStats> {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.queue);
        if !q.started {
            return Some(RewriteStats::default());
        }
        while q.busy || q.compact || q.write_back || !q.order.is_empty() {
            let left = deadline.checked_duration_since(Instant::now())?;
            q = self
                .changed
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some(q.rewritten)
    }
}
