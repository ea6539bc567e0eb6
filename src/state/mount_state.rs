//! The shared state of a mounted pool: the pool, its journals and allocator, the DRAM inode
//! table, the namespace lock, and the services a mount runs (page faults, background work).
//!
//! Lock order (never acquired in the other direction): the namespace lock (shared for lookups,
//! background moves and every name change but rename, exclusive for rename and fsck) → inode
//! locks (a namespace operation locks every inode it touches, each once, in inode-number order)
//! → a journal's lock → an allocator partition's lock. Data operations (read, write, truncate,
//! fallocate, setattr, xattrs) take only their inode's lock. Every operation that changes media
//! builds one transaction and commits it before it changes the DRAM indexes, so DRAM never runs
//! ahead of what a crash would recover.

use crate::error::{Error, Result};
use crate::media::alloc::{Allocator, BlockRun, Goal};
use crate::media::journal::{Journals, Tx};
use crate::media::recovery::RecoveryReport;
use crate::media::checksum;
use crate::media::layout::{
    self, BLOCK_SIZE, FileKind, Geometry, INODE_SIZE, InodeHeader, NAME_MAX, SbState, Superblock,
};
use crate::media::pool::Category;
use crate::media::pool::Pool;
use crate::state::accounting::Accounting;
use crate::state::background::Background;
use crate::state::zones::{Room, Zones};
use crate::state::inode_bits::{InoList, InodeBits};
use crate::state::inode_load::load_after_mount;
use crate::state::inode_state::{
    InoMap, InodeCell, InodeRef, InodeState, rlock, try_wlock, write_locked_here,
};
use crate::state::inode_table::InodeTable;
use crate::state::leases::Leases;
use crate::state::removed_held::RemovedHeld;
use crate::state::locks::lock;
use crate::state::mappings::FaultService;
use crate::sys::current_cpu;
use crate::types::{Attr, Consistency, OverwritePath, StatFs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared state of a mounted pool.
pub(crate) struct MountState {
    pub pool: Pool,
    pub geo: Geometry,
    pub sb: Superblock,
    pub journals: Journals,
    pub alloc: Allocator,
    /// Free inode numbers, one set per partition.
    pub inode_free: Vec<Mutex<InodeBits>>,
    /// With wear-aware allocation, where each partition's next inode number is looked for
    /// (empty otherwise: the lowest free number is taken).
    pub inode_cursor: Vec<std::sync::atomic::AtomicU64>,
    /// The in-use inodes loaded into DRAM: the directories from mount on, every other inode
    /// from its first use (or its creation) on, until it is freed or dropped as idle
    /// ([`MountState::insert_loaded`]).
    pub inodes: InodeTable,
    /// In-use inodes not loaded (left on media by the mount's scan, or dropped since as idle).
    /// Taken under the write lock of the inode's shard of `inodes`, so that an inode is loaded
    /// once at a time.
    pub on_media: Mutex<InodeBits>,
    /// Files loaded or created, oldest first: where idle states to drop are looked for.
    pub loaded_order: Mutex<std::collections::VecDeque<u64>>,
    /// Idle file states kept at most (`MountOptions::cached_inodes`).
    pub cached_inodes: usize,
    /// File states (all but directories') in `inodes`: what `cached_inodes` is held to.
    pub loaded_files: std::sync::atomic::AtomicUsize,
    /// The namespace lock (see the lock order above); it guards no data of its own. Sharded
    /// by CPU: every lookup, create and unlink takes it shared.
    pub namespace: crate::state::locks::ShardedRwLock,
    pub consistency: Consistency,
    /// How strict overwrites inside one block are written (`MountOptions::overwrite_path`).
    pub overwrite_path: OverwritePath,
    /// An internal failure left DRAM and media out of step: operations are refused.
    pub poisoned: AtomicBool,
    pub unmounted: AtomicBool,
    /// Bytes of the pool faulted in ahead of use so far (`background::prefault`).
    pub prefaulted: std::sync::atomic::AtomicU64,
    /// Asks the prefault thread to stop after its current chunk.
    pub prefault_stop: AtomicBool,
    /// Test-only (the crash explorer's self-test): appends by size word skip the fence between
    /// their bytes and the size that covers them.
    pub broken_skip_append_fence: AtomicBool,
    /// The prefault thread, joined before the facade lets go of the mount (it holds the
    /// mount, which must not be dropped — and unmounted — on that thread).
    pub prefault_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The superblock's state record as this mount last wrote it (clean unmount and the
    /// "needs fsck" flag, `state::damage`, write it under this lock).
    pub record: Mutex<SbState>,
    /// Read-only now: nothing reaches the pool, and calls that would change it are refused
    /// (`check_writable`). Set at mount, or later by [`MountState::set_read_only`].
    pub read_only: AtomicBool,
    /// Mounted read-only (a private mapping; recovery, if any, only in memory): never
    /// switched to read-write.
    pub opened_read_only: bool,
    /// Reads store no access times (`MountOptions::noatime`).
    pub noatime: bool,
    /// The latest fine-grained time this mount handed out ([`MountState::now_fine`]): a
    /// coarse time ([`MountState::now_coarse`]) never goes back behind it (the kernel's
    /// multigrain timestamp floor). One per mount, not per process: another mount's stream of
    /// fine times must not turn this mount's once-per-tick time stores into one per write.
    pub fine_floor: std::sync::atomic::AtomicI64,
    /// What recovery did at mount.
    pub recovery: RecoveryReport,
    /// In-use inodes that failed their checksum at mount (only a mount for fsck or repair
    /// gets this far with any): not free; loaded only if they pass every other check.
    pub damaged_inodes: Vec<u64>,
    /// Of those, the ones that pass their checksum but fail validation (their extent map,
    /// header ranges or directory blocks), with the line that says why; never loaded.
    pub unloadable_inodes: std::collections::BTreeMap<u64, String>,
    /// Why the allocator snapshot saved by the last clean unmount was not used (it fails its
    /// checksum or disagrees with the inode tables); the next clean unmount rewrites it.
    pub stale_snapshot: Option<String>,
    /// Directory blocks (directory, block index) whose header failed its checksum at mount
    /// (only a mount for fsck or repair gets this far with any): loaded with the header
    /// rebuilt from the entries it marks (`dir::rebuilt_starts`), which repair writes back.
    pub rebuilt_dir_headers: Vec<(u64, u32)>,
    /// The page-fault service of file mappings, started by the first `mmap`.
    pub faults: Mutex<Option<Arc<FaultService>>>,
    /// Requests for the background worker (reactive rewrite, hole compaction).
    pub background: Arc<Background>,
    /// Direct-path leases held by clients of the mount's channel, and their size board.
    pub leases: Leases,
    /// Inodes a removal kept for its caller, not freed yet: an allocation that finds no space
    /// waits a little for them (`alloc_blocks`).
    pub(crate) removed_held: RemovedHeld,
    /// What each kind of operation wrote (`winefs stat`).
    pub accounting: Accounting,
    /// The alternate-slot zones' free lists and use order (`state::slots`).
    pub zones: Zones,
}

/// How many times [`MountState::relieve_removed_held`] tries the lock of an inode held
/// elsewhere, a millisecond apart.
const REMOVED_LOCK_TRIES: u32 = 20;

/// Where one allocation stands in [`MountState::wait_for_closing`].
#[derive(Default)]
struct ClosingWait {
    /// When it began to wait.
    since: Option<Instant>,
    /// It tried once more after what it waited for had ended.
    retried: bool,
}

/// What ran short, for [`MountState::relieve_removed_held`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Short {
    /// Data blocks: regular files are freed (a directory's few blocks are not worth its
    /// holder's ESTALE).
    Blocks,
    /// Inode numbers: any kind is freed.
    Inodes,
}

