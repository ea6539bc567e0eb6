//! The data path: read, truncate, fallocate, punch hole, seek, setattr, fsync.
//!
//! Writes live in `ops::write`. Invariant kept by every path: bytes of a mapped block beyond the
//! file size read as zero.

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::{
    self, BLOCK_SIZE, FileKind, INODE_APPEND_ONLY, INODE_IMMUTABLE, INODE_TAIL_UNSETTLED,
    INODE_USER_FLAGS, InodeHeader, MAX_FILE_SIZE,
};
use crate::media::pool::Category;
use crate::meta::inode::MapUpdate;
use crate::meta::inode_flags::{self, Change};
use crate::ops::{acl, xattr};
use crate::state::appends;
use crate::state::inode_state::{InodeRef, InodeState, rlock, try_wlock};
use crate::state::map_hooks;
use crate::state::slots;
use crate::state::mount_state::MountState;
pub(crate) use crate::state::tx::commit_header;
use crate::state::tx::Reserved;
use crate::types::{Attr, SetAttr, TimeSet};

pub(crate) fn file_kind_check(n: &InodeState) -> Result<()> {
    match n.kind() {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(Error::IsDir),
        _ => Err(Error::Invalid("not a regular file".into())),
    }
}

/// Read into `buf` from `off` (holding the inode lock).
pub(crate) fn read_locked(
    state: &MountState,
    n: &InodeState,
    off: u64,
    buf: &mut [u8],
) -> Result<usize> {
    let size = n.hdr.size;
    if off >= size {
        return Ok(0);
    }
    let len = (buf.len() as u64).min(size - off) as usize;
    let mut done = 0usize;
    while done < len {
        let p = off + done as u64;
        let lb = p / BLOCK_SIZE;
        let inblk = p % BLOCK_SIZE;
        match n.map.lookup(lb) {
            Some((phys, cont)) => {
                let k = ((cont * BLOCK_SIZE - inblk) as usize).min(len - done);
                state
                    .pool
                    .read(phys * BLOCK_SIZE + inblk, &mut buf[done..done + k])?;
                done += k;
            }
            None => {
                let next = n
                    .map
                    .next_mapped(lb)
                    .map(|l| l * BLOCK_SIZE)
                    .unwrap_or(u64::MAX);
                let k = ((next - p) as usize).min(len - done);
                buf[done..done + k].fill(0);
                done += k;
            }
        }
    }
    slots::overlay(state, n, off, &mut buf[..len])?;
    Ok(len)
}

/// Read from `off` into `buf`; then, if `atime` (not an `O_NOATIME` read), store the access
/// time as [`touch_atime`] says.
pub(crate) fn read(
    state: &MountState,
    ino: u64,
    off: u64,
    buf: &mut [u8],
    atime: bool,
) -> Result<usize> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    appends::settle(state, &n)?;
    let g = rlock(&n);
    file_kind_check(&g)?;
    let got = read_locked(state, &g, off, buf)?;
    let due = atime && atime_due(state, &g.hdr);
    drop(g);
    if due {
        touch_atime(state, &n);
    }
    Ok(got)
}

/// A day: `relatime` stores an access time at least this often.
const DAY_NS: i64 = 86_400 * 1_000_000_000;

/// Whether a read of the inode with header `h` stores its access time, by Linux's default
/// `relatime` rule: when the stored one is not later than the last change (so "read since it
/// changed" shows, as mail readers and `find -amin` expect) or is a day old. Never on a
/// `noatime` or read-only mount, nor for an inode with the no-atime flag (`chattr +A`).
pub(crate) fn atime_due(state: &MountState, h: &InodeHeader) -> bool {
    !state.noatime
        && !state.is_read_only()
        && inode_flags::stores_atime(h.flags)
        && (h.atime <= h.mtime
            || h.atime <= h.ctime
            || state.now_coarse().saturating_sub(h.atime) >= DAY_NS)
}

