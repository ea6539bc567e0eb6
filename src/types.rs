//! The value types of the public API: options, attributes, directory entries, statistics.
//!
//! They sit below the mount state so that every layer can speak them; they hold no state and
//! do no I/O.

use crate::media::layout::FileKind;

/// Data guarantees of a mount (the WineFS paper's strict and relaxed modes), chosen at mount.
/// Not to be confused with a file's POSIX mode bits ([`Attr::perm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    /// Every metadata operation is atomic and durable when it returns; a data write is
    /// durable when it returns and atomic whatever its size (docs/DESIGN.md §5 gives the two
    /// bounds, both reported): small overwrites alternate between the file and a slot, whole
    /// 2 MiB units are swapped for fresh extents, the rest is undo-journaled or copied on write.
    #[default]
    Strict,
    /// Metadata atomic and durable; data written in place (durable on return, but a torn
    /// overwrite is possible after a crash).
    Relaxed,
}

/// Mount options.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    /// Data guarantees.
    pub consistency: Consistency,
    /// Map the pool copy-on-write: recovery and every change stay in this process (fsck).
    pub private: bool,
    /// Serve reads only: the pool is mapped copy-on-write (as `private`, so recovery of a pool
    /// that was not cleanly unmounted happens in memory), nothing is ever written to it, and
    /// every call that would change the file system fails with `Error::ReadOnly` (EROFS).
    /// The one way to mount a pool flagged "needs fsck".
    pub read_only: bool,
    /// Do not rewrite fragmented files or compact holes in the background (`Fs::rewrite` and
    /// `Fs::compact` still work), and write alternate slots back only when a zone is empty;
    /// for measuring layouts as they are, and for the crash explorer's determinism.
    pub no_background_rewrite: bool,
    /// How strict mode writes overwrites inside one block (for comparing the paths:
    /// `winefs bench small`); the default is the fastest.
    pub overwrite_path: OverwritePath,
    /// Wear-aware allocation: small allocations from holes go next fit (spread over every
    /// hole) instead of lowest address first; aligned extents are handed out as before.
    pub wear_aware: bool,
    /// Do not fault the pool's pages in ahead of use at mount (`Fs::prefault` starts it
    /// later: the mount daemon calls it after it forks, since a fork keeps no threads).
    pub no_prefault: bool,
    /// How many idle file states a mount keeps in DRAM at most (0: the default, 65,536). A file
    /// state is built from its inode's table slot on first use; past this many, the states of
    /// files that nothing holds (not open, mapped, leased, or holding alternate slots) are
    /// dropped again, oldest loaded first, and rebuilt when next used.
    pub cached_inodes: u64,
    /// Never store access times (as `mount -o noatime`). Without it, reads and directory
    /// listings store them as Linux's default `relatime` does (`ops::file::touch_atime`).
    pub noatime: bool,
}

/// How strict mode writes an overwrite inside one block of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverwritePath {
    /// Alternate writing: once, into a slot or at home (docs/DESIGN.md §5); the other paths
    /// where it does not apply.
    #[default]
    Alternate,
    /// Undo journaling in aligned extents, copy-on-write elsewhere (the paths before slots).
    Journal,
    /// Copy-on-write everywhere, aligned extents too (which the file then loses): the NOVA
    /// way, for comparison only.
    CopyOnWrite,
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
    /// Keep a write counter per pool block (`winefs wear`): 4 bytes per 4 KiB block, counted in
    /// DRAM and saved at clean unmount.
    pub wear_stats: bool,
}

/// Attributes of an inode. Times are nanoseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File type.
    pub kind: FileKind,
    /// Permission bits, including setuid, setgid and sticky (`mode & 0o7777`).
    pub perm: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte units allocated (data, extent index and xattr blocks).
    pub blocks: u64,
    /// Last access.
    pub atime: i64,
    /// Last data change.
    pub mtime: i64,
    /// Last inode change.
    pub ctime: i64,
    /// Creation.
    pub crtime: i64,
    /// Device number of a device special file.
    pub rdev: u32,
    /// Inode generation: differs between inodes that reused one inode number.
    pub generation: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time.
    Now,
    /// This time, in nanoseconds since the Unix epoch.
    At(i64),
}

/// Attribute changes (setattr); `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (the file type bits are ignored).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size (truncate or extend).
    pub size: Option<u64>,
    /// Access time.
    pub atime: Option<TimeSet>,
    /// Modification time.
    pub mtime: Option<TimeSet>,
    /// Mark the inode changed (a new ctime) even if nothing else is set, as `chown(f, -1, -1)`
    /// does on Linux; refused on an immutable file, as setting the times to now is.
    pub touch: bool,
}

/// One readdir entry; `offset` resumes after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode the entry names.
    pub ino: u64,
    /// Its file type.
    pub kind: FileKind,
    /// The name (any bytes but '/' and NUL).
    pub name: Vec<u8>,
    /// Position to resume a listing after this entry.
    pub offset: u64,
}

/// File-system statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Block size in bytes.
    pub block_size: u64,
    /// Blocks in the data area.
    pub blocks: u64,
    /// Blocks a write can use: free blocks plus `preallocated_blocks` and `zone_blocks`.
    pub free_blocks: u64,
    /// Of `free_blocks`, those files hold as speculative preallocation past their end, given
    /// back when a small file is closed or when an allocation would otherwise fail.
    pub preallocated_blocks: u64,
    /// Of `free_blocks`, those lent to the alternate-slot zones (whole 2 MiB units), given back
    /// when space runs short, at unmount and at mount.
    pub zone_blocks: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Longest name.
    pub name_max: u32,
    /// Free aligned 2 MiB extents (what hugepage mappings are made of).
    pub free_aligned_extents: u64,
}

/// Who makes a new inode: the owner and group it gets, and the making process's umask, which
/// narrows the permission bits unless the directory has a default ACL (whose entries narrow
/// them instead, POSIX.1e). What the kernel hands the FUSE front end with a create
/// (`Fs::create_by` and the rest); the plain `Fs::create` and the rest have no umask and
/// apply default ACLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Maker {
    /// The new inode's owner.
    pub uid: u32,
    /// The new inode's group.
    pub gid: u32,
    /// Permission bits the process does not grant by default (umask(2)).
    pub umask: u32,
    /// The directory's default ACL applies (it does unless the FUSE mount keeps no ACLs:
    /// then, as on ext4 mounted `noacl`, the umask always applies and nothing is inherited).
    pub acls: bool,
}

/// setxattr behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XattrSet {
    /// Create or replace.
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
    /// Fail with EEXIST if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap source and target atomically (RENAME_EXCHANGE).
    pub exchange: bool,
    /// Leave a whiteout at the source, owned by this `(uid, gid)`: a character device 0:0
    /// with mode 0, made in the rename's transaction (RENAME_WHITEOUT, which overlayfs asks of
    /// its upper layer). Not with `exchange`.
    pub whiteout: Option<(u32, u32)>,
}

/// What a reactive rewrite did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RewriteStats {
    /// Units moved onto aligned extents.
    pub units_rewritten: u64,
    /// Units holding data that were looked at.
    pub units_seen: u64,
}

/// What a hole compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Broken units emptied and returned as aligned extents.
    pub units_freed: u64,
    /// Blocks of file data moved.
    pub blocks_moved: u64,
    /// Broken units that qualified (file data only, at most 7/8 full).
    pub candidates: u64,
}
