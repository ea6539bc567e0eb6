//! Giving speculative preallocation back: the blocks past the end of a file that it took as
//! part of a whole aligned 2 MiB unit (`state::prealloc` keeps the count). They go back when a
//! small file is closed for the last time, and before an allocation would fail for want of
//! space they are taken back from other files (the allocator's pressure handler). Each
//! give-back is one transaction, like a truncate to the current size: the extent straddling
//! the end is shortened, the ones past it die by the lowered `map_end`, and the blocks return to
//! the allocator after the commit.

use crate::error::Result;
use crate::media::journal::Tx;
use crate::media::layout::HUGE_SIZE;
use crate::meta::inode::MapUpdate;
use crate::ops::file::{commit_map_change, guarded};
use crate::state::inode_state::InodeState;
use crate::state::mount_state::MountState;
use crate::state::slots;
use crate::state::zones::UNIT_HOLDERS;
use std::sync::{Arc, Weak};

/// Give back the file's speculative blocks past its end; returns how many went back.
pub(crate) fn trim(state: &MountState, g: &mut InodeState) -> Result<u64> {
    // Blocks a client maps or appends into stay with the file while it does.
    if g.spec.is_none() || g.leases > 0 {
        return Ok(0);
    }
    let keep = g.eof_block();
    let n = g.blocks_past_eof();
    if n > 0 {
        let mut upd = MapUpdate::default();
        guarded(state, || {
            g.map.truncate(keep, &mut upd);
            commit_map_change(state, g, &upd, Tx::new(), |h| h.map_end = keep)
        })?;
    }
    state.forget_prealloc(g);
    Ok(n)
}

/// The last handle of the file was closed: a file smaller than 2 MiB gives its speculative
/// blocks back (a large file keeps them for its next append, until space runs short).
pub(crate) fn on_last_close(state: &MountState, g: &mut InodeState) -> Result<()> {
    // A read-only mount changes nothing; the blocks stay with the file.
    if g.spec.is_some() && g.hdr.size < HUGE_SIZE && !state.is_read_only() {
        trim(state, g)?;
    }
    Ok(())
}

/// Take speculative blocks back from files, largest holding first, until `need` blocks came
/// back or none is left. Inodes locked by someone else (the caller's own among them) are
/// skipped rather than waited for, so this never deadlocks whatever locks the caller holds.
pub(crate) fn reclaim(state: &MountState, need: u64) -> u64 {
    let mut freed = 0;
    let mut zones_tried = false;
    for (ino, _) in state.alloc.speculative_holders() {
        if freed >= need {
            break;
        }
        if ino >= UNIT_HOLDERS {
            // The zones' units (one holder per zone; `shrink` goes through every zone, so only
            // the first holder calls it): their slots go home, then the units go back, whole,
            // until enough came back.
            if !zones_tried {
                zones_tried = true;
                match slots::shrink(state, need - freed, false) {
                    Ok(n) => freed += n,
                    Err(e) => log::warn!("cannot give the slot zones' units back: {e}"),
                }
            }
            continue;
        }
        let Ok(node) = state.inode(ino) else {
            continue;
        };
        let Some(mut g) = crate::state::inode_state::try_wlock(&node) else {
            continue;
        };
        if !state.still_live(ino, &node) {
            continue;
        }
        match trim(state, &mut g) {
            Ok(n) => freed += n,
            Err(e) => {
                log::warn!("cannot give back the preallocation of inode {ino}: {e}");
                break;
            }
        }
    }
    if freed > 0 {
        log::debug!("space pressure: {freed} preallocated blocks given back");
    }
    freed
}

/// Make [`reclaim`] the allocator's pressure handler for this mount.
pub(crate) fn attach(state: &Arc<MountState>) {
    let weak: Weak<MountState> = Arc::downgrade(state);
    state.alloc.set_pressure_handler(Box::new(move |need| {
        weak.upgrade().map_or(0, |s| reclaim(&s, need))
    }));
}