/// What [`MountState::relieve_removed_held`] gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relieved {
    /// Data blocks.
    pub blocks: u64,
    /// Inode numbers (files freed).
    pub inodes: u64,
}

/// Whether the state of file `n` can be dropped and rebuilt from media later without losing
/// anything: nothing else holds it (the map's write lock, which the caller holds, is the only
/// way to a new reference), and none of its DRAM-only state is live.
fn idle(n: &InodeRef) -> bool {
    if Arc::strong_count(n) != 1 {
        return false;
    }
    let Some(g) = crate::state::inode_state::try_rlock(n) else {
        return false;
    };
    !g.is_dir()
        && g.hdr.nlink > 0
        && g.open == 0
        && g.maps.is_empty()
        && g.leases == 0
        && g.appenders == 0
        && g.quarantine.is_empty()
        && g.slots.is_empty()
        && g.spec.is_none()
}

impl MountState {
    /// Refuse operations on an unmounted or poisoned mount.
    pub fn check_alive(&self) -> Result<()> {
        if self.unmounted.load(Ordering::Relaxed) {
            return Err(Error::Invalid("the file system has been unmounted".into()));
        }
        // First: a failed write to the disk poisons the mount too, and is its cause.
        self.pool.check_durable()?;
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
        self.seal_index_blocks(&mut tx)
            .and_then(|()| self.seal_inodes(&mut tx))
            .inspect_err(|_| self.poison())?;
        self.journals
            .commit(&self.pool, tx, current_cpu())
            .inspect_err(|_| self.poison())
    }

