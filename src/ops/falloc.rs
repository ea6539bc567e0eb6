//! The fallocate modes that rewrite a range of a file, with ext4's semantics and errors: zero
//! range (`FALLOC_FL_ZERO_RANGE`, with or without `KEEP_SIZE`), collapse range and insert range.
//!
//! Each is one transaction: the change is planned on a copy of the file's extent map, the
//! journaled writes (extent records, zeroed bytes, the header) are checked to fit one
//! transaction before anything changes, and the file's DRAM state follows only after the
//! commit. A crash leaves the file as it was before or as it is after, never in between.
//!
//! * **Zero range** gives the range fresh zeroed blocks, except inside a 2 MiB unit that sits on
//!   an aligned extent and is only partly covered: there the bytes are zeroed in place
//!   (undo-journaled; at most [`IN_PLACE_MAX`] blocks per unit), or, for a larger part, the
//!   unit is copied onto a fresh 2 MiB allocation with the range zeroed, so it stays one aligned
//!   extent when one is free. Whole units get whole (aligned) units. The old blocks are freed
//!   after the commit. On a file a direct-path client leases, the blocks stay where its mapping
//!   reaches them: the bytes are zeroed in place (atomic per 1 MiB piece), then the holes are
//!   allocated as fallocate does.
//! * **Collapse and insert range** move no data: the extents past the offset keep their
//!   physical blocks and only the logical block of their records changes (an extent straddling
//!   the offset is split first). Moving by whole 2 MiB units keeps aligned extents aligned.

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::{BLOCK_SIZE, BLOCKS_PER_HUGE, InodeHeader, MAX_FILE_SIZE, ino};
use crate::media::pool::Category;
use crate::meta::inode::{FileMap, MapUpdate};
use crate::meta::inode_flags;
use crate::ops::file::{commit_header, fallocate_locked, file_kind_check, mark_if_aligned, zero_leased_in_place};
use crate::state::appends;
use crate::state::inode_state::InodeState;
use crate::state::map_hooks;
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;

/// Most blocks of a partly covered aligned unit that zero range zeroes in place (undo
/// staging: two such units, head and tail, stay well inside one transaction's 4 MiB).
const IN_PLACE_MAX: u64 = 256;

/// Blocks in a 2 MiB unit.
const UNIT: u64 = BLOCKS_PER_HUGE;

/// The largest logical block bound a file may have (`MAX_FILE_SIZE` in blocks).
const MAX_BLOCKS: u64 = MAX_FILE_SIZE / BLOCK_SIZE;

/// A planned change of one file: its new extent map, the update that leads there, the new
/// header and the journaled writes, checked to fit one transaction.
struct Change<'a> {
    map: FileMap,
    upd: MapUpdate,
    hdr: InodeHeader,
    tx: Tx<'a>,
}

/// Finish planning: the map update's record writes join `tx`, `edit` makes the new header, and
/// the whole must fit one transaction (else nothing has changed and the caller gives back what
/// it reserved).
fn plan<'a>(
    state: &MountState,
    g: &InodeState,
    map: FileMap,
    upd: MapUpdate,
    mut tx: Tx<'a>,
    edit: impl FnOnce(&mut InodeHeader),
) -> Result<Change<'a>> {
    let mut hdr = g.hdr.clone();
    edit(&mut hdr);
    state.map_tx(&mut tx, &map, g.ino, &upd, &mut hdr)?;
    // The header adds at most one 32-byte chunk per chunk of it.
    let header_entries = ino::SLOTS / ino::CHUNK;
    if tx.entries_needed() + header_entries > state.journals.entry_capacity()
        || tx.staged_bytes() > state.journals.staging_capacity()
    {
        return Err(Error::NoSpace(format!(
            "the change touches too many extents of inode {} for one journal transaction",
            g.ino
        )));
    }
    Ok(Change { map, upd, hdr, tx })
}

/// Commit a planned change, then let DRAM follow and free what the change unmapped.
fn commit(state: &MountState, g: &mut InodeState, c: Change<'_>) -> Result<()> {
    commit_header(state, g.ino, &g.hdr, &c.hdr, c.tx)?;
    g.hdr = c.hdr;
    g.map = c.map;
    state.finish_map_update(g, &c.upd)
}

