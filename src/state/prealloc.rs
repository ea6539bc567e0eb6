//! Bookkeeping of speculative preallocation: the blocks a file holds past its end because it
//! took a whole aligned 2 MiB unit it is expected to grow into. An inode holding them is
//! registered with the allocator as a speculative holder (its blocks past EOF count as
//! available space), and the count follows every change of its size or block map. Giving the
//! blocks back is the data path's (`ops::prealloc`). DRAM only: after a remount nothing is
//! registered and blocks past EOF stay with their files until truncated.

use crate::state::inode_state::InodeState;
use crate::state::mount_state::MountState;

impl MountState {
    /// The file just took blocks past its end speculatively: register it (if it holds any).
    pub fn mark_prealloc(&self, g: &mut InodeState) {
        if g.spec.is_some() {
            return self.note_prealloc(g);
        }
        let n = g.blocks_past_eof();
        if n > 0 {
            g.spec = Some(self.alloc.hold_speculative(g.ino, n));
        }
    }

    /// After a change of the file's size or block map: recount its speculative blocks (a
    /// write or truncate that grew the file over them turned them into file data).
    pub fn note_prealloc(&self, g: &mut InodeState) {
        let Some(holding) = &g.spec else {
            return;
        };
        match g.blocks_past_eof() {
            0 => self.forget_prealloc(g),
            n => holding.set(n),
        }
    }

    /// The file's blocks past EOF stop being speculative: they were given back, the inode was
    /// freed, or the user asked for them (fallocate with KEEP_SIZE).
    pub fn forget_prealloc(&self, g: &mut InodeState) {
        if g.spec.take().is_some() {
            self.alloc.set_speculative(g.ino, 0);
        }
    }
}