    /// Add to `tx` the new checksum of every in-use inode it changes (`checksum::inode_checksum`
    /// of the inode as the transaction leaves it), so the checksum commits with the change. A
    /// change of the times alone leaves the checksum as it is. An inode that fails its checksum
    /// as it stands (damage that appeared since mount) is never resealed: the transaction is
    /// refused and the pool flagged "needs fsck".
    fn seal_inodes(&self, tx: &mut Tx<'_>) -> Result<()> {
        let g = &self.geo;
        let table = g.inode_table_start * BLOCK_SIZE;
        let table_end = table + g.total_inodes() * INODE_SIZE;
        // Usually one or two inodes: a sorted, deduplicated list beats a set, and up to eight
        // of them live on the stack (a commit takes no allocation for them).
        let mut touched = InoList::default();
        // The times (`ATIME..RDEV`) are outside the checksum: a write of only those leaves it.
        let times = layout::ino::ATIME as u64..layout::ino::RDEV as u64;
        for (off, len) in tx.targets() {
            let (a, b) = (off.max(table), (off + len).min(table_end));
            if a < b {
                for ino in (a - table) / INODE_SIZE + 1..=(b - 1 - table) / INODE_SIZE + 1 {
                    let start = table + (ino - 1) * INODE_SIZE;
                    let (ra, rb) = (a.max(start) - start, b.min(start + INODE_SIZE) - start);
                    if !(times.start <= ra && rb <= times.end) {
                        touched.push(ino);
                    }
                }
            }
        }
        for &ino in touched.sorted_unique() {
            let off = self.inode_off(ino);
            let mut raw = [0u8; layout::INODE_BYTES];
            self.pool.read(off, &mut raw)?;
            // Never seal damage: an in-use inode must match its checksum before the change
            // (those mount found damaged are repair's to judge, and it seals them itself).
            if InodeHeader::decode(&raw).in_use()
                && !checksum::inode_checksum_ok(&raw)
                && !self.damaged_inodes.contains(&ino)
            {
                return Err(self.inode_damage(ino));
            }
            tx.overlay(off, &mut raw);
            let crc = checksum::inode_checksum(&raw);
            if InodeHeader::decode(&raw).in_use() && layout::get_u32(&raw, layout::ino::CRC) != crc {
                tx.write_copy(off + layout::ino::CRC as u64, &crc.to_le_bytes(), Category::Metadata);
            }
        }
        Ok(())
    }

    /// Add to `tx` the new checksum of every extent-index block it asked to seal
    /// (`checksum::index_block_checksum` of the block as the transaction leaves it, with the
    /// owner's `map_end` as the transaction leaves that). A block that fails its checksum as it
    /// stands (damage a fsck or repair mount loaded, or that appeared since mount) is never
    /// resealed: the transaction is refused and the pool flagged "needs fsck". A transaction that touches no index block reads
    /// nothing here.
    fn seal_index_blocks(&self, tx: &mut Tx<'_>) -> Result<()> {
        for (block, ioff) in tx.take_index_seals() {
            let mut inode = [0u8; layout::INODE_BYTES];
            self.pool.read(ioff, &mut inode)?;
            let map_end_now = layout::get_u64(&inode, layout::ino::MAP_END);
            tx.overlay(ioff, &mut inode);
            if !InodeHeader::decode(&inode).in_use() {
                continue; // freed with its blocks
            }
            let map_end = layout::get_u64(&inode, layout::ino::MAP_END);
            let off = block * BLOCK_SIZE;
            let mut raw = vec![0u8; layout::BLOCK_BYTES];
            self.pool.read(off, &mut raw)?;
            if !checksum::index_block_checksum_ok(block, &raw, map_end_now) {
                return Err(self.index_block_damage(block));
            }
            tx.overlay(off, &mut raw);
            let crc = checksum::index_block_checksum(block, &raw, map_end);
            if layout::get_u32(&raw, layout::index_block::CRC) != crc {
                tx.write_copy(
                    off + layout::index_block::CRC as u64,
                    &crc.to_le_bytes(),
                    Category::Metadata,
                );
            }
        }
        Ok(())
    }

    /// Every in-use inode, as of now (a snapshot of the table, no inode locked). Inodes the
    /// mount left on media are loaded first: this is for fsck, repair and compaction, which
    /// look at every file.
    pub fn all_inodes(&self) -> Result<Vec<InodeRef>> {
        // The order `insert_loaded` takes them in: the shards (all of them here), the load
        // order, the inodes left on media.
        let mut shards = self.inodes.write_all();
        let mut order = lock(&self.loaded_order);
        let mut left = lock(&self.on_media);
        while let Some(ino) = left.next_from(0) {
            let node = self.rebuild(ino)?;
            left.remove(ino);
            if !rlock(&node).is_dir() {
                self.loaded_files.fetch_add(1, Ordering::Relaxed);
            }
            shards[InodeTable::shard_index(ino)].insert(ino, node);
            // Dropped again by later loads once idle (none is dropped here: the caller wants
            // them all).
            order.push_back(ino);
        }
        Ok(shards.iter().flat_map(|m| m.values().cloned()).collect())
    }

    /// The state of in-use inode `ino`, built from its table slot (`inode_load`). Its times may
    /// have been read before the state was last dropped: the next write stores fine-grained
    /// ones, so the change shows (as `MountState::attr` would have asked).
    fn rebuild(&self, ino: u64) -> Result<InodeRef> {
        let node = load_after_mount(&self.pool, &self.geo, ino)?;
        node.times_queried.store(true, Ordering::Relaxed);
        Ok(InodeCell::new_ref(node))
    }

