//! The `Fs` facade: a mounted winefs, and the inode-level API that mirrors the FUSE low-level
//! operations. Each call checks its arguments and hands the work to the layer below (the data
//! path, mappings and namespace in `ops`, the background work, the mount state); nothing here
//! touches media directly.

use crate::background;
use crate::error::{Error, Result};
use crate::media::alloc::{BlockRun, PartitionStats};
use crate::media::recovery::RecoveryReport;
use crate::media::layout::{FileKind, Geometry, ROOT_INO, SYMLINK_MAX, Superblock};
use crate::media::pool::{PersistStats, Pool};
use crate::meta::xattr::HUGEPAGE_HINT;
use crate::meta::acl::is_acl;
use crate::ops::namespace::NewInode;
use crate::ops::repair::{self, RepairReport};
use crate::ops::{acl, falloc, file, lease, namespace, open, prealloc, relocate, rename, write, xattr};
use crate::state::accounting::{OpKind, WriteStats};
use crate::state::inode_state::rlock;
use crate::state::mount_state::MountState;
use crate::state::mount::Inconsistent;
use crate::state::{damage, fsck, mkfs, mount};
use crate::types::{
    Attr, CompactStats, Consistency, DirEntry, Maker, MkfsOptions, MountOptions, RenameFlags,
    RewriteStats, SetAttr, StatFs, XattrSet,
};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a clean unmount lets queued background work finish first.
const UNMOUNT_SETTLE: Duration = Duration::from_secs(30);

/// A mounted winefs. Cheap to clone; all clones share one mount. Thread-safe.
#[derive(Clone)]
pub struct Fs {
    pub(crate) state: Arc<MountState>,
}

/// The prefault thread holds the mount: it is stopped first, so that the mount is let go of
/// (and, if this was the last reference, unmounted) on the caller's thread.
impl Drop for Fs {
    fn drop(&mut self) {
        background::prefault::stop(&self.state);
    }
}

impl Fs {
    /// Format a pool. See [`MkfsOptions`].
    pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<()> {
        mkfs::mkfs(path, opts)
    }

    /// Mount a pool: validate the superblock, roll back unfinished transactions, rebuild the DRAM
    /// indexes.
    pub fn mount(path: &Path, opts: MountOptions) -> Result<Fs> {
        let fs = Fs::in_service(mount::mount(path, &opts)?);
        if !opts.no_prefault {
            fs.prefault();
        }
        Ok(fs)
    }

    /// Fault the pool's pages in ahead of use, in a low-priority background thread, when the
    /// pool is a shared mapping of memory (see `background::prefault`); [`Fs::mount`] does it
    /// unless [`MountOptions::no_prefault`]. Changes nothing on media.
    pub fn prefault(&self) {
        background::prefault::start(&self.state);
    }

    /// Wait until the background prefault (if any) has faulted in the whole pool: a benchmark
    /// then measures the pool as a long-mounted one (or persistent memory) is, without the
    /// first touch of each page.
    pub fn wait_prefault(&self) {
        background::prefault::wait(&self.state);
    }

