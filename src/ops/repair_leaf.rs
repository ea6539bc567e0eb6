//! Repair of the per-inode blocks that fail their checks while their inode passes: damaged xattr
//! blocks and symlink targets. Neither can be rebuilt, and leaving them would keep a pool that
//! flagged itself "needs fsck" read-only for good, so repair does what e2fsck does with them:
//! an xattr block that fails its checks is dropped (the inode keeps everything else and loses
//! its extended attributes), and a symlink whose target fails its checksum is freed (the
//! entries naming it then dangle and the next pass removes them). Each is one transaction and
//! one report line.

use crate::error::Result;
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::FileKind;
use crate::meta::xattr;
use crate::state::inode_state::{InodeState, wlock};
use crate::state::mount_state::MountState;
use crate::state::validate;

/// Drop every xattr block that fails its checks and free every symlink whose target fails its
/// checksum (nothing else may use `state` meanwhile); one report line per change.
pub(crate) fn repair(state: &MountState) -> Result<Vec<String>> {
    let mut changes = Vec::new();
    for arc in state.all_inodes()? {
        let mut n = wlock(&arc);
        let block = n.hdr.xattr_block;
        if block != 0
            && let Err(e) = xattr::load(&state.pool, &state.geo, n.ino, block)
        {
            drop_xattr_block(state, &mut n)?;
            changes.push(format!(
                "inode {}: xattr block {block} failed its checks ({e}); dropped (its extended attributes are lost)",
                n.ino
            ));
        }
        if n.kind() == FileKind::Symlink && !symlink_ok(state, &n) {
            let ino = n.ino;
            state.free_inode(&mut n)?;
            changes.push(format!(
                "symlink {ino}: its target failed its checksum; freed (the entries naming it go next)"
            ));
        }
    }
    Ok(changes)
}

/// Point inode `n` at no xattr block, in one transaction; the block goes back to free space
/// after the commit when it lies in the data area (mount counted it as the inode's).
fn drop_xattr_block(state: &MountState, n: &mut InodeState) -> Result<()> {
    let block = n.hdr.xattr_block;
    let mut h = n.hdr.clone();
    h.xattr_block = 0;
    let mut tx = Tx::new();
    state.header_tx(&mut tx, n.ino, &n.hdr, &h);
    state.commit(tx)?;
    n.hdr = h;
    if state.geo.is_data_block(block) {
        state.free_runs(&[BlockRun {
            start: block,
            len: 1,
        }]);
    }
    Ok(())
}

/// Whether symlink `n`'s target passes the check fsck makes.
fn symlink_ok(state: &MountState, n: &InodeState) -> bool {
    let mut problems = Vec::new();
    validate::symlink_targets(state, [n], &mut problems);
    problems.is_empty()
}
