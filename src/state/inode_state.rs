//! The DRAM state of one inode: its header as on media, its extent map, its directory index,
//! its open count and its live memory mappings; and the lock that guards it.

use crate::media::alloc::{BlockRun, SpecHolding};
use crate::media::layout::{BLOCK_SIZE, FileKind, InodeHeader};
use crate::error::{Error, Result};
use crate::media::pool::Pool;
use crate::meta::dir::{DirEntryLoc, DirIndex, DirMedia};
use crate::meta::inode::FileMap;
use crate::state::mappings::MapState;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use crate::spin::taken;
use crate::state::locks;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// An inode in DRAM. Changed only under its lock, and only after the transaction that changes
/// its media copy has committed (so DRAM never runs ahead of what a crash would recover).
pub(crate) struct InodeState {
    pub ino: u64,
    /// The header, equal to the media copy between operations.
    pub hdr: InodeHeader,
    /// Logical block → extent, with the media slot of each extent.
    pub map: FileMap,
    /// Directories only: name → entry location, slot occupancy, readdir order. Boxed: most
    /// inodes are files, and an inline index would cost each of them its size.
    pub dir: Option<Box<DirIndex>>,
    /// Open handles; an unlinked inode lives until the last one is released.
    pub open: u32,
    /// Live memory mappings of this file; every change to its size or block map updates them.
    pub maps: Vec<Arc<MapState>>,
    /// Cached presence of the alignment hint xattr (None: not looked up yet).
    pub hugepage_hint: Option<bool>,
    /// The blocks mapped past the end of the file are speculative preallocation, registered
    /// with the allocator (`ops::prealloc`), and their count there; DRAM only, None after a
    /// remount.
    pub spec: Option<SpecHolding>,
    /// Made without a name and without `O_EXCL` (`ops::namespace::make_unnamed`), and not
    /// linked yet: a link may give it its first name. DRAM only (after a crash it is an orphan).
    pub linkable: bool,
    /// A truncate while the file was leased kept the blocks past its new end (`ops::file`):
    /// when the last lease goes they (and any other blocks then past the end) become
    /// speculative preallocation, given back as any is.
    pub kept_under_lease: bool,
    /// Direct-path leases held on this file by clients of the mount's channel (`ops::lease`):
    /// while any is held its blocks never move: truncate, punch hole and zero range keep them
    /// and zero bytes in place (`ops::file`), and blocks it frees otherwise (an unlinked
    /// file's) wait in `quarantine`.
    pub leases: u32,
    /// Of those, append leases (`state::appends`): clients that grow the file themselves.
    pub appenders: u32,
    /// Blocks the file stopped using while leased (a safety net: the operations that free
    /// blocks keep a leased file's instead): free on media, kept from the allocator until the
    /// last lease goes, so a client's stale mapping never reaches another file.
    pub quarantine: Vec<BlockRun>,
    /// Alternate slots holding the newest copy of lines of this file's blocks, by logical
    /// block (`state::slots`).
    pub slots: BTreeMap<u64, SlotRef>,
    /// Someone read the times since the last write stored them (`MountState::attr`): the next
    /// write stores fine-grained times, so the change shows (multigrain timestamps, as the
    /// kernel keeps for ext4); otherwise it stores the clock tick's, and nothing when they
    /// are already the tick's (`MountState::store_write_times`).
    pub times_queried: AtomicBool,
}

// What each loaded inode costs in DRAM besides what its fields point to (issue 18: DRAM per
// inode); `Fs::dram_usage` counts it, `examples/dram_per_file.rs` measures it.
const _: () = assert!(std::mem::size_of::<InodeState>() <= 256);

/// A file block's alternate slot (`state::slots`, `media::zone`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRef {
    /// Zone (partition) number.
    pub part: u32,
    /// Slot number in the zone.
    pub slot: u32,
    /// Pool block of the home (the file's block).
    pub home: u64,
    /// Lines newest in the slot.
    pub lines: u64,
    /// This slot is in the batch being copied home without the inode's lock (`Zones::copy`:
    /// `slots::hand_to_worker`, `slots::copy_in_background`): nothing may store into the block
    /// or free the slot until that copy is finished (`slots::finish_copy`).
    pub copying: bool,
}

