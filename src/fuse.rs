//! FUSE front end: the kernel's low-level requests mapped onto the [`Fs`] API.
//!
//! The operations' semantics (what each does to the namespace and the data, atomicity,
//! durability) live in the core, which the differential tests check against tmpfs, and so does
//! the choice of errno for every error the core returns: `attr::errno` (through `Error::errno`) is
//! the only place a core error becomes an errno.
//!
//! Request-level checks this module answers itself, before or instead of calling the core:
//! - `EINVAL`: a mknod mode of no known file type, or of a directory or symlink (those have
//!   their own requests); rename flags beyond NOREPLACE, EXCHANGE and WHITEOUT; setxattr
//!   flags other than 0, XATTR_CREATE and XATTR_REPLACE; an lseek whence other than
//!   SEEK_DATA and SEEK_HOLE (the kernel answers the others);
//! - `ENXIO`: SEEK_DATA/SEEK_HOLE from a negative offset;
//! - `EISDIR`: open of a directory, and a create whose name turns out to be a directory;
//! - `ENOTDIR`: opendir of anything else;
//! - `EOPNOTSUPP`: fallocate modes other than plain, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE,
//!   ZERO_RANGE (with or without KEEP_SIZE), COLLAPSE_RANGE and INSERT_RANGE; POSIX ACLs when
//!   the kernel does not enforce them (no `FUSE_POSIX_ACL`; extended attributes outside
//!   `user.`, `trusted.`, `security.` and the two ACLs are refused by the core);
//! - `ERANGE`: getxattr or listxattr with a buffer too small for the answer;
//! - `EACCES`: access(2) refused by the mode bits (`permitted`);
//! - `ENOSYS` for every FLUSH, so the kernel stops sending them (nothing is buffered);
//! - a create that loses the race for its name (`EEXIST` without O_EXCL) opens the winner; a
//!   copy_file_range that fails after copying some bytes reports those bytes, as write(2) does;
//!   readdirplus skips an entry removed since its page was read.
//!
//! The VFS duties the kernel leaves to a FUSE server are done here too: the owner, group and
//! mode of a new inode (the caller's ids, the BSD group rule of set-group-ID directories; the
//! core applies the umask or the directory's default ACL), and dropping set-user/group-ID
//! bits and file capabilities after a write, truncate or chown (`FUSE_HANDLE_KILLPRIV_V2`);
//! POSIX ACLs are the kernel's to enforce and cache (`xattr`). Besides:
//! - inode numbers pass through unchanged (the root is inode 1 in both), with the inode's
//!   generation, one more each time its slot is reused; with `FUSE_EXPORT_SUPPORT` and lookups of
//!   "." (any inode) and ".." (directories) that makes file handles (`name_to_handle_at`, an NFS
//!   server exporting the mount) outlive the kernel's caches, unmount and remount, and a
//!   reused inode number gives ESTALE;
//! - lookup counts are not tracked: an inode lives while it has links or open handles (`open` and
//!   `release` feed the core's open count), which is what unlinked-but-open files need;
//! - no writeback cache unless asked (`with_writeback_cache`, `mount --relaxed
//!   --writeback-cache`): every `write(2)` reaches the core before it returns, so strict mode's
//!   "durable when it returns" holds for applications too;
//! - attributes, entries and the absence of names are cached by the kernel for `TTL` (an hour):
//!   every change of metadata reaches winefs through the kernel, which updates or drops what it
//!   cached; the changes the kernel does not make itself (a write dropping set-user-ID, the
//!   direct path's appends and hole filling) are followed by `FUSE_NOTIFY_INVAL_INODE`, and a
//!   file with direct appenders is answered with no attribute caching at all;
//! - with a direct path (`channel`, the preload library), whose processes store into the pool
//!   itself, a file is never both cached by the kernel and leased (`cache_gate`): an open that
//!   may read, not `O_APPEND` nor `O_DIRECT`, is cached unless the file is leased or the opener
//!   is a client's; every other open (`O_WRONLY`, `O_APPEND`, `O_DIRECT`, leased, a client's) is
//!   `FOPEN_DIRECT_IO` and `FOPEN_PARALLEL_DIRECT_WRITES` (mmap allowed,
//!   `FUSE_DIRECT_IO_ALLOW_MMAP`; without it, and with a writeback cache, every open is cached);
//!   a lease waits briefly for cached opens to be released and is refused if one is left.
//!   A mount with no direct path (`with_page_cache`) lets the kernel cache every open.

