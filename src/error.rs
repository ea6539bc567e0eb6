//! Typed errors for every layer, and their one mapping to errno.

use std::io;

/// Result alias used across winefs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in winefs. Each variant maps to exactly one errno in [`Error::errno`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// ENOENT: no such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST: the name is taken.
    #[error("file exists")]
    Exists,
    /// ENOTDIR: a directory was needed.
    #[error("not a directory")]
    NotDir,
    /// EISDIR: a directory where a non-directory was needed.
    #[error("is a directory")]
    IsDir,
    /// ENOTEMPTY: removing or replacing a directory that has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// ENAMETOOLONG: a name longer than 255 bytes (its length).
    #[error("file name too long: {0} bytes (limit 255)")]
    NameTooLong(usize),
    /// ENOSPC: out of blocks, inodes or attribute space (what ran out).
    #[error("no space left in pool: {0}")]
    NoSpace(String),
    /// EINVAL: a bad argument or request (what was wrong).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// EPERM: not allowed (why).
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// EACCES: refused by permissions (why), such as a default ACL on a file that is not a
    /// directory.
    #[error("permission denied: {0}")]
    AccessDenied(String),
    /// EOPNOTSUPP: a request this file system does not serve (what), such as an extended
    /// attribute outside the `user.`, `trusted.` and `security.` namespaces.
    #[error("operation not supported: {0}")]
    NotSupported(String),
    /// ENODEV: not supported on this kind of file or pool (what).
    #[error("operation not supported here: {0}")]
    NoDevice(String),
    /// EBUSY: in use, e.g. a pool mounted by another process (what).
    #[error("resource busy: {0}")]
    Busy(String),
    /// EMLINK: the link count would overflow.
    #[error("too many links")]
    TooManyLinks,
    /// ENODATA: no extended attribute of that name.
    #[error("no such attribute")]
    NoAttr,
    /// ERANGE: a buffer too small, or an attribute name too long.
    #[error("attribute value does not fit in the caller's buffer")]
    Range,
    /// EFBIG: past the largest file size.
    #[error("file too large")]
    FileTooBig,
    /// ELOOP: too many symbolic links followed.
    #[error("too many levels of symbolic links")]
    Loop,
    /// ENXIO: SEEK_DATA/SEEK_HOLE past the end of the file.
    #[error("offset is beyond the end of the file")]
    NoSuchOffset,
    /// ESTALE: the inode (its number) was freed.
    #[error("stale inode {0}: it no longer exists")]
    Stale(u64),
    /// EIO: the media breaks an invariant of the format (the defect, naming the field).
    #[error("corrupt pool: {0}")]
    Corrupted(String),
    /// EROFS: the pool is mounted read-only (`MountOptions::read_only`).
    #[error("read-only file system: the pool is mounted read-only")]
    ReadOnly,
    /// EIO: a writable mount of a pool flagged "needs fsck" (why, and what to run).
    #[error("pool needs fsck: {0}")]
    NeedsFsck(String),
    /// EIO: the file or device does not hold a winefs pool (what was found).
    #[error("not a winefs pool: {0}")]
    Foreign(String),
    /// EIO: a pool of another format version.
    #[error("unsupported pool format version {found} (this build reads version {supported})")]
    Version {
        /// The version in the superblock.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// EINVAL: the pool cannot hold the requested layout.
    #[error("pool too small: {size} bytes, winefs needs at least {min} bytes")]
    PoolTooSmall {
        /// The pool's size in bytes.
        size: u64,
        /// The least size that would do, in bytes.
        min: u64,
    },
    /// The system's error from an I/O call (its errno).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wrap an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The POSIX errno this error stands for (the single place this mapping lives).
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong(_) => libc::ENAMETOOLONG,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Invalid(_) => libc::EINVAL,
            Error::NotPermitted(_) => libc::EPERM,
            Error::AccessDenied(_) => libc::EACCES,
            Error::Busy(_) => libc::EBUSY,
            Error::NoDevice(_) => libc::ENODEV,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::TooManyLinks => libc::EMLINK,
            Error::NoAttr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::FileTooBig => libc::EFBIG,
            Error::Loop => libc::ELOOP,
            Error::Stale(_) => libc::ESTALE,
            Error::NoSuchOffset => libc::ENXIO,
            Error::ReadOnly => libc::EROFS,
            Error::Corrupted(_)
            | Error::NeedsFsck(_)
            | Error::Foreign(_)
            | Error::Version { .. } => libc::EIO,
            Error::PoolTooSmall { .. } => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Shorthand for a corruption error with a formatted message (which names the field or defect).
macro_rules! corrupt {
    ($($arg:tt)*) => { $crate::error::Error::Corrupted(format!($($arg)*)) };
}
pub(crate) use corrupt;
