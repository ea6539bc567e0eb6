//! What the data path calls, with the inode lock held, to keep a file's live memory mappings in
//! step with its size and block map: pages past a new end turn SIGBUS pages before their blocks
//! are freed, new pages become missing pages, pages over moved blocks are dropped before the
//! move. Each is a no-op for a file without mappings.

use crate::error::Result;
use crate::media::layout::{BLOCK_SIZE, INODE_TAIL_UNSETTLED};
use crate::media::pool::Category;
use crate::state::inode_state::InodeState;
use crate::state::locks::lock;
use crate::state::mappings::{Shared, UNIT_BLOCKS};
use crate::state::mount_state::MountState;
use std::sync::Arc;

/// The mount's userfaultfds, if its fault service has started.
pub(crate) fn shared_of(state: &MountState) -> Option<Arc<Shared>> {
    lock(&state.faults).as_ref().map(|s| s.shared.clone())
}

/// Before a file shrinks to `new_size`: pages past the new end turn SIGBUS pages, before the
/// blocks behind them are freed.
pub(crate) fn before_shrink(state: &MountState, g: &InodeState, new_size: u64) -> Result<()> {
    if g.maps.is_empty() {
        return Ok(());
    }
    let Some(sh) = shared_of(state) else {
        return Ok(());
    };
    let (a, b) = (
        new_size.div_ceil(BLOCK_SIZE),
        g.hdr.size.div_ceil(BLOCK_SIZE),
    );
    for st in &g.maps {
        sh.replace(st, a, b, true)?;
        let mut va = lock(&st.va);
        // Units wholly past the new end hold no valid pages any more.
        let first_gone = a.div_ceil(UNIT_BLOCKS);
        let gone: Vec<u64> = va.installed.range(first_gone..).copied().collect();
        for u in gone {
            va.installed.remove(&u);
        }
    }
    Ok(())
}

/// Before a file grows from its current size: the bytes past the old end in its last block
/// are zeroed (a store through a mapping may have put something there, and the file system
/// promises zeros past EOF). Needs no journal: zeros past EOF are always consistent.
pub(crate) fn before_grow(state: &MountState, g: &InodeState) -> Result<()> {
    match g.is_mapped() {
        true => zero_last_block_tail(state, g),
        false => Ok(()),
    }
}

/// Zero the bytes of the file's last block past its end (if the block is mapped), then fence.
/// Needs no journal: zeros past EOF are always consistent.
pub(crate) fn zero_last_block_tail(state: &MountState, g: &InodeState) -> Result<()> {
    if g.hdr.size.is_multiple_of(BLOCK_SIZE) {
        return Ok(());
    }
    if let Some((phys, _)) = g.map.lookup(g.hdr.size / BLOCK_SIZE) {
        let inblk = g.hdr.size % BLOCK_SIZE;
        state.pool.zero_flush(
            phys * BLOCK_SIZE + inblk,
            BLOCK_SIZE - inblk,
            Category::Data,
        )?;
        state.pool.fence();
    }
    Ok(())
}

/// After a file grew from `old_size`: the new pages stop being SIGBUS pages and become
/// missing pages (installed on first touch). A mapping shows the new last block whole, so if
/// the file's bytes past its end may not be zero (`INODE_TAIL_UNSETTLED`: a fresh unit a write
/// took is not zeroed past what it stored) they are zeroed there first.
pub(crate) fn after_grow(state: &MountState, g: &InodeState, old_size: u64) -> Result<()> {
    if !g.maps.is_empty() && g.hdr.flags & INODE_TAIL_UNSETTLED != 0 {
        zero_last_block_tail(state, g)?;
    }
    let (a, b) = (
        old_size.div_ceil(BLOCK_SIZE),
        g.hdr.size.div_ceil(BLOCK_SIZE),
    );
    make_missing(state, g, a, b)
}

/// Before blocks [a, b) of the file are unmapped or moved (punch hole, rewrite): their pages
/// turn missing, so no store reaches a block after it has left the file.
pub(crate) fn before_move(state: &MountState, g: &InodeState, a: u64, b: u64) -> Result<()> {
    make_missing(state, g, a, b.min(g.hdr.size.div_ceil(BLOCK_SIZE)))
}

/// Turn the pages of blocks [a, b) of every mapping of the file missing.
fn make_missing(state: &MountState, g: &InodeState, a: u64, b: u64) -> Result<()> {
    if g.maps.is_empty() || a >= b {
        return Ok(());
    }
    let Some(sh) = shared_of(state) else {
        return Ok(());
    };
    for st in &g.maps {
        sh.replace(st, a, b, false)?;
    }
    Ok(())
}

/// Whether the file has an atomic mapping (whose private, not yet msynced pages a move of
/// its blocks would discard).
pub(crate) fn has_atomic(g: &InodeState) -> bool {
    g.maps.iter().any(|m| m.atomic)
}

/// Whether the file's blocks must stay where they are: an atomic mapping (see [`has_atomic`])
/// or a direct-path lease (a client maps the blocks themselves; nothing here can remap them).
/// Rewrite and compaction skip such a file.
pub(crate) fn pinned(g: &InodeState) -> bool {
    has_atomic(g) || g.leases > 0
}

/// Write back the cache lines of the backed blocks of [a, b) and fence.
pub(crate) fn flush_blocks(state: &MountState, g: &InodeState, a: u64, b: u64) {
    for (_, p, n) in g.map.segments(a, b) {
        state
            .pool
            .flush(p * BLOCK_SIZE, n * BLOCK_SIZE, Category::Data);
    }
    state.pool.fence();
}

/// Write back every installed page of every plain mapping of the file (fsync of a mapped
/// file; atomic mappings reach the file only through their own msync).
pub(crate) fn flush_mapped(state: &MountState, g: &InodeState) {
    for st in g.maps.iter().filter(|m| !m.atomic) {
        flush_blocks(state, g, st.first_block(), st.end_block());
    }
}