use crate::{
    DirEntry, Error, FileKind, Fs, RenameFlags as CoreRenameFlags, SetAttr,
};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, IoctlFlags, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatx, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use cache_gate::{CacheGate, OpenMode};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

mod attr;
pub mod cache_gate;
pub mod channel;
mod copy;
mod ioctl;
pub use ioctl::{READ_ONLY_IOCTL, READ_WRITE_IOCTL, SETTINGS_IOCTL, SETTINGS_LEN};
mod held;
mod notify;
mod privs;
pub mod proto;
mod xattr;

use attr::{errno, file_type, missing_name_attr, reply_empty, reply_entry, reply_xattr};
use attr::{to_time_set, ttl};
use held::KernelHeld;
pub(crate) use attr::TTL;
pub(crate) use notify::{invalidate_attributes, invalidate_data};
pub(crate) use attr::file_attr;

/// How long a thread serving `/dev/fuse` that has just answered keeps reading without sleeping
/// (`fuser::Config::dev_spin`): as long as the io_uring transport polls its rings. A caller
/// that sends its next request within it wakes no thread; on this virtual machine a wake-up
/// of an idle CPU at times took over 100 µs (docs/BENCHMARKS.md, "Reading on without
/// sleeping").
pub const DEV_SPIN: Duration = Duration::from_micros(50);

/// Largest write the kernel may send in one request (it needs `FUSE_MAX_PAGES`).
pub(crate) const MAX_WRITE: u32 = 1 << 20;

/// Directory entries fetched from the core per readdir page.
const READDIR_PAGE: usize = 256;

/// The FUSE adapter. Cheap to clone the handle it holds; the session owns one.
pub struct WinefsFuse {
    fs: Arc<Fs>,
    /// The session's channel for notifications to the kernel, once the session exists.
    notifier: Arc<OnceLock<Notifier>>,
    /// The direct-path channel's name, answered as the xattr `proto::CHANNEL_XATTR`.
    channel: Option<String>,
    /// The daemon's settings as mount options (`with_settings`), for `ioctl::SETTINGS_IOCTL`.
    settings: String,
    /// The kernel lets direct-I/O files be mapped: opens that must not be cached can be
    /// direct I/O.
    direct_io: bool,
    /// The kernel caches file data and writes it back later (`FUSE_WRITEBACK_CACHE`, asked
    /// for by `with_writeback_cache`): files are opened with the page cache.
    writeback_cache: bool,
    /// No process stores into the pool behind the kernel (no direct path): files are opened
    /// with the page cache (`with_page_cache`).
    page_cache: bool,
    /// Which opens are cached and which files are leased to direct-path clients, shared with
    /// the channel (`cache_gate`).
    gate: Arc<CacheGate>,
    /// POSIX ACLs are asked for (unless `without_acl`).
    want_acl: bool,
    /// The kernel enforces POSIX ACLs (`FUSE_POSIX_ACL`) and leaves the umask to us
    /// (`FUSE_DONT_MASK`): ACLs are kept (`xattr`).
    acl: bool,
    /// The inodes the kernel holds (`held`): READDIRPLUS lists them by name alone.
    held: KernelHeld,
}

/// The file handle of an open the kernel caches (`CacheGate` counts it until released);
/// direct-I/O opens get 0.
const CACHED_OPEN: FileHandle = FileHandle(1);