    /// The in-use inodes loaded into DRAM (what DRAM-only state, such as quarantined blocks or
    /// live mappings, can be found on).
    pub fn loaded_inodes(&self) -> Vec<InodeRef> {
        self.inodes.values()
    }

    /// The in-use inode `ino` (`Stale` if it is not in use), loaded from its table slot on its
    /// first use after mount.
    pub fn inode(&self, ino: u64) -> Result<InodeRef> {
        if let Some(n) = self.inodes.get(ino) {
            return Ok(n);
        }
        let mut map = self.inodes.write(ino);
        // Another thread may have loaded it while this one waited for the lock.
        if let Some(n) = map.get(&ino) {
            return Ok(n.clone());
        }
        let mut left = lock(&self.on_media);
        if !left.contains(ino) {
            return Err(Error::Stale(ino));
        }
        let node = self.rebuild(ino)?;
        left.remove(ino);
        drop(left);
        self.insert_loaded(&mut map, ino, node.clone());
        Ok(node)
    }

    /// Add a new or loaded inode's state to the table (`map`: its shard, write-locked by the
    /// caller); past `cached_inodes` file states, drop a few idle ones. An idle state in
    /// another shard is dropped only if that shard is free now (waiting for it while holding
    /// this one could deadlock); otherwise it goes to the back like a busy one.
    pub(crate) fn insert_loaded(&self, map: &mut InoMap<InodeRef>, ino: u64, node: InodeRef) {
        let is_dir = rlock(&node).is_dir();
        map.insert(ino, node);
        if is_dir {
            return;
        }
        let loaded = self.loaded_files.fetch_add(1, Ordering::Relaxed) + 1;
        let mut order = lock(&self.loaded_order);
        order.push_back(ino);
        // Files freed since they were loaded stay in the order until they come up (finding
        // where they are would cost a walk), and a number freed and reused is there twice; a
        // churn of creates and unlinks below the cap would let them pile up, so they are swept
        // out once they are as many as the states (the newest entry of a number is kept).
        if order.len() > 2 * loaded + 1024 {
            let mut seen = std::collections::HashSet::with_capacity(loaded);
            let kept: Vec<u64> = order
                .iter()
                .rev()
                .copied()
                .filter(|&i| {
                    seen.insert(i)
                        && match InodeTable::same_shard(i, ino) {
                            true => map.contains_key(&i),
                            // A shard busy now keeps its entries until the next sweep.
                            false => self.inodes.try_contains(i).unwrap_or(true),
                        }
                })
                .collect();
            order.clear();
            order.extend(kept.into_iter().rev());
        }
        // Two drops per load keep the count at the cap; a state still in use goes to the back
        // (a second chance), and at most eight are looked at per call. Entries of freed files
        // are not counted: the sweep above bounds them.
        let (mut dropped, mut looked) = (0, 0);
        while looked < 8 {
            if self.loaded_files.load(Ordering::Relaxed) <= self.cached_inodes || dropped == 2 {
                break;
            }
            let Some(old) = order.pop_front() else { break };
            let mut other = None;
            let shard: &mut InoMap<InodeRef> = if InodeTable::same_shard(old, ino) {
                map
            } else {
                match self.inodes.try_write(old) {
                    Some(g) => std::ops::DerefMut::deref_mut(other.insert(g)),
                    None => {
                        looked += 1;
                        order.push_back(old);
                        continue;
                    }
                }
            };
            let Some(n) = shard.get(&old) else {
                continue; // freed, or dropped already
            };
            looked += 1;
            match idle(n) {
                true => {
                    shard.remove(&old);
                    self.loaded_files.fetch_sub(1, Ordering::Relaxed);
                    lock(&self.on_media).insert(old);
                    dropped += 1;
                }
                false => order.push_back(old),
            }
        }
    }

    /// Whether `node` is still the in-use inode `ino` (not freed after it was looked up: a
    /// freed inode keeps its old map in DRAM, but its blocks are free already).
    pub fn still_live(&self, ino: u64, node: &InodeRef) -> bool {
        self.inodes.holds(ino, node)
    }

