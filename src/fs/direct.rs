//! The facade of the direct path (docs/DESIGN.md §7b): what the mount's channel needs to let
//! a client map a file's pool blocks itself — the pool's descriptor, the size board, and
//! leases on ranges of files (`ops::lease`).

use crate::error::Result;
use crate::fs::Fs;
use crate::ops::lease;
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;

/// A leased range of a file: its size at the grant and where its blocks are in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// File size when the lease was granted.
    pub size: u64,
    /// (first logical block, first pool block, blocks) for every block of the range inside
    /// the file, in file order.
    pub extents: Vec<(u64, u64, u64)>,
}

impl Fs {
    /// Lease bytes [off, off+len) of regular file `ino` for a client that maps its blocks:
    /// with `fill`, holes of the part inside the file are filled first (whole aligned 2 MiB
    /// units when `len` is 2 MiB or more); until [`Fs::unlease`], the file stays open, its blocks stay where they
    /// are, and blocks it frees are kept from other files. EROFS on a read-only mount.
    pub fn lease(&self, ino: u64, off: u64, len: u64, fill: bool) -> Result<Lease> {
        let g = lease::grant(&self.state, ino, off, len, fill)?;
        Ok(Lease {
            size: g.size,
            extents: g.extents,
        })
    }

    /// Give back one lease of `ino` taken by [`Fs::lease`].
    pub fn unlease(&self, ino: u64) -> Result<()> {
        lease::release(&self.state, ino)
    }

    /// The pool's open file (for a client to map; it shares the pool lock, so the pool cannot
    /// be mounted again while any client still maps it).
    pub fn pool_fd(&self) -> RawFd {
        self.state.pool.raw_fd()
    }

    /// The user that owns the pool file (who, with root, may use the direct path).
    pub fn pool_owner(&self) -> Result<u32> {
        let m = std::fs::metadata(self.state.pool.path())
            .map_err(|e| crate::Error::io("stat the pool", e))?;
        Ok(m.uid())
    }

    /// The size board (a memory file of one `u64` per inode number holding the size of every
    /// leased file) and its length, made on first use.
    pub fn size_board(&self) -> Result<(RawFd, u64)> {
        let max_ino = self.state.geo.total_inodes();
        Ok(self.state.leases.board(max_ino)?.fd())
    }

    /// Leases held on all files of the mount.
    pub fn leases_held(&self) -> u64 {
        self.state.leases.held.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Blocks freed while leased and not yet given back to the allocator, over all files.
    pub fn quarantined_blocks(&self) -> u64 {
        self.state
            .all_inodes()
            .iter()
            .map(|n| crate::state::inode_state::rlock(n).quarantine.iter().map(|r| r.len).sum::<u64>())
            .sum()
    }
}
