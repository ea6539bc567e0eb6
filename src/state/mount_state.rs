//! The shared state of a mounted pool: the pool, its journals and allocator, the DRAM inode
//! table, the namespace lock, and the services a mount runs (page faults, background work).
//!
//! Lock order (never acquired in the other direction): the namespace lock (shared for lookups
//! and for background moves, exclusive for operations that change names and for fsck) → inode
//! locks (a namespace operation locks every inode it touches, each once, in inode-number order)
//! → a journal's lock → an allocator partition's lock. Data operations (read, write, truncate,
//! fallocate, setattr, xattrs) take only their inode's lock. Every operation that changes media
//! builds one transaction and commits it before it changes the DRAM indexes, so DRAM never runs
//! ahead of what a crash would recover.

use crate::error::{Error, Result};
use crate::media::alloc::{Allocator, BlockRun};
use crate::media::journal::{Journals, Tx};
use crate::media::recovery::RecoveryReport;
use crate::media::checksum;
use crate::media::layout::{
    self, BLOCK_SIZE, Geometry, INODE_SIZE, InodeHeader, NAME_MAX, SbState, Superblock,
};
use crate::media::pool::Category;
use crate::media::pool::Pool;
use crate::state::background::Background;
use crate::state::inode_state::{InodeRef, InodeState};
use crate::state::locks::lock;
use crate::state::mappings::FaultService;
use crate::sys::current_cpu;
use crate::types::{Attr, Consistency, StatFs};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Shared state of a mounted pool.
pub(crate) struct MountState {
    pub pool: Pool,
    pub geo: Geometry,
    pub sb: Superblock,
    pub journals: Journals,
    pub alloc: Allocator,
    /// Free inode numbers, one set per partition.
    pub inode_free: Vec<Mutex<BTreeSet<u64>>>,
    /// Every in-use inode.
    pub inodes: RwLock<HashMap<u64, InodeRef>>,
    /// The namespace lock (see the lock order above); it guards no data of its own.
    pub namespace: RwLock<()>,
    pub consistency: Consistency,
    /// An internal failure left DRAM and media out of step: operations are refused.
    pub poisoned: AtomicBool,
    pub unmounted: AtomicBool,
    /// The superblock's state record as this mount last wrote it (clean unmount and the
    /// "needs fsck" flag, `state::damage`, write it under this lock).
    pub record: Mutex<SbState>,
    /// Mounted read-only: nothing reaches the pool, and calls that would change it are
    /// refused (`check_writable`).
    pub read_only: bool,
    /// Generation number of the next inode.
    pub generation: AtomicU32,
    /// What recovery did at mount.
    pub recovery: RecoveryReport,
    /// In-use inodes that failed their checksum at mount (only a mount for fsck or repair
    /// gets this far with any): not free; loaded only if they pass every other check.
    pub damaged_inodes: Vec<u64>,
    /// Why the allocator snapshot saved by the last clean unmount was not used (it fails its
    /// checksum or disagrees with the inode tables); the next clean unmount rewrites it.
    pub stale_snapshot: Option<String>,
    /// The page-fault service of file mappings, started by the first `mmap`.
    pub faults: Mutex<Option<Arc<FaultService>>>,
    /// Requests for the background worker (reactive rewrite, hole compaction).
    pub background: Arc<Background>,
}

impl MountState {
    /// Refuse operations on an unmounted or poisoned mount.
    pub fn check_alive(&self) -> Result<()> {
        if self.unmounted.load(Ordering::Relaxed) {
            return Err(Error::Invalid("the file system has been unmounted".into()));
        }
        if self.poisoned.load(Ordering::Relaxed) {
            return Err(Error::Corrupted(
                "an internal failure left DRAM and media out of step; operations are refused until remount (recovery will restore a consistent state)".into(),
            ));
        }
        Ok(())
    }