    /// Allocate `nblocks` data blocks on the current CPU's partition (stealing if it is full).
    /// Before it reports no space, speculative preallocation of other files is taken back
    /// (`ops::prealloc`), and files removed while their caller held them are freed
    /// (`state::removed_held`: a FUSE unlink's blocks come back at the kernel's FORGET, which
    /// may come after the caller's next write), so `NoSpace` means the blocks are not there. With a `goal`, the free
    /// blocks from there on are taken first, the rest where the file has room
    /// (`Allocator::alloc_from`).
    pub fn alloc_blocks(&self, nblocks: u64, goal: Option<Goal>) -> Result<Vec<BlockRun>> {
        let mut waiting = ClosingWait::default();
        loop {
            let got = match goal {
                Some(g) => self.alloc.alloc_from(nblocks, g, current_cpu()),
                None => self.alloc.alloc(nblocks, current_cpu()),
            };
            match got {
                Ok(runs) => {
                    // Space running short while the zones hold units lent from it: the
                    // background worker gives them back (waiting for inode locks as needed).
                    if self.zones_pressed(0)
                        && !self.zones.write_back_asked.swap(true, Ordering::AcqRel)
                    {
                        self.background.queue_write_back();
                    }
                    return Ok(runs);
                }
                Err(e) => {
                    let short = nblocks.saturating_sub(e.free).max(1);
                    if self.alloc.relieve(short) == 0
                        && self.relieve_removed_held(Short::Blocks).blocks == 0
                        && !self.wait_for_closing(&mut waiting)
                    {
                        return Err(Error::NoSpace(e.to_string()));
                    }
                }
            }
        }
    }

    /// The blocks an allocation could take ([`Allocator::available_blocks`]), for a caller about
    /// to refuse a request of `wanted` blocks when they are fewer: files removed under a
    /// caller's hold are freed first, as [`MountState::alloc_blocks`] frees them.
    pub fn available_blocks_for(&self, wanted: u64) -> u64 {
        let mut waiting = ClosingWait::default();
        loop {
            let available = self.alloc.available_blocks();
            if available >= wanted
                || (self.relieve_removed_held(Short::Blocks).blocks == 0
                    && !self.wait_for_closing(&mut waiting))
            {
                return available;
            }
        }
    }

