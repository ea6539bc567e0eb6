//! Open handles and symbolic link targets: an inode lives while it has links or open handles.

use crate::error::{Error, Result};
use crate::media::layout::{self, FileKind};
use crate::ops::file::read_locked;
use crate::ops::prealloc;
use crate::state::damage::Damage;
use crate::state::inode_state::{rlock, wlock};
use crate::state::mount_state::MountState;
use crate::types::Attr;

/// The target of symlink `ino`.
pub(crate) fn readlink(state: &MountState, ino: u64) -> Result<Vec<u8>> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let g = rlock(&n);
    if g.kind() != FileKind::Symlink {
        return Err(Error::Invalid("not a symbolic link".into()));
    }
    let mut buf = vec![0u8; g.hdr.size as usize];
    read_locked(state, &g, 0, &mut buf)?;
    let want: [u8; 4] = state
        .pool
        .read_array(state.inode_off(ino) + layout::ino::TARGET_CRC as u64)?;
    if crate::media::crc::crc32c(&buf) != u32::from_le_bytes(want) {
        let block = g.map.lookup(0).map_or(0, |(phys, _)| phys);
        return Err(state.media_damage(
            Damage::SymlinkTarget,
            format!("symlink {ino}: its target (block {block}) fails its checksum"),
        ));
    }
    Ok(buf)
}

/// Note an open handle: an unlinked inode lives until its last handle is released.
pub(crate) fn open(state: &MountState, ino: u64) -> Result<Attr> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    g.open += 1;
    Ok(state.attr(&g))
}

/// Drop an open handle; frees the inode if it was the last one and no links remain.
pub(crate) fn release(state: &MountState, ino: u64) -> Result<()> {
    state.check_alive()?;
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    g.open = g.open.saturating_sub(1);
    // Read-only (remounted so): freed when the mount is read-write again, or by the next one.
    if g.unreachable_in_use() && !state.is_read_only() {
        state.free_inode(&mut g)?;
    } else if g.open == 0 {
        prealloc::on_last_close(state, &mut g)?;
    }
    Ok(())
}