/// Arguments every mode checks first, as the VFS does: a positive length (EINVAL) and an end
/// within the largest file size (EFBIG). Returns the end.
fn check_range(off: u64, len: u64, what: &str) -> Result<u64> {
    if len == 0 {
        return Err(Error::Invalid(format!("{what} length must be positive")));
    }
    off.checked_add(len)
        .filter(|&end| end <= MAX_FILE_SIZE)
        .ok_or(Error::FileTooBig)
}

/// Collapse and insert work on whole blocks only (ext4: EINVAL otherwise).
fn check_aligned(off: u64, len: u64, what: &str) -> Result<()> {
    if !(off | len).is_multiple_of(BLOCK_SIZE) {
        return Err(Error::Invalid(format!(
            "{what} offset and length must be multiples of the {BLOCK_SIZE}-byte block size"
        )));
    }
    Ok(())
}

/// A change that replaces or moves blocks would discard the private, not yet msynced pages of
/// an atomic mapping.
fn check_no_atomic_mapping(g: &InodeState, what: &str) -> Result<()> {
    if map_hooks::has_atomic(g) {
        return Err(Error::Busy(format!(
            "{what}: inode {} has an atomic mapping (msync and drop it first)",
            g.ino
        )));
    }
    Ok(())
}

/// A shift would also move the bytes under a client's direct mapping (which this process
/// cannot remap).
fn check_no_mapping_to_shift(g: &InodeState, what: &str) -> Result<()> {
    check_no_atomic_mapping(g, what)?;
    if g.leases > 0 {
        return Err(Error::Busy(format!(
            "{what}: inode {} is mapped by a direct-path client (unmap it first)",
            g.ino
        )));
    }
    Ok(())
}

/// Pool block of logical block `lb` when `runs` are laid end to end from logical block `x`.
fn fresh_block(runs: &[BlockRun], x: u64, lb: u64) -> Result<u64> {
    let mut at = x;
    for r in runs {
        if lb < at + r.len {
            return Ok(r.start + (lb - at));
        }
        at += r.len;
    }
    Err(Error::Invalid(format!(
        "internal: logical block {lb} lies past the blocks allocated from {x}"
    )))
}

/// Fill fresh `runs` (laid end to end over logical blocks [x, y)) with the file's bytes as
/// `old` maps them, zero inside bytes [zs, ze) and wherever `old` has a hole.
fn fill_fresh(
    state: &MountState,
    old: &FileMap,
    (x, y): (u64, u64),
    runs: &[BlockRun],
    (zs, ze): (u64, u64),
) -> Result<()> {
    let pool = &state.pool;
    for r in runs {
        pool.zero_flush(r.start * BLOCK_SIZE, r.len * BLOCK_SIZE, Category::Data)?;
    }
    for (s, e) in [(x * BLOCK_SIZE, zs), (ze, y * BLOCK_SIZE)] {
        for lb in s / BLOCK_SIZE..e.div_ceil(BLOCK_SIZE) {
            let Some((phys, _)) = old.lookup(lb) else {
                continue;
            };
            let (bs, be) = (s.max(lb * BLOCK_SIZE), e.min((lb + 1) * BLOCK_SIZE));
            let inblk = bs - lb * BLOCK_SIZE;
            let dst = fresh_block(runs, x, lb)?;
            pool.copy_flush(
                phys * BLOCK_SIZE + inblk,
                dst * BLOCK_SIZE + inblk,
                be - bs,
                Category::Data,
            )?;
        }
    }
    Ok(())
}

/// How zero range treats one 2 MiB unit.
enum UnitPlan {
    /// Zero bytes [zs, ze) in place, at pool offset `at` (journaled).
    InPlace { at: u64, len: u64 },
    /// Give logical blocks [x, y) fresh blocks holding the file's bytes with [zs, ze) zeroed.
    Fresh {
        x: u64,
        y: u64,
        zs: u64,
        ze: u64,
        runs: Vec<BlockRun>,
    },
}

