//! POSIX ACLs on inodes (the format and rules are `meta::acl`): setting an access ACL sets the
//! permission bits in the same transaction, a chmod rewrites the access ACL in the chmod's
//! transaction, and a new inode takes its directory's default ACL in its create's — so no
//! crash leaves a mode that says more or less than the ACL beside it. The kernel enforces them
//! (a FUSE mount with `FUSE_POSIX_ACL`); winefs keeps them true.

use crate::error::{Error, Result};
use crate::media::layout::FileKind;
use crate::meta::acl::{self, Acl};
use crate::meta::inode_flags::{self, Change};
use crate::meta::xattr::{self as xattr_block, Attrs};
use crate::ops::xattr;
use crate::state::inode_state::{InodeState, wlock};
use crate::state::mount_state::MountState;

/// Set (`Some`) or remove (`None`) ACL `name` of `ino`, as Linux's `set_acl` does: an access
/// ACL sets the permission bits (and is not stored when they say all it says); without
/// `keep_set_gid` (a caller neither in the file's group nor privileged) it also drops
/// set-group-ID, as a chmod by that caller would. A default ACL is for directories only
/// (EACCES elsewhere; removing one from a file succeeds). XATTR_CREATE and XATTR_REPLACE do
/// not apply, as on Linux.
pub(crate) fn set(
    state: &MountState,
    ino: u64,
    name: &[u8],
    value: Option<&[u8]>,
    keep_set_gid: bool,
) -> Result<()> {
    state.check_alive()?;
    let new = match value {
        Some(v) if v.len() > xattr_block::XATTR_SIZE_MAX => return Err(Error::Range),
        Some(v) => Acl::decode(v)?,
        None => None,
    };
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    inode_flags::allow(g.hdr.flags, Change::Xattr)?;
    if g.kind() == FileKind::Symlink {
        // Linux has no ACLs on symlinks: their permission bits are not used.
        return Err(Error::NotSupported("POSIX ACLs on a symlink".into()));
    }
    let mut mode = g.hdr.mode;
    let stored = if name == acl::ACCESS {
        match &new {
            Some(a) => {
                let (bits, plain) = a.mode();
                mode = (mode & !0o777) | bits;
                if !keep_set_gid {
                    mode &= !libc::S_ISGID;
                }
                (!plain).then(|| a.encode())
            }
            None => None,
        }
    } else if !g.is_dir() {
        return match &new {
            Some(_) => Err(Error::AccessDenied(
                "a default ACL is for directories only".into(),
            )),
            None => Ok(()),
        };
    } else {
        new.as_ref().map(Acl::encode)
    };
    let mut attrs = xattr::load(state, &g)?;
    let before = attrs.len();
    attrs.retain(|(k, _)| k != name);
    let removed = attrs.len() != before;
    let changes_attrs = removed || stored.is_some();
    if let Some(v) = stored {
        attrs.push((name.to_vec(), v));
    }
    if !changes_attrs && mode == g.hdr.mode && new.is_none() {
        return Ok(()); // removing an ACL it does not have
    }
    xattr::install_attrs(state, &mut g, &attrs, Some(mode & 0o7777))
}

/// For a chmod of `g` to permission bits `mode`: when it has an access ACL whose owner, mask
/// or others entry changes, its attributes with the ACL rewritten, for the chmod's
/// transaction to stage (`xattr::stage_attrs`). None when nothing changes.
pub(crate) fn chmod_attrs(state: &MountState, g: &InodeState, mode: u32) -> Result<Option<Attrs>> {
    if g.hdr.xattr_block == 0 {
        return Ok(None);
    }
    let mut attrs = xattr::load(state, g)?;
    let Some(entry) = attrs.iter_mut().find(|(k, _)| k == acl::ACCESS) else {
        return Ok(None);
    };
    let Some(mut a) = Acl::decode(&entry.1)? else {
        return Ok(None);
    };
    a.chmod(mode);
    let rewritten = a.encode();
    if rewritten == entry.1 {
        return Ok(None);
    }
    entry.1 = rewritten;
    Ok(Some(attrs))
}

