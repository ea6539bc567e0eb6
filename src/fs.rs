//! The file system: shared state, locking, namespace operations and the public API (`Fs`).
//!
//! Lock order (never acquired in the other direction): the namespace lock `ns` (shared for
//! lookups, exclusive for operations that change names) → inode locks (a namespace operation
//! locks every inode it touches, each once) → a journal's lock → an allocator partition's lock.
//! Data operations (read, write, truncate, fallocate, setattr, xattrs) take only their inode's
//! lock. Every operation that changes media builds one `Tx` and commits it before it changes the
//! DRAM indexes, so DRAM never runs ahead of what a crash would recover.

use crate::alloc::{Allocator, BlockRun};
use crate::dir::{self, DirEntryLoc, DirIndex};
use crate::error::{Error, Result};
use crate::inode::{self, FileMap, MapUpdate};
use crate::journal::{Journals, Tx};
use crate::layout::{
    self, BLOCK_SIZE, FileKind, Geometry, INODE_IN_USE, INODE_SIZE, InodeHeader, NAME_MAX,
    ROOT_INO, SYMLINK_MAX, Superblock,
};
use crate::pool::{Category, PersistStats, Pool};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

/// Data guarantees, chosen at mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every data and metadata operation is atomic and durable when it returns.
    #[default]
    Strict,
    /// Metadata atomic and durable; data written in place.
    Relaxed,
}

/// Mount options.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub mode: Mode,
    /// Map the pool copy-on-write: recovery and every change stay in this process (fsck).
    pub private: bool,
    /// Do not rewrite fragmented files in the background (`Fs::rewrite` still works); for
    /// measuring fragmented layouts as they are.
    pub no_background_rewrite: bool,
}

/// mkfs options.
#[derive(Clone, Debug, Default)]
pub struct MkfsOptions {
    /// Pool size in bytes; required when the pool file does not exist yet.
    pub size: Option<u64>,
    /// Per-CPU partitions (default: CPUs, fewer for small pools).
    pub partitions: Option<u32>,
    /// Total inodes (default: one per 16 KiB of pool).
    pub inodes: Option<u64>,
    /// Format an existing file or device (its contents are lost).
    pub force: bool,
}

/// Attributes of an inode. Times are nanoseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte units allocated (data, extent index and xattr blocks).
    pub blocks: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    pub rdev: u32,
    pub generation: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(i64),
}

/// Attribute changes (setattr).
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (the file type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// One readdir entry; `offset` resumes after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
    pub offset: u64,
}

/// File-system statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u64,
    pub blocks: u64,
    pub free_blocks: u64,
    pub inodes: u64,
    pub free_inodes: u64,
    pub name_max: u32,
    pub free_aligned_extents: u64,
}

/// setxattr behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XattrSet {
    #[default]
    Any,
    /// Fail with EEXIST if present (XATTR_CREATE).
    Create,
    /// Fail with ENODATA if absent (XATTR_REPLACE).
    Replace,
}

/// rename flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// An inode in DRAM.
pub(crate) struct Node {
    pub ino: u64,
    pub hdr: InodeHeader,
    pub map: FileMap,
    pub dir: Option<DirIndex>,
    pub open: u32,
    /// Live memory mappings of this file; every change to its size or block map updates them.
    pub maps: Vec<Arc<crate::mmap::MapState>>,
    /// Cached presence of the alignment hint xattr (None: not looked up yet).
    pub hugepage_hint: Option<bool>,
}

impl Node {
    pub fn kind(&self) -> FileKind {
        self.hdr.kind().unwrap_or(FileKind::File)
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == FileKind::Dir
    }
}

pub(crate) type NodeRef = Arc<RwLock<Node>>;

/// Shared state of a mounted pool.
pub(crate) struct Inner {
    pub pool: Pool,
    pub geo: Geometry,
    pub sb: Superblock,
    pub journals: Journals,
    pub alloc: Allocator,
    pub inode_free: Vec<Mutex<BTreeSet<u64>>>,
    pub nodes: RwLock<HashMap<u64, NodeRef>>,
    pub ns: RwLock<()>,
    pub mode: Mode,
    pub poisoned: AtomicBool,
    pub unmounted: AtomicBool,
    pub mount_count: u64,
    pub generation: AtomicU32,
    pub recovery: crate::journal::RecoveryReport,
    /// The page-fault service of file mappings, started by the first `mmap`.
    pub faults: Mutex<Option<Arc<crate::mmap::FaultService>>>,
    /// The background rewriter, started by the first queued rewrite.
    pub rewriter: Mutex<Option<Arc<crate::rewrite::Rewriter>>>,
    /// This mount itself, for the threads it starts (they must not keep it alive).
    pub me: std::sync::OnceLock<std::sync::Weak<Inner>>,
    pub background_rewrite: bool,
}

/// A mounted winefs. Cheap to clone; all clones share one mount. Thread-safe.
#[derive(Clone)]
pub struct Fs {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 { 0 } else { c as usize }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn wlock(n: &NodeRef) -> RwLockWriteGuard<'_, Node> {
    n.write().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn rlock(n: &NodeRef) -> std::sync::RwLockReadGuard<'_, Node> {
    n.read().unwrap_or_else(|e| e.into_inner())
}

/// Validate a single path component.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong(name.len()));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!(
            "name {:?} contains '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Resources taken by an operation that are given back unless it commits.
pub(crate) struct Reserved<'a> {
    inner: &'a Inner,
    pub runs: Vec<BlockRun>,
    pub inodes: Vec<u64>,
}

impl<'a> Reserved<'a> {
    pub fn new(inner: &'a Inner) -> Self {
        Reserved {
            inner,
            runs: Vec::new(),
            inodes: Vec::new(),
        }
    }
    /// The operation committed: keep everything.
    pub fn keep(mut self) {
        self.runs.clear();
        self.inodes.clear();
    }
    pub fn alloc(&mut self, nblocks: u64) -> Result<Vec<BlockRun>> {
        let runs = self.inner.alloc_blocks(nblocks)?;
        self.runs.extend_from_slice(&runs);
        Ok(runs)
    }
    pub fn alloc_one(&mut self) -> Result<u64> {
        Ok(self.alloc(1)?[0].start)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        for r in self.runs.drain(..) {
            let _ = self.inner.alloc.free(r);
        }
        for i in self.inodes.drain(..) {
            self.inner.release_inode_number(i);
        }
    }
}

