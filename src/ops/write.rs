//! The write path (docs/DESIGN.md §5, "Strict and relaxed data paths").
//!
//! A write is planned in 2 MiB logical pieces (and, piece by piece, so that no piece touches
//! more than 128 existing extents). In strict mode:
//! - an overwrite inside one block goes by alternate writing (`state::slots`): written once;
//! - a piece covering a whole 2 MiB unit of a file nothing maps in place is written into a
//!   fresh extent (aligned when one is free) that replaces the unit's blocks in the map —
//!   written once, and the file stays aligned (*extent swap*);
//! - a piece in an aligned extent is data-journaled in place (undo images);
//! - a piece in hole-backed blocks is copied on write into new blocks;
//! - a write of several pieces is **one transaction**: all of it or none of it survives a
//!   crash. Its undo images and journal entries must fit one transaction (4 MiB, 1024
//!   entries): a write needing more fails with EINVAL before anything changes. A write that
//!   finds too little space goes piece by piece instead, each piece atomic, and may be short.
//!
//! In relaxed mode existing blocks are written in place and each piece is its own transaction.
//! Newly allocated blocks are always filled before the transaction that maps them. Bytes at or
//! past the old end need no undo image (they are stored before the size that covers them
//! commits, under `INODE_TAIL_UNSETTLED`).

use crate::error::{Error, Result};
use crate::media::alloc::{BlockRun, Goal};
use crate::media::journal::Tx;
use crate::media::layout::{
    BLOCK_SIZE, HUGE_SIZE, INODE_SIZE_CHECKED, MAX_FILE_SIZE, checked_size_word,
};
use crate::media::pool::Category;
use crate::meta::inode::MapUpdate;
use crate::meta::inode_flags::{self, Change};
use crate::ops::file::{
    commit_header, commit_map_change, file_kind_check, fill_unit_for_write, guarded, lay_out,
    mark_if_aligned, unit_fragmented,
};
use crate::ops::xattr;
use crate::state::appends;
use crate::state::inode_state::InodeState;
use crate::state::map_hooks;
use crate::state::mount_state::MountState;
use crate::state::slots;
use crate::state::tx::Reserved;
use crate::types::{Consistency, OverwritePath};
use std::sync::atomic::Ordering;

/// Most existing extents one piece of a piece-by-piece write may touch (bounds its journal
/// entries).
const MAX_EXTENTS_PER_TX: usize = 128;

/// Journal entries a transaction may need beyond its data and map writes: START and COMMIT,
/// the header's chunks, index-block links.
const ENTRY_MARGIN: usize = 8;

pub(crate) fn write(
    state: &MountState,
    ino: u64,
    off: Option<u64>,
    data: &[u8],
) -> Result<(usize, u64)> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let mut g = appends::lock_keeping_slots(state, &n)?;
    file_kind_check(&g)?;
    let off = off.unwrap_or(g.hdr.size);
    let growth = if off >= g.hdr.size { Change::Append } else { Change::Contents };
    inode_flags::allow(g.hdr.flags, growth)?;
    if data.is_empty() {
        return Ok((0, off));
    }
    let end = off
        .checked_add(data.len() as u64)
        .ok_or(Error::FileTooBig)?;
    if end > MAX_FILE_SIZE {
        return Err(Error::FileTooBig);
    }
    let old_size = g.hdr.size;
    let strict = state.consistency == Consistency::Strict;
    // An overwrite inside the file, written once with nothing journaled: by alternate writing
    // in strict mode, in place in relaxed mode. No size, block or mapping changes.
    if end <= old_size {
        let once = match strict {
            true => slots::try_write(state, &mut g, off, data)?,
            false => overwrite_in_place(state, &mut g, off, data)?,
        };
        if once {
            return Ok((data.len(), off));
        }
    }
    appends::zero_exposed(state, &g, off)?;
    if end > old_size {
        map_hooks::before_grow(state, &g)?;
    }
    let r = if append_in_place(state, &mut g, off, data)? {
        Ok(data.len())
    } else {
        write_planned(state, &mut g, off, data)
    };
    state.note_prealloc(&mut g);
    if g.hdr.size > old_size {
        map_hooks::after_grow(state, &g, old_size)?;
        // The first unit of a file that grew past two units was written while the file was
        // small (into holes): move it onto an aligned extent in the background.
        if old_size < 2 * HUGE_SIZE && g.hdr.size >= 2 * HUGE_SIZE && unit_fragmented(&g, 0) {
            state.background.queue_rewrite(ino);
        }
    }
    Ok((r?, off))
}