/// What a new inode of `kind` in directory `dir` takes from it (POSIX.1e, Linux's
/// `posix_acl_create`): with a default ACL there (looked for only if `default_acls`: the mount
/// keeps ACLs), the access ACL it gives (unless it says no more than the mode) with the
/// permission bits `perm` narrowed by it, and a new directory keeps the default ACL too;
/// without one, `umask` narrows the bits. Returns the attributes the inode is born with.
/// Symlinks take neither (their bits are not used).
pub(crate) fn inherit(
    state: &MountState,
    dir: &InodeState,
    kind: FileKind,
    perm: &mut u32,
    umask: u32,
    default_acls: bool,
) -> Result<Attrs> {
    let mut born = Attrs::new();
    if kind == FileKind::Symlink {
        return Ok(born);
    }
    let default = match dir.hdr.xattr_block {
        0 => None,
        _ if !default_acls => None,
        _ => default_acl(xattr::load(state, dir)?)?,
    };
    let Some((bytes, mut access)) = default else {
        *perm &= !(umask & 0o777);
        return Ok(born);
    };
    if access.create(perm) {
        born.push((acl::ACCESS.to_vec(), access.encode()));
    }
    if kind == FileKind::Dir {
        born.push((acl::DEFAULT.to_vec(), bytes));
    }
    Ok(born)
}

