//! Typed errors for every layer, and their one mapping to errno.

use std::io;

/// Result alias used across winefs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in winefs. Each variant maps to exactly one errno in [`Error::errno`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long: {0} bytes (limit 255)")]
    NameTooLong(usize),
    #[error("no space left in pool: {0}")]
    NoSpace(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("operation not supported here: {0}")]
    NoDevice(String),
    #[error("resource busy: {0}")]
    Busy(String),
    #[error("too many links")]
    TooManyLinks,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value does not fit in the caller's buffer")]
    Range,
    #[error("file too large")]
    FileTooBig,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("offset is beyond the end of the file")]
    NoSuchOffset,
    #[error("stale inode {0}: it no longer exists")]
    Stale(u64),
    #[error("corrupt pool: {0}")]
    Corrupted(String),
    #[error("not a winefs pool: {0}")]
    Foreign(String),
    #[error("unsupported pool format version {found} (this build reads version {supported})")]
    Version { found: u32, supported: u32 },
    #[error("pool too small: {size} bytes, winefs needs at least {min} bytes")]
    PoolTooSmall { size: u64, min: u64 },
    #[error("{context}: {source}")]
    Io {
        context: String,
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
            Error::Busy(_) => libc::EBUSY,
            Error::NoDevice(_) => libc::ENODEV,
            Error::TooManyLinks => libc::EMLINK,
            Error::NoAttr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::FileTooBig => libc::EFBIG,
            Error::Loop => libc::ELOOP,
            Error::Stale(_) => libc::ESTALE,
            Error::NoSuchOffset => libc::ENXIO,
            Error::Corrupted(_) | Error::Foreign(_) | Error::Version { .. } => libc::EIO,
            Error::PoolTooSmall { .. } => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Shorthand for a corruption error with a formatted message.
macro_rules! corrupt {
    ($($arg:tt)*) => { $crate::error::Error::Corrupted(format!($($arg)*)) };
}
pub(crate) use corrupt;