    /// Bytes of the pool faulted in ahead of use so far (from its start; the pool's length
    /// when done, 0 when the pool is not one that is faulted in).
    pub fn prefaulted_bytes(&self) -> u64 {
        self.state.prefaulted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Mount an already mapped pool (the crash explorer patches a private mapping of a crash
    /// image before recovery runs on it).
    pub(crate) fn mount_pool(pool: Pool, opts: MountOptions) -> Result<Fs> {
        Ok(Fs::in_service(mount::mount_pool(pool, &opts)?))
    }

    /// `winefs fsck --repair`: mount the pool at `path` without refusing a namespace that fails
    /// its checks, blocks two inodes claim or inodes that fail their checksum (anything mount
    /// cannot build a state from is still refused), repair it (`ops::repair`: damaged inodes
    /// resealed or freed, shared blocks copied, dangling and mistyped entries, nameless inodes
    /// into `/lost+found`, parent fields, link counts), clear the "needs fsck" flag if the pool
    /// then checks clean, and unmount cleanly, which rewrites the allocator snapshot. Every
    /// change is journaled.
    pub fn repair_pool(path: &Path) -> Result<RepairReport> {
        let opts = MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        };
        let state = mount::mount_checked(Pool::open(path, false)?, &opts, Inconsistent::Report)?;
        let mut rep = repair::repair(&state)?;
        // Damaged slot descriptors were cleared by the mount itself (nothing else can be done
        // with a descriptor that cannot be trusted).
        let cleared = state.recovery.notes.iter().filter(|n| n.starts_with("slot zone "));
        rep.changes.extend(cleared.cloned());
        // The "needs fsck" flag goes only when the repaired pool checks clean.
        let flag = state.needs_fsck();
        if flag != 0 && rep.left.is_empty() && fsck::check(&state).is_clean() {
            state.clear_needs_fsck();
            let why = damage::describe(flag);
            rep.changes.push(format!("cleared the \"needs fsck\" flag ({why})"));
        } else if flag != 0 {
            let why = damage::describe(flag);
            rep.left.push(format!("the \"needs fsck\" flag stays set ({why}): problems remain"));
        }
        mount::unmount(&state)?;
        Ok(rep)
    }

    /// A freshly mounted state, put in service: background requests now start the worker, and
    /// an allocation short of space takes speculative preallocation back from files.
    fn in_service(state: Arc<MountState>) -> Fs {
        background::attach(&state);
        prealloc::attach(&state);
        Fs { state }
    }

    /// Clean unmount: save the allocator state and mark the superblock clean.
    /// Queued background work gets up to 30 s to finish first.
    pub fn unmount(self) -> Result<()> {
        let _ = self.state.background.settle(UNMOUNT_SETTLE);
        mount::unmount(&self.state)
    }

    /// The root directory's inode number.
    pub fn root(&self) -> u64 {
        ROOT_INO
    }

    /// Whether this mount stores no access times ([`MountOptions::noatime`]).
    pub fn is_noatime(&self) -> bool {
        self.state.noatime
    }

    /// Idle file states this mount keeps at most ([`MountOptions::cached_inodes`], or its
    /// default).
    pub fn cached_inodes(&self) -> usize {
        self.state.cached_inodes
    }

    /// Whether this mount is read-only ([`MountOptions::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.state.is_read_only()
    }

    /// Make the mount read-only, or read-write again, while it serves (what `mount -o
    /// remount,ro` and `remount,rw` ask of a FUSE mount): calls that would change the pool get
    /// [`Error::ReadOnly`] from now on, and the mount's own stores (access times, background
    /// work, freeing released unlinked files) wait for read-write. An operation running at the
    /// switch finishes, or gets `ReadOnly` at its next commit (each commit is whole; over FUSE
    /// the kernel's remount lets none run: it refuses while a file is open for writing). A mount made read-only from the start ([`MountOptions::read_only`]) gets
    /// [`Error::ReadOnly`] when asked for read-write.
    pub fn set_read_only(&self, read_only: bool) -> Result<()> {
        self.state.set_read_only(read_only)
    }

    /// The pool's "needs fsck" flag as this mount keeps it: 0, or the code of what failed its
    /// check at run time (`state::damage::describe` puts it in words).
    pub fn needs_fsck(&self) -> u32 {
        self.state.needs_fsck()
    }

    /// Data guarantees of this mount.
    pub fn consistency(&self) -> Consistency {
        self.state.consistency
    }

    /// Writes of the pool file to the disk since mount, for a pool that is a file on a disk file
    /// system without DAX (there every fence after new stores is an `fdatasync`); `None` for a
    /// pool in memory or on DAX, whose cache-line write-backs reach the media.
    pub fn disk_syncs(&self) -> Option<u64> {
        let pool = &self.state.pool;
        pool.syncs_to_disk().then(|| pool.disk_syncs())
    }

    /// Persistence counters of the pool (bytes written and lines flushed per category).
    pub fn persist_stats(&self) -> PersistStats {
        self.state.pool.stats()
    }

    /// What each kind of operation has written to the pool since mount, per category of
    /// traffic (`winefs stat`).
    pub fn write_stats(&self) -> WriteStats {
        WriteStats::new(&self.state.accounting, &self.state.pool.stats())
    }

    /// Writes per pool block since mkfs (one count per store touching the block), for a pool
    /// made with `--wear-stats`; None otherwise.
    pub fn wear_counts(&self) -> Option<Vec<u32>> {
        self.state.pool.wear().map(|w| w.snapshot())
    }

