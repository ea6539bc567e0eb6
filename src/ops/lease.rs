//! Direct-path leases (docs/DESIGN.md §7b): a client of the mount's channel maps a file's pool
//! blocks into its own address space, so the blocks must exist (holes inside the file are
//! filled first, whole aligned 2 MiB units for ranges of 2 MiB or more), must not move while it
//! maps them, and must not go to another file before it lets go. A lease holds the file open
//! (an unlinked file lives until its last lease goes) and pins its blocks (`map_hooks::pinned`:
//! rewrite and compaction skip it; strict writes go in place; truncate, punch hole and zero
//! range keep them and zero bytes in place, `ops::file::zero_leased_in_place`). Whatever the
//! file would still free meanwhile is quarantined (`MountState::finish_map_update`).

use crate::error::{Error, Result};
use crate::media::layout::{BLOCK_SIZE, FileKind, MAX_FILE_SIZE};
use crate::meta::inode_flags::{self, Change};
use crate::ops::file::{fill_gaps, fill_unit_aligned, unit_fragmented};
use crate::ops::relocate::rewrite_unit;
use crate::ops::open;
use crate::ops::xattr;
use crate::state::appends::{self, FileLock};
use crate::state::inode_state::{InodeState, rlock};
use crate::state::mappings::UNIT_BLOCKS;
use crate::state::mount_state::MountState;
use crate::sys::vm::HUGE;
use std::sync::atomic::Ordering;

/// What a lease covers: the file size at the grant, and (logical block, pool block, blocks)
/// for every block of the range inside the file.
pub(crate) struct Grant {
    pub size: u64,
    pub extents: Vec<(u64, u64, u64)>,
    /// The client must write through the daemon ([`xattr::privileged`]).
    pub privileged: bool,
}

/// What a lease is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Purpose {
    /// Reads and writes of the blocks the file has: no hole filled.
    Existing,
    /// A mapping: the holes inside the file are filled first.
    Map,
    /// Appends: every block of the range is allocated, past the end of the file too, and the
    /// client grows the size itself (`state::appends`).
    Append,
}

/// Lease bytes [off, off+len) of file `ino` for `purpose`.
pub(crate) fn grant(state: &MountState, ino: u64, off: u64, len: u64, purpose: Purpose) -> Result<Grant> {
    state.check_writable()?;
    let fill = purpose == Purpose::Map;
    let end = off
        .checked_add(len)
        .filter(|&e| e <= MAX_FILE_SIZE && len > 0)
        .ok_or_else(|| Error::Invalid(format!("lease range {off}+{len}")))?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    if g.kind() != FileKind::File {
        return Err(Error::NoDevice("only regular files can be mapped".into()));
    }
    // The client stores into what it leases (an append lease: past the end only); denied,
    // it goes through FUSE.
    let change = if purpose == Purpose::Append { Change::Append } else { Change::Contents };
    inode_flags::allow(g.hdr.flags, change)?;
    if purpose == Purpose::Append {
        return grant_append(state, &mut g, off, end);
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
    // The client maps the last block whole: what lies past the end there must read as zeros.
    appends::zero_past_end(state, &g, a * BLOCK_SIZE, b * BLOCK_SIZE)?;
    let privileged = xattr::privileged(state, &g)?;
    hold(state, &mut g);
    Ok(Grant {
        size: g.hdr.size,
        extents: g.map.segments(a, b),
        privileged,
    })
}

/// Count one more lease of the locked file and publish its size.
fn hold(state: &MountState, g: &mut InodeState) {
    g.open += 1;
    g.leases += 1;
    state.leases.held.fetch_add(1, Ordering::AcqRel);
    if g.appenders == 0 {
        state.leases.publish(g.ino, g.hdr.size, false); // else the lock publishes when it drops
    }
}

/// An append lease of bytes [off, end): every block allocated (whole aligned units for the
/// empty ones, since an appended file is written from start to end), none speculative, the
/// file marked as one whose bytes past its end may not be zero, and the client counted as one
/// that grows the size itself.
fn grant_append(state: &MountState, g: &mut FileLock<'_>, off: u64, end: u64) -> Result<Grant> {
    let (a, b) = (off / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
    let privileged = xattr::privileged(state, g)?;
    // Blocks the file has there already may hold anything past its end; the client maps them
    // (blocks allocated below are zeroed).
    appends::zero_past_end(state, g, a * BLOCK_SIZE, b * BLOCK_SIZE)?;
    let mut unit = a / UNIT_BLOCKS;
    while unit * UNIT_BLOCKS < b {
        let (u0, u1) = (unit * UNIT_BLOCKS, (unit + 1) * UNIT_BLOCKS);
        let filled = match g.map.segments(u0, u1).is_empty() && fill_unit_aligned(state, g, u0)? {
            true => Ok(true),
            false => fill_gaps(state, g, a.max(u0), b.min(u1)),
        };
        if let Err(e) = filled {
            // Short of space: what was reserved past the end goes back under pressure.
            state.mark_prealloc(g);
            return Err(e);
        }
        unit += 1;
    }
    state.forget_prealloc(g);
    appends::mark_unsettled(state, g)?;
    if g.appenders == 0 {
        // From now on every size of the file is published by its lock (frozen meanwhile).
        state.leases.freeze(g.ino);
        g.arm_publish();
    }
    g.appenders += 1;
    state.leases.appending.fetch_add(1, Ordering::AcqRel);
    hold(state, g);
    Ok(Grant {
        size: g.hdr.size,
        extents: g.map.segments(a, b),
        privileged,
    })
}

/// Give back one lease of `ino` (an append lease: `append`; the sizes its client published
/// are pulled in first): the last one returns the quarantined blocks to the allocator; then the
/// open it held is released (which frees an unlinked file).
pub(crate) fn release(state: &MountState, ino: u64, append: bool) -> Result<()> {
    let n = state.inode(ino)?;
    {
        let mut g = appends::lock(state, &n)?;
        if g.leases == 0 || (append && g.appenders == 0) {
            return Err(Error::Invalid(format!("inode {ino} holds no such lease")));
        }
        // Its direct writes get their times now, while the file still counts as leased (a
        // failure to store them must not keep the lease).
        if state.leases.take_written(ino)
            && let Err(e) = appends::stamp_direct_writes(state, &mut g)
        {
            log::warn!("inode {ino}: the times of direct writes not stored: {e}");
        }
        if append {
            g.appenders -= 1;
            state.leases.appending.fetch_sub(1, Ordering::AcqRel);
            if g.appenders == 0 {
                // What it reserved past the end stays with the file as speculative
                // preallocation (given back at the last close of a small file, or under
                // space pressure).
                state.mark_prealloc(&mut g);
            }
        }
        g.leases -= 1;
        state.leases.held.fetch_sub(1, Ordering::AcqRel);
        if g.leases == 0 {
            let q = std::mem::take(&mut g.quarantine);
            state.free_runs(&q);
            // What a truncate kept past the end for the client's mapping is given back as
            // speculative preallocation is.
            if std::mem::take(&mut g.kept_under_lease) {
                state.mark_prealloc(&mut g);
            }
        }
    }
    open::release(state, ino)
}

/// After an operation that may have changed the size of `ino`: publish it for the clients
/// that lease the file.
pub(crate) fn size_changed(state: &MountState, ino: u64) {
    if !state.leases.any() {
        return;
    }
    if let Ok(n) = state.inode(ino) {
        let g = rlock(&n);
        // A file clients append to publishes its size from its lock, with the word frozen.
        if g.leases > 0 && g.appenders == 0 {
            state.leases.publish(ino, g.hdr.size, false);
        }
    }
}