impl InodeState {
    /// A freshly loaded or created inode: nothing open, nothing mapped.
    pub fn new(ino: u64, hdr: InodeHeader, map: FileMap, dir: Option<DirIndex>) -> InodeState {
        InodeState {
            ino,
            hdr,
            map,
            dir: dir.map(Box::new),
            open: 0,
            maps: Vec::new(),
            hugepage_hint: None,
            spec: None,
            linkable: false,
            kept_under_lease: false,
            leases: 0,
            appenders: 0,
            quarantine: Vec::new(),
            slots: BTreeMap::new(),
            times_queried: AtomicBool::new(false),
        }
    }
    /// Whether something maps the file's blocks where they are: a mapping of this process or a
    /// client's lease. Such a file is written in place, never copied on write.
    pub fn is_mapped(&self) -> bool {
        !self.maps.is_empty() || self.leases > 0
    }
    /// The file type (validated at mount, so the fallback is never taken).
    pub fn kind(&self) -> FileKind {
        self.hdr.kind().unwrap_or(FileKind::File)
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == FileKind::Dir
    }
    /// No links and no open handles, yet still in use: nothing can reach it any more, and it
    /// is freed (by the last release, or once a read-only mount is read-write again).
    pub fn unreachable_in_use(&self) -> bool {
        self.open == 0 && self.hdr.nlink == 0 && self.hdr.in_use()
    }
    /// A directory's index and where its entries live (`NotDir` for other inodes).
    pub fn dir_with_media<'a>(&'a self, pool: &'a Pool) -> Result<(&'a DirIndex, DirMedia<'a>)> {
        let d = self.dir.as_ref().ok_or(Error::NotDir)?;
        Ok((d, DirMedia { pool, map: &self.map, ino: self.ino }))
    }
    /// Where `name` lives in this directory, if it is there (`NotDir` for other inodes).
    pub fn find_name(&self, pool: &Pool, name: &[u8]) -> Result<Option<DirEntryLoc>> {
        let (d, media) = self.dir_with_media(pool)?;
        d.get(&media, name)
    }
    /// The first logical block past the end of the file.
    pub fn eof_block(&self) -> u64 {
        self.hdr.size.div_ceil(BLOCK_SIZE)
    }
    /// Blocks mapped at or past [`InodeState::eof_block`].
    pub fn blocks_past_eof(&self) -> u64 {
        let e = self.eof_block();
        self.map.mapped_blocks_in(e, self.hdr.map_end.max(e))
    }
    /// Every block the inode owns: mapped blocks, extent-index blocks, its xattr block.
    pub fn owned_runs(&self) -> Vec<BlockRun> {
        let mut runs = self.map.owned_runs();
        if self.hdr.xattr_block != 0 {
            runs.push(BlockRun {
                start: self.hdr.xattr_block,
                len: 1,
            });
        }
        runs
    }
}

/// An inode's state and its locks.
pub(crate) struct InodeCell {
    state: RwLock<InodeState>,
    /// Directories only (files have `None`): held by every writer of the state before
    /// `state`'s write lock, and by a name change in the directory (`DirChange`) from its first
    /// look until it has applied its edit. The name change holds `state` shared until its
    /// commit is durable, so lookups and readdir there do not wait for its commit; writers of
    /// the directory still wait for it here.
    changing: Option<Mutex<()>>,
}

/// A shared, locked inode.
pub(crate) type InodeRef = Arc<InodeCell>;

impl InodeCell {
    /// A loaded or new inode's state, unlocked.
    pub(crate) fn new_ref(n: InodeState) -> InodeRef {
        let changing = n.is_dir().then(Mutex::default);
        Arc::new(InodeCell { state: RwLock::new(n), changing })
    }
}

/// An inode locked for writing: its state's write lock and, for a directory, its name-change
/// mutex (released after the state's lock: fields drop in order).
pub(crate) struct InodeWriteGuard<'a> {
    g: RwLockWriteGuard<'a, InodeState>,
    _changing: Option<MutexGuard<'a, ()>>,
}

thread_local! {
    /// The inodes this thread holds locked for writing (a rename holds four at most): a thread
    /// short of space skips them among the files it could free
    /// (`MountState::relieve_removed_held`) instead of waiting for a lock it holds itself.
    static WRITE_LOCKED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl<'a> InodeWriteGuard<'a> {
    fn new(g: RwLockWriteGuard<'a, InodeState>, changing: Option<MutexGuard<'a, ()>>) -> Self {
        WRITE_LOCKED.with_borrow_mut(|v| v.push(g.ino));
        InodeWriteGuard { g, _changing: changing }
    }
}

impl Drop for InodeWriteGuard<'_> {
    fn drop(&mut self) {
        let ino = self.g.ino;
        WRITE_LOCKED.with_borrow_mut(|v| {
            if let Some(i) = v.iter().rposition(|&x| x == ino) {
                v.swap_remove(i);
            }
        });
    }
}

/// Whether this thread holds inode `ino` locked for writing ([`wlock`], [`try_wlock`]).
pub(crate) fn write_locked_here(ino: u64) -> bool {
    WRITE_LOCKED.with_borrow(|v| v.contains(&ino))
}

impl Deref for InodeWriteGuard<'_> {
    type Target = InodeState;
    fn deref(&self) -> &InodeState {
        &self.g
    }
}

