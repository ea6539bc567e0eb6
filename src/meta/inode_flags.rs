//! The flags a user sets on an inode with `chattr` (immutable, append-only, no-dump, no-atime):
//! what each change of an inode or directory they forbid, as the Linux VFS rules them, and their
//! two ioctl spellings (`FS_IOC_GETFLAGS` bits, `FS_IOC_FSGETXATTR` xflags).
//!
//! The kernel enforces these flags through a FUSE mount nowhere (it never sees them in the
//! inode), so every operation of the core that changes an inode asks [`allow`] under the
//! inode's lock; the library and the mount then agree.

use crate::error::{Error, Result};
use crate::media::layout::{
    INODE_APPEND_ONLY, INODE_IMMUTABLE, INODE_NOATIME, INODE_NODUMP, INODE_USER_FLAGS,
};

/// A change an operation is about to make to an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Bytes below the end rewritten, the size set or blocks punched, zeroed, collapsed or
    /// inserted.
    Contents,
    /// Bytes added at or past the end, or blocks allocated without touching what the file holds.
    Append,
    /// Owner, group, mode or times set to given values.
    Attributes,
    /// Modification and change times set to now (`touch`).
    TimesToNow,
    /// An extended attribute set or removed.
    Xattr,
    /// The inode itself gains or loses a name (link, unlink, rename).
    Name,
    /// A directory gains an entry.
    EntryAdded,
    /// A directory loses an entry (unlink, rename away, a name replaced by rename).
    EntryRemoved,
}

/// Ok if an inode with `flags` (its flags word) may undergo `change`; else EPERM, as Linux
/// answers: an immutable inode allows none of them, an append-only one only appends, touches
/// and new entries.
pub fn allow(flags: u32, change: Change) -> Result<()> {
    let denied = match change {
        Change::Append | Change::TimesToNow | Change::EntryAdded => INODE_IMMUTABLE,
        Change::Contents
        | Change::Attributes
        | Change::Xattr
        | Change::Name
        | Change::EntryRemoved => INODE_IMMUTABLE | INODE_APPEND_ONLY,
    };
    match flags & denied {
        0 => Ok(()),
        f if f & INODE_IMMUTABLE != 0 => Err(Error::NotPermitted("the file is immutable".into())),
        _ => Err(Error::NotPermitted("the file is append-only".into())),
    }
}

/// Whether reads and listings of an inode with `flags` store access times.
pub fn stores_atime(flags: u32) -> bool {
    flags & INODE_NOATIME == 0
}

/// The flags a new inode takes from its directory's `parent_flags`: no-dump and no-atime, as
/// ext4 passes them on.
pub fn inherited(parent_flags: u32) -> u32 {
    parent_flags & (INODE_NODUMP | INODE_NOATIME)
}

/// The user's flags of an inode whose flags word is `flags`, as `FS_IOC_GETFLAGS` bits (the
/// on-media bits are Linux's).
pub fn user_flags(flags: u32) -> u32 {
    flags & INODE_USER_FLAGS
}

/// `FS_IOC_SETFLAGS` bits checked: Ok(the user's flags) or EOPNOTSUPP for a flag winefs does not
/// keep (compression, data journaling, ...), the answer ext4 gives for those it lacks.
pub fn from_user_flags(bits: u32) -> Result<u32> {
    match bits & !INODE_USER_FLAGS {
        0 => Ok(bits),
        other => Err(Error::NotSupported(format!("inode flags {other:#x} are not kept"))),
    }
}

/// `FS_IOC_FSGETXATTR`'s flag bits and the inode flags they stand for.
const XFLAGS: [(u32, u32); 4] = [
    (0x8, INODE_IMMUTABLE),   // FS_XFLAG_IMMUTABLE
    (0x10, INODE_APPEND_ONLY), // FS_XFLAG_APPEND
    (0x40, INODE_NOATIME),     // FS_XFLAG_NOATIME
    (0x80, INODE_NODUMP),      // FS_XFLAG_NODUMP
];

/// The user's flags as `struct fsxattr`'s `fsx_xflags`.
pub fn to_xflags(flags: u32) -> u32 {
    XFLAGS.iter().filter(|&&(_, f)| flags & f != 0).map(|&(x, _)| x).sum()
}

/// `fsx_xflags` checked: Ok(the user's flags) or EOPNOTSUPP for a flag winefs does not keep.
pub fn from_xflags(xflags: u32) -> Result<u32> {
    let known: u32 = XFLAGS.iter().map(|&(x, _)| x).sum();
    match xflags & !known {
        0 => Ok(XFLAGS.iter().filter(|&&(x, _)| xflags & x != 0).map(|&(_, f)| f).sum()),
        other => Err(Error::NotSupported(format!("inode xflags {other:#x} are not kept"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immutable_forbids_every_change_and_append_only_all_but_growth() {
        let all = [
            Change::Contents,
            Change::Append,
            Change::Attributes,
            Change::TimesToNow,
            Change::Xattr,
            Change::Name,
            Change::EntryAdded,
            Change::EntryRemoved,
        ];
        for c in all {
            assert!(allow(0, c).is_ok(), "{c:?}");
            assert!(allow(INODE_NODUMP | INODE_NOATIME, c).is_ok(), "{c:?}");
            let e = allow(INODE_IMMUTABLE | INODE_APPEND_ONLY, c).unwrap_err();
            assert_eq!(e.errno(), libc::EPERM, "{c:?}");
            assert!(e.to_string().contains("immutable"), "{e}");
            let grows = matches!(c, Change::Append | Change::TimesToNow | Change::EntryAdded);
            assert_eq!(allow(INODE_APPEND_ONLY, c).is_ok(), grows, "{c:?}");
        }
    }

    #[test]
    fn both_spellings_round_trip_and_unknown_flags_are_refused() {
        // Linux's FS_IMMUTABLE_FL, FS_APPEND_FL, FS_NODUMP_FL, FS_NOATIME_FL (linux/fs.h).
        assert_eq!([INODE_IMMUTABLE, INODE_APPEND_ONLY, INODE_NODUMP, INODE_NOATIME], [0x10, 0x20, 0x40, 0x80]);
        for f in 0..=INODE_USER_FLAGS >> 4 {
            let f = f << 4;
            assert_eq!(from_user_flags(f).unwrap(), f);
            assert_eq!(from_xflags(to_xflags(f)).unwrap(), f);
        }
        assert_eq!(to_xflags(INODE_IMMUTABLE | INODE_NOATIME), 0x8 | 0x40);
        // Compression (FS_COMPR_FL) and FS_XFLAG_REALTIME are not kept.
        assert_eq!(from_user_flags(0x4 | INODE_IMMUTABLE).unwrap_err().errno(), libc::EOPNOTSUPP);
        assert_eq!(from_xflags(0x1).unwrap_err().errno(), libc::EOPNOTSUPP);
        // The inode's own bits never show as the user's.
        assert_eq!(user_flags(0x7 | INODE_APPEND_ONLY), INODE_APPEND_ONLY);
        assert_eq!(inherited(INODE_USER_FLAGS), INODE_NODUMP | INODE_NOATIME);
        assert!(!stores_atime(INODE_NOATIME) && stores_atime(INODE_NODUMP));
    }
}
