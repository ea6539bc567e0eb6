//! Moving a file's blocks without changing its content: a fragmented 2 MiB unit onto a fresh
//! aligned extent (reactive rewrite), blocks into holes elsewhere (hole compaction), and blocks
//! onto scattered single blocks (the "4 KiB-scattered" benchmark baseline). Each move copies
//! first, then remaps and frees the old blocks in one transaction, so a crash at any point
//! leaves the content as it was: before the commit the new blocks are unreferenced (free again
//! after recovery), after it the old ones are.

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::{BLOCK_SIZE, BLOCKS_PER_HUGE};
use crate::media::pool::Category;
use crate::meta::inode::MapUpdate;
use crate::ops::file::{commit_map_change, guarded, unit_fragmented};
use crate::ops::xattr;
use crate::state::slots;
use crate::state::inode_state::{InodeState, wlock};
use crate::state::map_hooks;
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use crate::sys::current_cpu;

/// Move 2 MiB unit `unit` of the file onto a fresh aligned extent (reactive rewrite): copy
/// its blocks (holes become zeros), then remap the unit and free the old blocks in one
/// transaction. The content is the same before and after, so a crash at any point is
/// harmless. Returns false when the unit needed nothing (empty or already aligned).
pub(crate) fn rewrite_unit(state: &MountState, g: &mut InodeState, unit: u64) -> Result<bool> {
    // Never under an atomic mapping (its stores not yet msynced live only in its pages) nor a
    // direct-path lease (a client maps the blocks themselves).
    if !unit_fragmented(g, unit) || map_hooks::pinned(g) {
        return Ok(false);
    }
    let ext = state
        .alloc
        .alloc_aligned_extent(current_cpu())
        .ok_or_else(|| Error::NoSpace("no free aligned 2 MiB extent to rewrite onto".into()))?;
    let run = BlockRun {
        start: ext,
        len: BLOCKS_PER_HUGE,
    };
    // Given back unless the move commits.
    let mut res = Reserved::new(state);
    res.runs.push(run);
    relocate_runs(state, g, unit * BLOCKS_PER_HUGE, &[run])?;
    res.keep();
    xattr::add_hint(state, g)?;
    Ok(true)
}

/// Move blocks [l, l+n) of the file onto the freshly allocated `runs` (n blocks in all, in
/// order): copy (unmapped blocks become zeros), then remap and free the old blocks in one
/// transaction. The content is the same before and after, so a crash at any point is harmless:
/// before the commit the new blocks are unreferenced (free again after recovery), after it the
/// old ones are. Used by hole compaction and, one block per run, by [`scatter_file`].
pub(crate) fn relocate_runs(
    state: &MountState,
    g: &mut InodeState,
    l: u64,
    runs: &[BlockRun],
) -> Result<()> {
    copy_runs(state, g, l, runs, true)
}

/// Copy blocks [l, l+n) of the file onto the freshly allocated `runs` and remap them, as
/// [`relocate_runs`] does; the old blocks are freed only with `free_old`. Without it, the file
/// gets a copy of its own of blocks another inode claims too, which stay with that inode
/// (`fsck --repair`).
pub(crate) fn copy_runs(
    state: &MountState,
    g: &mut InodeState,
    l: u64,
    runs: &[BlockRun],
    free_old: bool,
) -> Result<()> {
    let n: u64 = runs.iter().map(|r| r.len).sum();
    map_hooks::before_move(state, g, l, l + n)?;
    let pool = &state.pool;
    let mut pos = l;
    for r in runs {
        let end = pos + r.len;
        let dst = |x: u64| (r.start + x - pos) * BLOCK_SIZE;
        let mut cur = pos;
        for (sl, sp, sn) in g.map.segments(pos, end) {
            if sl > cur {
                pool.zero_flush(dst(cur), (sl - cur) * BLOCK_SIZE, Category::Data)?;
            }
            pool.copy_flush(sp * BLOCK_SIZE, dst(sl), sn * BLOCK_SIZE, Category::Data)?;
            cur = sl + sn;
        }
        if cur < end {
            pool.zero_flush(dst(cur), (end - cur) * BLOCK_SIZE, Category::Data)?;
        }
        pos = end;
    }
    let mut res = Reserved::new(state);
    let mut upd = MapUpdate::default();
    state.reserve_slots(&mut res, &mut g.map, runs.len() + 2, &mut upd)?;
    guarded(state, || {
        g.map.remap(l, n, runs, &mut upd);
        if !free_old {
            upd.freed.clear();
        }
        commit_map_change(state, g, &upd, Tx::new(), |h| {
            h.map_end = h.map_end.max(l + n)
        })
    })?;
    res.keep();
    Ok(())
}

/// Blocks relocated per transaction by [`scatter_file`].
const SCATTER_CHUNK: usize = 64;

/// Move every block of `ino` inside its size onto its own 4 KiB block, with a free block
/// between any two: the layout a badly aged file system gives a file. For benchmarks and tests
/// (the "4 KiB-scattered" baseline of `winefs bench mmap`); the content does not change.
pub(crate) fn scatter_file(state: &MountState, ino: u64) -> Result<u64> {
    let node = state.inode(ino)?;
    let mut g = wlock(&node);
    state.check_alive()?;
    if map_hooks::pinned(&g) {
        return Err(Error::Busy(format!("inode {ino} is mapped where it stands")));
    }
    slots::fold_all(state, &mut g)?;
    let blocks = g.hdr.size.div_ceil(BLOCK_SIZE);
    let cpu = current_cpu();
    // Spacers stay allocated until the end, so no later block lands next to an earlier one.
    let mut spacers = Vec::new();
    let mut moved = 0;
    let result = (|| -> Result<()> {
        let mut l = 0;
        while l < blocks {
            let n = (blocks - l).min(SCATTER_CHUNK as u64);
            let mut news = Vec::with_capacity(n as usize);
            let one = || -> Result<u64> {
                let r = state.alloc.alloc(1, cpu).map_err(|e| {
                    Error::NoSpace(format!("scattering needs twice the file's size free: {e}"))
                })?;
                Ok(r[0].start)
            };
            let got = (|| -> Result<()> {
                for _ in 0..n {
                    news.push(one()?);
                    spacers.push(one()?);
                }
                Ok(())
            })();
            if let Err(e) = got {
                state.free_runs(&singles(&news));
                return Err(e);
            }
            relocate_runs(state, &mut g, l, &singles(&news))?;
            moved += n;
            l += n;
        }
        Ok(())
    })();
    state.free_runs(&singles(&spacers));
    result.map(|()| moved)
}

fn singles(blocks: &[u64]) -> Vec<BlockRun> {
    blocks
        .iter()
        .map(|&b| BlockRun { start: b, len: 1 })
        .collect()
}