/// A write through the planner: atomic as a whole in strict mode, else piece by piece.
fn write_planned(state: &MountState, g: &mut InodeState, off: u64, data: &[u8]) -> Result<usize> {
    let end = off + data.len() as u64;
    let strict = state.consistency == Consistency::Strict;
    match (off / HUGE_SIZE != (end - 1) / HUGE_SIZE) && strict {
        true => match write_atomic(state, g, off, data) {
            // Short of space: piece by piece, each atomic, possibly short.
            Err(Error::NoSpace(_)) => write_pieces(state, g, off, data),
            r => r.map(|()| data.len()),
        },
        false => write_pieces(state, g, off, data),
    }
}

/// A write at or past the end of a file with a checked size word whose blocks the file already
/// has, in one extent (preallocated past the end: the rest of its 2 MiB unit), in either mode:
/// the bytes are stored past the end, fence, then the size commits with one atomic 8-byte store
/// and the times beside it, fence — no transaction (docs/DESIGN.md §5). A crash before the
/// size store leaves the bytes past the end, which the file's `INODE_TAIL_UNSETTLED` mark
/// allows; after it, the size covers them. Ok(false): not such a write.
fn append_in_place(state: &MountState, g: &mut InodeState, off: u64, data: &[u8]) -> Result<bool> {
    let end = off + data.len() as u64;
    if off < g.hdr.size || g.hdr.flags & INODE_SIZE_CHECKED == 0 {
        return Ok(false);
    }
    let (lb0, lb1) = (off / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
    let Some((phys, run)) = g.map.lookup(lb0) else {
        return Ok(false);
    };
    // The first block may hold the file's last bytes, whose newest lines may be in a slot.
    if run < lb1 - lb0 || g.slots.range(lb0..lb1).next().is_some() {
        return Ok(false);
    }
    appends::mark_unsettled(state, g)?;
    state
        .pool
        .write_flush(phys * BLOCK_SIZE + off % BLOCK_SIZE, data, Category::Data)?;
    // Made before the fence, while the data drains to media.
    let word = checked_size_word(g.hdr.generation, end);
    if !state.broken_skip_append_fence.load(Ordering::Relaxed) {
        state.pool.fence();
    }
    if state.journals.crash_injected() {
        state.poison();
        return Err(Error::Corrupted("injected crash before an append's size store".into()));
    }
    state.commit_size_word(g, word)?;
    Ok(true)
}

/// A relaxed overwrite of [off, off + len) inside the file whose blocks lie in one extent and
/// hold the file's bytes (no alternate slot): stored in place, then the times, one fence — no
/// transaction, as nothing but the times changes. Ok(false): not such a write.
fn overwrite_in_place(state: &MountState, g: &mut InodeState, off: u64, data: &[u8]) -> Result<bool> {
    let (lb0, lb1) = (off / BLOCK_SIZE, (off + data.len() as u64).div_ceil(BLOCK_SIZE));
    let Some((phys, run)) = g.map.lookup(lb0) else {
        return Ok(false);
    };
    if run < lb1 - lb0 || !g.slots.is_empty() {
        return Ok(false);
    }
    state
        .pool
        .write_flush(phys * BLOCK_SIZE + off % BLOCK_SIZE, data, Category::Data)?;
    state.store_write_times(g)?;
    state.pool.fence();
    state.pool.check_durable()?;
    Ok(true)
}

/// Write `data` at `off` piece by piece; returns the bytes written (short only on ENOSPC).
/// Short of space, a piece is retried in place instead of copied on write, then halved down to
/// what fits, so a write fails with ENOSPC only when not even its first block can be written.
fn write_pieces(state: &MountState, g: &mut InodeState, off: u64, data: &[u8]) -> Result<usize> {
    let end = off + data.len() as u64;
    let strict = state.consistency == Consistency::Strict;
    let mut done = 0usize;
    let mut cap = u64::MAX; // the longest piece to try, lowered when space ran short
    while done < data.len() {
        let pos = off + done as u64;
        let mut piece_end = end
            .min((pos / HUGE_SIZE + 1) * HUGE_SIZE)
            .min(pos.saturating_add(cap));
        let segs = g
            .map
            .segments(pos / BLOCK_SIZE, piece_end.div_ceil(BLOCK_SIZE));
        if segs.len() > MAX_EXTENTS_PER_TX {
            let s = segs[MAX_EXTENTS_PER_TX - 1];
            piece_end = piece_end.min((s.0 + s.2) * BLOCK_SIZE).max(pos + 1);
        }
        let k = (piece_end - pos) as usize;
        let piece = &data[done..done + k];
        let r = match write_piece(state, g, pos, piece, true) {
            Err(Error::NoSpace(_)) if strict => write_piece(state, g, pos, piece, false),
            r => r,
        };
        match r {
            Ok(()) => done += k,
            Err(Error::NoSpace(m)) => {
                let to_block_end = BLOCK_SIZE - pos % BLOCK_SIZE;
                if k as u64 > to_block_end {
                    cap = (k as u64 / 2).max(to_block_end);
                } else if done > 0 {
                    break;
                } else {
                    return Err(Error::NoSpace(m));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Write `data` (spanning two or more 2 MiB units) at `off` in one transaction.
fn write_atomic(state: &MountState, g: &mut InodeState, off: u64, data: &[u8]) -> Result<()> {
    let end = off + data.len() as u64;
    let mut res = Reserved::new(state);
    let mut plans = Vec::new();
    let mut pos = off;
    while pos < end {
        let piece_end = end.min((pos / HUGE_SIZE + 1) * HUGE_SIZE);
        let buf = &data[(pos - off) as usize..(piece_end - off) as usize];
        let how = How { cow: true, write_end: end, keep_aligned: false };
        plans.push(plan(state, g, pos, buf, how, &mut res)?);
        pos = piece_end;
    }
    // From here on the map changes; kept to be put back should the transaction not fit.
    let saved = g.map.clone();
    let mut upd = MapUpdate::default();
    let slots_needed = plans.iter().map(Plan::slots_needed).sum();
    state.reserve_slots(&mut res, &mut g.map, slots_needed, &mut upd)?;
    let lb_end = end.div_ceil(BLOCK_SIZE);
    let too_big = guarded(state, || {
        let mut tx = Tx::new();
        for p in &plans {
            apply(state, g, p, &mut tx, &mut upd)?;
        }
        let now = state.now_fine();
        let mut hdr = g.hdr.clone();
        hdr.size = hdr.size.max(end);
        hdr.map_end = hdr.map_end.max(lb_end);
        hdr.mtime = now;
        hdr.ctime = now;
        state.map_tx(&mut tx, &g.map, g.ino, &upd, &mut hdr)?;
        let (entries, staged) = (tx.entries_needed() + ENTRY_MARGIN, tx.staged_bytes());
        let (max_entries, max_staged) =
            (state.journals.entry_capacity(), state.journals.staging_capacity());
        if entries > max_entries || staged > max_staged {
            g.map = saved;
            let _ = tx.take_index_seals();
            return Ok(Some(Error::Invalid(format!(
                "a strict write of {} bytes is atomic as one transaction, and this one would need \
                 {staged} bytes of undo images (limit {max_staged}) and {entries} journal entries \
                 (limit {max_entries}); nothing was written: write it in smaller pieces",
                data.len()
            ))));
        }
        commit_header(state, g.ino, &g.hdr, &hdr, tx)?;
        g.hdr = hdr;
        state.finish_map_update(g, &upd)?;
        Ok(None)
    })?;
    if let Some(e) = too_big {
        return Err(e);
    }
    res.keep();
    for p in &plans {
        mark_if_aligned(state, g, &p.runs)?;
    }
    Ok(())
}

/// Whether a write of [pos, end) into an empty 2 MiB unit takes the whole unit as an aligned
/// extent (when one is free): the file will use it — it is 2 MiB or larger (or will be once
/// the write that this piece belongs to ends at `write_end`), carries the alignment hint, or
/// has a mapping of 2 MiB or more — and the write is sequential: it starts
/// at the unit's first byte, or runs on from inside the file (or its end) past the end. So
/// appends and sequential writes of large files land on aligned extents (FUSE splits writes
/// at 1 MiB; applications append 4 KiB at a time), while random writes into sparse ranges and
/// small files take only the blocks they write.
fn wants_unit(
    state: &MountState,
    g: &mut InodeState,
    pos: u64,
    end: u64,
    write_end: u64,
) -> Result<bool> {
    let size = g.hdr.size;
    if !(pos.is_multiple_of(HUGE_SIZE) || (pos <= size && end > size)) {
        return Ok(false);
    }
    Ok(size.max(write_end) >= HUGE_SIZE
        || g.maps.iter().any(|m| m.len as u64 >= HUGE_SIZE)
        || xattr::hinted(state, g)?)
}

/// How a piece is to be written.
#[derive(Clone, Copy)]
struct How {
    /// Strict mode: hole-backed blocks are copied on write (false: journaled in place, which
    /// needs no space).
    cow: bool,
    /// Where the whole write this piece belongs to ends.
    write_end: u64,
    /// The piece is a whole write: rather undo-journaled in place than lose an aligned extent.
    keep_aligned: bool,
}

/// One piece of a write, planned: where each block goes.
struct Plan<'a> {
    pos: u64,
    buf: &'a [u8],
    /// Ranges (first logical block, blocks, old pool block if copied on write) written into
    /// the new blocks of the same index in `placements`.
    targets: Vec<(u64, u64, Option<u64>)>,
    placements: Vec<Vec<BlockRun>>,
    /// Ranges (first logical block, pool block, blocks) written where they are.
    in_place: Vec<(u64, u64, u64)>,
    /// The new blocks.
    runs: Vec<BlockRun>,
}

impl Plan<'_> {
    /// Extent slots the map update of this piece may need.
    fn slots_needed(&self) -> usize {
        self.placements.iter().map(Vec::len).sum::<usize>() + self.targets.len()
    }
}

/// Write `buf` at `pos` (inside one 2 MiB logical unit) as one transaction. `cow`: in strict
/// mode, hole-backed blocks are copied on write (false: journaled in place, which needs no
/// space).
fn write_piece(
    state: &MountState,
    g: &mut InodeState,
    pos: u64,
    buf: &[u8],
    cow: bool,
) -> Result<()> {
    let end = pos + buf.len() as u64;
    let mut res = Reserved::new(state);
    // Pieces written one by one see the size the previous one committed.
    let how = How { cow, write_end: g.hdr.size, keep_aligned: true };
    let p = plan(state, g, pos, buf, how, &mut res)?;
    let mut upd = MapUpdate::default();
    state.reserve_slots(&mut res, &mut g.map, p.slots_needed(), &mut upd)?;
    let lb1 = end.div_ceil(BLOCK_SIZE);
    // From here on DRAM changes before the commit: any failure poisons the mount.
    guarded(state, || {
        let mut tx = Tx::new();
        apply(state, g, &p, &mut tx, &mut upd)?;
        let now = state.now_fine();
        commit_map_change(state, g, &upd, tx, |h| {
            h.size = h.size.max(end);
            h.map_end = h.map_end.max(lb1);
            h.mtime = now;
            h.ctime = now;
        })
    })?;
    res.keep();
    mark_if_aligned(state, g, &p.runs)
}

/// Plan writing `buf` at `pos` (inside one 2 MiB logical unit): the steps before anything in
/// DRAM changes. Slots of the range are written home; an empty unit the file will use gets an
/// aligned extent (its own transaction); new blocks are allocated into `res`.
fn plan<'a>(
    state: &MountState,
    g: &mut InodeState,
    pos: u64,
    buf: &'a [u8],
    how: How,
    res: &mut Reserved<'_>,
) -> Result<Plan<'a>> {
    let How { cow, write_end, keep_aligned } = how;
    let end = pos + buf.len() as u64;
    let (lb0, lb1) = (pos / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
    slots::fold(state, g, lb0, lb1)?;
    // Space is short (or this write may need more than is free) and the zones hold units lent
    // from it: this file's slots go home, so the units can be given back even while its lock
    // is held here.
    if state.zones_pressed(lb1 - lb0) {
        slots::fold_all(state, g)?;
    }
    let strict = state.consistency == Consistency::Strict;
    let unit = lb0 / 512 * 512;
    // Extent swap: a strict write of a whole unit goes into a fresh extent that replaces the
    // unit's blocks (freed after the commit) — an aligned one if one is free. With none free, a
    // unit that is aligned now is written in place instead (undo-journaled) when the write is
    // this one piece (`keep_aligned`); a piece of a larger atomic write, which could not hold
    // that many undo images, takes any 512 blocks, and the background rewriter aligns the unit
    // again when it can.
    let whole = strict && cow && pos == unit * BLOCK_SIZE && end == pos + HUGE_SIZE;
    let fresh = match whole && !g.is_mapped() {
        false => None,
        true => match res.alloc_aligned() {
            Some(r) => Some(vec![r]),
            None if keep_aligned && g.map.in_aligned_unit(unit) => None,
            None => {
                state.background.queue_rewrite(g.ino);
                Some(res.alloc(512)?)
            }
        },
    };
    if let Some(runs) = fresh {
        return Ok(Plan {
            pos,
            buf,
            targets: vec![(unit, 512, None)],
            placements: vec![runs.clone()],
            in_place: Vec::new(),
            runs,
        });
    }
    // The whole unit as an aligned extent when the file will use it; the write then lands in
    // place, and the bytes from it on past the end are not zeroed first. With no aligned extent
    // free, the write takes only the blocks it needs.
    if g.map.segments(unit, unit + 512).is_empty() && wants_unit(state, g, pos, end, write_end)? {
        fill_unit_for_write(state, g, unit, pos)?;
    }
    // A mapped file is never copied on write: its mappings point at the blocks in place.
    let cow_all = state.overwrite_path == OverwritePath::CopyOnWrite;
    let aligned = !cow || (g.map.in_aligned_unit(lb0) && !cow_all) || g.is_mapped();
    // Bytes at or past the old end hold nothing of the file: blocks wholly past it are written
    // in place, and those bytes need no undo image (docs/DESIGN.md §5).
    let old_size = g.hdr.size;
    // Blocks holding bytes of the file that this write overwrites are copied on write. A write
    // at or past the end overwrites none: the last block's bytes past the end hold nothing of
    // the file, so an append stores into that block in place instead of moving it (which cost a
    // copy of the block and split the file into one more extent per append).
    let cow_end = match pos >= old_size {
        true => lb0,
        false => old_size.div_ceil(BLOCK_SIZE),
    };
    // Targets that need new blocks: gaps (None) and, in strict mode outside aligned extents,
    // mapped blocks holding bytes of the file rewritten copy-on-write (Some(old phys)).
    let mut targets: Vec<(u64, u64, Option<u64>)> = Vec::new();
    let mut in_place: Vec<(u64, u64, u64)> = Vec::new();
    let mut cur = lb0;
    for (l, phys, len) in g.map.segments(lb0, lb1) {
        if l > cur {
            targets.push((cur, l - cur, None));
        }
        if strict && !aligned {
            let split = cow_end.clamp(l, l + len);
            if split > l {
                targets.push((l, split - l, Some(phys)));
            }
            if l + len > split {
                in_place.push((split, phys + (split - l), l + len - split));
            }
        } else {
            in_place.push((l, phys, len));
        }
        cur = l + len;
    }
    // Stored in place past the end, those bytes reach media before the size that covers them
    // commits: a crash in between leaves them past the end, which the file's mark allows
    // (whatever extends it later zeroes what it exposes). Marked once per file.
    if in_place.iter().any(|&(l, _, len)| (l + len) * BLOCK_SIZE > old_size && end > old_size) {
        appends::mark_unsettled(state, g)?;
    }
    if cur < lb1 {
        targets.push((cur, lb1 - cur, None));
    }
    let need: u64 = targets.iter().map(|t| t.1).sum();
    // New blocks for a gap right after a mapped block go after that block when it is free, so
    // that an appended file stays one extent (fewer slots, frees and copies per read); when it
    // is not, where there is room to grow as much again in place.
    let goal = match targets.first() {
        Some(&(t0, _, None)) if t0 > 0 => {
            g.map.lookup(t0 - 1).map(|(phys, _)| Goal { at: phys + 1, room: t0 })
        }
        _ => None,
    };
    let runs = if need > 0 { res.alloc_from(need, goal)? } else { Vec::new() };
    let placements = lay_out(&runs, targets.iter().map(|t| t.1));
    Ok(Plan { pos, buf, targets, placements, in_place, runs })
}

/// Carry out a plan up to its commit: fill the new blocks (written bytes, the rest zero or the
/// old content), add the undo-journaled in-place writes to `tx` (bytes past the old end are
/// stored directly), and remap the targets in DRAM.
fn apply<'a>(
    state: &MountState,
    g: &mut InodeState,
    p: &Plan<'a>,
    tx: &mut Tx<'a>,
    upd: &mut MapUpdate,
) -> Result<()> {
    let pool = &state.pool;
    let (pos, buf) = (p.pos, p.buf);
    let end = pos + buf.len() as u64;
    for (t, pl) in p.targets.iter().zip(&p.placements) {
        let mut l = t.0;
        for r in pl {
            for i in 0..r.len {
                let fb = (l + i) * BLOCK_SIZE; // file offset of this block
                let dst = (r.start + i) * BLOCK_SIZE;
                let ws = pos.max(fb);
                let we = end.min(fb + BLOCK_SIZE);
                let old = t.2.map(|o| (o + (l + i - t.0)) * BLOCK_SIZE);
                let fill = |from: u64, to: u64| -> Result<()> {
                    if to > from {
                        match old {
                            Some(o) => pool.copy_flush(
                                o + (from - fb),
                                dst + (from - fb),
                                to - from,
                                Category::Cow,
                            ),
                            None => pool.zero_flush(dst + (from - fb), to - from, Category::Cow),
                        }?;
                    }
                    Ok(())
                };
                fill(fb, ws)?;
                pool.write_flush(
                    dst + (ws - fb),
                    &buf[(ws - pos) as usize..(we - pos) as usize],
                    Category::Data,
                )?;
                fill(we, fb + BLOCK_SIZE)?;
            }
            l += r.len;
        }
    }
    let old_size = g.hdr.size;
    let strict = state.consistency == Consistency::Strict;
    for &(l, phys, len) in &p.in_place {
        let ws = pos.max(l * BLOCK_SIZE);
        let we = end.min((l + len) * BLOCK_SIZE);
        let dst = phys * BLOCK_SIZE + (ws - l * BLOCK_SIZE);
        // In strict mode the bytes inside the old size are undo-journaled; those past it are
        // not (nothing of the file is there to restore).
        let keep = if strict { old_size.clamp(ws, we) } else { ws };
        if keep > ws {
            tx.write_ref(dst, &buf[(ws - pos) as usize..(keep - pos) as usize], Category::Data);
        }
        if we > keep {
            let at = dst + (keep - ws);
            pool.write_flush(at, &buf[(keep - pos) as usize..(we - pos) as usize], Category::Data)?;
        }
    }
    for (t, pl) in p.targets.iter().zip(&p.placements) {
        g.map.remap(t.0, t.1, pl, upd);
    }
    Ok(())
}