    /// Space ran short while another thread frees a removed file: a hold given up is being
    /// released (the kernel's FORGET), or a file open handles held was removed within
    /// [`RemovedHeld::closing_wait`] (its RELEASE, which frees it, may be in another thread's
    /// hands). A program that closes a file, removes it and at once allocates its space gets
    /// there first now and then. Waits a millisecond and says to try again, until that while
    /// has passed since the first wait, however long the tries between took; once the free it
    /// waited for has ended, says to try once more (its blocks may have come back between the
    /// caller's try and this look).
    fn wait_for_closing(&self, waiting: &mut ClosingWait) -> bool {
        let window = self.removed_held.closing_wait();
        let releasing = self.removed_held.releasing();
        if !releasing && !self.removed_held.removed_open_within(window) {
            let again = waiting.since.is_some() && !waiting.retried;
            waiting.retried = true;
            return again;
        }
        let since = *waiting.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= window {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
        true
    }

    /// Space ran `short`: free every inode a removal kept for its caller
    /// (`state::removed_held`) that only its hold keeps open (no handle, no mapping, no lease):
    /// the regular files when data blocks ran short, every kind when inode numbers did (a
    /// directory removed while it was a process's working directory is kept too, and holds a
    /// number as a file does). An inode locked elsewhere is tried again for a while and then
    /// skipped, so this never waits for good whatever locks the caller holds. Returns the
    /// blocks and inode numbers that came back.
    pub(crate) fn relieve_removed_held(&self, short: Short) -> Relieved {
        let before = self.alloc.free_blocks();
        let mut inodes = 0;
        for ino in self.removed_held.snapshot() {
            if write_locked_here(ino) {
                // The caller's own file (a write to a file it removed while open): not only
                // the hold keeps it, and its lock would never come free while this waits.
                continue;
            }
            let Ok(node) = self.inode(ino) else {
                continue;
            };
            // Its lock may be held by the thread letting it go (then it is being freed anyway) or
            // by one reading it: tried again a millisecond apart, a few times, never waited for.
            let mut g = None;
            for _ in 0..REMOVED_LOCK_TRIES {
                g = try_wlock(&node);
                if g.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let Some(mut g) = g else {
                log::debug!("space pressure: removed inode {ino} stays locked: not freed early");
                continue;
            };
            let only_the_hold = g.open == 1 && g.maps.is_empty() && g.leases == 0;
            if !self.still_live(ino, &node)
                || (short == Short::Blocks && g.kind() != FileKind::File)
                || g.hdr.nlink != 0
                || !only_the_hold
                || self.is_read_only()
                || !self.removed_held.take(ino)
            {
                continue;
            }
            g.open = 0;
            if let Err(e) = self.free_inode(&mut g) {
                log::warn!("space pressure: cannot free removed inode {ino}: {e}");
                break;
            }
            inodes += 1;
        }
        let blocks = self.alloc.free_blocks().saturating_sub(before);
        if inodes > 0 {
            log::debug!(
                "space pressure: {inodes} removed files ({blocks} blocks) freed before their FORGET"
            );
        }
        Relieved { blocks, inodes }
    }

    /// The space figures that decide lending units to the slot zones and asking them back.
    pub(crate) fn room(&self) -> Room {
        Room {
            data_blocks: self.geo.data_blocks,
            free: self.alloc.free_blocks(),
            free_aligned: self.alloc.free_aligned_blocks(),
            lent: self.zones.unit_blocks(),
        }
    }

    /// Whether the slot zones hold units lent from free space that should go back before
    /// `blocks` more are allocated ([`Room::pressed`]: space or free aligned extents short);
    /// the background worker gives them back (`slots::shrink`), and may wait for inode locks.
    pub(crate) fn zones_pressed(&self, blocks: u64) -> bool {
        self.room().pressed(blocks)
    }

    /// Give blocks back to the allocator (after the transaction that stopped using them).
    pub fn free_runs(&self, runs: &[BlockRun]) {
        if let Err(e) = self.alloc.free_all(runs) {
            // A double free means the DRAM indexes disagree with themselves.
            self.poison();
            log::error!("allocator refused a free: {e}");
        }
        // Frees are what leave holes behind; compaction starts from here when they pile up.
        let freed: u64 = runs.iter().map(|r| r.len).sum();
        if freed > 0 {
            self.background.note_freed(&self.alloc, freed);
        }
    }

    /// A free inode number, from the current CPU's partition if it has one.
    /// Before it reports none, files removed under a caller's hold are freed, or waited for
    /// while another thread frees them, as [`MountState::alloc_blocks`] does: an unlink's inode
    /// number comes back at the kernel's FORGET, which may come after the caller's next create.
    pub fn alloc_inode_number(&self) -> Result<u64> {
        let mut waiting = ClosingWait::default();
        loop {
            if let Some(i) = self.any_inode_number() {
                return Ok(i);
            }
            if self.relieve_removed_held(Short::Inodes).inodes == 0
                && !self.wait_for_closing(&mut waiting)
            {
                return Err(Error::NoSpace("no free inodes".into()));
            }
        }
    }

    /// A free inode number: [`MountState::alloc_inode_number`] without freeing anything.
    fn any_inode_number(&self) -> Option<u64> {
        let n = self.inode_free.len();
        let local = current_cpu() % n;
        if let Some(i) = self.take_inode_number(local) {
            return Some(i);
        }
        // Steal from the fullest partition; the lengths are read without holding every lock,
        // so if that one emptied meanwhile fall back to any partition that still has one.
        let best = (0..n)
            .max_by_key(|&p| lock(&self.inode_free[p]).len())
            .unwrap_or(0);
        if let Some(i) = self.take_inode_number(best) {
            return Some(i);
        }
        (0..n).find_map(|p| self.take_inode_number(p))
    }

    /// A free inode number of partition `p`: the lowest, or with wear-aware allocation the next
    /// one after the last taken (wrapping), so churn spreads over the inode table instead of
    /// rewriting the same inode slot.
    fn take_inode_number(&self, p: usize) -> Option<u64> {
        let mut free = lock(&self.inode_free[p]);
        let Some(cursor) = self.inode_cursor.get(p) else {
            return free.pop_first();
        };
        let c = cursor.load(Ordering::Relaxed);
        let i = free.next_from(c).or_else(|| free.next_from(0))?;
        free.remove(i);
        cursor.store(i + 1, Ordering::Relaxed);
        Some(i)
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

    /// Commit `size` as the size of `g`'s inode, which has a checked size word
    /// (`layout::INODE_SIZE_CHECKED`), with no journal: one atomic 8-byte store of the word
    /// (it carries its own check bits and lies outside the inode checksum), the write times
    /// beside it, then a fence. The caller has made everything the new size exposes durable
    /// first.
    pub(crate) fn commit_size(&self, g: &mut InodeState, size: u64) -> Result<()> {
        self.commit_size_word(g, layout::checked_size_word(g.hdr.generation, size))
    }

    /// [`MountState::commit_size`] with the word already made by `layout::checked_size_word`
    /// for `g`'s generation: an append makes it before its data's fence, while the data drains.
    pub(crate) fn commit_size_word(&self, g: &mut InodeState, word: u64) -> Result<()> {
        debug_assert!(g.hdr.flags & layout::INODE_SIZE_CHECKED != 0);
        let size = word & layout::CHECKED_SIZE_MASK;
        debug_assert_eq!(word, layout::checked_size_word(g.hdr.generation, size));
        self.pool.store_u64_flush(
            self.inode_off(g.ino) + layout::ino::SIZE as u64,
            word,
            Category::Metadata,
        )?;
        g.hdr.size = size;
        self.store_write_times(g)?;
        self.pool.fence();
        self.pool.check_durable()
    }

    /// A data write's times: the modification and change times become now, stored in the inode
    /// in place (16 bytes, outside the checksummed header, as every data write stores them)
    /// and written back, durable at the caller's next fence; and in DRAM.
    ///
    /// "Now" is multigrain, as the kernel keeps it for ext4 and tmpfs: the clock tick's time
    /// (`sys::coarse_now_ns`) unless someone read the times since they last changed, then the
    /// fine-grained clock, so a change after a look always shows. Times already equal to the
    /// tick's are not stored again: a stream of writes within one tick stores them once.
    pub(crate) fn store_write_times(&self, g: &mut InodeState) -> Result<()> {
        let now = self.change_time(&[&*g]);
        self.times_changed(g);
        if g.hdr.mtime == now && g.hdr.ctime == now {
            return Ok(());
        }
        let mut times = [0u8; 16];
        times[..8].copy_from_slice(&now.to_le_bytes());
        times[8..].copy_from_slice(&now.to_le_bytes());
        self.pool
            .write_flush(self.inode_off(g.ino) + layout::ino::MTIME as u64, &times, Category::Metadata)?;
        g.hdr.mtime = now;
        g.hdr.ctime = now;
        const _: () = assert!(layout::ino::MTIME + 8 == layout::ino::CTIME);
        Ok(())
    }

    /// The time an operation that changes `nodes` gives them (mtime, ctime), multigrain: the
    /// clock tick's (`sys::coarse_now_ns`), or, if anyone read the attributes of any of them
    /// since their times last changed, the fine-grained clock, different from every time they
    /// hold — so a change after a look always shows, and a stream of changes nobody looks
    /// at rewrites the times once per tick (a header change of times alone to an equal value
    /// writes nothing). Once the change has committed, [`MountState::times_changed`] clears
    /// the nodes' `times_queried`.
    pub(crate) fn change_time(&self, nodes: &[&InodeState]) -> i64 {
        let queried = nodes
            .iter()
            .any(|n| n.times_queried.load(std::sync::atomic::Ordering::Relaxed));
        if !queried {
            return self.now_coarse();
        }
        // The clock's time, nudged past any time just seen that it equals (a clock coarser
        // than a nanosecond); a time set ahead of the clock (utimensat) is simply replaced.
        let mut t = self.now_fine();
        while nodes.iter().any(|n| n.hdr.mtime == t || n.hdr.ctime == t) {
            t = t.saturating_add(1);
        }
        t
    }

    /// The time now, to the clock's full resolution; coarse times given later are never
    /// earlier.
    pub(crate) fn now_fine(&self) -> i64 {
        let t = crate::sys::now_ns();
        self.fine_floor.fetch_max(t, std::sync::atomic::Ordering::Relaxed);
        t
    }

    /// The time now at clock-tick resolution (`sys::coarse_now_ns`), but never earlier than a
    /// time [`MountState::now_fine`] gave: what a file's times become when nobody has looked
    /// at them since their last change (multigrain timestamps, Linux 6.13 and later).
    pub(crate) fn now_coarse(&self) -> i64 {
        crate::sys::coarse_now_ns().max(self.fine_floor.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The times of `n` changed (committed): nobody has seen them yet.
    pub(crate) fn times_changed(&self, n: &InodeState) {
        n.times_queried.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// The attributes of an inode.
    pub fn attr(&self, n: &InodeState) -> Attr {
        // The caller sees the times: the next write must change them visibly.
        n.times_queried.store(true, std::sync::atomic::Ordering::Relaxed);
        let h = &n.hdr;
        let extra = n.map.index_blocks().len() as u64 + u64::from(h.xattr_block != 0);
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
            // Speculative preallocation and the units the slot zones grew into are given back
            // on demand, so writes can use them.
            free_blocks: self.alloc.available_blocks(),
            preallocated_blocks: self.alloc.speculative_blocks() - self.zones.unit_blocks(),
            zone_blocks: self.zones.unit_blocks(),
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

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::fs::Fs;
    use crate::media::checksum;
    use crate::media::pool::Category;
    use crate::media::layout::{BLOCK_BYTES, BLOCK_SIZE, INODE_BYTES, get_u64, index_block, ino};
    use crate::types::{MkfsOptions, MountOptions};

    const B: u64 = BLOCK_SIZE;

    fn fresh() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        Fs::mkfs(
            &p,
            &MkfsOptions {
                size: Some(48 << 20),
                partitions: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        (d, p)
    }

    fn opts() -> MountOptions {
        MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        }
    }

    /// The extent-index chain of `ino` on media, each block checked against its checksum with
    /// the inode's `map_end` on media; returns the chain.
    fn sealed_chain(fs: &Fs, ino: u64) -> Vec<u64> {
        let pool = fs.pool();
        let mut raw = [0u8; INODE_BYTES];
        pool.read(fs.geometry().inode_offset(ino).unwrap(), &mut raw)
            .unwrap();
        let map_end = get_u64(&raw, ino::MAP_END);
        let mut chain = Vec::new();
        let mut next = get_u64(&raw, ino::INDEX_BLOCK);
        while next != 0 {
            let mut blk = vec![0u8; BLOCK_BYTES];
            pool.read(next * B, &mut blk).unwrap();
            assert!(
                checksum::index_block_checksum_ok(next, &blk, map_end),
                "index block {next} of inode {ino} is not sealed (map end {map_end})"
            );
            chain.push(next);
            next = get_u64(&blk, index_block::NEXT);
        }
        chain
    }

    /// `n` one-block extents at logical blocks 0, 2, 4, ... (holes keep them apart).
    fn fragmented(fs: &Fs, n: u64) -> u64 {
        let ino = fs.create(fs.root(), b"frag", 0o644, 0, 0).unwrap().ino;
        for k in 0..n {
            fs.write(ino, 2 * k * B, &[(k % 255) as u8 + 1; 100]).unwrap();
        }
        ino
    }

    #[test]
    fn index_blocks_stay_sealed_through_every_map_change() {
        let (_d, p) = fresh();
        let fs = Fs::mount(&p, opts()).unwrap();
        // 600 writes: more extents than the 8 inline slots and one index block hold.
        let ino = fragmented(&fs, 600);
        assert!(sealed_chain(&fs, ino).len() >= 2);
        // Truncate kills records in the last two blocks by `map_end` alone.
        fs.truncate(ino, 2 * 300 * B).unwrap();
        sealed_chain(&fs, ino);
        // A punch across records of every block, a collapse and an insert.
        fs.punch_hole(ino, 2 * B, 2 * 280 * B).unwrap();
        sealed_chain(&fs, ino);
        fs.collapse_range(ino, 4 * B, 8 * B).unwrap();
        sealed_chain(&fs, ino);
        fs.insert_range(ino, 2 * B, 4 * B).unwrap();
        sealed_chain(&fs, ino);
        fs.zero_range(ino, 0, 40 * B, false).unwrap();
        sealed_chain(&fs, ino);
        // Growing again reuses the slots the truncate freed.
        for k in 300..500 {
            fs.write(ino, 2 * k * B, &[7; 10]).unwrap();
        }
        sealed_chain(&fs, ino);
        assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
        let size = fs.getattr(ino).unwrap().size;
        let mut before = vec![0u8; size as usize];
        fs.read(ino, 0, &mut before).unwrap();
        fs.unmount().unwrap();
        let fs = Fs::mount(&p, opts()).unwrap();
        sealed_chain(&fs, ino);
        assert!(fs.check().is_clean());
        let mut after = vec![0u8; size as usize];
        fs.read(ino, 0, &mut after).unwrap();
        assert!(before == after, "content changed across the remount");
    }

    #[test]
    fn dead_records_a_truncate_left_behind_keep_the_checksum_valid() {
        let (_d, p) = fresh();
        let fs = Fs::mount(&p, opts()).unwrap();
        let ino = fragmented(&fs, 300);
        let chain = sealed_chain(&fs, ino);
        // Read a live record of the last index block before the truncate kills it.
        let last = *chain.last().unwrap();
        let mut blk = vec![0u8; BLOCK_BYTES];
        fs.pool().read(last * B, &mut blk).unwrap();
        let slot = (0..255)
            .map(|s| index_block::SLOTS + s * 16)
            .find(|&o| blk[o + 4..o + 8] != [0; 4])
            .unwrap();
        let rec = blk[slot..slot + 16].to_vec();
        fs.truncate(ino, 2 * B).unwrap();
        sealed_chain(&fs, ino);
        fs.unmount().unwrap();
        // As a crash between the truncate's commit and the zeroing of its dead slots leaves it:
        // the record is back, dead by `map_end`.
        let mut img = std::fs::read(&p).unwrap();
        let at = (last * B) as usize + slot;
        img[at..at + 16].copy_from_slice(&rec);
        std::fs::write(&p, &img).unwrap();
        let fs = Fs::mount(&p, opts()).unwrap();
        sealed_chain(&fs, ino);
        assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
        let mut z = [0u8; 16];
        fs.pool().read(last * B + slot as u64, &mut z).unwrap();
        assert_eq!(z, [0; 16], "mount zeroes the dead record");
        assert_eq!(fs.getattr(ino).unwrap().size, 2 * B);
    }

    #[test]
    fn damage_that_appears_under_a_mount_is_never_sealed() {
        let (_d, p) = fresh();
        let fs = Fs::mount(&p, opts()).unwrap();
        let ino = fragmented(&fs, 20);
        let b = sealed_chain(&fs, ino)[0];
        // A bit of the first record's physical block flips under the mount.
        let at = b * B + index_block::SLOTS as u64 + 8;
        let mut crc = [0u8; 4];
        fs.pool().read(b * B + index_block::CRC as u64, &mut crc).unwrap();
        let mut x = [0u8; 1];
        fs.pool().read(at, &mut x).unwrap();
        x[0] ^= 1;
        fs.pool().write_flush(at, &x, Category::Metadata).unwrap();
        // A truncate killing the block's records would seal it: refused instead.
        let e = fs.truncate(ino, 0).unwrap_err();
        assert!(
            matches!(&e, Error::Corrupted(m) if m.contains(&format!("extent-index block {b} fails its checksum"))),
            "{e}"
        );
        let mut after = [0u8; 4];
        fs.pool().read(b * B + index_block::CRC as u64, &mut after).unwrap();
        assert_eq!(crc, after, "the damage was sealed");
        assert_eq!(fs.needs_fsck(), 3, "flagged \"needs fsck\"");
    }
}