/// Directory changes of one namespace operation, applied to DRAM after commit.
#[derive(Default)]
struct DirEdit {
    /// starts-word pool offset → new value.
    starts: HashMap<u64, u64>,
    inserts: Vec<(u64, Vec<u8>, DirEntryLoc)>,
    removes: Vec<(u64, Vec<u8>)>,
    repoints: Vec<(u64, Vec<u8>, u64, FileKind)>,
    new_blocks: Vec<u64>,
}

impl Inner {
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

    /// Commit a transaction on the current CPU's journal. A failure here means DRAM state may
    /// have moved ahead of media, so the mount is poisoned.
    pub fn commit(&self, tx: Tx<'_>) -> Result<()> {
        self.journals
            .commit(&self.pool, tx, current_cpu())
            .inspect_err(|_| {
                self.poisoned.store(true, Ordering::Relaxed);
            })
    }

    pub fn node(&self, ino: u64) -> Result<NodeRef> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .cloned()
            .ok_or(Error::Stale(ino))
    }

    pub fn alloc_blocks(&self, nblocks: u64) -> Result<Vec<BlockRun>> {
        self.alloc
            .alloc(nblocks, current_cpu())
            .map_err(|e| Error::NoSpace(e.to_string()))
    }

    pub fn free_runs(&self, runs: &[BlockRun]) {
        for r in runs {
            if r.len > 0
                && let Err(e) = self.alloc.free(*r)
            {
                // A double free means the DRAM indexes disagree with themselves.
                self.poisoned.store(true, Ordering::Relaxed);
                eprintln!("winefs: allocator refused a free: {e}");
            }
        }
        // Frees are what leave holes behind; compaction starts from here when they pile up.
        let freed: u64 = runs.iter().map(|r| r.len).sum();
        if freed > 0 {
            crate::rewrite::maybe_compact(self, freed);
        }
    }

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

    pub fn release_inode_number(&self, ino: u64) {
        lock(&self.inode_free[self.geo.inode_partition(ino) as usize]).insert(ino);
    }

    pub fn inode_off(&self, ino: u64) -> u64 {
        self.geo
            .inode_offset(ino)
            .expect("inode numbers in DRAM are validated")
    }

    /// Journaled writes turning `old` into `new` for inode `ino`.
    pub fn header_tx(&self, tx: &mut Tx<'_>, ino: u64, old: &InodeHeader, new: &InodeHeader) {
        for (off, bytes) in layout::header_diff(self.inode_off(ino), old, new) {
            tx.write(off, bytes, Category::Metadata);
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

    /// Add a map update's slot and link writes to `tx`, and the first index block to `hdr`.
    pub fn map_tx(
        &self,
        tx: &mut Tx<'_>,
        map: &FileMap,
        ino: u64,
        upd: &MapUpdate,
        hdr: &mut InodeHeader,
    ) -> Result<()> {
        for (off, bytes) in inode::slot_pool_writes(&self.pool, map, self.inode_off(ino), upd)? {
            tx.write(off, bytes, Category::Metadata);
        }
        if let Some(b) = upd.first_index_block {
            hdr.index_block = b;
        }
        Ok(())
    }

    /// After commit: zero dead slots (unjournaled; they are already dead by `map_end`) and give
    /// freed blocks back.
    pub fn finish_map_update(&self, map: &FileMap, ino: u64, upd: &MapUpdate) -> Result<()> {
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
        self.free_runs(&upd.freed);
        Ok(())
    }

    pub fn attr(&self, n: &Node) -> Attr {
        let h = &n.hdr;
        let extra = n.map.index_blocks.len() as u64 + (h.xattr_block != 0) as u64;
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

    #[allow(clippy::too_many_arguments)]
    /// Plan inserting `name → ino` into directory `d`: writes the entry bytes into free slots
    /// (or a fresh block) unjournaled and records the journaled `starts` change in `edit`.
    fn plan_insert(
        &self,
        d: &mut Node,
        name: &[u8],
        ino: u64,
        kind: FileKind,
        edit: &mut DirEdit,
        tx: &mut Tx<'_>,
        res: &mut Reserved<'_>,
    ) -> Result<()> {
        let dino = d.ino;
        let n = layout::dentry_slots(name.len());
        // Slots claimed by earlier inserts of this same operation are not visible in the index
        // yet, so a second insert into one directory within one operation uses a fresh search
        // that skips them.
        let dirx = d.dir.as_mut().ok_or(Error::NotDir)?;
        let pending: Vec<(u32, u32, u32)> = edit
            .inserts
            .iter()
            .filter(|i| i.0 == dino)
            .map(|i| (i.2.block, i.2.slot, i.2.nslots))
            .collect();
        let mut found = None;
        if pending.is_empty() {
            found = dirx.find_space(name.len());
        }
        let (block, slot, phys) = match found {
            Some((b, s)) => (
                b,
                s,
                d.map
                    .lookup(b as u64)
                    .ok_or_else(|| {
                        Error::Corrupted(format!("directory {dino} block {b} unmapped"))
                    })?
                    .0,
            ),
            None => {
                // Blocks this transaction already added to this directory come after its last one.
                let added = edit.new_blocks.iter().filter(|&&d| d == dino).count() as u32;
                let b = dirx.blocks() + added;
                let phys = res.alloc_one()?;
                dir::init_dir_block(&self.pool, phys)?;
                let mut upd = MapUpdate::default();
                self.reserve_slots(res, &mut d.map, 1, &mut upd)?;
                d.map.remap(
                    b as u64,
                    1,
                    &[BlockRun {
                        start: phys,
                        len: 1,
                    }],
                    &mut upd,
                );
                let mut hdr = d.hdr.clone();
                self.map_tx(tx, &d.map, dino, &upd, &mut hdr)?;
                hdr.size = (b as u64 + 1) * BLOCK_SIZE;
                hdr.map_end = hdr.map_end.max(b as u64 + 1);
                self.header_tx(tx, dino, &d.hdr, &hdr);
                d.hdr = hdr;
                edit.new_blocks.push(dino);
                (b, 1, phys)
            }
        };
        let bytes = layout::encode_dentry(ino, kind, name);
        let off = dir::slot_offset(phys, slot);
        self.pool.write_flush(off, &bytes, Category::Metadata)?;
        let so = dir::starts_offset(phys);
        let cur = match edit.starts.get(&so) {
            Some(&w) => w,
            None if (block as usize) < dirx.starts.len() => dirx.starts[block as usize],
            None => 0,
        };
        edit.starts.insert(so, cur | (1u64 << slot));
        edit.inserts.push((
            dino,
            name.to_vec(),
            DirEntryLoc {
                ino,
                kind,
                block,
                slot,
                nslots: n,
            },
        ));
        Ok(())
    }

    fn plan_remove(&self, d: &Node, name: &[u8], edit: &mut DirEdit) -> Result<()> {
        let dirx = d.dir.as_ref().ok_or(Error::NotDir)?;
        let loc = *dirx.get(name).ok_or(Error::NotFound)?;
        let phys = d
            .map
            .lookup(loc.block as u64)
            .ok_or_else(|| {
                Error::Corrupted(format!("directory {} block {} unmapped", d.ino, loc.block))
            })?
            .0;
        let so = dir::starts_offset(phys);
        let cur = edit
            .starts
            .get(&so)
            .copied()
            .unwrap_or(dirx.starts[loc.block as usize]);
        edit.starts.insert(so, cur & !(1u64 << loc.slot));
        edit.removes.push((d.ino, name.to_vec()));
        Ok(())
    }

    fn plan_repoint(
        &self,
        d: &Node,
        name: &[u8],
        ino: u64,
        kind: FileKind,
        tx: &mut Tx<'_>,
        edit: &mut DirEdit,
    ) -> Result<()> {
        let dirx = d.dir.as_ref().ok_or(Error::NotDir)?;
        let loc = *dirx.get(name).ok_or(Error::NotFound)?;
        let phys = d
            .map
            .lookup(loc.block as u64)
            .ok_or_else(|| {
                Error::Corrupted(format!("directory {} block {} unmapped", d.ino, loc.block))
            })?
            .0;
        let bytes = layout::encode_dentry(ino, kind, name);
        tx.write(
            dir::slot_offset(phys, loc.slot),
            bytes[..layout::DENTRY_HEADER].to_vec(),
            Category::Metadata,
        );
        edit.repoints.push((d.ino, name.to_vec(), ino, kind));
        Ok(())
    }

    fn edit_tx(edit: &DirEdit, tx: &mut Tx<'_>) {
        for (&off, &w) in &edit.starts {
            tx.write(off, w.to_le_bytes().to_vec(), Category::Metadata);
        }
    }

    fn apply_edit(edit: DirEdit, guards: &mut HashMap<u64, RwLockWriteGuard<'_, Node>>) {
        for d in &edit.new_blocks {
            if let Some(dx) = guards.get_mut(d).and_then(|g| g.dir.as_mut()) {
                dx.push_block();
            }
        }
        for (d, name) in &edit.removes {
            if let Some(dx) = guards.get_mut(d).and_then(|g| g.dir.as_mut()) {
                dx.remove(name);
            }
        }
        for (d, name, loc) in &edit.inserts {
            if let Some(dx) = guards.get_mut(d).and_then(|g| g.dir.as_mut()) {
                dx.insert(name, *loc);
            }
        }
        for (d, name, ino, kind) in &edit.repoints {
            if let Some(dx) = guards.get_mut(d).and_then(|g| g.dir.as_mut()) {
                dx.repoint(name, *ino, *kind);
            }
        }
    }

    /// Free an inode whose last link went away and that nobody has open: one journaled write
    /// clears its in-use flag; its blocks go back after commit.
    fn free_inode_tx(&self, n: &Node, tx: &mut Tx<'_>) {
        let mut h = n.hdr.clone();
        h.flags &= !INODE_IN_USE;
        h.nlink = 0;
        self.header_tx(tx, n.ino, &n.hdr, &h);
    }

    /// After the transaction of `free_inode_tx` committed.
    fn forget_inode(&self, n: &Node) {
        let mut runs = n.map.owned_runs();
        if n.hdr.xattr_block != 0 {
            runs.push(BlockRun {
                start: n.hdr.xattr_block,
                len: 1,
            });
        }
        self.free_runs(&runs);
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n.ino);
        self.release_inode_number(n.ino);
    }

    fn lock_all<'a>(&self, arcs: &'a [(u64, NodeRef)]) -> HashMap<u64, RwLockWriteGuard<'a, Node>> {
        arcs.iter().map(|(i, a)| (*i, wlock(a))).collect()
    }

    fn arcs(&self, inos: &[u64]) -> Result<Vec<(u64, NodeRef)>> {
        let mut v: Vec<u64> = inos.to_vec();
        v.sort_unstable();
        v.dedup();
        v.into_iter().map(|i| Ok((i, self.node(i)?))).collect()
    }

    fn dir_lookup(&self, parent: u64, name: &[u8]) -> Result<DirEntryLoc> {
        let p = self.node(parent)?;
        let g = rlock(&p);
        let d = g.dir.as_ref().ok_or(Error::NotDir)?;
        d.get(name).copied().ok_or(Error::NotFound)
    }

    /// Create an inode of `kind` named `name` in `parent`.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        self.check_alive()?;
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::Exists);
        }
        let _ns = self.ns.write().unwrap_or_else(|e| e.into_inner());
        let p = self.node(parent)?;
        let mut pg = wlock(&p);
        let pdir = pg.dir.as_ref().ok_or(Error::NotDir)?;
        if pdir.get(name).is_some() {
            return Err(Error::Exists);
        }
        if pg.hdr.nlink == 0 {
            return Err(Error::NotFound); // parent was removed while we waited
        }
        if kind == FileKind::Dir && pg.hdr.nlink >= MAX_LINKS {
            return Err(Error::TooManyLinks);
        }
        let mut res = Reserved::new(self);
        let ino = self.alloc_inode_number()?;
        res.inodes.push(ino);
        let now = now_ns();
        let mut hdr = InodeHeader {
            flags: INODE_IN_USE,
            mode: kind.mode_bits() | (perm & 0o7777),
            uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            generation: self.generation.fetch_add(1, Ordering::Relaxed),
            parent: if kind == FileKind::Dir { parent } else { 0 },
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev,
            ..Default::default()
        };
        let mut map = FileMap::new();
        let ioff = self.inode_off(ino);
        let mut body = [0u8; INODE_SIZE as usize];
        if let Some(t) = target {
            let b = res.alloc_one()?;
            let off = b * BLOCK_SIZE;
            self.pool.write_flush(off, t, Category::Data)?;
            self.pool.zero_flush(
                off + t.len() as u64,
                BLOCK_SIZE - t.len() as u64,
                Category::Data,
            )?;
            let mut upd = MapUpdate::default();
            map.remap(0, 1, &[BlockRun { start: b, len: 1 }], &mut upd);
            for (slot, rec) in &upd.slot_writes {
                let o = (map.slot_offset(ioff, *slot) - ioff) as usize;
                body[o..o + 16].copy_from_slice(&rec.encode());
            }
            hdr.size = t.len() as u64;
            hdr.map_end = 1;
        }
        body[..128].copy_from_slice(&hdr.encode());
        // The inode slot is free, so everything but its first 32 bytes (which hold the in-use
        // flag) can be written without journaling.
        self.pool
            .write_flush(ioff + 32, &body[32..], Category::Metadata)?;
        let mut tx = Tx::new();
        tx.write(ioff, body[..32].to_vec(), Category::Metadata);
        let mut edit = DirEdit::default();
        self.plan_insert(&mut pg, name, ino, kind, &mut edit, &mut tx, &mut res)?;
        let mut ph = pg.hdr.clone();
        ph.mtime = now;
        ph.ctime = now;
        if kind == FileKind::Dir {
            inc_links(&mut ph);
        }
        self.header_tx(&mut tx, parent, &pg.hdr, &ph);
        Self::edit_tx(&edit, &mut tx);
        self.commit(tx)?;
        res.keep();
        pg.hdr = ph;
        let dir = (kind == FileKind::Dir).then(DirIndex::default);
        let mut node = Node {
            ino,
            hdr,
            map,
            dir,
            open: 0,
            maps: Vec::new(),
            hugepage_hint: None,
        };
        // Files created directly in a directory with the alignment hint inherit it (its own
        // transaction: the hint is advice, a crash may drop it without harm).
        if kind == FileKind::File && crate::xattr::hinted(self, &mut pg)? {
            crate::xattr::add_hint(self, &mut node)?;
        }
        let attr = self.attr(&node);
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, Arc::new(RwLock::new(node)));
        let mut guards = HashMap::new();
        guards.insert(parent, pg);
        Self::apply_edit(edit, &mut guards);
        Ok(attr)
    }

    fn unlink_impl(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        self.check_alive()?;
        check_name(name)?;
        if name == b"." {
            return Err(if want_dir {
                Error::Invalid("cannot remove '.'".into())
            } else {
                Error::IsDir
            });
        }
        if name == b".." {
            return Err(if want_dir {
                Error::NotEmpty
            } else {
                Error::IsDir
            });
        }
        let _ns = self.ns.write().unwrap_or_else(|e| e.into_inner());
        let loc = self.dir_lookup(parent, name)?;
        match (want_dir, loc.kind == FileKind::Dir) {
            (false, true) => return Err(Error::IsDir),
            (true, false) => return Err(Error::NotDir),
            _ => {}
        }
        let arcs = self.arcs(&[parent, loc.ino])?;
        let mut g = self.lock_all(&arcs);
        let now = now_ns();
        let mut tx = Tx::new();
        let mut edit = DirEdit::default();
        self.plan_remove(&g[&parent], name, &mut edit)?;
        let child = &g[&loc.ino];
        if want_dir && !child.dir.as_ref().is_some_and(|d| d.is_empty()) {
            return Err(Error::NotEmpty);
        }
        let mut ph = g[&parent].hdr.clone();
        ph.mtime = now;
        ph.ctime = now;
        if want_dir {
            dec_links(&mut ph);
        }
        self.header_tx(&mut tx, parent, &g[&parent].hdr, &ph);
        let mut ch = child.hdr.clone();
        ch.nlink = if want_dir {
            0
        } else {
            ch.nlink.saturating_sub(1)
        };
        ch.ctime = now;
        let free_now = ch.nlink == 0 && (want_dir || child.open == 0);
        if free_now {
            self.free_inode_tx(child, &mut tx);
        } else {
            self.header_tx(&mut tx, loc.ino, &child.hdr, &ch);
        }
        Self::edit_tx(&edit, &mut tx);
        self.commit(tx)?;
        g.get_mut(&parent).expect("locked").hdr = ph;
        {
            let c = g.get_mut(&loc.ino).expect("locked");
            c.hdr = ch;
            if free_now {
                c.hdr.flags &= !INODE_IN_USE;
                self.forget_inode(c);
            }
        }
        Self::apply_edit(edit, &mut g);
        Ok(())
    }

    /// True if `anc` is `d` or one of its ancestors (walks `parent` fields; caller holds `ns`).
    fn is_ancestor(&self, anc: u64, mut d: u64) -> Result<bool> {
        for _ in 0..=self.geo.total_inodes() {
            if d == anc {
                return Ok(true);
            }
            if d == ROOT_INO {
                return Ok(false);
            }
            d = rlock(&self.node(d)?).hdr.parent;
        }
        Err(Error::Corrupted("directory parent chain has a loop".into()))
    }

    fn rename_impl(
        &self,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.check_alive()?;
        check_name(n1)?;
        check_name(n2)?;
        if flags.noreplace && flags.exchange {
            return Err(Error::Invalid(
                "RENAME_NOREPLACE and RENAME_EXCHANGE together".into(),
            ));
        }
        if is_dot(n1) || is_dot(n2) {
            return Err(Error::Busy("cannot rename '.' or '..'".into()));
        }
        let _ns = self.ns.write().unwrap_or_else(|e| e.into_inner());
        let src = self.dir_lookup(p1, n1)?;
        let dst = match self.dir_lookup(p2, n2) {
            Ok(l) => Some(l),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        if flags.exchange && dst.is_none() {
            return Err(Error::NotFound);
        }
        if flags.noreplace && dst.is_some() {
            return Err(Error::Exists);
        }
        // Checks in Linux's order: the source may not be an ancestor of the target's directory
        // (EINVAL), the target may not be an ancestor of the source's directory (ENOTEMPTY, or
        // EINVAL for an exchange), then same-file, then the type rules.
        if p1 != p2 {
            if src.kind == FileKind::Dir && self.is_ancestor(src.ino, p2)? {
                return Err(Error::Invalid("cannot move a directory into itself".into()));
            }
            if let Some(d) = dst
                && d.kind == FileKind::Dir
                && self.is_ancestor(d.ino, p1)?
            {
                return Err(if flags.exchange {
                    Error::Invalid("cannot exchange a directory with its own descendant".into())
                } else {
                    Error::NotEmpty
                });
            }
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(()); // same file under both names: POSIX says do nothing
            }
            if !flags.exchange {
                match (src.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                    (true, false) => return Err(Error::NotDir),
                    (false, true) => return Err(Error::IsDir),
                    _ => {}
                }
            }
        }
        let mut inos = vec![p1, p2, src.ino];
        if let Some(d) = dst {
            inos.push(d.ino);
        }
        let arcs = self.arcs(&inos)?;
        let mut g = self.lock_all(&arcs);
        if let Some(d) = dst
            && !flags.exchange
            && d.kind == FileKind::Dir
            && !g[&d.ino].dir.as_ref().is_some_and(|x| x.is_empty())
        {
            return Err(Error::NotEmpty);
        }
        // A directory moving to a new parent adds a ".." link there, unless it replaces one.
        let dst_is_dir = dst.is_some_and(|d| d.kind == FileKind::Dir);
        if src.kind == FileKind::Dir && p1 != p2 && !dst_is_dir && g[&p2].hdr.nlink >= MAX_LINKS {
            return Err(Error::TooManyLinks);
        }
        if flags.exchange
            && dst_is_dir
            && src.kind != FileKind::Dir
            && p1 != p2
            && g[&p1].hdr.nlink >= MAX_LINKS
        {
            return Err(Error::TooManyLinks);
        }
        let now = now_ns();
        let mut tx = Tx::new();
        let mut edit = DirEdit::default();
        let mut res = Reserved::new(self);
        let mut new_hdr: HashMap<u64, InodeHeader> =
            inos.iter().map(|&i| (i, g[&i].hdr.clone())).collect();
        let mut victim_freed = None;
        let src_dir = src.kind == FileKind::Dir;
        if flags.exchange {
            let d = dst.expect("checked");
            self.plan_repoint(&g[&p1], n1, d.ino, d.kind, &mut tx, &mut edit)?;
            self.plan_repoint(&g[&p2], n2, src.ino, src.kind, &mut tx, &mut edit)?;
            if p1 != p2 {
                let dst_dir = d.kind == FileKind::Dir;
                if src_dir {
                    new_hdr.get_mut(&src.ino).expect("in set").parent = p2;
                }
                if dst_dir {
                    new_hdr.get_mut(&d.ino).expect("in set").parent = p1;
                }
                if src_dir != dst_dir {
                    let (from, to) = if src_dir { (p1, p2) } else { (p2, p1) };
                    dec_links(new_hdr.get_mut(&from).expect("in set"));
                    inc_links(new_hdr.get_mut(&to).expect("in set"));
                }
            }
            new_hdr.get_mut(&d.ino).expect("in set").ctime = now;
        } else {
            match dst {
                Some(d) => {
                    self.plan_repoint(&g[&p2], n2, src.ino, src.kind, &mut tx, &mut edit)?;
                    let v = new_hdr.get_mut(&d.ino).expect("in set");
                    v.ctime = now;
                    if d.kind == FileKind::Dir {
                        v.nlink = 0;
                        dec_links(new_hdr.get_mut(&p2).expect("in set"));
                    } else {
                        dec_links(v);
                    }
                    if new_hdr[&d.ino].nlink == 0
                        && (d.kind == FileKind::Dir || g[&d.ino].open == 0)
                    {
                        victim_freed = Some(d.ino);
                    }
                }
                None => {
                    let pg2 = g.get_mut(&p2).expect("locked");
                    // The insert may add a directory block, which updates p2's header itself.
                    self.plan_insert(pg2, n2, src.ino, src.kind, &mut edit, &mut tx, &mut res)?;
                    new_hdr.insert(p2, {
                        let mut h = pg2.hdr.clone();
                        h.nlink = new_hdr[&p2].nlink;
                        h
                    });
                }
            }
            self.plan_remove(&g[&p1], n1, &mut edit)?;
            if src_dir && p1 != p2 {
                new_hdr.get_mut(&src.ino).expect("in set").parent = p2;
                dec_links(new_hdr.get_mut(&p1).expect("in set"));
                inc_links(new_hdr.get_mut(&p2).expect("in set"));
            }
        }
        new_hdr.get_mut(&src.ino).expect("in set").ctime = now;
        for p in [p1, p2] {
            let h = new_hdr.get_mut(&p).expect("in set");
            h.mtime = now;
            h.ctime = now;
        }
        for (&i, h) in &new_hdr {
            if Some(i) == victim_freed {
                continue;
            }
            self.header_tx(&mut tx, i, &g[&i].hdr, h);
        }
        if let Some(v) = victim_freed {
            self.free_inode_tx(&g[&v], &mut tx);
        }
        Self::edit_tx(&edit, &mut tx);
        self.commit(tx)?;
        res.keep();
        for (i, h) in new_hdr {
            g.get_mut(&i).expect("locked").hdr = h;
        }
        if let Some(v) = victim_freed {
            let n = g.get_mut(&v).expect("locked");
            n.hdr.flags &= !INODE_IN_USE;
            self.forget_inode(n);
        }
        Self::apply_edit(edit, &mut g);
        Ok(())
    }

    fn link_impl(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        self.check_alive()?;
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::Exists);
        }
        let _ns = self.ns.write().unwrap_or_else(|e| e.into_inner());
        let arcs = self.arcs(&[ino, parent])?;
        let mut g = self.lock_all(&arcs);
        // Linux checks the new name before the source's type.
        if g[&parent]
            .dir
            .as_ref()
            .ok_or(Error::NotDir)?
            .get(name)
            .is_some()
        {
            return Err(Error::Exists);
        }
        if g[&ino].is_dir() {
            return Err(Error::NotPermitted(
                "hard links to directories are not allowed".into(),
            ));
        }
        if g[&ino].hdr.nlink == 0 && g[&ino].open > 0 {
            return Err(Error::NotFound);
        }
        if g[&ino].hdr.nlink >= MAX_LINKS {
            return Err(Error::TooManyLinks);
        }
        let now = now_ns();
        let mut tx = Tx::new();
        let mut edit = DirEdit::default();
        let mut res = Reserved::new(self);
        let kind = g[&ino].kind();
        self.plan_insert(
            g.get_mut(&parent).expect("locked"),
            name,
            ino,
            kind,
            &mut edit,
            &mut tx,
            &mut res,
        )?;
        let mut ph = g[&parent].hdr.clone();
        ph.mtime = now;
        ph.ctime = now;
        // If plan_insert added a directory block it has journaled the parent's size and map
        // change and updated its DRAM header, so `ph` (cloned after it) only adds the times.
        let mut ih = g[&ino].hdr.clone();
        inc_links(&mut ih);
        ih.ctime = now;
        self.header_tx(&mut tx, ino, &g[&ino].hdr, &ih);
        self.header_tx(&mut tx, parent, &g[&parent].hdr, &ph);
        Self::edit_tx(&edit, &mut tx);
        self.commit(tx)?;
        res.keep();
        g.get_mut(&parent).expect("locked").hdr = ph;
        g.get_mut(&ino).expect("locked").hdr = ih;
        Self::apply_edit(edit, &mut g);
        Ok(self.attr(&g[&ino]))
    }
}

