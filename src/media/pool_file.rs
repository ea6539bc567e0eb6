//! The file a pool lives in, apart from its mapping: its size, its blocks reserved (at mkfs, and
//! when a writer opens it if the file has holes), and on a DAX file system the state of its
//! blocks.
//!
//! A store through a shared mapping of a DAX file reaches the media, but if the page it faults
//! in needs the file system to change its own metadata first (a hole to allocate, an
//! unwritten extent to convert, a shared extent to copy), that change is journaled by the file
//! system and is durable only at its next commit or at an `fsync` of the file, neither of which
//! a fence waits for. A crash in between loses the write although it was flushed: the block
//! reads as zeros again. `MAP_SYNC` makes such faults wait for the metadata; rather than
//! ask every mapping of the pool (the pool's own, each file mapped through the library, each
//! preloaded process's) for it, the pool's blocks are settled once before the first store:
//! holes and unwritten extents (what `posix_fallocate` leaves) are written with zeros, shared
//! extents unshared, and the file synced. A fault then only maps blocks that are already the
//! file's. Zeros over a hole or an unwritten extent change no byte the file reads.

use crate::error::{Error, Result};
use crate::media::layout::MAGIC;
use crate::sys::{self, FileExtent};
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;

/// Size in bytes of a pool backing: a regular file's length, or a device-DAX character device's
/// size from sysfs.
pub(crate) fn backing_size(path: &Path, file: &File) -> Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if meta.file_type().is_char_device() {
        let rdev = meta.rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let sys = format!("/sys/dev/char/{major}:{minor}/size");
        let text =
            std::fs::read_to_string(&sys).map_err(|e| Error::io(format!("read {sys}"), e))?;
        return text
            .trim()
            .parse::<u64>()
            .map_err(|_| Error::Invalid(format!("{sys}: not a size: {text:?}")));
    }
    if meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is a directory, not a pool file",
            path.display()
        )));
    }
    Ok(meta.len())
}

/// The bytes of the regular file `file` that have blocks, if fewer than `len`: None for a file
/// that has them all (one `fstat`), a device, or a file on ramfs, whose holes cannot run out of
/// room (it has no limit, and reports no free blocks).
fn sparse(path: &Path, file: &File, len: u64) -> Result<Option<u64>> {
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    let held = meta.blocks().saturating_mul(512);
    if !meta.is_file() || held >= len || sys::fs_magic(path) == Some(RAMFS_MAGIC) {
        return Ok(None);
    }
    Ok(Some(held))
}

/// Allocate (without changing the size) every block of a regular file; devices need nothing.
pub(crate) fn reserve_backing(path: &Path, file: &File, len: u64) -> Result<()> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if !meta.is_file() || len == 0 {
        return Ok(());
    }
    // ENOSPC reads "reserve N bytes for POOL: No space left on device": the host file system's
    // space, not the pool's.
    sys::posix_fallocate(file, len)
        .map_err(|e| Error::io(format!("reserve {len} bytes for {}", path.display()), e))
}

/// When a writer opens a pool, before it reads it: a regular file with fewer blocks than bytes
/// (a sparse copy: `cp` and `rsync -S` leave runs of zeros as holes) that starts like a pool
/// gets its missing blocks now, so a file system without room for them is one error here,
/// with nothing stored, rather than SIGBUS at a store into a hole (or, on tmpfs, at a read of
/// one). A file that has them all costs an `fstat`; one that is no pool is left as it is for
/// the superblock check to refuse, if it can be read. Not on ramfs.
pub(crate) fn reserve_if_sparse(path: &Path, file: &File, len: u64) -> Result<()> {
    let Some(held) = sparse(path, file, len)? else {
        return Ok(());
    };
    let mut magic = [0u8; MAGIC.len()];
    if file.read_exact_at(&mut magic, 0).is_err() || magic != MAGIC {
        return holes_readable(path, file, len, held);
    }
    sys::posix_fallocate(file, len).map_err(|e| {
        Error::io(
            format!(
                "allocate the holes of {} ({held} of its {len} bytes are allocated: a sparse \
                 copy?) before reading it; nothing was read or stored",
                path.display()
            ),
            e,
        )
    })
}

/// When a reader opens a pool privately (fsck, `winefs info`, a read-only mount), which must
/// not change the file: on tmpfs or hugetlbfs a read of a hole through a mapping takes a page
/// of the file system, so a sparse file there whose holes do not fit in its free space
/// would kill the reader with SIGBUS at the first hole it reads. Such a file is refused in one
/// line instead; one that has all its blocks costs an `fstat`.
pub(crate) fn check_holes_readable(path: &Path, file: &File, len: u64) -> Result<()> {
    match sparse(path, file, len)? {
        Some(held) => holes_readable(path, file, len, held),
        None => Ok(()),
    }
}

/// [`check_holes_readable`] for a file known to hold `held` of its `len` bytes. On a disk file
/// system a read of a hole allocates no block: nothing to check there.
fn holes_readable(path: &Path, file: &File, len: u64, held: u64) -> Result<()> {
    if sys::backing(path, file) != sys::Backing::Memory {
        return Ok(());
    }
    let (unit, _, free) =
        sys::space(path).map_err(|e| Error::io(format!("statvfs {}", path.display()), e))?;
    let free = unit.saturating_mul(free);
    if free >= len - held {
        return Ok(());
    }
    Err(Error::io(
        format!(
            "{} has holes ({held} of its {len} bytes are allocated: a sparse copy?), and on this \
             memory file system reading a hole takes a page, but {free} bytes are free; make \
             room, or give it its blocks (`fallocate -l {len}` on it)",
            path.display()
        ),
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    ))
}

