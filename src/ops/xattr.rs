//! Extended-attribute operations: get, list, set and remove through one copy-on-write step
//! (a new block, one transaction pointing the inode at it, the old block freed after commit;
//! with no block free, the block rewritten in place under the journal: [`stage_attrs`]), and
//! the alignment hint that keeps a file on aligned extents.

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::{BLOCK_SIZE, InodeHeader};
use crate::media::pool::Category;
use crate::meta::inode_flags::{self, Change};
use crate::meta::xattr::{self, Attrs, HUGEPAGE_HINT, XATTR_SIZE_MAX, check_name};
use crate::state::damage::Damage;
use crate::state::inode_state::{InodeState, rlock, wlock};
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use crate::types::XattrSet;

/// The attributes of an inode (empty if it has no block). A block that fails its checks is
/// EIO, and flags the pool "needs fsck".
pub(crate) fn load(state: &MountState, g: &InodeState) -> Result<Attrs> {
    let block = g.hdr.xattr_block;
    xattr::load(&state.pool, &state.geo, g.ino, block).map_err(|e| match e {
        Error::Corrupted(why) => {
            state.media_damage(Damage::XattrBlock, format!("{why} (block {block})"))
        }
        e => e,
    })
}

/// [`check_name`], but a name outside the kept namespaces is answered by the caller (who reads
/// or removes it only if the inode has it: a pool written before names were checked keeps
/// such attributes, and nothing stored becomes unreachable) with the error returned here.
fn check_name_kept(name: &[u8]) -> Result<Option<Error>> {
    match check_name(name) {
        Ok(()) => Ok(None),
        Err(e @ Error::NotSupported(_)) => Ok(Some(e)),
        Err(e) => Err(e),
    }
}

pub(crate) fn get(state: &MountState, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
    state.check_alive()?;
    let unsupported = check_name_kept(name)?;
    let n = state.inode(ino)?;
    let g = rlock(&n);
    load(state, &g)?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .ok_or(unsupported.unwrap_or(Error::NoAttr))
}

/// The names of the inode's attributes, less the alignment hint: winefs's own bookkeeping is
/// read and set by name (`getfattr -n`, `setfattr -n`) but not listed, so tools that copy every
/// listed attribute (`cp -a`, `rsync -X`, `tar --xattrs`) do not carry it to other file systems.
pub(crate) fn list(state: &MountState, ino: u64) -> Result<Vec<Vec<u8>>> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let g = rlock(&n);
    Ok(load(state, &g)?
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != HUGEPAGE_HINT)
        .collect())
}

/// Set (`Some`) or remove (`None`) an attribute.
pub(crate) fn set(
    state: &MountState,
    ino: u64,
    name: &[u8],
    value: Option<&[u8]>,
    how: XattrSet,
) -> Result<()> {
    state.check_alive()?;
    let unsupported = match (check_name_kept(name)?, value) {
        (Some(e), Some(_)) => return Err(e),
        (u, _) => u,
    };
    if value.is_some_and(|v| v.len() > XATTR_SIZE_MAX) {
        return Err(Error::Range);
    }
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    inode_flags::allow(g.hdr.flags, Change::Xattr)?;
    match (set_locked(state, &mut g, name, value, how), unsupported) {
        (Err(Error::NoAttr), Some(e)) => Err(e),
        (r, _) => r,
    }
}