    /// Mark the mount unusable until remount (DRAM may have moved ahead of media).
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Relaxed);
    }

    /// Commit a transaction on the current CPU's journal. A failure here means DRAM state may
    /// have moved ahead of media, so the mount is poisoned.
    pub fn commit(&self, mut tx: Tx<'_>) -> Result<()> {
        // Nothing has been written yet: the transaction is refused, the mount stays usable.
        self.check_writable()?;
        self.seal_inodes(&mut tx).inspect_err(|_| self.poison())?;
        self.journals
            .commit(&self.pool, tx, current_cpu())
            .inspect_err(|_| self.poison())
    }

    /// Add to `tx` the new checksum of every in-use inode it changes (`checksum::inode_checksum`
    /// of the inode as the transaction leaves it), so the checksum commits with the change.
    fn seal_inodes(&self, tx: &mut Tx<'_>) -> Result<()> {
        let g = &self.geo;
        let table = g.inode_table_start * BLOCK_SIZE;
        let table_end = table + g.total_inodes() * INODE_SIZE;
        // Usually one or two inodes: a sorted, deduplicated vector beats a set.
        let mut touched = Vec::new();
        for (off, len) in tx.targets() {
            let (a, b) = (off.max(table), (off + len).min(table_end));
            if a < b {
                touched.extend((a - table) / INODE_SIZE + 1..=(b - 1 - table) / INODE_SIZE + 1);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for ino in touched {
            let off = self.inode_off(ino);
            let mut raw = [0u8; layout::INODE_BYTES];
            self.pool.read(off, &mut raw)?;
            tx.overlay(off, &mut raw);
            let crc = checksum::inode_checksum(&raw);
            if InodeHeader::decode(&raw).in_use() && layout::get_u32(&raw, layout::ino::CRC) != crc {
                tx.write(
                    off + layout::ino::CRC as u64,
                    crc.to_le_bytes().to_vec(),
                    Category::Metadata,
                );
            }
        }
        Ok(())
    }

    /// Every in-use inode, as of now (a snapshot of the table, no inode locked).
    pub fn all_inodes(&self) -> Vec<InodeRef> {
        self.inodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The in-use inode `ino` (`Stale` if it is not in use).
    pub fn inode(&self, ino: u64) -> Result<InodeRef> {
        self.inodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .cloned()
            .ok_or(Error::Stale(ino))
    }

    /// Whether `node` is still the in-use inode `ino` (not freed after it was looked up: a
    /// freed inode keeps its old map in DRAM, but its blocks are free already).
    pub fn still_live(&self, ino: u64, node: &InodeRef) -> bool {
        self.inodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .is_some_and(|n| Arc::ptr_eq(n, node))
    }

    /// Allocate `nblocks` data blocks on the current CPU's partition (stealing if it is full).
    /// Before it reports no space, speculative preallocation of other files is taken back
    /// (`ops::prealloc`), so `NoSpace` means the blocks are not there.
    pub fn alloc_blocks(&self, nblocks: u64) -> Result<Vec<BlockRun>> {
        loop {
            match self.alloc.alloc(nblocks, current_cpu()) {
                Ok(runs) => return Ok(runs),
                Err(e) => {
                    let short = nblocks.saturating_sub(e.free).max(1);
                    if self.alloc.relieve(short) == 0 {
                        return Err(Error::NoSpace(e.to_string()));
                    }
                }
            }
        }
    }

    /// Give blocks back to the allocator (after the transaction that stopped using them).
    pub fn free_runs(&self, runs: &[BlockRun]) {
        for r in runs {
            if r.len > 0
                && let Err(e) = self.alloc.free(*r)
            {
                // A double free means the DRAM indexes disagree with themselves.
                self.poison();
                log::error!("allocator refused a free: {e}");
            }
        }
        // Frees are what leave holes behind; compaction starts from here when they pile up.
        let freed: u64 = runs.iter().map(|r| r.len).sum();
        if freed > 0 {
            self.background.note_freed(&self.alloc, freed);
        }
    }

    /// A free inode number, from the current CPU's partition if it has one.
    pub fn alloc_inode_number(&self) -> Result<u64> {
        let n = self.inode_free.len();
        let local = current_cpu() % n;
        if let Some(i) = lock(&self.inode_free[local]).pop_first() {
            return Ok(i);
        }
        // Steal from the fullest partition; the lengths are read without holding every lock,
        // so if that one emptied meanwhile fall back to any partition that still has one.
        let best = (0..n)
            .max_by_key(|&p| lock(&self.inode_free[p]).len())
            .unwrap_or(0);
        if let Some(i) = lock(&self.inode_free[best]).pop_first() {
            return Ok(i);
        }
        (0..n)
            .find_map(|p| lock(&self.inode_free[p]).pop_first())
            .ok_or_else(|| Error::NoSpace("no free inodes".into()))
    }

    /// Put an inode number back on its partition's free list.
    pub fn release_inode_number(&self, ino: u64) {
        lock(&self.inode_free[self.geo.inode_partition(ino) as usize]).insert(ino);
    }

    /// Pool offset of inode `ino` (inode numbers in DRAM were validated when they got there).
    pub fn inode_off(&self, ino: u64) -> u64 {
        self.geo
            .inode_offset(ino)
            .expect("inode numbers in DRAM are validated")
    }

    /// The attributes of an inode.
    pub fn attr(&self, n: &InodeState) -> Attr {
        let h = &n.hdr;
        let extra = n.map.index_blocks.len() as u64 + u64::from(h.xattr_block != 0);
        Attr {
            ino: n.ino,
            kind: n.kind(),
            perm: h.mode & 0o7777,
            nlink: h.nlink,
            uid: h.uid,
            gid: h.gid,
            size: h.size,
            blocks: (n.map.mapped_blocks() + extra) * (BLOCK_SIZE / 512),
            atime: h.atime,
            mtime: h.mtime,
            ctime: h.ctime,
            crtime: h.crtime,
            rdev: h.rdev,
            generation: h.generation,
        }
    }

    /// File-system statistics.
    pub fn statfs(&self) -> StatFs {
        let free_inodes = self.inode_free.iter().map(|f| lock(f).len() as u64).sum();
        StatFs {
            block_size: BLOCK_SIZE,
            blocks: self.geo.data_blocks,
            // Speculative preallocation is given back on demand, so writes can use it.
            free_blocks: self.alloc.available_blocks(),
            preallocated_blocks: self.alloc.speculative_blocks(),
            inodes: self.geo.total_inodes(),
            free_inodes,
            name_max: NAME_MAX as u32,
            free_aligned_extents: self
                .alloc
                .stats()
                .iter()
                .map(|s| s.free_aligned_extents)
                .sum(),
        }
    }
}
