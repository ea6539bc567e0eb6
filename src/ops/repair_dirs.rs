//! `winefs fsck --repair`'s pass over directory block headers: a header that failed its
//! checksum at mount was loaded rebuilt (`meta::dir::rebuilt_starts`: the entries its `starts`
//! word marks that are valid by their own checksums), and this pass writes the rebuilt header
//! back — checksum and `starts` in one journaled write per block, one report line each.
//! Names it dropped leave their inodes named nowhere; the passes after it in `ops::repair`
//! link those into `/lost+found`.

use crate::error::{Error, Result};
use crate::media::journal::Tx;
use crate::media::pool::Category;
use crate::meta::dir;
use crate::state::inode_state::rlock;
use crate::state::mount_state::MountState;

/// Write back every directory block header that mount rebuilt; one line per block in `changes`.
pub(crate) fn rewrite_headers(state: &MountState, changes: &mut Vec<String>) -> Result<()> {
    for &(dino, block) in &state.rebuilt_dir_headers {
        let node = state.inode(dino)?;
        let g = rlock(&node);
        let (phys, _) = g
            .map
            .lookup(u64::from(block))
            .ok_or_else(|| Error::Corrupted(format!("directory {dino} block {block} unmapped")))?;
        let dirx = g.dir.as_ref().ok_or(Error::NotDir)?;
        let starts = dirx.starts.get(block as usize).copied().ok_or_else(|| {
            Error::Corrupted(format!("directory {dino} has no block {block} in memory"))
        })?;
        let mut tx = Tx::new();
        tx.write_copy(
            dir::header_offset(phys),
            &dir::header_bytes(dino, block, starts),
            Category::Metadata,
        );
        state.commit(tx)?;
        changes.push(format!(
            "directory {dino}: the header of block {block} failed its checksum; rewritten from the {} valid entries it marks",
            starts.count_ones()
        ));
    }
    Ok(())
}
