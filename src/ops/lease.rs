//! Direct-path leases (docs/DESIGN.md §7b): a client of the mount's channel maps a file's pool
//! blocks into its own address space, so the blocks must exist (holes inside the file are
//! filled first, whole aligned 2 MiB units for ranges of 2 MiB or more), must not move while it
//! maps them, and must not go to another file before it lets go. A lease holds the file open
//! (an unlinked file lives until its last lease goes), pins its blocks (`map_hooks::pinned`:
//! rewrite and compaction skip it; strict writes go in place) and quarantines what the file
//! frees meanwhile (`MountState::finish_map_update`).

use crate::error::{Error, Result};
use crate::media::layout::{BLOCK_SIZE, FileKind, MAX_FILE_SIZE};
use crate::ops::file::{fill_gaps, fill_unit_aligned, unit_fragmented};
use crate::ops::relocate::rewrite_unit;
use crate::ops::namespace;
use crate::state::inode_state::{rlock, wlock};
use crate::state::mappings::UNIT_BLOCKS;
use crate::state::mount_state::MountState;
use crate::sys::vm::HUGE;
use std::sync::atomic::Ordering;

/// What a lease covers: the file size at the grant, and (logical block, pool block, blocks)
/// for every block of the range inside the file.
pub(crate) struct Grant {
    pub size: u64,
    pub extents: Vec<(u64, u64, u64)>,
}

/// Lease bytes [off, off+len) of file `ino`; with `fill`, the holes of the part inside the
/// file are filled first.
pub(crate) fn grant(state: &MountState, ino: u64, off: u64, len: u64, fill: bool) -> Result<Grant> {
    state.check_writable()?;
    let end = off
        .checked_add(len)
        .filter(|&e| e <= MAX_FILE_SIZE && len > 0)
        .ok_or_else(|| Error::Invalid(format!("lease range {off}+{len}")))?;
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    if g.kind() != FileKind::File {
        return Err(Error::NoDevice("only regular files can be mapped".into()));
    }
    let (a, b) = (off / BLOCK_SIZE, end.min(g.hdr.size).div_ceil(BLOCK_SIZE));
    let big = len >= HUGE as u64;
    let mut unit = a / UNIT_BLOCKS;
    while fill && unit * UNIT_BLOCKS < b {
        let (u0, u1) = (unit * UNIT_BLOCKS, (unit + 1) * UNIT_BLOCKS);
        // The LMDB pattern (ftruncate, then map and touch): one aligned extent per unit, so
        // the client's first touch of a unit maps all 2 MiB of it with one fault. A unit that
        // holds a few scattered blocks already (the header LMDB wrote before it grew the file,
        // taken from holes on an aged pool) is moved onto an aligned extent first, unless
        // another lease pins the file.
        let empty = g.map.segments(u0, u1).is_empty();
        let aligned = big
            && if empty {
                fill_unit_aligned(state, &mut g, u0)?
            } else {
                g.leases == 0 && unit_fragmented(&g, unit) && rewrite_unit(state, &mut g, unit).unwrap_or(false)
            };
        if !aligned {
            fill_gaps(state, &mut g, a.max(u0), b.min(u1))?;
        }
        unit += 1;
    }
    g.open += 1;
    g.leases += 1;
    state.leases.held.fetch_add(1, Ordering::AcqRel);
    state.leases.publish(ino, g.hdr.size);
    Ok(Grant {
        size: g.hdr.size,
        extents: g.map.segments(a, b),
    })
}

/// Give back one lease of `ino`: the last one returns the quarantined blocks to the allocator;
/// then the open it held is released (which frees an unlinked file).
pub(crate) fn release(state: &MountState, ino: u64) -> Result<()> {
    let n = state.inode(ino)?;
    {
        let mut g = wlock(&n);
        if g.leases == 0 {
            return Err(Error::Invalid(format!("inode {ino} holds no lease")));
        }
        g.leases -= 1;
        state.leases.held.fetch_sub(1, Ordering::AcqRel);
        if g.leases == 0 {
            let q = std::mem::take(&mut g.quarantine);
            state.free_runs(&q);
        }
    }
    namespace::release(state, ino)
}

/// After an operation that may have changed the size of `ino`: publish it for the clients
/// that lease the file.
pub(crate) fn size_changed(state: &MountState, ino: u64) {
    if !state.leases.any() {
        return;
    }
    if let Ok(n) = state.inode(ino) {
        let g = rlock(&n);
        if g.leases > 0 {
            state.leases.publish(ino, g.hdr.size);
        }
    }
}
