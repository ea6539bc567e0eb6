//! Building and finishing transactions on the mount state: resources reserved for an operation
//! (given back unless it commits), the journaled writes of inode header and extent-map changes,
//! the work after a map change commits, and freeing an inode (the one path that unlink, rename,
//! the last release and mount-time orphan cleanup all take).

use crate::error::Result;
use crate::media::alloc::{BlockRun, Goal};
use crate::media::journal::Tx;
use crate::media::layout::{self, BLOCKS_PER_HUGE, INODE_IN_USE, InodeHeader};
use crate::media::pool::Category;
use crate::meta::inode::{self, FileMap, MapUpdate};
use crate::state::claims;
use crate::state::slots;
use crate::state::inode_state::InodeState;
use crate::state::mount_state::MountState;
use crate::sys::current_cpu;

/// Resources taken by an operation that are given back unless it commits.
pub(crate) struct Reserved<'a> {
    state: &'a MountState,
    pub runs: Vec<BlockRun>,
    pub inodes: Vec<u64>,
}

impl<'a> Reserved<'a> {
    pub fn new(state: &'a MountState) -> Self {
        Reserved {
            state,
            runs: Vec::new(),
            inodes: Vec::new(),
        }
    }
    /// The operation committed: keep everything.
    pub fn keep(mut self) {
        self.runs.clear();
        self.inodes.clear();
    }
    /// Allocate `nblocks` blocks, given back on drop unless kept.
    pub fn alloc(&mut self, nblocks: u64) -> Result<Vec<BlockRun>> {
        self.alloc_from(nblocks, None)
    }
    /// [`Reserved::alloc`], the free blocks from `goal` on first (`Allocator::alloc_from`).
    pub fn alloc_from(&mut self, nblocks: u64, goal: Option<Goal>) -> Result<Vec<BlockRun>> {
        let runs = self.state.alloc_blocks(nblocks, goal)?;
        self.runs.extend_from_slice(&runs);
        Ok(runs)
    }
    /// One free aligned 2 MiB extent, given back on drop unless kept; None when there is none
    /// (never gathered from holes, never taken back from other files' preallocation).
    pub fn alloc_aligned(&mut self) -> Option<BlockRun> {
        let start = self.state.alloc.alloc_aligned_extent(current_cpu())?;
        let run = BlockRun {
            start,
            len: BLOCKS_PER_HUGE,
        };
        self.runs.push(run);
        Some(run)
    }
    /// Allocate one block, given back on drop unless kept.
    pub fn alloc_one(&mut self) -> Result<u64> {
        Ok(self.alloc(1)?[0].start)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        for r in self.runs.drain(..) {
            let _ = self.state.alloc.free(r);
        }
        for i in self.inodes.drain(..) {
            self.state.release_inode_number(i);
        }
    }
}

/// The header of a freed inode: not in use, no links.
fn freed_header(h: &InodeHeader) -> InodeHeader {
    let mut h = h.clone();
    h.flags &= !INODE_IN_USE;
    h.nlink = 0;
    h
}

impl MountState {
    /// Journaled writes turning `old` into `new` for inode `ino`.
    pub fn header_tx(&self, tx: &mut Tx<'_>, ino: u64, old: &InodeHeader, new: &InodeHeader) {
        for (off, bytes) in layout::header_diff(self.inode_off(ino), old, new) {
            tx.write_copy(off, &bytes, Category::Metadata);
        }
    }

    /// Reserve index blocks so `map` can take `pieces` more extents, recording the link writes.
    pub fn reserve_slots(
        &self,
        res: &mut Reserved<'_>,
        map: &mut FileMap,
        pieces: usize,
        upd: &mut MapUpdate,
    ) -> Result<()> {
        // Allocate every block first so a failure leaves the map untouched.
        let blocks = (0..map.index_blocks_needed(pieces))
            .map(|_| res.alloc_one())
            .collect::<Result<Vec<u64>>>()?;
        for b in blocks {
            inode::init_index_block(&self.pool, b)?;
            map.add_index_block(b, upd);
        }
        Ok(())
    }

    /// Add a map update's slot and link writes to `tx`, and the first index block to `hdr`;
    /// every extent-index block the update changes or kills records in is sealed by the commit.
    pub fn map_tx(
        &self,
        tx: &mut Tx<'_>,
        map: &FileMap,
        ino: u64,
        upd: &MapUpdate,
        hdr: &mut InodeHeader,
    ) -> Result<()> {
        let ioff = self.inode_off(ino);
        inode::slot_pool_writes(&self.pool, map, ioff, upd, tx)?;
        for b in upd.index_blocks_touched(map) {
            tx.seal_index_block(b, ioff);
        }
        if let Some(b) = upd.first_index_block {
            hdr.index_block = b;
        }
        Ok(())
    }

