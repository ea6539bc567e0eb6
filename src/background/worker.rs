//! The background worker of a mount: one thread, started on the first request, that takes jobs
//! from the mount's mailbox (`state::background`) — rewrites first, then compaction passes —
//! and runs them throttled, holding the mount only while it works on one unit.

use crate::background::compact;
use crate::background::rewrite::rewrite_file;
use crate::media::pool::thread_stats;
use crate::state::accounting::OpKind;
use crate::state::slots;
use crate::state::background::{Background, Job};
use crate::state::mount_state::MountState;
use std::sync::{Arc, Weak};

/// Units emptied per compaction pass: a pass ends (and queued rewrites go first) every 64.
const COMPACT_PASS: u64 = 64;

/// Put the mount in service: its first background request starts the worker thread.
pub(crate) fn attach(state: &Arc<MountState>) {
    let weak = Arc::downgrade(state);
    state.background.set_starter(Box::new(move |mailbox| {
        let weak = weak.clone();
        std::thread::Builder::new()
            .name("winefs-background".into())
            .spawn(move || run(&weak, &mailbox))
            .map(drop)
    }));
}

/// The worker's loop; ends when the mount is gone.
fn run(state: &Weak<MountState>, mailbox: &Background) {
    while let Some(job) = mailbox.next_job(|| state.strong_count() == 0) {
        // A read-only mount stores nothing: requests made before the switch are dropped.
        if state.upgrade().is_some_and(|s| s.is_read_only()) {
            mailbox.job_failed();
            continue;
        }
        let before = thread_stats();
        match job {
            Job::Rewrite(ino) => match rewrite_file(state, ino, true) {
                Ok(done) => mailbox.rewrite_done(done),
                // A pool too full to give the file aligned extents is not a fault: the file
                // keeps its data and its current layout.
                Err(crate::error::Error::NoSpace(why)) => {
                    log::info!("background rewrite of inode {ino} left for later: {why}");
                    mailbox.job_failed();
                }
                Err(e) => {
                    log::error!("background rewrite of inode {ino} stopped: {e}");
                    mailbox.job_failed();
                }
            },
            Job::WriteBack => match state.upgrade().map(|s| slots::write_back_lru(&s)) {
                Some(Err(e)) => {
                    log::error!("background write-back of alternate slots stopped: {e}");
                    mailbox.job_failed();
                }
                _ => mailbox.write_back_done(),
            },
            Job::CopySlots => match state.upgrade().map(|s| slots::copy_handed_off(&s)) {
                Some(Err(e)) => {
                    log::error!("background copy of alternate slots stopped: {e}");
                    mailbox.job_failed();
                }
                _ => mailbox.write_back_done(),
            },
            Job::Compact => {
                match compact::compact(state, compact::GOAL_SHARE, COMPACT_PASS, true) {
                    Ok(done) => {
                        let free = state.upgrade().map_or(0, |s| s.alloc.free_blocks());
                        mailbox.compact_done(done, done.units_freed == COMPACT_PASS, free);
                    }
                    Err(e) => {
                        log::error!("background hole compaction stopped: {e}");
                        mailbox.job_failed();
                    }
                }
            }
        }
        if let Some(s) = state.upgrade() {
            s.accounting.record(OpKind::Background, &thread_stats().since(&before));
        }
    }
}