impl Fs {
    /// Format a pool. See [`MkfsOptions`].
    pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<()> {
        crate::recovery::mkfs(path, opts)
    }

    /// Mount a pool: validate the superblock, roll back unfinished transactions, rebuild the DRAM
    /// indexes.
    pub fn mount(path: &Path, opts: MountOptions) -> Result<Fs> {
        crate::recovery::mount(path, opts)
    }

    /// Clean unmount: save the allocator state and mark the superblock clean.
    /// Queued background rewrites get up to 30 s to finish first.
    pub fn unmount(self) -> Result<()> {
        let _ = crate::rewrite::settle(&self.inner, std::time::Duration::from_secs(30));
        crate::recovery::unmount(&self.inner)
    }

    /// The root directory's inode number.
    pub fn root(&self) -> u64 {
        ROOT_INO
    }

    /// Data guarantees of this mount.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// Persistence counters of the pool (bytes written and lines flushed per category).
    pub fn persist_stats(&self) -> PersistStats {
        self.inner.pool.stats()
    }

    /// What recovery did at mount.
    pub fn recovery_report(&self) -> crate::journal::RecoveryReport {
        self.inner.recovery.clone()
    }

    /// Fault injection for tests: the `n`-th transaction from now stops after its in-place
    /// writes and before its COMMIT record, as a crash at that point would; the mount is then
    /// poisoned and the next mount must roll the transaction back.
    #[doc(hidden)]
    pub fn inject_crash_before_commit(&self, n: u64) {
        self.inner
            .journals
            .crash_countdown
            .store(n, Ordering::Relaxed);
    }

