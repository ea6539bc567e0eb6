//! The ioctls a FUSE server answers: the inode flags, as `lsattr` and `chattr` read and set
//! them. The kernel turns `FS_IOC_GETFLAGS`/`SETFLAGS` and `FS_IOC_FSGETXATTR`/`FSSETXATTR` on
//! a file of the mount into these requests (on a handle it opens for them), after checking
//! that the caller may set them: the owner, and `CAP_LINUX_IMMUTABLE` to change immutable or
//! append-only. Two of winefs's own switch the mount between read-only and read-write
//! (`mount -o remount,ro|rw` through `mount.winefs`), for root only. Every other ioctl is
//! ENOTTY, as for a file system that has none.

use crate::media::layout::INODE_APPEND_ONLY;
use crate::meta::inode_flags::{from_xflags, to_xflags};
use super::attr::errno;
use crate::{Error, Fs};
use fuser::Errno;

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)` (the FUSE request carries 4 bytes of flags).
const GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
const SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
const FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
const FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize (u32 each), 8 bytes padding.
const FSXATTR_BYTES: usize = 28;

/// winefs's own `_IO('W', 0xf0)`: make the mount read-only (`Fs::set_read_only`). Sent to the
/// mount's root by `mount.winefs -o remount,ro` once the kernel's remount has stopped writes.
pub const READ_ONLY_IOCTL: u32 = 0x57f0;
/// winefs's own `_IO('W', 0xf1)`: make the mount read-write again, before the kernel's remount.
pub const READ_WRITE_IOCTL: u32 = 0x57f1;

/// winefs's own `_IOR('W', 0xf2, [u8; 256])`: the daemon's settings as mount options
/// (`mode=strict,...,threads=2,...`, NUL-padded), which a remount's options are held to.
pub const SETTINGS_IOCTL: u32 = 0x8100_57f2;
/// The bytes [`SETTINGS_IOCTL`] answers.
pub const SETTINGS_LEN: usize = 256;

/// What an ioctl answered: the bytes for the caller, and whether the inode changed (its
/// ctime: the kernel's cached attributes are then stale).
pub(crate) struct Answer {
    pub out: Vec<u8>,
    pub changed: bool,
}

/// Answer ioctl `cmd` from user `uid` on inode `ino` with `input` (what the caller passed in);
/// `settings` are the daemon's, as mount options.
pub(crate) fn serve(
    fs: &Fs,
    settings: &str,
    uid: u32,
    ino: u64,
    cmd: u32,
    input: &[u8],
) -> Result<Answer, Errno> {
    let core = |e: Error| errno(&e);
    let word = |at: usize| -> Result<u32, Errno> {
        let b = input.get(at..at + 4).ok_or(Errno::EINVAL)?;
        Ok(u32::from_le_bytes(b.try_into().map_err(|_| Errno::EINVAL)?))
    };
    match cmd {
        GETFLAGS => {
            let flags = fs.inode_flags(ino).map_err(core)?;
            Ok(Answer { out: flags.to_le_bytes().to_vec(), changed: false })
        }
        SETFLAGS => {
            fs.set_inode_flags(ino, word(0)?).map_err(core)?;
            Ok(Answer { out: Vec::new(), changed: true })
        }
        FSGETXATTR => {
            let mut out = vec![0u8; FSXATTR_BYTES];
            out[..4].copy_from_slice(&to_xflags(fs.inode_flags(ino).map_err(core)?).to_le_bytes());
            Ok(Answer { out, changed: false })
        }
        FSSETXATTR => {
            // Extent size hints, project ids and copy-on-write hints are not kept: only zero
            // (what FSGETXATTR answered) may be set.
            if (4..20).step_by(4).map(word).collect::<Result<Vec<_>, _>>()?.iter().any(|&w| w != 0) {
                return Err(Errno::EOPNOTSUPP);
            }
            let flags = from_xflags(word(0)?).map_err(core)?;
            fs.set_inode_flags(ino, flags).map_err(core)?;
            Ok(Answer { out: Vec::new(), changed: true })
        }
        SETTINGS_IOCTL => {
            let mut out = settings.as_bytes().to_vec();
            if out.len() >= SETTINGS_LEN {
                return Err(Errno::EOVERFLOW);
            }
            out.resize(SETTINGS_LEN, 0);
            Ok(Answer { out, changed: false })
        }
        READ_ONLY_IOCTL | READ_WRITE_IOCTL if uid != 0 => Err(Errno::EPERM),
        READ_ONLY_IOCTL | READ_WRITE_IOCTL => {
            fs.set_read_only(cmd == READ_ONLY_IOCTL).map_err(core)?;
            Ok(Answer { out: Vec::new(), changed: false })
        }
        _ => Err(Errno::ENOTTY),
    }
}

/// Whether file `ino` is append-only (`chattr +a`).
pub(crate) fn append_only(fs: &Fs, ino: u64) -> bool {
    fs.inode_flags(ino).is_ok_and(|f| f & INODE_APPEND_ONLY != 0)
}