impl DerefMut for InodeWriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut InodeState {
        &mut self.g
    }
}

/// Lock an inode for writing (a panic elsewhere does not make the state unusable: every
/// change is committed to media before DRAM follows; a contended lock is spun on a while
/// first, `locks::spin_then_block`).
pub(crate) fn wlock(n: &InodeRef) -> InodeWriteGuard<'_> {
    let changing = n.changing.as_ref().map(locks::lock_spinning);
    InodeWriteGuard::new(locks::write(&n.state), changing)
}

/// [`wlock`] if nothing holds the inode now.
pub(crate) fn try_wlock(n: &InodeRef) -> Option<InodeWriteGuard<'_>> {
    let changing = match &n.changing {
        Some(m) => Some(taken(m.try_lock())?),
        None => None,
    };
    Some(InodeWriteGuard::new(taken(n.state.try_write())?, changing))
}

/// Lock an inode for reading.
pub(crate) fn rlock(n: &InodeRef) -> RwLockReadGuard<'_, InodeState> {
    locks::read(&n.state)
}

/// [`rlock`] if no writer holds the inode now.
pub(crate) fn try_rlock(n: &InodeRef) -> Option<RwLockReadGuard<'_, InodeState>> {
    taken(n.state.try_read())
}

/// A directory locked for a change of its names (create, unlink): its name-change mutex from
/// the start, so no other writer changes it, but its state only shared until
/// [`DirChange::upgrade`]: lookups and readdir go on while the change plans and commits, and
/// see the directory as it was before it. A file (no name-change mutex) is locked exclusively
/// from the start.
///
/// Whoever holds it must not take the directory's state lock again, and a reader of a
/// directory must not wait for another inode's lock while it holds the directory's: a name
/// change waits for the directory's readers when it upgrades, holding the locks of the other
/// inodes it changes.
pub(crate) enum DirChange<'a> {
    Shared {
        cell: &'a InodeCell,
        g: RwLockReadGuard<'a, InodeState>,
        changing: MutexGuard<'a, ()>,
    },
    Exclusive(InodeWriteGuard<'a>),
}

impl<'a> DirChange<'a> {
    /// Lock `n` for a change of its names.
    pub(crate) fn begin(n: &'a InodeRef) -> DirChange<'a> {
        match &n.changing {
            Some(m) => {
                let changing = locks::lock_spinning(m);
                DirChange::Shared { cell: n, g: locks::read(&n.state), changing }
            }
            None => DirChange::Exclusive(wlock(n)),
        }
    }

    /// The directory locked for writing: waits for its readers to leave (after the change's
    /// commit, so they saw its names as they were before it, never half changed).
    pub(crate) fn upgrade(self) -> InodeWriteGuard<'a> {
        match self {
            DirChange::Shared { cell, g, changing } => {
                drop(g);
                // No writer can come in between: every one takes `changing`, held here.
                InodeWriteGuard::new(locks::write(&cell.state), Some(changing))
            }
            DirChange::Exclusive(w) => w,
        }
    }
}

impl Deref for DirChange<'_> {
    type Target = InodeState;
    fn deref(&self) -> &InodeState {
        match self {
            DirChange::Shared { g, .. } => g,
            DirChange::Exclusive(w) => w,
        }
    }
}

/// Hashes inode numbers with one multiply and a shift. They are handed out by winefs, not
/// chosen by clients, so SipHash's resistance to chosen keys buys nothing on the map every
/// operation looks its inodes up in, and costs it tens of nanoseconds per lookup.
#[derive(Default, Clone, Copy)]
pub struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

/// A map keyed by inode number, hashed with [`InoHasher`].
pub type InoMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<InoHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::layout::InodeHeader;
    use crate::meta::inode::FileMap;

    fn cell(ino: u64) -> InodeRef {
        InodeCell::new_ref(InodeState::new(ino, InodeHeader::default(), FileMap::new(), None))
    }

    #[test]
    fn a_thread_knows_the_inodes_it_holds_locked_for_writing() {
        let (a, b) = (cell(3), cell(4));
        assert!(!write_locked_here(3));
        let ga = wlock(&a);
        let gb = try_wlock(&b).expect("free");
        assert!(write_locked_here(3) && write_locked_here(4));
        std::thread::scope(|s| {
            s.spawn(|| assert!(!write_locked_here(3), "another thread's lock"));
        });
        drop(ga);
        assert!(!write_locked_here(3) && write_locked_here(4));
        assert!(try_wlock(&a).is_some_and(|_| write_locked_here(3)));
        assert!(!write_locked_here(3), "the guard went with the expression");
        drop(gb);
        assert!(!write_locked_here(4));
        let _r = rlock(&a);
        assert!(!write_locked_here(3), "a read lock is not counted");
    }
}