/// Store the access time of `n` after a read or a directory listing, if [`atime_due`] still
/// says so under its write lock. Stored in place and not written back: the time group is kept
/// out of the inode checksum and written in place by every change (`commit_header`), so a
/// crash that loses this store leaves the older access time, and the next write-back of the
/// line carries it (as `lazytime` keeps access times in memory).
///
/// Only if the lock is free now: a read never waits for a writer (nor a listing for a name
/// change committing in the directory, which it must not: see `DirChange`) just to store an
/// access time; a later read stores it.
pub(crate) fn touch_atime(state: &MountState, n: &InodeRef) {
    let Some(mut g) = try_wlock(n) else {
        return;
    };
    if !g.hdr.in_use() || !atime_due(state, &g.hdr) {
        return;
    }
    // The fine clock: a coarse time could equal the change time it follows, and the rule
    // would then store again at the next read.
    let now = state.now_fine();
    let at = state.inode_off(g.ino) + layout::ino::ATIME as u64;
    // The slot is the inode's own and in bounds, so the store cannot fail; if it ever did, the
    // access time would stay as it was, which the rule allows.
    if state.pool.write(at, &now.to_le_bytes(), Category::Metadata).is_ok() {
        g.hdr.atime = now;
    }
}

/// Run `f`, which may change DRAM state before committing; on error poison the mount, since
/// DRAM may have moved ahead of media.
pub(crate) fn guarded<T>(state: &MountState, f: impl FnOnce() -> Result<T>) -> Result<T> {
    f().inspect_err(|_| state.poison())
}

/// The last steps of every change to a file's block map: apply `edit` to a copy of the
/// header, add the map update's slot writes to `tx`, commit both (times in place, see
/// [`commit_header`]), let DRAM follow, then finish the update (dead slots zeroed, freed
/// blocks returned). Called inside [`guarded`]: the map in DRAM has changed already.
pub(crate) fn commit_map_change(
    state: &MountState,
    g: &mut InodeState,
    upd: &MapUpdate,
    mut tx: Tx<'_>,
    edit: impl FnOnce(&mut InodeHeader),
) -> Result<()> {
    let mut hdr = g.hdr.clone();
    edit(&mut hdr);
    state.map_tx(&mut tx, &g.map, g.ino, upd, &mut hdr)?;
    commit_header(state, g.ino, &g.hdr, &hdr, tx)?;
    g.hdr = hdr;
    state.finish_map_update(g, upd)
}

/// After `runs` joined the file: if one is a whole aligned 2 MiB extent, record the alignment
/// hint on the file, so copies of it (`cp --preserve=xattr`, `rsync -X`) stay aligned.
pub(crate) fn mark_if_aligned(
    state: &MountState,
    g: &mut InodeState,
    runs: &[BlockRun],
) -> Result<()> {
    if runs
        .iter()
        .any(|r| r.len >= 512 && r.start.is_multiple_of(512))
    {
        xattr::add_hint(state, g)?;
    }
    Ok(())
}

/// Extent-index blocks one truncate transaction may kill records in, so seal: each is one more
/// journal entry (a ring holds 1024), beside the header, tail and straddler writes.
const MAX_SEALED_INDEX_BLOCKS: usize = 768;

pub(crate) fn truncate(state: &MountState, ino: u64, size: u64) -> Result<()> {
    state.check_alive()?;
    if size > MAX_FILE_SIZE {
        return Err(Error::FileTooBig);
    }
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    inode_flags::allow(g.hdr.flags, Change::Contents)?;
    truncate_locked(state, &mut g, size)
}