/// FALLOC_FL_ZERO_RANGE: bytes [off, off+len) read as zeros and are allocated; the size grows
/// to off+len unless `keep_size`; mtime and ctime change.
pub(crate) fn zero_range(
    state: &MountState,
    ino: u64,
    off: u64,
    len: u64,
    keep_size: bool,
) -> Result<()> {
    state.check_alive()?;
    let end = check_range(off, len, "zero range")?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    inode_flags::allow(g.hdr.flags, inode_flags::Change::Contents)?;
    check_no_atomic_mapping(&g, "zero range")?;
    if g.leases > 0 {
        // A client maps the file: its blocks stay where the mapping reaches them. The holes
        // of the range are allocated first, zeroed, with the size kept: what the file reads
        // does not change, so a lack of space there refuses the call with the file as it was.
        // Then the mapped bytes inside the file are zeroed in place (no space needed), and
        // the size grows as for fallocate (bytes past the end are zero, or zeroed before the
        // size grows over them).
        let inside = end.min(g.hdr.size);
        fallocate_locked(state, &mut g, off, end, true)?;
        zero_leased_in_place(state, &mut g, off, inside)?;
        if keep_size || end <= g.hdr.size {
            return Ok(());
        }
        return fallocate_locked(state, &mut g, off, end, false);
    }
    let (lb0, lb1) = (off / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
    let mut res = Reserved::new(state);
    // Plan and allocate unit by unit; nothing is written yet, so running out of space here
    // changes nothing (the reservation gives the blocks back).
    let mut plans = Vec::new();
    for unit in lb0 / UNIT..=(lb1 - 1) / UNIT {
        let u0 = unit * UNIT;
        let (a, b) = (lb0.max(u0), lb1.min(u0 + UNIT));
        let (zs, ze) = (off.max(a * BLOCK_SIZE), end.min(b * BLOCK_SIZE));
        let aligned = g.map.in_aligned_unit(u0);
        let whole = zs == u0 * BLOCK_SIZE && ze == (u0 + UNIT) * BLOCK_SIZE;
        if aligned && !whole && b - a <= IN_PLACE_MAX {
            // An aligned unit is one extent, so the bytes are contiguous on the pool.
            if let Some((phys, _)) = g.map.lookup(a) {
                plans.push(UnitPlan::InPlace {
                    at: phys * BLOCK_SIZE + (zs - a * BLOCK_SIZE),
                    len: ze - zs,
                });
                continue;
            }
        }
        // A partly covered aligned unit is copied whole, so it can stay one aligned extent.
        let (x, y) = if aligned { (u0, u0 + UNIT) } else { (a, b) };
        let runs = res.alloc(y - x)?;
        plans.push(UnitPlan::Fresh { x, y, zs, ze, runs });
    }
    let mut map = g.map.clone();
    let mut upd = MapUpdate::default();
    let pieces = plans
        .iter()
        .map(|p| match p {
            UnitPlan::Fresh { runs, .. } => runs.len() + 1,
            UnitPlan::InPlace { .. } => 0,
        })
        .sum();
    state.reserve_slots(&mut res, &mut map, pieces, &mut upd)?;
    let in_place_max = plans
        .iter()
        .map(|p| match p {
            UnitPlan::InPlace { len, .. } => *len,
            UnitPlan::Fresh { .. } => 0,
        })
        .max()
        .unwrap_or(0);
    let zeros = vec![0u8; usize::try_from(in_place_max).unwrap_or(0)];
    let mut tx = Tx::new();
    let mut new_runs = Vec::new();
    for p in &plans {
        match p {
            UnitPlan::InPlace { at, len } => {
                tx.write_ref(*at, &zeros[..*len as usize], Category::Data);
            }
            UnitPlan::Fresh { x, y, runs, .. } => {
                map.remap(*x, y - x, runs, &mut upd);
                new_runs.extend_from_slice(runs);
            }
        }
    }
    let now = state.now_fine();
    let old_size = g.hdr.size;
    let grows = !keep_size && end > old_size;
    if grows {
        appends::zero_exposed(state, &g, off)?;
    }
    let change = plan(state, &g, map, upd, tx, |h| {
        if grows {
            h.size = end;
        }
        h.map_end = h.map_end.max(lb1);
        h.mtime = now;
        h.ctime = now;
    })?;
    // Live mappings: pages over blocks that are replaced turn missing before the old blocks
    // are read (no store lands in them afterwards); the file's tail is zeroed before it grows.
    for p in &plans {
        if let UnitPlan::Fresh { x, y, .. } = p {
            map_hooks::before_move(state, &g, *x, *y)?;
        }
    }
    if grows {
        map_hooks::before_grow(state, &g)?;
    }
    for p in &plans {
        if let UnitPlan::Fresh { x, y, zs, ze, runs } = p {
            fill_fresh(state, &g.map, (*x, *y), runs, (*zs, *ze))?;
        }
    }
    commit(state, &mut g, change)?;
    res.keep();
    if grows {
        map_hooks::after_grow(state, &g, old_size)?;
    }
    mark_if_aligned(state, &mut g, &new_runs)
}

/// FALLOC_FL_COLLAPSE_RANGE: remove bytes [off, off+len) (whole blocks) and move the rest of
/// the file down; the file shrinks by `len`. The range must end before the end of the file.
pub(crate) fn collapse_range(state: &MountState, ino: u64, off: u64, len: u64) -> Result<()> {
    state.check_alive()?;
    let end = check_range(off, len, "collapse range")?;
    check_aligned(off, len, "collapse range")?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    inode_flags::allow(g.hdr.flags, inode_flags::Change::Contents)?;
    let size = g.hdr.size;
    if end >= size {
        return Err(Error::Invalid(format!(
            "collapse range {off}+{len} must end before the end of the file ({size} bytes); use truncate"
        )));
    }
    check_no_mapping_to_shift(&g, "collapse range")?;
    let (a, nb) = (off / BLOCK_SIZE, len / BLOCK_SIZE);
    let new_size = size - len;
    let mut res = Reserved::new(state);
    let mut map = g.map.clone();
    let mut upd = MapUpdate::default();
    state.reserve_slots(&mut res, &mut map, 1, &mut upd)?;
    map.remap(a, nb, &[], &mut upd);
    map.shift(a + nb, a, &mut upd);
    let now = state.now_fine();
    let change = plan(state, &g, map, upd, Tx::new(), |h| {
        h.size = new_size;
        h.map_end = if h.map_end > a + nb {
            h.map_end - nb
        } else {
            h.map_end.min(a)
        };
        h.mtime = now;
        h.ctime = now;
    })?;
    // Live mappings: pages past the new end fault (SIGBUS), pages from the offset on turn
    // missing and are installed again from the moved blocks.
    map_hooks::before_shrink(state, &g, new_size)?;
    map_hooks::before_move(state, &g, a, new_size.div_ceil(BLOCK_SIZE))?;
    commit(state, &mut g, change)?;
    res.keep();
    Ok(())
}

/// FALLOC_FL_INSERT_RANGE: open a hole of `len` bytes (whole blocks) at `off`, moving the rest
/// of the file up; the file grows by `len`. The offset must lie inside the file.
pub(crate) fn insert_range(state: &MountState, ino: u64, off: u64, len: u64) -> Result<()> {
    state.check_alive()?;
    check_range(off, len, "insert range")?;
    check_aligned(off, len, "insert range")?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    inode_flags::allow(g.hdr.flags, inode_flags::Change::Contents)?;
    let size = g.hdr.size;
    let (a, nb) = (off / BLOCK_SIZE, len / BLOCK_SIZE);
    if len > MAX_FILE_SIZE - size || g.hdr.map_end + nb > MAX_BLOCKS {
        return Err(Error::FileTooBig);
    }
    if off >= size {
        return Err(Error::Invalid(format!(
            "insert range offset {off} must lie inside the file ({size} bytes); use truncate to extend it"
        )));
    }
    check_no_mapping_to_shift(&g, "insert range")?;
    let mut res = Reserved::new(state);
    let mut map = g.map.clone();
    let mut upd = MapUpdate::default();
    state.reserve_slots(&mut res, &mut map, 1, &mut upd)?;
    map.split_at(a, &mut upd);
    map.shift(a, a + nb, &mut upd);
    let now = state.now_fine();
    let change = plan(state, &g, map, upd, Tx::new(), |h| {
        h.size = size + len;
        if h.map_end > a {
            h.map_end += nb;
        }
        h.mtime = now;
        h.ctime = now;
    })?;
    // Live mappings: the tail past the old end is zeroed first (the file grows), pages from
    // the offset on turn missing, and after the commit the new end's pages do too.
    map_hooks::before_grow(state, &g)?;
    map_hooks::before_move(state, &g, a, u64::MAX)?;
    commit(state, &mut g, change)?;
    res.keep();
    map_hooks::after_grow(state, &g, size)
}