impl WinefsFuse {
    /// Feeds the entries of directory `ino` after position `offset` to `add` page by
    /// page until `add` reports the reply buffer full or the directory ends.
    fn each_dir_entry(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&DirEntry) -> bool,
    ) -> Result<(), Errno> {
        let mut pos = offset;
        loop {
            let page = self
                .fs
                .readdir_page(ino, pos, READDIR_PAGE)
                .map_err(|e| errno(&e))?;
            if page.is_empty() {
                return Ok(());
            }
            for e in &page {
                pos = e.offset;
                if add(e) {
                    return Ok(());
                }
            }
        }
    }

    /// Answer a lookup-like request (`attr::reply_entry`); the kernel then holds the inode.
    fn reply_entry(&self, reply: ReplyEntry, r: crate::Result<crate::Attr>) {
        if let Ok(a) = &r {
            self.held.mark(a.ino);
        }
        reply_entry(reply, r, &self.fs);
    }

    /// The adapter serving `fs` (the session holds it; `fs` stays shared with the caller).
    pub fn new(fs: Arc<Fs>) -> Self {
        WinefsFuse {
            held: KernelHeld::new(fs.statfs().inodes + 1),
            fs,
            notifier: Arc::new(OnceLock::new()),
            channel: None,
            settings: String::new(),
            direct_io: false,
            writeback_cache: false,
            page_cache: false,
            gate: Arc::new(CacheGate::default()),
            want_acl: true,
            acl: false,
        }
    }

    /// Keep no POSIX ACLs (ext4's `noacl`): they are refused with EOPNOTSUPP, the kernel
    /// enforces none, and a getxattr of an ACL name (`ls -l` asks one per file) is answered
    /// without a look at the file — with ACLs the kernel asks the daemon again after every
    /// listing with attributes, which drops what it cached.
    pub fn without_acl(mut self) -> Self {
        self.want_acl = false;
        self
    }

    /// Ask the kernel for its writeback cache: `write(2)` lands in the page cache and reaches
    /// winefs later (at the latest at fsync and close), and the kernel keeps mtime itself,
    /// sending it with SETATTR. For relaxed mounts with no direct path (the mount command
    /// enforces both): strict mode's "durable when the write returns" cannot hold, and a
    /// direct-path store would miss the cached copy.
    pub fn with_writeback_cache(mut self) -> Self {
        self.writeback_cache = true;
        self
    }

    /// Let the kernel cache file data, for a mount that offers no direct path (`mount
    /// --no-direct`, a read-only mount): every write then goes through the kernel, which
    /// keeps its cache in step, so reads are served from it and read ahead in large requests
    /// instead of one request per `read(2)`, and kept from one open to the next
    /// (`FOPEN_KEEP_CACHE`); writes still reach winefs before `write(2)` returns.
    pub fn with_page_cache(mut self) -> Self {
        self.page_cache = true;
        self
    }

    /// What the daemon was started with, as mount options (`relaxed,threads=2,...`): a
    /// remount is refused an option that differs (`mount.winefs`).
    pub fn with_settings(mut self, settings: String) -> Self {
        self.settings = settings;
        self
    }

    /// Advertise the direct-path channel `name` to the preload library.
    pub fn with_channel(mut self, name: &str) -> Self {
        self.channel = Some(name.to_string());
        self
    }

    /// Which files the kernel may cache, shared with the mount's direct-path channel.
    pub fn cache_gate(&self) -> Arc<CacheGate> {
        Arc::clone(&self.gate)
    }

    /// How thread `tid` opens regular file `ino` with open flags `flags`: with the page cache
    /// where no direct-path store can go behind the kernel (`with_page_cache`,
    /// `with_writeback_cache`); otherwise, on a kernel that can map direct-I/O files, as the
    /// [`CacheGate`] decides. The handle tells `release` whether a cached open goes.
    fn open_file(&self, ino: u64, tid: u32, flags: i32) -> (FileHandle, FopenFlags) {
        // An append-only file only takes writes at its end; a writeback cache would send pages
        // back from below it.
        if self.writeback_cache
            && flags & libc::O_ACCMODE != libc::O_RDONLY
            && ioctl::append_only(&self.fs, ino)
        {
            return (FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        if self.writeback_cache || self.page_cache {
            // Nothing stores behind the kernel: what it cached stays true across opens.
            return (FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
        if !self.direct_io {
            // A direct path the kernel cannot be kept apart from: each open at least starts
            // from what the pool holds.
            return (FileHandle(0), FopenFlags::empty());
        }
        match self.gate.open(ino, tid, flags) {
            // Kept across opens: a lease's end drops the pages (`channel`); the rest is the kernel's.
            OpenMode::Cached => (CACHED_OPEN, FopenFlags::FOPEN_KEEP_CACHE),
            OpenMode::Direct => (
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            ),
        }
    }

    /// Where the mount puts the session's [`Notifier`] once the session is made (the adapter
    /// moves into the session first). With it, a change the kernel did not ask for (a write
    /// dropping set-user-ID) reaches the kernel's attribute cache at once; without it the
    /// kernel shows the old mode until its cache times out (`TTL`).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        Arc::clone(&self.notifier)
    }

    /// A removal's result (`Fs::unlink_held` and its kin): an inode that lost its last name is
    /// kept until the kernel forgets it (`held`), or let go at once if it already has (its
    /// FORGET, served meanwhile, found nothing kept to let go).
    fn removed(&self, r: crate::Result<Option<u64>>) -> crate::Result<()> {
        if let Ok(Some(ino)) = r
            && !self.held.holds(ino)
        {
            self.let_go(ino);
        }
        r.map(drop)
    }

    /// The kernel holds `ino` no more: the hold a removal took on it, if any, goes.
    fn let_go(&self, ino: u64) {
        if let Err(e) = self.fs.let_go(ino) {
            log::error!("inode {ino}, removed and now forgotten by the kernel: {e}");
        }
    }

    /// Tell the kernel that its cached attributes of `ino` are stale.
    fn attributes_changed(&self, ino: u64) {
        invalidate_attributes(&self.notifier, ino);
    }
}

impl Filesystem for WinefsFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Optional capabilities: a kernel without them still works, only slower.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_EXPORT_SUPPORT
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let caps = config.add_capabilities(wanted);
        // Both or neither: with ACLs the kernel stops applying the umask itself, and a create
        // in a directory with a default ACL must not have it applied at all.
        self.acl = self.want_acl
            && config
                .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
                .is_ok();
        if self.want_acl && !self.acl {
            log::warn!("the kernel does not enforce POSIX ACLs for FUSE: setfacl is refused");
        }
        if self.writeback_cache {
            config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .map_err(|_| std::io::Error::other("the kernel offers no FUSE writeback cache"))?;
        }
        // Without it a direct-I/O file cannot be mapped shared: keep the page cache then.
        self.direct_io = config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        if !self.direct_io && !self.writeback_cache {
            log::warn!(
                "the kernel cannot map direct-I/O FUSE files: file data is cached by the kernel, \
                 and a store through a direct-path mapping may be missed by read(2) through \
                 the mount until that cache is dropped"
            );
        }
        let size = |r: Result<u32, u32>| match r {
            Ok(_) => format!("{MAX_WRITE}"),
            Err(max) => format!("left as it was ({MAX_WRITE} is over {max})"),
        };
        let write = size(config.set_max_write(MAX_WRITE));
        let readahead = size(config.set_max_readahead(MAX_WRITE));
        log::debug!(
            "FUSE init: optional capabilities {}; max write {write}; max readahead {readahead}",
            match caps {
                Ok(()) => "on".to_string(),
                Err(missing) => format!("off (the kernel lacks {missing:?})"),
            },
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // The kernel asks for "." of any inode (a directory or not) to turn a file handle
        // (`open_by_handle_at`, an NFS server) whose inode it no longer caches back into one;
        // a freed inode answers ESTALE, a reused one a new generation, which the kernel
        // compares with the handle's.
        if name.as_bytes() == b"." {
            return self.reply_entry(reply, self.fs.getattr(parent.0));
        }
        match self.fs.lookup(parent.0, name.as_bytes()) {
            // A missing name is cached as missing (node 0): only a request through the kernel
            // can make it, and that replaces the kernel's negative entry.
            Err(e) if e.errno() == libc::ENOENT => reply.entry(
                &TTL,
                &missing_name_attr(),
                Generation(0),
            ),
            r => self.reply_entry(reply, r),
        }
    }

    /// The kernel dropped `ino` (a BATCH_FORGET comes here once per inode).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if self.held.forget(ino.0, nlookup) {
            self.let_go(ino.0);
        }
    }

    /// The session ends (unmount): the kernel forgets every inode without a FORGET.
    fn destroy(&mut self) {
        if let Err(e) = self.fs.let_go_all() {
            log::error!("inodes removed while the kernel held them, let go at the end: {e}");
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl(&self.fs, ino.0), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// statx(2) asking for the birth time (GNU `stat` does): GETATTR's answer with the inode's
    /// creation time. No statx attribute bits: the kernel's FUSE client (6.18) drops them.
    fn statx(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, _flags: u32, _mask: u32, reply: ReplyStatx) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.statx(&ttl(&self.fs, ino.0), &file_attr(&a), 0, 0),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Nothing to set: chown(f, -1, -1), which changes ctime and drops set-ID bits below.
        let touch = [mode, uid, gid].iter().all(Option::is_none)
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(to_time_set),
            mtime: mtime.map(to_time_set),
            touch,
        };
        let before = match self.fs.getattr(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        let a = match self.fs.setattr(ino.0, &set) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        // The VFS rules the kernel leaves to us under FUSE_HANDLE_KILLPRIV_V2: a chown of a
        // non-directory drops set-user/group-ID, and so does a truncate by an unprivileged
        // caller (fuser does not pass FATTR_KILL_SUIDGID; uid 0 stands in for CAP_FSETID).
        // Group membership is judged by the group the file had before a chown.
        let chown = (uid.is_some() || gid.is_some() || touch) && a.kind != FileKind::Dir;
        let truncate = size.is_some() && req.uid() != 0;
        if mode.is_none() && (chown || truncate) || size.is_some() {
            let kill = (mode.is_none() && (chown || truncate))
                .then(|| privs::keeps_set_gid(req, before.gid));
            privs::drop_privileges_as(&self.fs, ino.0, kill);
        }
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl(&self.fs, ino.0), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // Directories and symlinks have their own requests (mkdir, symlink).
        let Some(kind) =
            FileKind::from_mode(mode).filter(|k| !matches!(k, FileKind::Dir | FileKind::Symlink))
        else {
            return reply.error(Errno::EINVAL);
        };
        let (perm, who) = privs::new_owner(&self.fs, req, parent.0, mode, umask, false, self.acl);
        let r = match kind {
            FileKind::File => self.fs.create_by(parent.0, name.as_bytes(), perm, who),
            _ => self.fs.mknod_by(parent.0, name.as_bytes(), kind, perm, rdev, who),
        };
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (perm, who) = privs::new_owner(&self.fs, req, parent.0, mode, umask, true, self.acl);
        self.reply_entry(reply, self.fs.mkdir_by(parent.0, name.as_bytes(), perm, who));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.removed(self.fs.unlink_held(parent.0, name.as_bytes(), true)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.removed(self.fs.rmdir_held(parent.0, name.as_bytes(), true)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (_, who) = privs::new_owner(&self.fs, req, parent.0, 0o777, 0, false, self.acl);
        let target = target.as_os_str().as_bytes();
        let r = self.fs.symlink(parent.0, link_name.as_bytes(), target, who.uid, who.gid);
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = RenameFlags::RENAME_NOREPLACE
            | RenameFlags::RENAME_EXCHANGE
            | RenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) {
            return reply.error(Errno::EINVAL);
        }
        // The whiteout is the caller's, as a mknod in the source's directory would be (the
        // kernel has checked CAP_MKNOD).
        let whiteout = flags.contains(RenameFlags::RENAME_WHITEOUT).then(|| {
            let (_, who) = privs::new_owner(&self.fs, req, parent.0, 0, 0, false, self.acl);
            (who.uid, who.gid)
        });
        let f = CoreRenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            whiteout,
        };
        let (from, to) = ((parent.0, name.as_bytes()), (newparent.0, newname.as_bytes()));
        reply_empty(reply, self.removed(self.fs.rename_held(from, to, f, true)));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0) {
            Ok(a) if a.kind == FileKind::Dir => {
                let _ = self.fs.release(ino.0);
                reply.error(Errno::EISDIR)
            }
            // Immutable or append-only (`chattr`): writing opens refused as Linux refuses them.
            Ok(_) => match self.fs.check_open(ino.0, flags.0) {
                Ok(()) => {
                    let (fh, how) = self.open_file(ino.0, req.pid(), flags.0);
                    reply.opened(fh, how)
                }
                Err(e) => {
                    let _ = self.fs.release(ino.0);
                    reply.error(errno(&e))
                }
            },
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The kernel leaves access times to the daemon; an O_NOATIME open's reads store none.
        let atime = flags.0 & libc::O_NOATIME == 0;
        // Straight into the reply: over io_uring that is the ring entry's payload, which the
        // kernel copies to the caller (one copy fewer than a buffer of our own).
        reply.data_with(size as usize, |buf| {
            let r = match atime {
                true => self.fs.read(ino.0, offset, buf),
                false => self.fs.read_noatime(ino.0, offset, buf),
            };
            r.map_err(|e| errno(&e))
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // O_APPEND: the kernel passes the end of file it knows as `offset`, which lags behind
        // while a direct-path client appends (its size is on the size board); the end is found
        // here, atomically with the write.
        let written = if flags.0 & libc::O_APPEND != 0 {
            self.fs.append(ino.0, data).map(|(n, _)| n)
        } else {
            self.fs.write(ino.0, offset, data)
        };
        match written {
            Ok(n) => {
                // The kernel sets the flag for callers without CAP_FSETID.
                let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
                if privs::drop_privileges(&self.fs, req, ino.0, kill) {
                    // The write reply carries no attributes, and the kernel's cached mode
                    // (still with the dropped bits) would be shown until it times out.
                    self.attributes_changed(ino.0);
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        match ioctl::serve(&self.fs, &self.settings, req.uid(), ino.0, cmd, in_data) {
            Ok(answer) => {
                if answer.changed {
                    self.attributes_changed(ino.0);
                }
                reply.ioctl(0, &answer.out)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered: every write was durable when it returned. ENOSYS (rather than
        // success) tells the kernel never to send FLUSH again, saving a round trip per close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh == CACHED_OPEN {
            self.gate.closed(ino.0);
        }
        reply_empty(reply, self.fs.release(ino.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Counted as a file's open is: a directory removed while open lives until RELEASEDIR.
        match self.fs.open(ino.0) {
            Ok(a) if a.kind == FileKind::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => {
                let _ = self.fs.release(ino.0);
                reply.error(Errno::ENOTDIR)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.release(ino.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.each_dir_entry(ino.0, offset, |e| {
            reply.add(
                INodeNo(e.ino),
                e.offset,
                file_type(e.kind),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut linked: Vec<u64> = Vec::new();
        let r = self.each_dir_entry(ino.0, offset, |e| {
            // An entry removed since the page was read is skipped, as a later readdir
            // would not show it either.
            let Ok(a) = self.fs.getattr(e.ino) else {
                return false;
            };
            let name = OsStr::from_bytes(&e.name);
            // Linking an inode the kernel holds would drop its cached ACLs (held.rs).
            if self.held.holds(e.ino) {
                return reply.add_name_only(e.offset, name, &file_attr(&a));
            }
            let full = reply.add(
                INodeNo(e.ino),
                e.offset,
                name,
                &ttl(&self.fs, e.ino),
                &file_attr(&a),
                Generation(a.generation as u64),
            );
            if !full {
                self.held.mark(e.ino);
                linked.push(e.ino);
            }
            full
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => {
                // The entries counted are never sent.
                for ino in linked {
                    if self.held.forget(ino, 1) {
                        self.let_go(ino);
                    }
                }
                reply.error(e)
            }
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fs.fsync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.free_blocks,
            s.free_blocks,
            s.inodes,
            s.free_inodes,
            s.block_size as u32,
            s.name_max,
            s.block_size as u32,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.set_attribute(req, ino.0, name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.attribute(ino.0, name), size);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.attribute_names(ino.0), size);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove_attribute(req, ino.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.fs.getattr(ino.0) {
            Ok(a) if privs::permitted(req, &a, mask) => reply.ok(),
            Ok(_) => reply.error(Errno::EACCES),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (perm, who) = privs::new_owner(&self.fs, req, parent.0, mode, umask, false, self.acl);
        let made = match self.fs.create_by(parent.0, name.as_bytes(), perm, who) {
            // Another opener won the race for the name: O_CREAT without O_EXCL opens it.
            Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                self.fs.lookup(parent.0, name.as_bytes())
            }
            r => r,
        };
        let a = match made.and_then(|a| self.fs.open(a.ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        if a.kind == FileKind::Dir {
            let _ = self.fs.release(a.ino);
            return reply.error(Errno::EISDIR);
        }
        let (fh, how) = self.open_file(a.ino, req.pid(), flags);
        self.held.mark(a.ino);
        reply.created(&TTL, &file_attr(&a), Generation(a.generation as u64), fh, how);
    }

    /// open(2) with `O_TMPFILE`: a file in no directory, opened (its release frees it unless a
    /// link named it; the kernel sends that link only without `O_EXCL`).
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (perm, who) = privs::new_owner(&self.fs, req, parent.0, mode, umask, false, self.acl);
        let linkable = flags & libc::O_EXCL == 0;
        match self.fs.create_unnamed_by(parent.0, perm, who, linkable) {
            Ok(a) => {
                let (fh, how) = self.open_file(a.ino, req.pid(), flags);
                self.held.mark(a.ino);
                reply.created(&TTL, &file_attr(&a), Generation(a.generation as u64), fh, how);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        let (fs, ino) = (&self.fs, ino.0);
        let r = match mode {
            0 => fs.fallocate(ino, offset, length, false),
            KEEP => fs.fallocate(ino, offset, length, true),
            m if m == libc::FALLOC_FL_PUNCH_HOLE | KEEP => fs.punch_hole(ino, offset, length),
            libc::FALLOC_FL_ZERO_RANGE => fs.zero_range(ino, offset, length, false),
            m if m == libc::FALLOC_FL_ZERO_RANGE | KEEP => fs.zero_range(ino, offset, length, true),
            // The kernel's FUSE client (Linux 6.18) refuses these two itself; served for
            // clients that pass them on.
            libc::FALLOC_FL_COLLAPSE_RANGE => fs.collapse_range(ino, offset, length),
            libc::FALLOC_FL_INSERT_RANGE => fs.insert_range(ino, offset, length),
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        // A change of the file drops its privileges as a write does (ext4's file_modified);
        // the kernel leaves that to the server here. Uid 0 stands in for CAP_FSETID.
        if r.is_ok() && privs::drop_privileges(fs, req, ino, req.uid() != 0) {
            self.attributes_changed(ino);
        }
        reply_empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        // The kernel answers SEEK_SET/CUR/END itself; only SEEK_DATA and SEEK_HOLE come here.
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek_data_hole(ino.0, off, data) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match copy::copy_range(&self.fs, ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

#[cfg(test)]
mod tests;