fn truncate_locked(state: &MountState, g: &mut InodeState, size: u64) -> Result<()> {
    let old_size = g.hdr.size;
    if size < old_size {
        map_hooks::before_shrink(state, g, size)?;
    } else if size > old_size {
        appends::zero_exposed(state, g, size)?;
        map_hooks::before_grow(state, g)?;
    }
    let now = state.now_fine();
    let mut tx = Tx::new();
    let mut upd = MapUpdate::default();
    let zeros = vec![0u8; BLOCK_SIZE as usize];
    if size < g.hdr.size {
        let inblk = size % BLOCK_SIZE;
        if inblk != 0
            && let Some((phys, _)) = g.map.lookup(size / BLOCK_SIZE)
        {
            let off = phys * BLOCK_SIZE + inblk;
            // Journaled in both modes: truncate is a metadata operation, so a crash must
            // not leave the old size with the tail already zeroed.
            tx.write_ref(off, &zeros[..(BLOCK_SIZE - inblk) as usize], Category::Data);
        }
    }
    let keep = size.div_ceil(BLOCK_SIZE);
    // A client maps the file: the blocks past the new end stay with it (a shrunk file's marked
    // first as blocks whose bytes past the end may not be zero), so whatever grows the file
    // again zeroes them in place, where the client's mapping sees the zeros and its later
    // stores stay in the file. (Freed, they would wait in quarantine while the mapping kept
    // showing the old bytes after the file grew back onto fresh blocks.)
    let keep_blocks = g.leases > 0;
    if keep_blocks && size < old_size {
        appends::mark_unsettled(state, g)?;
    }
    if keep_blocks && keep < g.hdr.map_end {
        g.kept_under_lease = true;
    }
    guarded(state, || {
        // A truncate killing records in more index blocks than one transaction can seal is
        // done from the end in steps, each a truncate to a smaller size (atomic per step).
        while !keep_blocks && let Some(step) = g.map.truncate_step(keep, MAX_SEALED_INDEX_BLOCKS) {
            let mut upd = MapUpdate::default();
            g.map.truncate(step, &mut upd);
            commit_map_change(state, g, &upd, Tx::new(), |h| {
                h.size = h.size.min(step * BLOCK_SIZE);
                h.map_end = h.map_end.min(step);
                h.mtime = now;
                h.ctime = now;
            })?;
        }
        let shrinks_map = !keep_blocks && keep < g.hdr.map_end;
        if shrinks_map {
            g.map.truncate(keep, &mut upd);
        }
        commit_map_change(state, g, &upd, tx, |h| {
            h.size = size;
            h.mtime = now;
            h.ctime = now;
            if shrinks_map {
                h.map_end = keep;
            }
        })
    })?;
    state.note_prealloc(g);
    map_hooks::after_grow(state, g, old_size)
}

/// Unmapped sub-ranges of logical blocks [a, b).
fn gaps(n: &InodeState, a: u64, b: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut cur = a;
    for (l, _, len) in n.map.segments(a, b) {
        if l > cur {
            out.push((cur, l - cur));
        }
        cur = l + len;
    }
    if cur < b {
        out.push((cur, b - cur));
    }
    out
}

pub(crate) fn fallocate(
    state: &MountState,
    ino: u64,
    off: u64,
    len: u64,
    keep_size: bool,
) -> Result<()> {
    state.check_alive()?;
    if len == 0 {
        return Err(Error::Invalid("fallocate length must be positive".into()));
    }
    let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
    if end > MAX_FILE_SIZE {
        return Err(Error::FileTooBig);
    }
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    // Allocating leaves what the file holds as it was: an append-only file may.
    inode_flags::allow(g.hdr.flags, Change::Append)?;
    fallocate_locked(state, &mut g, off, end, keep_size)
}

