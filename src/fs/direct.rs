//! The facade of the direct path (docs/DESIGN.md §7b): what the mount's channel needs to let
//! a client map a file's pool blocks itself — the pool's descriptor, the size board, and
//! leases on ranges of files (`ops::lease`).

use crate::state::accounting::OpKind;
use crate::error::Result;
use crate::fs::Fs;
use crate::ops::lease::{self, Purpose};
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
    /// Writes must go through the daemon, which drops the privileges the file carries (a
    /// set-user-ID or set-group-ID bit, file capabilities) as the kernel does at a write.
    pub privileged: bool,
}

impl Fs {
    /// Lease bytes [off, off+len) of regular file `ino` for a client that maps its blocks:
    /// with `fill`, holes of the part inside the file are filled first (whole aligned 2 MiB
    /// units when `len` is 2 MiB or more); until [`Fs::unlease`], the file stays open, its blocks stay where they
    /// are, and blocks it frees are kept from other files. EROFS on a read-only mount.
    pub fn lease(&self, ino: u64, off: u64, len: u64, fill: bool) -> Result<Lease> {
        let _op = self.state.accounting.scope(OpKind::Lease);
        let purpose = if fill { Purpose::Map } else { Purpose::Existing };
        let g = lease::grant(&self.state, ino, off, len, purpose)?;
        Ok(Lease {
            size: g.size,
            extents: g.extents,
            privileged: g.privileged,
        })
    }

    /// Lease bytes [off, off+len) of regular file `ino` for a client that appends to it
    /// directly: every block of the range is allocated, past the end of the file too, and
    /// returned; until [`Fs::unlease_append`] the client grows the file's size itself, with
    /// one atomic swap of its word on the size board (`state::size_word`), and every operation
    /// on the file takes the size from there first (making it durable). ENOSPC when the blocks
    /// cannot be had.
    pub fn lease_append(&self, ino: u64, off: u64, len: u64) -> Result<Lease> {
        let _op = self.state.accounting.scope(OpKind::Lease);
        let g = lease::grant(&self.state, ino, off, len, Purpose::Append)?;
        Ok(Lease {
            size: g.size,
            extents: g.extents,
            privileged: g.privileged,
        })
    }

    /// Give back one lease of `ino` taken by [`Fs::lease`].
    pub fn unlease(&self, ino: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Lease);
        lease::release(&self.state, ino, false)
    }

    /// Give back one lease of `ino` taken by [`Fs::lease_append`]: the size its client
    /// published is pulled in first.
    pub fn unlease_append(&self, ino: u64) -> Result<()> {
        let _op = self.state.accounting.scope(OpKind::Lease);
        lease::release(&self.state, ino, true)
    }

    /// Whether direct-path clients lease `ino`: they may append to it or write it, so its size
    /// and times may change without a request, and the kernel must not cache its attributes.
    pub fn changed_directly(&self, ino: u64) -> bool {
        self.state.leases.any()
            && self.state.inode(ino).is_ok_and(|n| crate::state::inode_state::rlock(&n).leases > 0)
    }

    /// The pool's open file (for a client to map; it shares the pool lock, so the pool cannot
    /// be mounted again while any client still maps it).
    pub fn pool_fd(&self) -> RawFd {
        self.state.pool.raw_fd()
    }

    /// The user that owns the pool file (who, with root, may use the direct path).
    pub fn pool_owner(&self) -> Result<u32> {
        Ok(self.pool_file()?.uid())
    }

    /// Whether processes may store into this pool themselves: not into a file on a disk file
    /// system without DAX, where their stores and write-backs would reach only the page cache
    /// (this process's fences write the pool to the disk).
    pub fn check_direct_path(&self) -> Result<()> {
        if self.state.pool.syncs_to_disk() {
            return Err(crate::Error::Invalid(format!(
                "{} is a file on a disk file system without DAX: a process's own stores would \
                 not reach the disk",
                self.state.pool.path().display()
            )));
        }
        Ok(())
    }

    /// The pool file's device and inode numbers (`st_dev`, `st_ino`), which name the
    /// direct-path channel (`fuse::proto::channel_name`).
    pub fn pool_file_id(&self) -> Result<(u64, u64)> {
        let m = self.pool_file()?;
        Ok((m.dev(), m.ino()))
    }

    fn pool_file(&self) -> Result<std::fs::Metadata> {
        std::fs::metadata(self.state.pool.path()).map_err(|e| crate::Error::io("stat the pool", e))
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
            .loaded_inodes()
            .iter()
            .map(|n| crate::state::inode_state::rlock(n).quarantine.iter().map(|r| r.len).sum::<u64>())
            .sum()
    }
}