/// Make every block of the DAX file `file` (`len` bytes of pool) written and the file's own,
/// durably (see the module comment). Returns the bytes written or unshared: all of a new
/// pool's at its mkfs, nothing at later mounts.
pub(crate) fn settle_dax_file(path: &Path, file: &File, len: u64) -> Result<u64> {
    let extents = sys::file_extents(file, len)
        .map_err(|e| Error::io(format!("read the block map of {}", path.display()), e))?;
    let (zero, unshare) = unsettled(&extents, len).map_err(|at| {
        Error::Invalid(format!(
            "{}: the file system cannot say where the pool's bytes at {at} lie; a pool on a DAX file needs a file system that can (ext4 or xfs)",
            path.display()
        ))
    })?;
    let mut done = 0;
    let zeros = vec![0u8; 1 << 20];
    for (off, n) in zero {
        let mut at = off;
        while at < off + n {
            let k = (off + n - at).min(zeros.len() as u64);
            file.write_all_at(&zeros[..k as usize], at).map_err(|e| {
                Error::io(format!("write the unwritten blocks of {}", path.display()), e)
            })?;
            at += k;
        }
        done += n;
    }
    for (off, n) in unshare {
        sys::fallocate_mode(file, libc::FALLOC_FL_UNSHARE_RANGE, off, n)
            .map_err(|e| Error::io(format!("unshare the blocks of {}", path.display()), e))?;
        done += n;
    }
    if done > 0 {
        file.sync_data()
            .map_err(|e| Error::io(format!("sync the block map of {}", path.display()), e))?;
        log::info!(
            "{}: wrote or unshared {} MiB of the pool file so that no store needs new blocks (a DAX file)",
            path.display(),
            done >> 20
        );
    }
    Ok(done)
}

/// Ranges of [0, len) to write with zeros (holes, unwritten extents) and to unshare (shared
/// extents), from the file's extents; `Err(offset)` where an extent's place is not known
/// (delayed or unknown allocation, which a synced FIEMAP should not report).
#[allow(clippy::type_complexity)]
fn unsettled(extents: &[FileExtent], len: u64) -> std::result::Result<(Vec<(u64, u64)>, Vec<(u64, u64)>), u64> {
    let (mut zero, mut unshare) = (Vec::new(), Vec::new());
    let mut at = 0u64;
    for e in extents {
        let (a, b) = (e.start.max(at), (e.start + e.len).min(len));
        if a >= b {
            continue;
        }
        if a > at {
            zero.push((at, a - at));
        }
        if e.flags & (sys::FIEMAP_EXTENT_DELALLOC | sys::FIEMAP_EXTENT_UNKNOWN) != 0 {
            return Err(a);
        }
        if e.flags & sys::FIEMAP_EXTENT_UNWRITTEN != 0 {
            zero.push((a, b - a));
        } else if e.flags & sys::FIEMAP_EXTENT_SHARED != 0 {
            unshare.push((a, b - a));
        }
        at = b;
    }
    if at < len {
        zero.push((at, len - at));
    }
    Ok((zero, unshare))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(start: u64, len: u64, flags: u32) -> FileExtent {
        FileExtent { start, len, flags }
    }

    #[test]
    fn holes_unwritten_and_shared_extents_are_found() {
        let m = 1u64 << 20;
        let extents = [
            ext(m, m, sys::FIEMAP_EXTENT_UNWRITTEN),
            ext(2 * m, m, 0),
            ext(3 * m, m, sys::FIEMAP_EXTENT_SHARED),
            ext(5 * m, 4 * m, sys::FIEMAP_EXTENT_LAST),
        ];
        let (zero, unshare) = unsettled(&extents, 8 * m).unwrap();
        assert_eq!(zero, vec![(0, m), (m, m), (4 * m, m)]);
        assert_eq!(unshare, vec![(3 * m, m)]);
        let (zero, _) = unsettled(&extents[..2], 4 * m).unwrap();
        assert_eq!(zero, vec![(0, m), (m, m), (3 * m, m)], "a hole at the end");
        assert_eq!(
            unsettled(&[ext(0, m, sys::FIEMAP_EXTENT_DELALLOC)], m),
            Err(0)
        );
    }

    /// On the file system the checkout is on (FIEMAP needs a disk file system: tmpfs has
    /// none): a file reserved with `posix_fallocate` (unwritten), with data in its middle and a
    /// hole at its end, is settled into written blocks with its bytes unchanged, once.
    #[test]
    fn a_reserved_file_is_settled_into_written_blocks_once() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("pool");
        let m = 1u64 << 20;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.set_len(8 * m).unwrap();
        sys::fallocate_mode(&file, libc::FALLOC_FL_KEEP_SIZE, 0, 4 * m).unwrap();
        let data = vec![0x5au8; m as usize];
        file.write_all_at(&data, 4 * m).unwrap();
        let before = sys::file_extents(&file, 8 * m).unwrap();
        let (zero, _) = unsettled(&before, 8 * m).unwrap();
        assert_eq!(
            zero.iter().map(|z| z.1).sum::<u64>(),
            7 * m,
            "four unwritten MiB and a three-MiB hole: {before:?}"
        );

        assert_eq!(settle_dax_file(&path, &file, 8 * m).unwrap(), 7 * m);
        let after = sys::file_extents(&file, 8 * m).unwrap();
        assert_eq!(unsettled(&after, 8 * m).unwrap(), (vec![], vec![]), "{after:?}");
        let mut back = vec![1u8; (8 * m) as usize];
        file.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..(4 * m) as usize].iter().all(|&b| b == 0));
        assert!(back[(4 * m) as usize..(5 * m) as usize] == data[..]);
        assert!(back[(5 * m) as usize..].iter().all(|&b| b == 0));
        assert_eq!(settle_dax_file(&path, &file, 8 * m).unwrap(), 0, "nothing left to do");
    }
}
