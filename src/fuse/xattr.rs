//! Extended attributes over FUSE: the core's attributes, the two virtual ones of the direct
//! path and the write accounting, and POSIX ACLs. With `FUSE_POSIX_ACL` the kernel enforces
//! ACLs, caches them, and hands `setfacl`'s changes over as `system.posix_acl_*` attributes;
//! the core keeps the mode in step (`ops::acl`), and the front end adds what only it knows:
//! whether the caller may keep set-group-ID. Without it (a kernel that does not offer it)
//! ACLs are refused, as the kernel would not enforce them.

use super::{WinefsFuse, errno, privs, proto};
use crate::meta::acl::is_acl;
use crate::{Error, FileKind, XattrSet};
use fuser::{Errno, Request};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

impl WinefsFuse {
    /// ACL names on a mount whose kernel does not enforce ACLs: refused, as on ext4 `noacl`.
    fn acl_refused(&self, name: &[u8]) -> Option<Errno> {
        (!self.acl && is_acl(name)).then_some(Errno::EOPNOTSUPP)
    }

    /// setxattr(2); `flags` as the kernel passes them (0, XATTR_CREATE, XATTR_REPLACE).
    pub(super) fn set_attribute(&self, req: &Request, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        if name == proto::CHANNEL_XATTR {
            return Err(Errno::EPERM);
        }
        let name = name.as_bytes();
        if let Some(e) = self.acl_refused(name) {
            return Err(e);
        }
        let how = match flags {
            0 => XattrSet::Any,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let r = match is_acl(name) {
            true => self.fs.set_acl(ino, name, Some(value), self.keeps_set_gid(req, ino)),
            false => self.fs.setxattr(ino, name, value, how),
        };
        r.map_err(|e| errno(&e))
    }

    /// removexattr(2).
    pub(super) fn remove_attribute(&self, req: &Request, ino: u64, name: &OsStr) -> Result<(), Errno> {
        if name == proto::CHANNEL_XATTR {
            return Err(Errno::EPERM);
        }
        let name = name.as_bytes();
        if let Some(e) = self.acl_refused(name) {
            return Err(e);
        }
        let r = match is_acl(name) {
            true => self.fs.set_acl(ino, name, None, self.keeps_set_gid(req, ino)),
            false => self.fs.removexattr(ino, name),
        };
        r.map_err(|e| errno(&e))
    }

    /// Whether a set-group-ID file stays so when the caller of `req` sets its access ACL (the
    /// kernel's `posix_acl_update_mode`).
    fn keeps_set_gid(&self, req: &Request, ino: u64) -> bool {
        self.fs.getattr(ino).is_ok_and(|a| privs::keeps_set_gid(req, a.gid))
    }

    /// getxattr(2)'s value: the virtual attributes, else the core's.
    pub(super) fn attribute(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, Errno> {
        if let Some(e) = self.acl_refused(name.as_bytes()) {
            return Err(e);
        }
        let answer = match &self.channel {
            // Virtual, on regular files and the root only: the preload library asks the file it
            // maps, or the mount point when its process starts (`connect_mounts`).
            Some(ch) if name == proto::CHANNEL_XATTR => match self.fs.getattr(ino) {
                Ok(a) if a.kind == FileKind::File || ino == self.fs.root() => {
                    Ok(ch.as_bytes().to_vec())
                }
                Ok(_) => Err(Error::NoAttr),
                Err(e) => Err(e),
            },
            // Virtual, on the root only: the mount's write accounting (`winefs stat`).
            _ if ino == self.fs.root() && name == proto::STATS_XATTR => {
                serde_json::to_vec(&self.fs.write_stats()).map_err(|e| Error::Invalid(e.to_string()))
            }
            _ => self.fs.getxattr(ino, name.as_bytes()),
        };
        answer.map_err(|e| errno(&e))
    }

    /// listxattr(2)'s names, each ended by NUL.
    pub(super) fn attribute_names(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let names = self.fs.listxattr(ino).map_err(|e| errno(&e))?;
        let mut buf = Vec::new();
        for n in names.iter().filter(|n| self.acl || !is_acl(n)) {
            buf.extend_from_slice(n);
            buf.push(0);
        }
        Ok(buf)
    }
}