    /// After commit: zero dead slots (unjournaled; they are already dead by `map_end`) and give
    /// freed blocks back (to the file's quarantine while a client leases it).
    pub fn finish_map_update(&self, g: &mut InodeState, upd: &MapUpdate) -> Result<()> {
        let (map, ino) = (&g.map, g.ino);
        if !upd.dead_slots.is_empty() {
            for &s in &upd.dead_slots {
                let off = map.slot_offset(self.inode_off(ino), s);
                self.pool
                    .zero(off, layout::EXTENT_SIZE, Category::Metadata)?;
                self.pool
                    .flush(off, layout::EXTENT_SIZE, Category::Metadata);
            }
            self.pool.fence();
        }
        if g.leases > 0 {
            if upd.freed.iter().any(|r| r.len > 0) {
                g.quarantine.extend(upd.freed.iter().filter(|r| r.len > 0));
                self.leases.bump(g.ino);
            }
        } else {
            self.free_runs(&upd.freed);
        }
        Ok(())
    }

    /// Add to `tx` the freeing of inode `n` (its last link went away and nobody has it open):
    /// one journaled header change clears its in-use flag and link count. After the commit,
    /// [`MountState::forget_inode`] gives its blocks and number back.
    /// Slots the inode has are written back home first (durably): should the transaction not
    /// commit, the file keeps its newest bytes; once it commits, no slot names its blocks.
    pub fn free_inode_tx(&self, n: &InodeState, tx: &mut Tx<'_>) -> Result<()> {
        slots::write_back(self, n)?;
        self.header_tx(tx, n.ino, &n.hdr, &freed_header(&n.hdr));
        Ok(())
    }

    /// After the transaction of [`MountState::free_inode_tx`] committed: the inode's blocks
    /// (data, extent index, xattr) go back, and it leaves the inode table.
    pub fn forget_inode(&self, n: &mut InodeState) {
        let runs = n.owned_runs();
        self.forget_inode_freeing(n, &runs);
    }

    /// [`MountState::forget_inode`], except that the blocks of `kept` (runs sorted by start:
    /// what other inodes claim too, for `fsck --repair`) are not given back, and a block the
    /// inode claims twice is given back once.
    pub fn forget_inode_keeping(&self, n: &mut InodeState, kept: &[BlockRun]) {
        let runs = claims::subtract(&claims::merged(n.owned_runs()), kept);
        self.forget_inode_freeing(n, &runs);
    }

    /// Forget inode `n`, giving `runs` back (in that order: the order decides which free
    /// aligned extents are taken next).
    fn forget_inode_freeing(&self, n: &mut InodeState, runs: &[BlockRun]) {
        let was_file = !n.is_dir();
        self.forget_prealloc(n);
        slots::forget(self, n);
        n.hdr = freed_header(&n.hdr);
        self.free_runs(runs);
        self.free_runs(&std::mem::take(&mut n.quarantine));
        if self.inodes.remove(n.ino).is_some() && was_file {
            self.loaded_files.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.release_inode_number(n.ino);
    }

    /// Free inode `n` now, in its own transaction (last release of an unlinked file; orphans
    /// found at mount).
    pub fn free_inode(&self, n: &mut InodeState) -> Result<()> {
        let mut tx = Tx::new();
        self.free_inode_tx(n, &mut tx)?;
        self.commit(tx)?;
        self.forget_inode(n);
        Ok(())
    }
}

/// Commit `tx` plus the header change `old → new`. The timestamp group (bytes 64..96: atime,
/// mtime, ctime, crtime, each an aligned 8-byte store) is written in place without the journal:
/// a crash can leave new times on rolled-back content, never an invalid time, and it saves a
/// journal entry on every data write.
pub(crate) fn commit_header(
    state: &MountState,
    ino: u64,
    old: &InodeHeader,
    new: &InodeHeader,
    mut tx: Tx<'_>,
) -> Result<()> {
    let times = state.inode_off(ino) + layout::ino::ATIME as u64;
    for (off, b) in layout::header_diff(state.inode_off(ino), old, new) {
        if off == times {
            state.pool.write_flush(off, &b, Category::Metadata)?;
        } else {
            tx.write_copy(off, &b, Category::Metadata);
        }
    }
    if tx.is_empty() {
        state.pool.fence();
        return state.pool.check_durable();
    }
    state.commit(tx)
}