    /// What recovery did at mount.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.state.recovery.clone()
    }

    /// Fault injection for tests: the `n`-th transaction from now stops after its in-place
    /// writes and before its COMMIT record (or the `n`-th commit point, when that is an
    /// append's one-store size commit: after its bytes, before the size), as a crash at that
    /// point would; the mount is then poisoned and the next mount must roll the transaction
    /// back.
    #[doc(hidden)]
    pub fn inject_crash_before_commit(&self, n: u64) {
        self.state
            .journals
            .crash_countdown
            .store(n, Ordering::Relaxed);
    }

    /// Fault injection for tests: end the mount the way a power cut right after the last
    /// commit would — nothing more is written (no allocator bitmap, the superblock stays "not
    /// clean"), so the next mount recovers and rebuilds free space from the inode tables.
    /// (Dropping an `Fs` without [`Fs::unmount`] unmounts cleanly.)
    #[doc(hidden)]
    pub fn simulate_crash(self) {
        self.state.unmounted.store(true, Ordering::SeqCst);
    }

    /// Test-only switch for the crash explorer's self-test: alternate writes skip the fence
    /// between their stores and their descriptor store (a deliberately broken build).
    #[doc(hidden)]
    pub fn set_broken_skip_slot_fence(&self, on: bool) {
        self.state.zones.broken_skip_fence.store(on, Ordering::Relaxed);
    }

    /// Test-only switch for the crash explorer's self-test: appends that commit their size by
    /// one store skip the fence between their bytes and that store (a deliberately broken
    /// build).
    #[doc(hidden)]
    pub fn set_broken_skip_append_fence(&self, on: bool) {
        self.state.broken_skip_append_fence.store(on, Ordering::Relaxed);
    }

    /// Test-only switch for the crash explorer's self-test: commits skip the fence between
    /// their undo records and their in-place writes (a deliberately broken build).
    #[doc(hidden)]
    pub fn set_broken_skip_undo_fence(&self, on: bool) {
        self.state
            .journals
            .broken_skip_undo_fence
            .store(on, Ordering::Relaxed);
    }

    /// The pool's superblock (geometry, uuid, creation time).
    pub fn superblock(&self) -> &Superblock {
        &self.state.sb
    }

    /// Geometry of the pool.
    pub fn geometry(&self) -> Geometry {
        self.state.geo.clone()
    }

    /// Per-partition allocator statistics.
    pub fn alloc_stats(&self) -> Vec<PartitionStats> {
        self.state.alloc.stats()
    }

    /// Look `name` up in directory `parent` ("." and ".." included).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let a = namespace::lookup(&self.state, parent, name)?;
        // A file a direct-path client leases: its size is on the size board, and direct
        // writes give it new times at the next look.
        if self.changed_directly(a.ino) {
            return self.getattr(a.ino);
        }
        Ok(a)
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.state.check_alive()?;
        let n = self.state.inode(ino)?;
        crate::state::appends::settle(&self.state, &n)?;
        let g = rlock(&n);
        Ok(self.state.attr(&g))
    }

    /// Create a regular file (EEXIST if the name exists).
    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.create_by(parent, name, perm, Maker { uid, gid, umask: 0, acls: true })
    }

    /// [`Fs::create`] for `maker` (its umask applies, or the directory's default ACL).
    pub fn create_by(&self, parent: u64, name: &[u8], perm: u32, maker: Maker) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Create);
        self.state.check_writable()?;
        namespace::make_inode(&self.state, parent, name, new_inode(FileKind::File, perm, maker))
    }

    /// Create a regular file in no directory, open once, as open(2) with `O_TMPFILE` in
    /// directory `parent` (`linkable` false: with `O_EXCL`). It has no links: it goes when the
    /// handle is released (and at the next mount after a crash) unless [`Fs::link`] gives it a
    /// name first, which only a `linkable` one takes. The directory's times do not change.
    pub fn create_unnamed(
        &self,
        parent: u64,
        perm: u32,
        uid: u32,
        gid: u32,
        linkable: bool,
    ) -> Result<Attr> {
        self.create_unnamed_by(parent, perm, Maker { uid, gid, umask: 0, acls: true }, linkable)
    }

    /// [`Fs::create_unnamed`] for `maker`.
    pub fn create_unnamed_by(&self, parent: u64, perm: u32, maker: Maker, linkable: bool) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Create);
        self.state.check_writable()?;
        let new = new_inode(FileKind::File, perm, maker);
        namespace::make_unnamed(&self.state, parent, new, linkable)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mkdir_by(parent, name, perm, Maker { uid, gid, umask: 0, acls: true })
    }

    /// [`Fs::mkdir`] for `maker`.
    pub fn mkdir_by(&self, parent: u64, name: &[u8], perm: u32, maker: Maker) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Mkdir);
        self.state.check_writable()?;
        namespace::make_inode(&self.state, parent, name, new_inode(FileKind::Dir, perm, maker))
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
        self.mknod_by(parent, name, kind, perm, rdev, Maker { uid, gid, umask: 0, acls: true })
    }

    /// [`Fs::mknod`] for `maker`.
    pub fn mknod_by(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u32,
        maker: Maker,
    ) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Create);
        self.state.check_writable()?;
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(Error::Invalid(
                "mknod cannot make directories or symlinks".into(),
            ));
        }
        let new = NewInode {
            rdev,
            ..new_inode(kind, perm, maker)
        };
        namespace::make_inode(&self.state, parent, name, new)
    }

    /// Create a symbolic link to `target`.
    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Create);
        self.state.check_writable()?;
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong(target.len()));
        }
        let new = NewInode {
            target: Some(target),
            ..NewInode::plain(FileKind::Symlink, 0o777, uid, gid)
        };
        namespace::make_inode(&self.state, parent, name, new)
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        open::readlink(&self.state, ino)
    }

    /// Give inode `ino` another name (or the first, to a linkable file of
    /// [`Fs::create_unnamed`] not yet named: ENOENT for any other inode without links).
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Link);
        self.state.check_writable()?;
        namespace::link(&self.state, ino, newparent, newname)
    }

    /// Remove a name (not of a directory). An inode that loses its last name is freed unless
    /// open.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.unlink_held(parent, name, false).map(drop)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.rmdir_held(parent, name, false).map(drop)
    }

    /// Rename (or, with `flags.exchange`, swap) atomically.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_held((parent, name), (newparent, newname), flags, false).map(drop)
    }

    /// [`Fs::unlink`] for a caller that may still refer to the inode by number once its name
    /// is gone (a FUSE mount's kernel does until it forgets the inode). With `hold`, an inode
    /// that loses its last name is kept, open or not, as if opened once more, and its number
    /// returned: [`Fs::let_go`] lets it go (and frees it when nothing else has it open). A
    /// regular file kept so, with nothing else open, is freed at once if space runs short.
    pub fn unlink_held(&self, parent: u64, name: &[u8], hold: bool) -> Result<Option<u64>> {
        let _op = self.state.accounting.scope(OpKind::Unlink);
        self.state.check_writable()?;
        namespace::unlink(&self.state, parent, name, false, hold)
    }

    /// [`Fs::rmdir`], keeping the directory as [`Fs::unlink_held`] keeps a file.
    pub fn rmdir_held(&self, parent: u64, name: &[u8], hold: bool) -> Result<Option<u64>> {
        let _op = self.state.accounting.scope(OpKind::Unlink);
        self.state.check_writable()?;
        if parent == ROOT_INO && name == b".." {
            return Err(Error::Busy("cannot remove the root".into()));
        }
        namespace::unlink(&self.state, parent, name, true, hold)
    }

    /// [`Fs::rename`] of `from` to `to` (directory, name), keeping an inode it replaces as
    /// [`Fs::unlink_held`] keeps one.
    pub fn rename_held(
        &self,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        flags: RenameFlags,
        hold: bool,
    ) -> Result<Option<u64>> {
        let _op = self.state.accounting.scope(OpKind::Rename);
        self.state.check_writable()?;
        rename::rename(&self.state, from, to, flags, hold)
    }

    /// Note an open handle: an unlinked inode lives until its last handle is released.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Other);
        open::open(&self.state, ino)
    }

    /// Give up the hold [`Fs::unlink_held`] (or its kin) took on `ino`: frees the inode when
    /// nothing else has it open. Nothing to do if space ran short meanwhile and the inode, a
    /// regular file only the hold kept, was freed then.
    /// Nothing either for an inode no removal kept.
    pub fn let_go(&self, ino: u64) -> Result<()> {
        // Counted as being released until the free is done: a thread short of space waits.
        let Some(_releasing) = self.state.removed_held.take_to_release(ino) else {
            return Ok(());
        };
        let _op = self.state.accounting.scope(OpKind::Other);
        open::release(&self.state, ino)
    }

    /// [`Fs::let_go`] of every inode a removal kept (the caller forgets every number at once:
    /// a FUSE session's end). All are let go; the last failure, if any, is returned.
    pub fn let_go_all(&self) -> Result<()> {
        let mut r = Ok(());
        for ino in self.state.removed_held.take_all() {
            let _op = self.state.accounting.scope(OpKind::Other);
            if let Err(e) = open::release(&self.state, ino) {
                r = Err(e);
            }
        }
        r
    }

    /// Drop an open handle; frees the inode if it was the last one and no links remain.
    pub fn release(&self, ino: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Other);
        open::release(&self.state, ino)
    }

    /// Pass `r` through after an operation that may have changed the size of `ino`, publishing
    /// the size to direct-path clients that lease the file.
    fn sized<T>(&self, ino: u64, r: Result<T>) -> Result<T> {
        lease::size_changed(&self.state, ino);
        r
    }

    /// Read from `off` into `buf`; returns the bytes read (short at the end of file). Stores
    /// the access time as Linux's `relatime` does ([`MountOptions::noatime`]: never).
    pub fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let _op = self.state.accounting.scope(OpKind::Read);
        file::read(&self.state, ino, off, buf, true)
    }

    /// [`Fs::read`] that leaves the access time alone (a read through an `O_NOATIME` open).
    pub fn read_noatime(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let _op = self.state.accounting.scope(OpKind::Read);
        file::read(&self.state, ino, off, buf, false)
    }

    /// Write `data` at `off`; returns the bytes written (short only when the pool fills).
    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        let mut op = self.state.accounting.scope(OpKind::Write);
        op.user_bytes(data.len() as u64);
        self.state.check_writable()?;
        self.sized(ino, write::write(&self.state, ino, Some(off), data).map(|(n, _)| n))
    }

    /// Write at the current end of file, atomically with finding it; returns (bytes, offset).
    pub fn append(&self, ino: u64, data: &[u8]) -> Result<(usize, u64)> {
        let mut op = self.state.accounting.scope(OpKind::Append);
        op.user_bytes(data.len() as u64);
        self.state.check_writable()?;
        self.sized(ino, write::write(&self.state, ino, None, data))
    }

    /// Set the file's size: cut it, or extend it with a hole.
    pub fn truncate(&self, ino: u64, size: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Truncate);
        self.state.check_writable()?;
        self.sized(ino, file::truncate(&self.state, ino, size))
    }

    /// Allocate (and zero) the blocks under [off, off+len); extends the size unless `keep_size`.
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, keep_size: bool) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fallocate);
        self.state.check_writable()?;
        self.sized(ino, file::fallocate(&self.state, ino, off, len, keep_size))
    }

    /// Deallocate [off, off+len) (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE): it reads back as zeros.
    pub fn punch_hole(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fallocate);
        self.state.check_writable()?;
        file::punch_hole(&self.state, ino, off, len)
    }

    /// Zero [off, off+len) (FALLOC_FL_ZERO_RANGE, with `keep_size` | KEEP_SIZE): it reads back
    /// as zeros and is allocated; the size grows to off+len unless `keep_size`. Atomic.
    pub fn zero_range(&self, ino: u64, off: u64, len: u64, keep_size: bool) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fallocate);
        self.state.check_writable()?;
        self.sized(ino, falloc::zero_range(&self.state, ino, off, len, keep_size))
    }

    /// Remove [off, off+len) and move the rest of the file down (FALLOC_FL_COLLAPSE_RANGE):
    /// `off` and `len` are multiples of 4096 and the range ends before the end of the file
    /// (else EINVAL). No data is copied. Atomic.
    pub fn collapse_range(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fallocate);
        self.state.check_writable()?;
        self.sized(ino, falloc::collapse_range(&self.state, ino, off, len))
    }

    /// Open a hole of `len` bytes at `off`, moving the rest of the file up
    /// (FALLOC_FL_INSERT_RANGE): `off` and `len` are multiples of 4096 and `off` lies inside
    /// the file (else EINVAL); EFBIG past the largest file size. No data is copied. Atomic.
    pub fn insert_range(&self, ino: u64, off: u64, len: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fallocate);
        self.state.check_writable()?;
        self.sized(ino, falloc::insert_range(&self.state, ino, off, len))
    }

    /// First offset >= `off` that holds data (`data == true`) or a hole (SEEK_DATA/SEEK_HOLE).
    pub fn seek_data_hole(&self, ino: u64, off: u64, data: bool) -> Result<u64> {
        file::seek_data_hole(&self.state, ino, off, data)
    }

    /// Change attributes (mode, owner, size, times); returns the new attributes.
    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Setattr);
        self.state.check_writable()?;
        self.sized(ino, file::setattr(&self.state, ino, set))
    }

    /// The user's inode flags (`FS_IOC_GETFLAGS` bits, `chattr`'s letters): immutable (`i`),
    /// append-only (`a`), no-dump (`d`), no-atime (`A`); every operation refuses the changes
    /// the first two forbid (EPERM), as Linux does (docs/DESIGN.md, "Inode flags").
    pub fn inode_flags(&self, ino: u64) -> Result<u32> {
        file::flags(&self.state, ino)
    }

    /// Set the user's inode flags (`FS_IOC_SETFLAGS`); EOPNOTSUPP for a flag winefs does not
    /// keep. Who may set them is the caller's to check (the owner; immutable and append-only
    /// need `CAP_LINUX_IMMUTABLE`), as the kernel does before a FUSE mount hears of it.
    pub fn set_inode_flags(&self, ino: u64, flags: u32) -> Result<Attr> {
        let _op = self.state.accounting.scope(OpKind::Setattr);
        self.state.check_writable()?;
        file::set_flags(&self.state, ino, flags)
    }

    /// Whether `ino` may be opened with open(2) `flags`: EPERM for writing an immutable file, and
    /// for writing an append-only one without `O_APPEND` or with `O_TRUNC`.
    pub fn check_open(&self, ino: u64, flags: i32) -> Result<()> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (append, truncate) = (flags & libc::O_APPEND != 0, flags & libc::O_TRUNC != 0);
        file::check_open(&self.state, ino, write, append, truncate)
    }

    /// Every operation is durable when it returns, so fsync only orders this call after them
    /// (and writes back stores made through the file's mappings).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Fsync);
        file::fsync(&self.state, ino)
    }

    /// Entries after position `offset` (0 starts at "."), in a stable order.
    pub fn readdir(&self, ino: u64, offset: u64) -> Result<Vec<DirEntry>> {
        self.readdir_page(ino, offset, usize::MAX)
    }

    /// At most `max` entries after position `offset` (for paged readers such as FUSE).
    pub fn readdir_page(&self, ino: u64, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        namespace::readdir_page(&self.state, ino, offset, max)
    }

    /// Set an extended attribute; a POSIX ACL's name sets that ACL as [`Fs::set_acl`] does
    /// (`how` does not apply, as on Linux).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Xattr);
        self.state.check_writable()?;
        if is_acl(name) {
            return acl::set(&self.state, ino, name, Some(value), true);
        }
        xattr::set(&self.state, ino, name, Some(value), how)?;
        // The hint given to a file that already has data (as `cp --preserve=xattr` and
        // `rsync -X` do, after copying) moves that data onto aligned extents.
        if name == HUGEPAGE_HINT && self.getattr(ino)?.kind == FileKind::File {
            self.state.background.queue_rewrite(ino);
        }
        Ok(())
    }

    /// Move every 2 MiB unit of file `ino` that holds data but is not one aligned extent onto
    /// a fresh aligned extent, now (the background rewriter does the same, throttled).
    pub fn rewrite(&self, ino: u64) -> Result<RewriteStats> {
        self.state.check_writable()?;
        self.state.check_alive()?;
        if self.getattr(ino)?.kind != FileKind::File {
            return Err(Error::Invalid("only regular files can be rewritten".into()));
        }
        background::rewrite_file(&Arc::downgrade(&self.state), ino, false)
    }

    /// Move every block of file `ino` onto its own 4 KiB block with free gaps between them,
    /// the layout of a badly aged file system (a benchmark and test baseline). Needs twice
    /// the file's size free. Returns the blocks moved.
    #[doc(hidden)]
    pub fn scatter(&self, ino: u64) -> Result<u64> {
        self.state.check_writable()?;
        relocate::scatter_file(&self.state, ino)
    }

    /// Compact holes now (docs/DESIGN.md §4, "Hole compaction"): empty broken 2 MiB units that
    /// hold little file data into holes elsewhere, until holes hold at most 4% of free space.
    pub fn compact(&self) -> Result<CompactStats> {
        self.state.check_writable()?;
        background::compact_now(&Arc::downgrade(&self.state))
    }

    /// All free space of the pool as sorted, merged runs of blocks.
    pub fn free_runs(&self) -> Vec<BlockRun> {
        self.state.alloc.free_runs()
    }

    /// Wait for queued background rewrites to finish (None if `timeout` passes first);
    /// returns what the background rewriter has done so far.
    pub fn settle_rewrites(&self, timeout: Duration) -> Option<RewriteStats> {
        self.state.background.settle(timeout)
    }

    /// The value of extended attribute `name`.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        xattr::get(&self.state, ino, name)
    }

    /// The names of the inode's extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        xattr::list(&self.state, ino)
    }

    /// Set (`Some`) or remove (`None`) POSIX ACL `name` (`system.posix_acl_access` or
    /// `system.posix_acl_default`, in the kernel's format) as the FUSE front end does for a
    /// caller: an access ACL sets the permission bits, and drops set-group-ID unless
    /// `keep_set_gid` (the caller is in the file's group or privileged). [`Fs::setxattr`] and
    /// [`Fs::removexattr`] of these names keep it.
    pub fn set_acl(&self, ino: u64, name: &[u8], value: Option<&[u8]>, keep_set_gid: bool) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Xattr);
        self.state.check_writable()?;
        if !is_acl(name) {
            return Err(Error::Invalid(format!("{:?} is not a POSIX ACL", String::from_utf8_lossy(name))));
        }
        acl::set(&self.state, ino, name, value, keep_set_gid)
    }

    /// Every free block taken (in DRAM; given back when the guard drops), so that what runs
    /// meanwhile finds the pool full: the crash explorer's `Op::XattrNoSpace`.
    pub(crate) fn take_all_free_blocks(&self) -> crate::state::tx::Reserved<'_> {
        let mut res = crate::state::tx::Reserved::new(&self.state);
        while res.alloc(1).is_ok() {}
        res
    }

    /// Remove extended attribute `name` (ENODATA if absent; a POSIX ACL it lacks is no error,
    /// as on Linux).
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Xattr);
        self.state.check_writable()?;
        if is_acl(name) {
            return acl::set(&self.state, ino, name, None, true);
        }
        xattr::set(&self.state, ino, name, None, XattrSet::Replace)
    }

    /// Remove extended attribute `name` if the inode has it (Ok(false) if not); not counted
    /// as an operation of its own (the FUSE front end drops `security.capability` this way
    /// after every write).
    pub fn remove_xattr_if_present(&self, ino: u64, name: &[u8]) -> Result<bool> {
        self.state.check_writable()?;
        xattr::remove_if_present(&self.state, ino, name)
    }

    /// File-system statistics.
    pub fn statfs(&self) -> StatFs {
        self.state.statfs()
    }

    /// Bytes of DRAM held by each structure that grows with the number of files, largest first
    /// (issue 18's DRAM per file; `examples/dram_per_file.rs`).
    pub fn dram_usage(&self) -> Vec<(&'static str, u64)> {
        self.state.dram_usage()
    }

    /// Check every invariant of the mounted file system (see `fsck`).
    pub fn check(&self) -> fsck::Report {
        fsck::check(&self.state)
    }

    /// The physical extents of a file: (logical block, pool block, blocks).
    pub fn extents(&self, ino: u64) -> Result<Vec<(u64, u64, u64)>> {
        let n = self.state.inode(ino)?;
        let g = rlock(&n);
        Ok(g.map
            .extents
            .iter()
            .map(|(&l, e)| (l, e.phys, e.len))
            .collect())
    }

    /// The pool (for tools beside the core: the crash explorer records its persistence).
    pub(crate) fn pool(&self) -> &Pool {
        &self.state.pool
    }
}

/// A new inode of `kind` with bits `perm` for `maker`.
fn new_inode(kind: FileKind, perm: u32, maker: Maker) -> NewInode<'static> {
    NewInode {
        umask: maker.umask,
        default_acl: maker.acls,
        ..NewInode::plain(kind, perm, maker.uid, maker.gid)
    }
}