/// The default ACL among a directory's attributes, as stored and decoded.
fn default_acl(attrs: Attrs) -> Result<Option<(Vec<u8>, Acl)>> {
    let Some((_, v)) = attrs.into_iter().find(|(k, _)| k == acl::DEFAULT) else {
        return Ok(None);
    };
    Ok(Acl::decode(&v)?.map(|a| (v, a)))
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::fs::Fs;
    use crate::meta::acl::{ACCESS, DEFAULT, NO_ID, value};
    use crate::types::{Maker, MkfsOptions, MountOptions, SetAttr, XattrSet};

    fn fresh() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        Fs::mkfs(&p, &MkfsOptions { size: Some(32 << 20), ..Default::default() }).unwrap();
        (d, p)
    }

    /// user::rw-, user:1000:<named>, group::r--, mask::<mask>, other::---
    fn with_named(named: u16, mask: u16) -> Vec<u8> {
        value(&[(1, 6, NO_ID), (2, named, 1000), (4, 4, NO_ID), (0x10, mask, NO_ID), (0x20, 0, NO_ID)])
    }

    #[test]
    fn an_access_acl_sets_the_mode_and_one_equal_to_the_mode_is_not_stored() {
        let (_d, p) = fresh();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        let f = fs.create(fs.root(), b"f", 0o2644, 0, 0).unwrap().ino;
        let acl = with_named(7, 5);
        fs.setxattr(f, ACCESS, &acl, XattrSet::Create).unwrap();
        assert_eq!(fs.getattr(f).unwrap().perm, 0o2650);
        assert_eq!(fs.getxattr(f, ACCESS).unwrap(), acl);
        assert_eq!(fs.listxattr(f).unwrap(), vec![ACCESS.to_vec()]);
        // Set by a caller outside the file's group: set-group-ID goes too.
        fs.set_acl(f, ACCESS, Some(&with_named(7, 7)), false).unwrap();
        assert_eq!(fs.getattr(f).unwrap().perm, 0o670);
        // user::rwx, group::r-x, other::r-- is the mode alone: stored as the mode.
        fs.setxattr(f, ACCESS, &value(&[(1, 7, NO_ID), (4, 5, NO_ID), (0x20, 4, NO_ID)]), XattrSet::Any)
            .unwrap();
        assert_eq!(fs.getattr(f).unwrap().perm, 0o754);
        assert!(matches!(fs.getxattr(f, ACCESS), Err(Error::NoAttr)));
        // Removing what is not there is no error (as Linux's set_acl); a bad value is EINVAL.
        fs.removexattr(f, ACCESS).unwrap();
        fs.removexattr(f, DEFAULT).unwrap();
        let bad = value(&[(1, 7, NO_ID), (2, 7, 5), (4, 5, NO_ID), (0x20, 4, NO_ID)]);
        assert!(matches!(fs.setxattr(f, ACCESS, &bad, XattrSet::Any), Err(Error::Invalid(_))));
        // A default ACL is a directory's.
        let dflt = value(&[(1, 7, NO_ID), (4, 5, NO_ID), (0x20, 4, NO_ID)]);
        assert!(matches!(fs.setxattr(f, DEFAULT, &dflt, XattrSet::Any), Err(Error::AccessDenied(_))));
    }

    /// Also on a pool with no block free, where the ACL's block is rewritten in place (the
    /// chmod once failed there with ENOSPC).
    #[test]
    fn a_chmod_rewrites_the_access_acl_and_both_survive_a_remount() {
        for full in [false, true] {
            let (_d, p) = fresh();
            {
                let fs = Fs::mount(&p, MountOptions::default()).unwrap();
                let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
                fs.setxattr(f, b"user.k", b"v", XattrSet::Any).unwrap();
                fs.setxattr(f, ACCESS, &with_named(6, 6), XattrSet::Any).unwrap();
                let hold = full.then(|| fs.take_all_free_blocks());
                let set = SetAttr { mode: Some(0o600), ..Default::default() };
                fs.setattr(f, &set).unwrap();
                drop(hold);
            }
            let fs = Fs::mount(&p, MountOptions::default()).unwrap();
            let f = fs.lookup(fs.root(), b"f").unwrap().ino;
            assert_eq!(fs.getattr(f).unwrap().perm, 0o600);
            // The named entry keeps its bits; the mask (the group class) and others follow the mode.
            let want = value(&[(1, 6, NO_ID), (2, 6, 1000), (4, 4, NO_ID), (0x10, 0, NO_ID), (0x20, 0, NO_ID)]);
            assert_eq!(fs.getxattr(f, ACCESS).unwrap(), want, "full pool: {full}");
            assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"v");
            let r = fs.check();
            assert!(r.is_clean(), "{r:?}");
        }
    }

    #[test]
    fn a_new_inode_takes_the_default_acl_instead_of_the_umask() {
        let (_d, p) = fresh();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        let who = Maker { uid: 5, gid: 6, umask: 0o077, acls: true };
        let root = fs.root();
        // Without a default ACL the umask applies; a symlink keeps 0777.
        let plain = fs.create_by(root, b"plain", 0o666, who).unwrap();
        assert_eq!((plain.perm, plain.uid, plain.gid), (0o600, 5, 6));
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let dflt = value(&[(1, 7, NO_ID), (2, 7, 1000), (4, 5, NO_ID), (0x10, 7, NO_ID), (0x20, 5, NO_ID)]);
        fs.setxattr(d, DEFAULT, &dflt, XattrSet::Any).unwrap();
        let f = fs.create_by(d, b"f", 0o666, who).unwrap();
        assert_eq!(f.perm, 0o664);
        let access = value(&[(1, 6, NO_ID), (2, 7, 1000), (4, 5, NO_ID), (0x10, 6, NO_ID), (0x20, 4, NO_ID)]);
        assert_eq!(fs.getxattr(f.ino, ACCESS).unwrap(), access);
        assert!(matches!(fs.getxattr(f.ino, DEFAULT), Err(Error::NoAttr)));
        // For a mount that keeps no ACLs, the umask applies and nothing is inherited.
        let noacl = fs.create_by(d, b"noacl", 0o666, Maker { acls: false, ..who }).unwrap();
        assert_eq!(noacl.perm, 0o600);
        assert!(fs.listxattr(noacl.ino).unwrap().is_empty());
        // A directory keeps the default ACL too, and passes it on.
        let sub = fs.mkdir_by(d, b"sub", 0o777, who).unwrap();
        assert_eq!(sub.perm, 0o775);
        assert_eq!(fs.getxattr(sub.ino, DEFAULT).unwrap(), dflt);
        let deeper = fs.mknod_by(sub.ino, b"fifo", crate::FileKind::Fifo, 0o640, 0, who).unwrap();
        assert_eq!(deeper.perm, 0o640);
        let t = fs.create_unnamed_by(sub.ino, 0o600, who, false).unwrap();
        assert_eq!(fs.getxattr(t.ino, ACCESS).unwrap().len(), access.len());
        fs.release(t.ino).unwrap();
        let l = fs.symlink(d, b"l", b"f", 0, 0).unwrap();
        assert!(fs.listxattr(l.ino).unwrap().is_empty());
        assert!(matches!(fs.setxattr(l.ino, ACCESS, &access, XattrSet::Any), Err(Error::NotSupported(_))));
    }
}