/// [`fallocate`] of bytes [off, end) of the locked file `g`, its arguments checked.
pub(crate) fn fallocate_locked(
    state: &MountState,
    g: &mut InodeState,
    off: u64,
    end: u64,
    keep_size: bool,
) -> Result<()> {
    let ino = g.ino;
    let (lb0, lb1) = (off / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
    let grows = !keep_size && end > g.hdr.size;
    if grows {
        appends::zero_exposed(state, g, end)?;
        map_hooks::before_grow(state, g)?;
    }
    let old_size = g.hdr.size;
    let missing: u64 = gaps(g, lb0, lb1).iter().map(|x| x.1).sum();
    let available = state.available_blocks_for(missing);
    if missing > available {
        return Err(Error::NoSpace(format!("fallocate needs {missing} blocks, {available} free")));
    }
    // One transaction per 2 MiB logical unit, so whole units get aligned extents.
    let mut a = lb0;
    while a < lb1 {
        let b = lb1.min((a / 512 + 1) * 512);
        fill_gaps(state, g, a, b)?;
        a = b;
    }
    let mut hdr = g.hdr.clone();
    let now = state.now_fine();
    hdr.ctime = now;
    if !keep_size && end > hdr.size {
        hdr.size = end;
        hdr.mtime = now;
    }
    commit_header(state, ino, &g.hdr, &hdr, Tx::new())?;
    g.hdr = hdr;
    if keep_size && end > old_size {
        state.forget_prealloc(g); // blocks past EOF the caller asked for are not speculative
    } else {
        state.note_prealloc(g);
    }
    if grows {
        map_hooks::after_grow(state, g, old_size)?;
    }
    Ok(())
}

/// Cut the allocated `runs` into consecutive pieces of the given lengths (their sum is the
/// runs' total), in order: the placement of each target range.
pub(crate) fn lay_out(runs: &[BlockRun], lens: impl Iterator<Item = u64>) -> Vec<Vec<BlockRun>> {
    let mut ri = runs.iter().copied();
    let mut left: Option<BlockRun> = None;
    lens.map(|len| {
        let mut pl = Vec::new();
        let mut want = len;
        while want > 0 {
            let Some(r) = left.take().or_else(|| ri.next()) else {
                break; // the caller allocated exactly the sum; nothing is missing
            };
            let take = r.len.min(want);
            pl.push(BlockRun {
                start: r.start,
                len: take,
            });
            if take < r.len {
                left = Some(BlockRun {
                    start: r.start + take,
                    len: r.len - take,
                });
            }
            want -= take;
        }
        pl
    })
    .collect()
}

/// Allocate zeroed blocks for the unmapped blocks of [a, b) (inside one 2 MiB logical unit) in
/// one transaction; a whole-unit gap gets an aligned 2 MiB extent when one is free. Returns
/// whether anything was allocated. The file size does not change.
pub(crate) fn fill_gaps(state: &MountState, g: &mut InodeState, a: u64, b: u64) -> Result<bool> {
    fill(state, g, a, b, Fill::Gaps)
}

/// Give the empty 2 MiB unit starting at block `unit` a free aligned extent, zeroed, in one
/// transaction; false (and nothing changed) when no aligned extent is free. The blocks past the
/// end of the file become speculative preallocation (`ops::prealloc`), unless the file already
/// held blocks past its end that it asked for.
pub(crate) fn fill_unit_aligned(state: &MountState, g: &mut InodeState, unit: u64) -> Result<bool> {
    fill_unit(state, g, unit, None)
}

/// [`fill_unit_aligned`] for a write that stores from byte `from` of the file on (at or past
/// its end): only the extent's bytes before `max(from, size)` are zeroed, and the file is marked
/// `INODE_TAIL_UNSETTLED` in the same transaction. The rest lies past the end until the write
/// (or a later one) stores there, and whatever exposes bytes past the end of such a file
/// zeroes them first (`state::appends`), so nothing the blocks held before shows. An append
/// into a fresh unit then stores its bytes once instead of zeroing 2 MiB first.
pub(crate) fn fill_unit_for_write(
    state: &MountState,
    g: &mut InodeState,
    unit: u64,
    from: u64,
) -> Result<bool> {
    fill_unit(state, g, unit, Some(from.max(g.hdr.size)))
}

fn fill_unit(state: &MountState, g: &mut InodeState, unit: u64, keep_from: Option<u64>) -> Result<bool> {
    let clean_tail = g.spec.is_some() || g.blocks_past_eof() == 0;
    if !fill(state, g, unit, unit + 512, Fill::AlignedUnit { keep_from })? {
        return Ok(false);
    }
    if clean_tail && unit + 512 > g.eof_block() {
        state.mark_prealloc(g);
    }
    Ok(true)
}

/// What [`fill`] allocates and zeroes.
#[derive(Clone, Copy)]
enum Fill {
    /// Free blocks for the gaps, zeroed.
    Gaps,
    /// One free aligned extent for the whole empty unit or nothing, zeroed before file byte
    /// `keep_from` (all of it: None), see [`fill_unit_for_write`].
    AlignedUnit { keep_from: Option<u64> },
}

/// Allocate and map blocks for the gaps of [a, b) in one transaction, as `how` says.
fn fill(state: &MountState, g: &mut InodeState, a: u64, b: u64, how: Fill) -> Result<bool> {
    let gs = gaps(g, a, b);
    if gs.is_empty() {
        return Ok(false);
    }
    let need: u64 = gs.iter().map(|x| x.1).sum();
    let mut res = Reserved::new(state);
    let runs = if matches!(how, Fill::AlignedUnit { .. }) {
        match res.alloc_aligned() {
            Some(r) if a.is_multiple_of(512) && gs == [(a, r.len)] => vec![r],
            _ => return Ok(false),
        }
    } else {
        res.alloc(need)?
    };
    // Bytes of the unit from `keep_from` on are left as they are (past the end of the file).
    let zero_len = |r: &BlockRun| match how {
        Fill::AlignedUnit { keep_from: Some(from) } => {
            from.saturating_sub(a * BLOCK_SIZE).min(r.len * BLOCK_SIZE)
        }
        _ => r.len * BLOCK_SIZE,
    };
    let unsettled = runs.iter().any(|r| zero_len(r) < r.len * BLOCK_SIZE);
    for r in runs.iter().filter(|r| zero_len(r) > 0) {
        state
            .pool
            .zero_flush(r.start * BLOCK_SIZE, zero_len(r), Category::Data)?;
    }
    let mut upd = MapUpdate::default();
    state.reserve_slots(&mut res, &mut g.map, runs.len() + gs.len(), &mut upd)?;
    let placements = lay_out(&runs, gs.iter().map(|x| x.1));
    guarded(state, || {
        for ((gl, glen), pl) in gs.iter().zip(&placements) {
            g.map.remap(*gl, *glen, pl, &mut upd);
        }
        commit_map_change(state, g, &upd, Tx::new(), |h| {
            h.map_end = h.map_end.max(b);
            if unsettled {
                h.flags |= INODE_TAIL_UNSETTLED;
            }
        })
    })?;
    res.keep();
    mark_if_aligned(state, g, &runs)?;
    Ok(true)
}

/// Whether 2 MiB unit `unit` holds data but is not one aligned extent (so it cannot be
/// mapped with a hugepage): what a rewrite would fix.
/// Only units wholly inside the file count: the last, partial unit of a file cannot be mapped
/// with a hugepage anyway, and rewriting it would only add space.
pub(crate) fn unit_fragmented(g: &InodeState, unit: u64) -> bool {
    let u0 = unit * 512;
    u0 + 512 <= g.hdr.size.div_ceil(BLOCK_SIZE)
        && !g.map.in_aligned_unit(u0)
        && !g.map.segments(u0, u0 + 512).is_empty()
}

/// Blocks of a leased file that one transaction of [`zero_leased_in_place`] zeroes: their undo
/// images (1 MiB) and records (one per extent piece, at most 256) fit one transaction well.
const LEASED_ZERO_PIECE: u64 = 256;

/// Punch hole and zero range of a file a client leases: the mapped bytes of [from, to) are
/// zeroed in place, journaled, with mtime and ctime, in transactions of at most
/// [`LEASED_ZERO_PIECE`] blocks (a crash leaves each piece zeroed or as it was). The blocks
/// stay where the client's mappings reach them, so loads there read zeros at once and stores
/// made afterwards stay in the file, as through a kernel mapping; nothing is freed (holes stay
/// holes). With `from >= to` only the times change.
pub(crate) fn zero_leased_in_place(state: &MountState, g: &mut InodeState, from: u64, to: u64) -> Result<()> {
    let zeros = vec![0u8; (LEASED_ZERO_PIECE * BLOCK_SIZE) as usize];
    let now = state.now_fine();
    let mut pos = from;
    loop {
        let piece_end = to.min((pos / BLOCK_SIZE + LEASED_ZERO_PIECE) * BLOCK_SIZE).max(pos);
        let mut tx = Tx::new();
        for (at, len) in appends::pool_bytes(g, pos, piece_end) {
            tx.write_ref(at, &zeros[..len as usize], Category::Data);
        }
        commit_map_change(state, g, &MapUpdate::default(), tx, |h| {
            h.mtime = now;
            h.ctime = now;
        })?;
        if piece_end >= to {
            return Ok(());
        }
        pos = piece_end;
    }
}

pub(crate) fn punch_hole(state: &MountState, ino: u64, off: u64, len: u64) -> Result<()> {
    state.check_alive()?;
    if len == 0 {
        return Err(Error::Invalid("punch length must be positive".into()));
    }
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    file_kind_check(&g)?;
    inode_flags::allow(g.hdr.flags, Change::Contents)?;
    if g.leases > 0 {
        // Bytes past the end are zero already, or marked as maybe not (and zeroed before the
        // file grows over them).
        let end = off.saturating_add(len).min(g.hdr.size);
        return zero_leased_in_place(state, &mut g, off, end);
    }
    let end = off.saturating_add(len).min(g.hdr.map_end * BLOCK_SIZE);
    if off >= end {
        return Ok(());
    }
    let zeros = vec![0u8; BLOCK_SIZE as usize];
    let first_full = off.div_ceil(BLOCK_SIZE);
    let last_full = end / BLOCK_SIZE;
    // Partial blocks at either end are zeroed in place (journaled in strict mode).
    let mut partial = Vec::new();
    if first_full > last_full {
        partial.push((off, end));
    } else {
        if !off.is_multiple_of(BLOCK_SIZE) {
            partial.push((off, first_full * BLOCK_SIZE));
        }
        if !end.is_multiple_of(BLOCK_SIZE) && last_full >= first_full {
            partial.push((last_full * BLOCK_SIZE, end));
        }
    }
    let mut tx = Tx::new();
    for (s, e) in partial {
        if let Some((phys, _)) = g.map.lookup(s / BLOCK_SIZE) {
            let o = phys * BLOCK_SIZE + s % BLOCK_SIZE;
            // Journaled in both modes, like truncate's tail: punching is a metadata operation.
            tx.write_ref(o, &zeros[..(e - s) as usize], Category::Data);
        }
    }
    map_hooks::before_move(state, &g, first_full, last_full)?;
    let mut a = first_full;
    let mut first = true;
    loop {
        let mut b = last_full.min((a / 512 + 1) * 512).max(a);
        // A unit whose records lie in very many index blocks (a slot write and a checksum
        // each) is punched in smaller pieces, so a piece stays within one transaction.
        while b - a > 1 && g.map.index_blocks_in(a, b) > MAX_SEALED_INDEX_BLOCKS / 2 {
            b = a + (b - a) / 2;
        }
        let mut upd = MapUpdate::default();
        let mut res = Reserved::new(state);
        state.reserve_slots(&mut res, &mut g.map, 1, &mut upd)?;
        let piece_tx = if first {
            std::mem::take(&mut tx)
        } else {
            Tx::new()
        };
        first = false;
        guarded(state, || {
            if b > a {
                g.map.remap(a, b - a, &[], &mut upd);
            }
            let now = state.now_fine();
            commit_map_change(state, &mut g, &upd, piece_tx, |h| {
                h.mtime = now;
                h.ctime = now;
            })
        })?;
        res.keep();
        if b >= last_full {
            break;
        }
        a = b;
    }
    state.note_prealloc(&mut g);
    Ok(())
}

pub(crate) fn seek_data_hole(state: &MountState, ino: u64, off: u64, data: bool) -> Result<u64> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    appends::settle(state, &n)?;
    let g = rlock(&n);
    let size = g.hdr.size;
    if off >= size {
        return Err(Error::NoSuchOffset);
    }
    let mut lb = off / BLOCK_SIZE;
    if data {
        match g.map.next_mapped(lb) {
            Some(l) if l * BLOCK_SIZE < size => Ok(off.max(l * BLOCK_SIZE)),
            _ => Err(Error::NoSuchOffset),
        }
    } else {
        while let Some((_, cont)) = g.map.lookup(lb) {
            lb += cont;
        }
        Ok(off.max(lb * BLOCK_SIZE).min(size))
    }
}