/// Remove attribute `name` if the inode has it; Ok(false) if it has not. An inode with no
/// attributes at all is answered under the read lock: the FUSE front end asks this after every
/// write (a write drops `security.capability`), and parallel writers of one file should not
/// take its exclusive lock for nothing.
pub(crate) fn remove_if_present(state: &MountState, ino: u64, name: &[u8]) -> Result<bool> {
    state.check_alive()?;
    check_name(name)?;
    let n = state.inode(ino)?;
    if rlock(&n).hdr.xattr_block == 0 {
        return Ok(false);
    }
    match set_locked(state, &mut wlock(&n), name, None, XattrSet::Replace) {
        Ok(()) => Ok(true),
        Err(Error::NoAttr) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The file capabilities attribute, which a write removes (`fuse::privs`).
pub(crate) const CAPABILITY: &[u8] = b"security.capability";

/// Whether a write to the file must drop privileges it carries: a set-user-ID or set-group-ID
/// bit, or file capabilities. A direct-path client does not write such a file directly.
pub(crate) fn privileged(state: &MountState, g: &InodeState) -> Result<bool> {
    if g.hdr.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return Ok(true);
    }
    Ok(g.hdr.xattr_block != 0 && load(state, g)?.iter().any(|(k, _)| k == CAPABILITY))
}

/// Whether the inode carries the alignment hint (cached in the node).
pub(crate) fn hinted(state: &MountState, g: &mut InodeState) -> Result<bool> {
    if let Some(h) = g.hugepage_hint {
        return Ok(h);
    }
    let h = load(state, g)?.iter().any(|(k, _)| k == HUGEPAGE_HINT);
    g.hugepage_hint = Some(h);
    Ok(h)
}

/// Give the inode the alignment hint if it lacks it.
pub(crate) fn add_hint(state: &MountState, g: &mut InodeState) -> Result<()> {
    if hinted(state, g)? {
        return Ok(());
    }
    set_locked(state, g, HUGEPAGE_HINT, Some(b"1"), XattrSet::Any)
}

/// [`set`] with the inode lock held.
pub(crate) fn set_locked(
    state: &MountState,
    g: &mut InodeState,
    name: &[u8],
    value: Option<&[u8]>,
    how: XattrSet,
) -> Result<()> {
    let mut attrs = load(state, g)?;
    let pos = attrs.iter().position(|(k, _)| k == name);
    match (value, how, pos) {
        (Some(_), XattrSet::Create, Some(_)) => return Err(Error::Exists),
        (Some(_), XattrSet::Replace, None) | (None, _, None) => return Err(Error::NoAttr),
        (Some(v), _, Some(i)) => attrs[i].1 = v.to_vec(),
        (Some(v), _, None) => attrs.push((name.to_vec(), v.to_vec())),
        (None, _, Some(i)) => {
            attrs.remove(i);
        }
    }
    install_attrs(state, g, &attrs, None)?;
    if name == CAPABILITY && value.is_some() && g.leases > 0 {
        // As for a set-user-ID bit (`ops::file::setattr`): clients stop writing directly.
        state.leases.bump(g.ino);
    }
    if name == HUGEPAGE_HINT {
        g.hugepage_hint = Some(value.is_some());
    }
    Ok(())
}

/// Write `attrs` (not empty) to a newly allocated block, reserved in `res`: the first step of
/// every change, the block being unreachable until a transaction points an inode at it.
pub(crate) fn write_new_block(state: &MountState, res: &mut Reserved, attrs: &Attrs) -> Result<u64> {
    write_block(state, res, &xattr::encode(attrs)?)
}

fn write_block(state: &MountState, res: &mut Reserved, bytes: &[u8]) -> Result<u64> {
    let b = res.alloc_one()?;
    state
        .pool
        .write_flush(b * BLOCK_SIZE, bytes, Category::Metadata)?;
    Ok(b)
}

/// Give the inode the attributes `attrs` (none: no block) and a new ctime, with the permission
/// bits of `mode` if given, in one transaction ([`stage_attrs`]: on a pool with no block free,
/// an inode that has a block gets it rewritten in place, so that removing an attribute, as
/// privilege dropping does after a write, never fails for lack of space).
pub(crate) fn install_attrs(state: &MountState, g: &mut InodeState, attrs: &Attrs, mode: Option<u32>) -> Result<()> {
    let mut res = Reserved::new(state);
    let mut hdr = g.hdr.clone();
    let mut tx = Tx::new();
    let moved = stage_attrs(state, &mut res, g, attrs, &mut hdr, &mut tx)?;
    hdr.ctime = state.now_fine();
    if let Some(m) = mode {
        hdr.mode = (hdr.mode & libc::S_IFMT) | (m & 0o7777);
    }
    state.header_tx(&mut tx, g.ino, &g.hdr, &hdr);
    state.commit(tx)?;
    res.keep();
    let old = g.hdr.xattr_block;
    g.hdr = hdr;
    if moved {
        free_block(state, old);
    }
    Ok(())
}

/// The copy-on-write step of every attribute change, for transaction `tx`, which changes the
/// inode's header from `g.hdr` to `hdr`: `attrs` written to a new block reserved in `res` that
/// `hdr` points at (none for no attributes), and true: the caller frees the old block once
/// `tx` has committed. On a pool with no block free, an inode that has a block gets `attrs`
/// written over it inside `tx`, journaled with undo images like any metadata changed in place
/// (a crash leaves the old block or the new one whole), and false.
pub(crate) fn stage_attrs(
    state: &MountState,
    res: &mut Reserved,
    g: &InodeState,
    attrs: &Attrs,
    hdr: &mut InodeHeader,
    tx: &mut Tx,
) -> Result<bool> {
    if attrs.is_empty() {
        hdr.xattr_block = 0;
        return Ok(true);
    }
    let bytes = xattr::encode(attrs)?;
    match write_block(state, res, &bytes) {
        Ok(b) => {
            hdr.xattr_block = b;
            Ok(true)
        }
        Err(Error::NoSpace(_)) if g.hdr.xattr_block != 0 => {
            tx.write(g.hdr.xattr_block * BLOCK_SIZE, bytes, Category::Metadata);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Free an xattr block (0: none) no inode points at any more, once the transaction that
/// replaced it has committed.
pub(crate) fn free_block(state: &MountState, block: u64) {
    if block != 0 {
        state.free_runs(&[BlockRun { start: block, len: 1 }]);
    }
}

/// Move the inode's xattr block, which must be at `from`, onto a newly allocated block (hole
/// compaction): the copy-on-write step of [`set_locked`] with the same bytes and no new ctime,
/// never in place. Returns the new block, or None when the block is not at `from` any more.
pub(crate) fn relocate_block(
    state: &MountState,
    g: &mut InodeState,
    from: u64,
) -> Result<Option<u64>> {
    if from == 0 || g.hdr.xattr_block != from {
        return Ok(None);
    }
    let mut bytes = vec![0u8; BLOCK_SIZE as usize];
    state.pool.read(from * BLOCK_SIZE, &mut bytes)?;
    let mut res = Reserved::new(state);
    let mut hdr = g.hdr.clone();
    hdr.xattr_block = write_block(state, &mut res, &bytes)?;
    let mut tx = Tx::new();
    state.header_tx(&mut tx, g.ino, &g.hdr, &hdr);
    state.commit(tx)?;
    res.keep();
    g.hdr = hdr;
    free_block(state, from);
    Ok(Some(g.hdr.xattr_block))
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::fs::Fs;
    use crate::state::inode_state::wlock;
    use crate::types::{MkfsOptions, MountOptions, XattrSet};
    use std::path::PathBuf;

    /// A fresh 32 MiB pool, mounted.
    fn fresh() -> (tempfile::TempDir, PathBuf, Fs) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        Fs::mkfs(&p, &MkfsOptions { size: Some(32 << 20), ..Default::default() }).unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        (d, p, fs)
    }

    /// An attribute outside the kept namespaces, as a build that took any name stored it, can
    /// still be read and removed; one the inode lacks, or a new one, is EOPNOTSUPP.
    #[test]
    fn a_name_outside_the_namespaces_already_kept_can_be_read_and_removed() {
        let (_d, _, fs) = fresh();
        let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let old = &b"bogus.old"[..];
        let n = fs.state.inode(ino).unwrap();
        super::set_locked(&fs.state, &mut wlock(&n), old, Some(b"v"), XattrSet::Any).unwrap();
        assert_eq!(fs.getxattr(ino, old).unwrap(), b"v");
        assert!(matches!(fs.setxattr(ino, old, b"w", XattrSet::Any), Err(Error::NotSupported(_))));
        assert!(matches!(fs.getxattr(ino, b"bogus.new"), Err(Error::NotSupported(_))));
        fs.removexattr(ino, old).unwrap();
        assert!(matches!(fs.getxattr(ino, old), Err(Error::NotSupported(_))));
        assert!(matches!(fs.removexattr(ino, old), Err(Error::NotSupported(_))));
        assert!(fs.listxattr(ino).unwrap().is_empty());
    }

    /// With no block free, attributes are still removed (privilege dropping needs it) and
    /// changed, by rewriting the inode's block in place; an inode with none still needs one.
    #[test]
    fn with_no_block_free_the_block_is_rewritten_in_place() {
        let (_d, p, fs) = fresh();
        let root = fs.root();
        let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
        let bare = fs.create(root, b"bare", 0o644, 0, 0).unwrap().ino;
        fs.setxattr(a, b"user.one", b"1", XattrSet::Any).unwrap();
        fs.setxattr(a, b"security.capability", &[7u8; 20], XattrSet::Any).unwrap();
        let block = |ino| wlock(&fs.state.inode(ino).unwrap()).hdr.xattr_block;
        let before = block(a);
        let full = fs.take_all_free_blocks();
        assert_eq!(fs.statfs().free_blocks, 0);
        fs.removexattr(a, b"security.capability").unwrap();
        fs.setxattr(a, b"user.two", &[2u8; 300], XattrSet::Any).unwrap();
        assert_eq!(block(a), before, "not rewritten in place");
        assert!(matches!(
            fs.setxattr(bare, b"user.one", b"1", XattrSet::Any),
            Err(Error::NoSpace(_))
        ));
        drop(full);
        assert!(matches!(fs.getxattr(a, b"security.capability"), Err(Error::NoAttr)));
        assert_eq!(fs.getxattr(a, b"user.two").unwrap(), vec![2u8; 300]);
        assert_eq!(fs.getxattr(a, b"user.one").unwrap(), b"1");
        fs.unmount().unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        assert_eq!(fs.getxattr(a, b"user.two").unwrap(), vec![2u8; 300]);
        let r = fs.check();
        assert!(r.is_clean(), "{r:?}");
        fs.unmount().unwrap();
    }
}
