//! Reactive rewrite (paper §3.6): a file found fragmented when it is memory-mapped, or given
//! the alignment hint after its data was written (`cp --preserve=xattr` and `rsync -X` set
//! attributes after copying data), is queued; the background worker moves each of its 2 MiB
//! units that holds data but is not one aligned extent onto a fresh aligned extent, one unit
//! per transaction (`ops::relocate::rewrite_unit`), sleeping between units as long as the unit
//! took, so foreground work keeps at least half of the time. `Fs::rewrite` does the same at
//! once.

use crate::error::{Error, Result};
use crate::media::layout::BLOCKS_PER_HUGE;
use crate::ops::relocate::rewrite_unit;
use crate::state::slots;
use crate::state::inode_state::wlock;
use crate::state::mount_state::MountState;
use crate::types::RewriteStats;
use std::sync::Weak;
use std::time::Instant;

/// Rewrite every fragmented unit of `ino`, taking the mount and the inode lock one unit at a
/// time (so neither a foreground writer nor an unmount waits long for it).
pub(crate) fn rewrite_file(
    state: &Weak<MountState>,
    ino: u64,
    throttle: bool,
) -> Result<RewriteStats> {
    let mut stats = RewriteStats::default();
    let mut next = Some(0u64);
    while let Some(lb) = next {
        let Some(state) = state.upgrade() else {
            break;
        };
        let node = match state.inode(ino) {
            Ok(n) => n,
            Err(Error::Stale(_)) => break, // deleted meanwhile
            Err(e) => return Err(e),
        };
        let start = Instant::now();
        let moved = {
            // Like any foreground operation: fsck (which takes it for writing) sees no unit
            // half moved.
            let _ns = state.namespace.read();
            let mut g = wlock(&node);
            // Freed after the lookup: its DRAM map still lists blocks that are free now.
            if !state.still_live(ino, &node) {
                break;
            }
            let Some(first) = g.map.next_mapped(lb) else {
                break;
            };
            state.check_alive()?;
            // The unit's blocks are copied: their newest bytes must be in them.
            slots::fold_all(&state, &mut g)?;
            let unit = first / BLOCKS_PER_HUGE;
            stats.units_seen += 1;
            next = Some((unit + 1) * BLOCKS_PER_HUGE);
            rewrite_unit(&state, &mut g, unit)?
        };
        drop(state);
        if moved {
            stats.units_rewritten += 1;
            if throttle {
                std::thread::sleep(start.elapsed());
            }
        }
    }
    Ok(stats)
}
