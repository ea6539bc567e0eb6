//! Core attributes, times and errors in the kernel's form (`FileAttr`, `SystemTime`, `Errno`),
//! and how long the kernel may keep attributes.

use crate::{Attr, FileKind, Fs, TimeSet};
use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, ReplyEmpty, ReplyEntry, ReplyXattr};
use fuser::TimeOrNow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache attributes, directory entries and names found missing. Long:
/// winefs has no writer the kernel does not see, except those it tells the kernel about (see
/// the module doc); a short one costs a LOOKUP and a GETATTR round trip per `stat` of a file
/// not touched for that long.
pub(crate) const TTL: Duration = Duration::from_secs(3600);

/// How long the kernel may cache the attributes of `ino`: `TTL`, or not at all while a
/// direct-path client leases it (its size and times then change without a request).
pub(super) fn ttl(fs: &Fs, ino: u64) -> Duration {
    if fs.changed_directly(ino) { Duration::ZERO } else { TTL }
}

/// The errno the kernel gets for a core error: the only translation of core errors, so every
/// request answers a given failure the same way the library reports it.
pub(super) fn errno(e: &crate::Error) -> fuser::Errno {
    fuser::Errno::from_i32(e.errno())
}

/// An xattr value or name list, or its size when the caller asks with no buffer (ERANGE when
/// its buffer is too small).
pub(super) fn reply_xattr(reply: ReplyXattr, r: Result<Vec<u8>, Errno>, size: u32) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

pub(super) fn reply_empty(reply: ReplyEmpty, r: crate::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answer a lookup-like request with the entry `r` found (or its error).
pub(super) fn reply_entry(reply: ReplyEntry, r: crate::Result<Attr>, fs: &Fs) {
    match r {
        // The name may be cached long even when the attributes may not be.
        Ok(a) => reply.entry_with_ttls(
            &ttl(fs, a.ino),
            &TTL,
            &file_attr(&a),
            Generation(a.generation as u64),
        ),
        Err(e) => reply.error(errno(&e)),
    }
}


pub(super) fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(super) fn time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// A time of a setattr in the core's form.
pub(super) fn to_time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(time_ns(s)),
    }
}

pub(super) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Core attributes in the kernel's form.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: crate::media::layout::BLOCK_SIZE as u32,
        flags: 0,
    }
}

/// The attributes of a negative entry: node 0 tells the kernel the name does not exist.
pub(super) fn missing_name_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: crate::media::layout::BLOCK_SIZE as u32,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -1, -86_400_000_000_001] {
            assert_eq!(time_ns(system_time(ns)), ns);
        }
    }

    #[test]
    fn attributes_keep_type_permission_and_size() {
        let a = Attr {
            ino: 42,
            kind: FileKind::Symlink,
            perm: 0o104755,
            nlink: 3,
            uid: 7,
            gid: 8,
            size: 12345,
            blocks: 32,
            atime: 1,
            mtime: 2_000_000_001,
            ctime: 3,
            crtime: 4,
            rdev: 0,
            generation: 9,
        };
        let f = file_attr(&a);
        assert_eq!(f.ino, INodeNo(42));
        assert_eq!(f.kind, FileType::Symlink);
        assert_eq!(f.perm, 0o4755, "type bits must not leak into perm");
        assert_eq!(
            (f.nlink, f.uid, f.gid, f.size, f.blocks),
            (3, 7, 8, 12345, 32)
        );
        assert_eq!(time_ns(f.mtime), 2_000_000_001);
    }
}