pub(crate) fn setattr(state: &MountState, ino: u64, set: &SetAttr) -> Result<Attr> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    for change in setattr_changes(set) {
        inode_flags::allow(g.hdr.flags, change)?;
    }
    if let Some(size) = set.size {
        file_kind_check(&g)?;
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        truncate_locked(state, &mut g, size)?;
    }
    let now = state.now_fine();
    let mut hdr = g.hdr.clone();
    if let Some(m) = set.mode {
        hdr.mode = (hdr.mode & libc::S_IFMT) | (m & 0o7777);
    }
    if let Some(u) = set.uid {
        hdr.uid = u;
    }
    if let Some(gid) = set.gid {
        hdr.gid = gid;
    }
    let t = |ts: TimeSet| match ts {
        TimeSet::Now => now,
        TimeSet::At(x) => x,
    };
    if let Some(a) = set.atime {
        hdr.atime = t(a);
    }
    if let Some(m) = set.mtime {
        hdr.mtime = t(m);
    }
    if set.mode.is_some()
        || set.uid.is_some()
        || set.gid.is_some()
        || set.atime.is_some()
        || set.mtime.is_some()
        || set.touch
    {
        hdr.ctime = now;
        // A chmod rewrites the access ACL in its own transaction (`ops::acl`).
        let mut res = Reserved::new(state);
        let mut tx = Tx::new();
        let mut moved = false;
        if let Some(attrs) = set.mode.map(|m| acl::chmod_attrs(state, &g, m)).transpose()?.flatten() {
            moved = xattr::stage_attrs(state, &mut res, &g, &attrs, &mut hdr, &mut tx)?;
        }
        commit_header(state, ino, &g.hdr, &hdr, tx)?;
        res.keep();
        if moved {
            xattr::free_block(state, g.hdr.xattr_block);
        }
        let gains_set_id = hdr.mode & !g.hdr.mode & (libc::S_ISUID | libc::S_ISGID) != 0;
        g.hdr = hdr;
        if gains_set_id && g.leases > 0 {
            // Clients write leased files directly, where no write drops the bit: they stop
            // and go through the daemon, which does (`ops::lease::privileged`).
            state.leases.bump(ino);
        }
    }
    Ok(state.attr(&g))
}

