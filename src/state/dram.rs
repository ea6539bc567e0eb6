//! The mount's account of its DRAM: bytes held by each structure that grows with the number of
//! files (issue 18: DRAM per directory entry and per inode), computed from the structures'
//! lengths and capacities. `examples/dram_per_file.rs` prints it beside a counting allocator's
//! total.

use crate::meta::dir::hash_table_bytes;
use crate::state::inode_state::{InodeRef, rlock};
use crate::state::locks::lock;
use crate::state::mount_state::MountState;
use std::mem::size_of;

impl MountState {
    /// Bytes of DRAM held per structure: (what, bytes), largest structures first.
    pub fn dram_usage(&self) -> Vec<(&'static str, u64)> {
        let (table, nodes) = {
            let table = hash_table_bytes(self.inodes.capacity(), size_of::<(u64, InodeRef)>());
            (table, self.inodes.values())
        };
        // Each inode's state sits in an `Arc` (two counts) around its locks.
        let per_state =
            (2 * size_of::<usize>() + size_of::<crate::state::inode_state::InodeCell>()) as u64;
        let (mut dirs, mut maps) = (0, 0);
        for n in &nodes {
            let g = rlock(n);
            if let Some(d) = &g.dir {
                dirs += size_of::<crate::meta::dir::DirIndex>() as u64 + d.heap_bytes();
            }
            maps += g.map.heap_bytes();
        }
        let free_inodes: u64 = self.inode_free.iter().map(|f| lock(f).heap_bytes()).sum();
        let mut v = vec![
            ("inode states", per_state * nodes.len() as u64),
            ("inode table (number -> state)", table),
            ("directory indexes", dirs),
            ("extent maps (beyond the state)", maps),
            ("free inode numbers", free_inodes),
        ];
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v
    }
}