    /// Test-only switch for the crash explorer's self-test: commits skip the fence between
    /// their undo records and their in-place writes (a deliberately broken build).
    #[doc(hidden)]
    pub fn set_broken_skip_undo_fence(&self, on: bool) {
        self.inner
            .journals
            .broken_skip_undo_fence
            .store(on, Ordering::Relaxed);
    }

    /// The pool's superblock (geometry, uuid, creation time).
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Geometry of the pool.
    pub fn geometry(&self) -> Geometry {
        self.inner.geo.clone()
    }

    /// Per-partition allocator statistics.
    pub fn alloc_stats(&self) -> Vec<crate::alloc::PartitionStats> {
        self.inner.alloc.stats()
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.inner.check_alive()?;
        check_name(name)?;
        let _ns = self.inner.ns.read().unwrap_or_else(|e| e.into_inner());
        let p = self.inner.node(parent)?;
        let ino = {
            let g = rlock(&p);
            let d = g.dir.as_ref().ok_or(Error::NotDir)?;
            match name {
                b"." => parent,
                b".." => g.hdr.parent,
                _ => d.get(name).ok_or(Error::NotFound)?.ino,
            }
        };
        self.getattr(ino)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.inner.check_alive()?;
        let n = self.inner.node(ino)?;
        let g = rlock(&n);
        Ok(self.inner.attr(&g))
    }

    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.inner
            .make_node(parent, name, FileKind::File, perm, uid, gid, 0, None)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.inner
            .make_node(parent, name, FileKind::Dir, perm, uid, gid, 0, None)
    }

    /// Create a special file (FIFO, socket, device) or a regular file.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(Error::Invalid(
                "mknod cannot make directories or symlinks".into(),
            ));
        }
        self.inner
            .make_node(parent, name, kind, perm, uid, gid, rdev, None)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong(target.len()));
        }
        self.inner.make_node(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            uid,
            gid,
            0,
            Some(target),
        )
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.inner.check_alive()?;
        let n = self.inner.node(ino)?;
        let g = rlock(&n);
        if g.kind() != FileKind::Symlink {
            return Err(Error::Invalid("not a symbolic link".into()));
        }
        let mut buf = vec![0u8; g.hdr.size as usize];
        crate::file::read_locked(&self.inner, &g, 0, &mut buf)?;
        Ok(buf)
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.inner.link_impl(ino, newparent, newname)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.inner.unlink_impl(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if parent == ROOT_INO && name == b".." {
            return Err(Error::Busy("cannot remove the root".into()));
        }
        self.inner.unlink_impl(parent, name, true)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.inner
            .rename_impl(parent, name, newparent, newname, flags)
    }

    /// Note an open handle: an unlinked inode lives until its last handle is released.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        self.inner.check_alive()?;
        let n = self.inner.node(ino)?;
        let mut g = wlock(&n);
        g.open += 1;
        Ok(self.inner.attr(&g))
    }

    /// Drop an open handle; frees the inode if it was the last one and no links remain.
    pub fn release(&self, ino: u64) -> Result<()> {
        self.inner.check_alive()?;
        let n = self.inner.node(ino)?;
        let mut g = wlock(&n);
        g.open = g.open.saturating_sub(1);
        if g.open == 0 && g.hdr.nlink == 0 && g.hdr.in_use() {
            let mut tx = Tx::new();
            self.inner.free_inode_tx(&g, &mut tx);
            self.inner.commit(tx)?;
            g.hdr.flags &= !INODE_IN_USE;
            self.inner.forget_inode(&g);
        }
        Ok(())
    }

    pub fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        crate::file::read(&self.inner, ino, off, buf)
    }

    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        crate::file::write(&self.inner, ino, Some(off), data).map(|(n, _)| n)
    }

    /// Write at the current end of file, atomically with finding it; returns (bytes, offset).
    pub fn append(&self, ino: u64, data: &[u8]) -> Result<(usize, u64)> {
        crate::file::write(&self.inner, ino, None, data)
    }

    pub fn truncate(&self, ino: u64, size: u64) -> Result<()> {
        crate::file::truncate(&self.inner, ino, size)
    }

    /// Allocate (and zero) the blocks under [off, off+len); extends the size unless `keep_size`.
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, keep_size: bool) -> Result<()> {
        crate::file::fallocate(&self.inner, ino, off, len, keep_size)
    }

    /// Deallocate [off, off+len) (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE): it reads back as zeros.
    pub fn punch_hole(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        crate::file::punch_hole(&self.inner, ino, off, len)
    }

    /// First offset >= `off` that holds data (`data == true`) or a hole (SEEK_DATA/SEEK_HOLE).
    pub fn seek_data_hole(&self, ino: u64, off: u64, data: bool) -> Result<u64> {
        crate::file::seek_data_hole(&self.inner, ino, off, data)
    }

    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        crate::file::setattr(&self.inner, ino, set)
    }

    /// Every operation is durable when it returns, so fsync only orders this call after them.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.inner.check_alive()?;
        let n = self.inner.node(ino)?;
        // Stores through memory mappings are the only writes not yet written back.
        crate::mmap::flush_mapped(&self.inner, &rlock(&n));
        self.inner.pool.fence();
        Ok(())
    }

    /// Entries after position `offset` (0 starts at "."), in a stable order.
    pub fn readdir(&self, ino: u64, offset: u64) -> Result<Vec<DirEntry>> {
        self.readdir_page(ino, offset, usize::MAX)
    }

    /// At most `max` entries after position `offset` (for paged readers such as FUSE).
    pub fn readdir_page(&self, ino: u64, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.inner.check_alive()?;
        let _ns = self.inner.ns.read().unwrap_or_else(|e| e.into_inner());
        let n = self.inner.node(ino)?;
        let g = rlock(&n);
        let d = g.dir.as_ref().ok_or(Error::NotDir)?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry {
                ino,
                kind: FileKind::Dir,
                name: b".".to_vec(),
                offset: 1,
            });
        }
        if offset < 2 {
            out.push(DirEntry {
                ino: g.hdr.parent,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
                offset: 2,
            });
        }
        for (pos, name, loc) in d.entries_after(offset.max(2)) {
            if out.len() >= max {
                break;
            }
            out.push(DirEntry {
                ino: loc.ino,
                kind: loc.kind,
                name: name.to_vec(),
                offset: pos,
            });
        }
        out.truncate(max);
        Ok(out)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        crate::xattr::set(&self.inner, ino, name, Some(value), how)?;
        // The hint given to a file that already has data (as `cp --preserve=xattr` and
        // `rsync -X` do, after copying) moves that data onto aligned extents.
        if name == crate::xattr::HUGEPAGE_HINT && self.getattr(ino)?.kind == FileKind::File {
            crate::rewrite::queue(&self.inner, ino);
        }
        Ok(())
    }

    /// Move every 2 MiB unit of file `ino` that holds data but is not one aligned extent onto
    /// a fresh aligned extent, now (the background rewriter does the same, throttled).
    pub fn rewrite(&self, ino: u64) -> Result<crate::rewrite::RewriteStats> {
        self.inner.check_alive()?;
        if self.getattr(ino)?.kind != FileKind::File {
            return Err(Error::Invalid("only regular files can be rewritten".into()));
        }
        crate::rewrite::rewrite_file(&Arc::downgrade(&self.inner), ino, false)
    }

    /// Move every block of file `ino` onto its own 4 KiB block with free gaps between them,
    /// the layout of a badly aged file system (a benchmark and test baseline). Needs twice
    /// the file's size free. Returns the blocks moved.
    #[doc(hidden)]
    pub fn scatter(&self, ino: u64) -> Result<u64> {
        crate::rewrite::scatter_file(&self.inner, ino)
    }

    /// Compact holes now (docs/DESIGN.md §4, "Hole compaction"): empty broken 2 MiB units that
    /// hold little file data into holes elsewhere, until holes hold at most 4% of free space.
    pub fn compact(&self) -> Result<crate::compact::CompactStats> {
        crate::compact::compact_with(
            &Arc::downgrade(&self.inner),
            crate::compact::GOAL_SHARE,
            u64::MAX,
            false,
            0,
        )
    }

    /// All free space of the pool as sorted, merged runs of blocks.
    pub fn free_runs(&self) -> Vec<crate::alloc::BlockRun> {
        self.inner.alloc.free_runs()
    }

    /// Wait for queued background rewrites to finish (None if `timeout` passes first);
    /// returns what the background rewriter has done so far.
    pub fn settle_rewrites(
        &self,
        timeout: std::time::Duration,
    ) -> Option<crate::rewrite::RewriteStats> {
        crate::rewrite::settle(&self.inner, timeout)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        crate::xattr::get(&self.inner, ino, name)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        crate::xattr::list(&self.inner, ino)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        crate::xattr::set(&self.inner, ino, name, None, XattrSet::Replace)
    }

    pub fn statfs(&self) -> StatFs {
        let free_inodes = self
            .inner
            .inode_free
            .iter()
            .map(|f| lock(f).len() as u64)
            .sum();
        StatFs {
            block_size: BLOCK_SIZE,
            blocks: self.inner.geo.data_blocks,
            free_blocks: self.inner.alloc.free_blocks(),
            inodes: self.inner.geo.total_inodes(),
            free_inodes,
            name_max: NAME_MAX as u32,
            free_aligned_extents: self
                .inner
                .alloc
                .stats()
                .iter()
                .map(|s| s.free_aligned_extents)
                .sum(),
        }
    }

    /// Check every invariant of the mounted file system (see `fsck`).
    pub fn check(&self) -> crate::fsck::Report {
        crate::fsck::check(&self.inner)
    }

    /// The physical extents of a file: (logical block, pool block, blocks).
    pub fn extents(&self, ino: u64) -> Result<Vec<(u64, u64, u64)>> {
        let n = self.inner.node(ino)?;
        let g = rlock(&n);
        Ok(g.map
            .extents
            .iter()
            .map(|(&l, e)| (l, e.phys, e.len))
            .collect())
    }

    // ----- path helpers -----

    /// Resolve a path from the root ('/'-separated; leading '/' optional). Symlinks in
    /// intermediate components are followed; the last one only if `follow`.
    pub fn resolve(&self, path: &str, follow: bool) -> Result<u64> {
        let mut budget = 40;
        self.resolve_from(ROOT_INO, path.as_bytes(), follow, &mut budget)
    }

    fn resolve_from(&self, start: u64, path: &[u8], follow: bool, budget: &mut u32) -> Result<u64> {
        let mut cur = if path.first() == Some(&b'/') {
            ROOT_INO
        } else {
            start
        };
        let comps: Vec<&[u8]> = path
            .split(|&c| c == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let a = self.lookup(cur, c)?;
            if a.kind == FileKind::Symlink && (!last || follow) {
                if *budget == 0 {
                    return Err(Error::Loop);
                }
                *budget -= 1;
                let t = self.readlink(a.ino)?;
                cur = self.resolve_from(cur, &t, true, budget)?;
            } else {
                if !last && a.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                cur = a.ino;
            }
        }
        Ok(cur)
    }

    /// Split a path into (parent inode, final name).
    pub fn parent_of(&self, path: &str) -> Result<(u64, Vec<u8>)> {
        let t = path.trim_end_matches('/');
        let (dirpart, name) = match t.rfind('/') {
            Some(i) => (&t[..i], &t[i + 1..]),
            None => ("", t),
        };
        if name.is_empty() {
            return Err(Error::Invalid(format!(
                "path {path:?} has no final component"
            )));
        }
        let parent = self.resolve(dirpart, true)?;
        if self.getattr(parent)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok((parent, name.as_bytes().to_vec()))
    }

    /// Attributes of the file at `path` (following a final symlink).
    pub fn stat_path(&self, path: &str) -> Result<Attr> {
        self.getattr(self.resolve(path, true)?)
    }

    /// Create a new file (error if it exists) and open it.
    pub fn create_file(&self, path: &str) -> Result<crate::file::File> {
        let (p, n) = self.parent_of(path)?;
        let a = self.create(p, &n, 0o644, 0, 0)?;
        crate::file::File::open(self.clone(), a.ino)
    }

    /// Open an existing file.
    pub fn open_file(&self, path: &str) -> Result<crate::file::File> {
        let ino = self.resolve(path, true)?;
        if self.getattr(ino)?.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        crate::file::File::open(self.clone(), ino)
    }

    pub fn mkdir_path(&self, path: &str) -> Result<Attr> {
        let (p, n) = self.parent_of(path)?;
        self.mkdir(p, &n, 0o755, 0, 0)
    }

    pub fn unlink_path(&self, path: &str) -> Result<()> {
        let (p, n) = self.parent_of(path)?;
        self.unlink(p, &n)
    }

    pub fn rmdir_path(&self, path: &str) -> Result<()> {
        let (p, n) = self.parent_of(path)?;
        self.rmdir(p, &n)
    }

    pub fn rename_path(&self, from: &str, to: &str) -> Result<()> {
        let (p1, n1) = self.parent_of(from)?;
        let (p2, n2) = self.parent_of(to)?;
        self.rename(p1, &n1, p2, &n2, RenameFlags::default())
    }

    /// Names in a directory (without "." and "..").
    pub fn list_dir(&self, path: &str) -> Result<Vec<Vec<u8>>> {
        let ino = self.resolve(path, true)?;
        Ok(self.readdir(ino, 2)?.into_iter().map(|e| e.name).collect())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Relaxed) {
            let _ = crate::recovery::unmount(self);
        }
    }
}

/// Link-count ceiling (`EMLINK` beyond it), kept well below `u32::MAX` so a count read from
/// media can never overflow.
pub const MAX_LINKS: u32 = 65000;

/// Drop one link; saturating, so a damaged count from media cannot underflow into a panic.
fn dec_links(h: &mut crate::layout::InodeHeader) {
    h.nlink = h.nlink.saturating_sub(1);
}

/// Add one link; callers check `MAX_LINKS` first, this only keeps a damaged count from wrapping.
fn inc_links(h: &mut crate::layout::InodeHeader) {
    h.nlink = h.nlink.saturating_add(1);
}