/// The user's flags of `ino` (`FS_IOC_GETFLAGS` bits).
pub(crate) fn flags(state: &MountState, ino: u64) -> Result<u32> {
    state.check_alive()?;
    Ok(inode_flags::user_flags(rlock(&state.inode(ino)?).hdr.flags))
}

/// Set the user's flags of `ino` to `flags` (`FS_IOC_SETFLAGS` bits); ctime changes, as on ext4.
pub(crate) fn set_flags(state: &MountState, ino: u64, flags: u32) -> Result<Attr> {
    state.check_alive()?;
    let user = inode_flags::from_user_flags(flags)?;
    let n = state.inode(ino)?;
    let mut g = appends::lock(state, &n)?;
    let mut hdr = g.hdr.clone();
    hdr.flags = (hdr.flags & !INODE_USER_FLAGS) | user;
    hdr.ctime = state.now_fine();
    commit_header(state, ino, &g.hdr, &hdr, Tx::new())?;
    let restricts = hdr.flags & !g.hdr.flags & (INODE_IMMUTABLE | INODE_APPEND_ONLY) != 0;
    g.hdr = hdr;
    if restricts && g.leases > 0 {
        // Clients write leased files directly, where no flag is checked: they stop and go
        // through the daemon, which refuses what the flag forbids.
        state.leases.bump(ino);
    }
    Ok(state.attr(&g))
}

