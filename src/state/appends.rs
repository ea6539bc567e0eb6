//! Direct appends (docs/DESIGN.md §7b): a client of the mount's channel holding an append
//! lease stores bytes past the end of a file into blocks reserved for it and grows the size in
//! the size board itself (`size_word`), with no round trip. The daemon pulls such sizes in,
//! durably, before anything reads or changes the file's size or blocks, and freezes the word
//! while it changes the file, so a client's size never overwrites the daemon's or the reverse.
//!
//! A client's bytes may lie past the end of the file (a write whose swap failed and went
//! through FUSE, a client killed between its copy and its swap, a crash before the size was
//! pulled in), and so may a write's that was stored in place past the end with no undo image
//! and cut by a crash before its size committed (`ops::file`), and so may whatever a fresh
//! 2 MiB unit held before a write took it (`ops::file::fill_unit_for_write`): such a file
//! carries [`INODE_TAIL_UNSETTLED`] on media, and whatever extends it zeroes what it exposes
//! first ([`zero_exposed`]), as do leases that map bytes past its end ([`zero_past_end`]).

use crate::error::Result;
use crate::media::journal::Tx;
use crate::media::layout::{BLOCK_SIZE, INODE_SIZE_CHECKED, INODE_TAIL_UNSETTLED, MAX_FILE_SIZE};
use crate::media::pool::Category;
use crate::state::inode_state::{InodeRef, InodeState, InodeWriteGuard, rlock, wlock};
use crate::state::map_hooks;
use crate::state::mount_state::MountState;
use crate::state::size_word;
use crate::state::slots;
use crate::state::tx::commit_header;
use std::ops::{Deref, DerefMut};

/// A regular file locked for a change: if clients append to it, their sizes were pulled in and
/// the size word is frozen until the lock drops, which publishes the size the file has then.
pub(crate) struct FileLock<'a> {
    state: &'a MountState,
    g: InodeWriteGuard<'a>,
    frozen: bool,
    /// The size word before the freeze.
    before: u64,
    /// The holder only looked (`settle`): the word goes back as it was if the size is still
    /// its size, so appenders that read it before are not sent through FUSE for nothing.
    looked_only: bool,
}

/// Write-lock `n` for an operation that may read or change its size or blocks: its alternate
/// slots are folded home first (`state::slots`), so the operation sees the blocks hold the
/// file's bytes.
pub(crate) fn lock<'a>(state: &'a MountState, n: &'a InodeRef) -> Result<FileLock<'a>> {
    let mut l = lock_keeping_slots(state, n)?;
    slots::fold_all(state, &mut l.g)?;
    Ok(l)
}

/// [`lock`], leaving alternate slots where they are (the write path folds the ones it must).
pub(crate) fn lock_keeping_slots<'a>(state: &'a MountState, n: &'a InodeRef) -> Result<FileLock<'a>> {
    let g = wlock(n);
    let frozen = g.appenders > 0;
    let mut l = FileLock { state, g, frozen, before: 0, looked_only: false };
    if frozen && let Some(w) = state.leases.freeze(l.g.ino) {
        l.before = w;
        pull(state, &mut l.g, size_word::size(w))?;
    }
    Ok(l)
}

impl FileLock<'_> {
    /// The file has its first appender now (its word was frozen): publish when the lock drops.
    pub(crate) fn arm_publish(&mut self) {
        self.frozen = true;
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        if !self.frozen {
            return;
        }
        let (ino, size, open) = (self.g.ino, self.g.hdr.size, self.g.appenders > 0);
        let unchanged = self.looked_only && size == size_word::size(self.before);
        if unchanged && open && !size_word::frozen(self.before) {
            self.state.leases.thaw(ino, self.before);
        } else {
            self.state.leases.publish(ino, size, open);
        }
    }
}

impl Deref for FileLock<'_> {
    type Target = InodeState;
    fn deref(&self) -> &InodeState {
        &self.g
    }
}

impl DerefMut for FileLock<'_> {
    fn deref_mut(&mut self) -> &mut InodeState {
        &mut self.g
    }
}

/// Before a read-only look at `n` (attributes, reads, seeks, fsync): pull in the size clients
/// appending to it published, so the look and everything durable after it include their bytes,
/// and give it new times if a client wrote it directly since the last look.
pub(crate) fn settle(state: &MountState, n: &InodeRef) -> Result<()> {
    // Append leases are leases: with none held anywhere there is nothing to pull or stamp.
    if !state.leases.any() {
        return Ok(());
    }
    let (ino, leased, appended) = {
        let g = rlock(n);
        (g.ino, g.leases > 0, g.appenders > 0)
    };
    if leased && state.leases.take_written(ino) {
        stamp_direct_writes(state, &mut wlock(n))?;
    }
    if !appended {
        return Ok(());
    }
    let mut l = lock(state, n)?;
    l.looked_only = true;
    Ok(())
}

