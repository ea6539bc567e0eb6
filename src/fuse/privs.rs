//! The VFS duties a FUSE server takes over under `default_permissions` and
//! `FUSE_HANDLE_KILLPRIV_V2`: the owner, group and mode of a new inode, the set-user-ID and
//! set-group-ID bits (and file capabilities) dropped after a write, truncate or chown, and
//! access(2) checks by the mode bits. The rules are the kernel's (`setattr_should_drop_sgid`,
//! `should_remove_suid` in fs/attr.c and fs/inode.c, Linux 6.2 and later), checked against ext4
//! in `tests/fuse_mount.rs`.

use crate::{Attr, FileKind, Fs, Maker, SetAttr};
use fuser::{AccessFlags, Request};

/// Permission bits and maker of a new inode in `parent`: the caller's ids and umask (the core
/// applies it, or the directory's default ACL instead when the mount keeps `acls`), and the
/// BSD group rule of a set-group-ID directory.
pub(super) fn new_owner(
    fs: &Fs,
    req: &Request,
    parent: u64,
    mode: u32,
    umask: u32,
    dir: bool,
    acls: bool,
) -> (u32, Maker) {
    let mut perm = mode & 0o7777;
    let mut gid = req.gid();
    if let Ok(p) = fs.getattr(parent)
        && p.perm & libc::S_ISGID != 0
    {
        gid = p.gid;
        if dir {
            perm |= libc::S_ISGID;
        }
    }
    (perm, Maker { uid: req.uid(), gid, umask, acls })
}

/// Whether the caller of `req` is in group `gid`: its filesystem gid, or one of its
/// supplementary groups (from `/proc/PID/status`, as libfuse's `fuse_req_getgroups` reads them;
/// a caller that is gone counts as no member).
pub(super) fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|groups| {
            groups
                .split_whitespace()
                .any(|g| g.parse::<u32>() == Ok(gid))
        })
}

/// Whether the caller of `req` may keep a set-group-ID bit on a file of group `gid` through a
/// change that drops it for others (a chown, an access ACL; the kernel's
/// `in_group_or_capable`): it is root (standing for CAP_FSETID) or in the group.
pub(super) fn keeps_set_gid(req: &Request, gid: u32) -> bool {
    req.uid() == 0 || in_group(req, gid)
}

/// The permission bits left after a write, truncate or chown drops privileges: set-user-ID
/// always; set-group-ID when the group may execute the file, or when the caller is not in the
/// file's group (`member_of_group`, taken before a chown changes the group) and is not root
/// (root stands for CAP_FSETID). A set-group-ID file without group execute is a mandatory-
/// locking marker that a group member may keep writing to.
pub(super) fn after_kill(perm: u32, member_of_group: bool) -> u32 {
    let mut perm = perm & 0o7777 & !libc::S_ISUID;
    if perm & libc::S_IXGRP != 0 || !member_of_group {
        perm &= !libc::S_ISGID;
    }
    perm
}

/// After a write or fallocate of `ino` by the caller of `req`: remove its file capabilities
/// and, with `kill` (the caller lacks CAP_FSETID), the set-user/group-ID bits [`after_kill`]
/// drops. Best effort: the data change has already succeeded. Returns whether the mode changed
/// (the kernel's cached copy of it is then stale).
pub(super) fn drop_privileges(fs: &Fs, req: &Request, ino: u64, kill: bool) -> bool {
    drop_privileges_as(fs, ino, kill.then(|| fs.getattr(ino).is_ok_and(|a| in_group(req, a.gid))))
}

/// [`drop_privileges`] with the caller's membership of the file's group already known (for a
/// chown, taken before the group changes): `kill` is `Some(member)` to drop set-ID bits.
pub(super) fn drop_privileges_as(fs: &Fs, ino: u64, kill: Option<bool>) -> bool {
    let mut changed = false;
    if let Some(member) = kill
        && let Ok(a) = fs.getattr(ino)
        && a.kind != FileKind::Dir
    {
        let perm = after_kill(a.perm, member);
        if perm != a.perm & 0o7777 {
            let set = SetAttr {
                mode: Some(perm),
                ..Default::default()
            };
            changed = fs.setattr(ino, &set).is_ok();
        }
    }
    // Removing never needs space (the block is rewritten in place on a full pool); what can
    // still fail is reading a damaged attribute block (EIO, the pool flagged for fsck).
    if let Err(e) = fs.remove_xattr_if_present(ino, b"security.capability") {
        log::error!("inode {ino}: security.capability not removed after a change: {e}");
    }
    changed
}

/// POSIX access check for `access(2)` (the kernel does it itself under `default_permissions`,
/// so this serves only mounts without it).
pub(super) fn permitted(req: &Request, a: &Attr, mask: AccessFlags) -> bool {
    let want = mask.bits() as u32 & 0o7;
    if want == 0 {
        return true;
    }
    if req.uid() == 0 {
        // Root may read and write anything, and execute what anyone may execute.
        return want & 0o1 == 0 || a.kind == FileKind::Dir || a.perm & 0o111 != 0;
    }
    let bits = if req.uid() == a.uid {
        (a.perm >> 6) & 0o7
    } else if req.gid() == a.gid {
        (a.perm >> 3) & 0o7
    } else {
        a.perm & 0o7
    };
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::after_kill;

    #[test]
    fn set_id_bits_dropped_as_the_kernel_drops_them() {
        // Set-user-ID always goes; group-executable set-group-ID always goes.
        assert_eq!(after_kill(0o4755, true), 0o755);
        assert_eq!(after_kill(0o2775, true), 0o775);
        assert_eq!(after_kill(0o6775, true), 0o775);
        // Set-group-ID without group execute stays for a group member, goes for anyone else.
        assert_eq!(after_kill(0o2767, true), 0o2767);
        assert_eq!(after_kill(0o2767, false), 0o767);
        // Nothing else changes.
        assert_eq!(after_kill(0o1777, false), 0o1777);
        assert_eq!(after_kill(0o644, false), 0o644);
    }
}