/// Whether `ino` may be opened for writing (`write`), with `O_APPEND` (`append`) and `O_TRUNC`
/// (`truncate`): EPERM for an immutable file, and for an append-only one opened for writing
/// without `O_APPEND` or with `O_TRUNC`, as Linux refuses them at open.
pub(crate) fn check_open(state: &MountState, ino: u64, write: bool, append: bool, truncate: bool) -> Result<()> {
    let flags = rlock(&state.inode(ino)?).hdr.flags;
    match (write || truncate, append && !truncate) {
        (false, _) => Ok(()),
        (true, true) => inode_flags::allow(flags, Change::Append),
        (true, false) => inode_flags::allow(flags, Change::Contents),
    }
}

/// What `set` changes, as the inode flags weigh it.
fn setattr_changes(set: &SetAttr) -> impl Iterator<Item = Change> {
    let given = set.mode.is_some()
        || set.uid.is_some()
        || set.gid.is_some()
        || [set.atime, set.mtime].iter().any(|t| matches!(t, Some(TimeSet::At(_))));
    let now = set.touch || [set.atime, set.mtime].iter().any(|t| matches!(t, Some(TimeSet::Now)));
    [
        set.size.map(|_| Change::Contents),
        given.then_some(Change::Attributes),
        now.then_some(Change::TimesToNow),
    ]
    .into_iter()
    .flatten()
}

/// Every operation is durable when it returns, so fsync only orders this call after them and
/// writes back what stores through the file's mappings left in the CPU caches.
pub(crate) fn fsync(state: &MountState, ino: u64) -> Result<()> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    appends::settle(state, &n)?;
    map_hooks::flush_mapped(state, &rlock(&n));
    state.pool.fence();
    state.pool.check_durable()
}