/// A client wrote `g` directly (`size_word::WRITTEN`, taken): new modification and change
/// times, the time of this look (a direct write reaches neither the kernel nor the daemon, so
/// without this the file would keep its old mtime, and a backup that compares size and mtime
/// would skip it).
pub(crate) fn stamp_direct_writes(state: &MountState, g: &mut InodeState) -> Result<()> {
    let now = state.now_fine();
    let mut hdr = g.hdr.clone();
    hdr.mtime = now;
    hdr.ctime = now;
    commit_header(state, g.ino, &g.hdr, &hdr, Tx::new())?;
    g.hdr = hdr;
    Ok(())
}

/// Make `size`, which clients appended up to, the file's size on media (with new times), its
/// bytes written back first.
fn pull(state: &MountState, g: &mut InodeState, size: u64) -> Result<()> {
    let size = size.min(MAX_FILE_SIZE);
    if size <= g.hdr.size {
        return Ok(());
    }
    let old_size = g.hdr.size;
    // Clients do not write their appended bytes back (a size not yet taken in keeps them out
    // of the file anyway): that is done here, before the size that covers them commits.
    for (at, len) in pool_bytes(g, old_size, size) {
        state.pool.flush(at, len, Category::Data);
    }
    state.pool.fence();
    if g.hdr.flags & INODE_SIZE_CHECKED != 0 {
        // One store commits the size (docs/DESIGN.md §5, appends by size word).
        state.commit_size(g, size)?;
    } else {
        let now = state.now_fine();
        let mut hdr = g.hdr.clone();
        hdr.size = size;
        hdr.mtime = now;
        hdr.ctime = now;
        commit_header(state, g.ino, &g.hdr, &hdr, Tx::new())?;
        g.hdr = hdr;
    }
    map_hooks::after_grow(state, g, old_size)
}

/// Mark the file as one whose bytes past its end may not be zero (before its first append
/// lease, or its first write stored in place past the end: the mark is durable before anything
/// is stored there).
pub(crate) fn mark_unsettled(state: &MountState, g: &mut InodeState) -> Result<()> {
    if g.hdr.flags & INODE_TAIL_UNSETTLED != 0 {
        return Ok(());
    }
    let mut hdr = g.hdr.clone();
    hdr.flags |= INODE_TAIL_UNSETTLED;
    commit_header(state, g.ino, &g.hdr, &hdr, Tx::new())?;
    g.hdr = hdr;
    Ok(())
}

/// Before the file's size grows to `to` other than by a client's append: zero the bytes of its
/// mapped blocks between the end and `to` if clients may have left some there. No journal: the
/// bytes lie past the end until the size change commits, and zeros there are always right.
pub(crate) fn zero_exposed(state: &MountState, g: &InodeState, to: u64) -> Result<()> {
    zero_past_end(state, g, g.hdr.size, to)
}

/// Zero the bytes of the file's mapped blocks in [from, to) that lie past its end, if it is
/// marked as one whose bytes there may not be zero, then fence: before something shows them
/// (a lease lets a client map them; a write stored from the end on into a fresh unit left what
/// the blocks held before, `ops::file::fill_unit_for_write`). No journal, as for
/// [`zero_exposed`]. Bytes a client appending to the file has stored there but not published
/// may be zeroed: its size swap then fails (the file is locked, its word frozen) and the write
/// goes through FUSE.
pub(crate) fn zero_past_end(state: &MountState, g: &InodeState, from: u64, to: u64) -> Result<()> {
    let from = from.max(g.hdr.size);
    if g.hdr.flags & INODE_TAIL_UNSETTLED == 0 || to <= from {
        return Ok(());
    }
    for (at, len) in pool_bytes(g, from, to) {
        state.pool.zero_flush(at, len, Category::Data)?;
    }
    state.pool.fence();
    Ok(())
}

/// Where the mapped bytes of file range [from, to) lie in the pool: (pool offset, length) per
/// extent, holes skipped.
pub(crate) fn pool_bytes(g: &InodeState, from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> {
    g.map
        .segments(from / BLOCK_SIZE, to.div_ceil(BLOCK_SIZE))
        .into_iter()
        .filter_map(move |(l, phys, len)| {
            let (a, b) = ((l * BLOCK_SIZE).max(from), ((l + len) * BLOCK_SIZE).min(to));
            (a < b).then(|| (phys * BLOCK_SIZE + (a - l * BLOCK_SIZE), b - a))
        })
}
