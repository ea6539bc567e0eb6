//! The mount-wide side of direct-path leases (docs/DESIGN.md §7b): how many are held, and the
//! size board, a shared memory array through which clients of the channel read the current
//! size of every file they lease without a round trip. Per-file lease counts and quarantined
//! blocks live in `InodeState`; `ops::lease` grants and releases.

use crate::error::{Error, Result};
use crate::state::size_word;
use crate::sys::{self, vm};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The size board: two little-endian `u64`s per inode number (at `16 * ino`: the size word of
/// `size_word`, then the layout generation, bumped whenever a leased file gives blocks up, with
/// `size_word::WRITTEN` on top), in a memory file the daemon maps read-write and hands to
/// clients, who read it, grow the size in it for the files they append to directly, and set
/// `WRITTEN` after a direct write.
pub(crate) struct SizeBoard {
    fd: OwnedFd,
    addr: usize,
    len: usize,
}

impl SizeBoard {
    /// A zeroed board for inode numbers up to `max_ino`.
    fn new(max_ino: u64) -> Result<SizeBoard> {
        let len = usize::try_from((max_ino + 1) * 16)
            .map_err(|_| Error::Invalid("inode table too large for a size board".into()))?
            .next_multiple_of(vm::PAGE);
        let fd = sys::memfd("winefs-sizes", len as u64)
            .map_err(|e| Error::io("create the size board", e))?;
        let addr = vm::map_file_shared(fd.as_raw_fd(), len)?;
        Ok(SizeBoard { fd, addr, len })
    }

    /// Publish the size of `ino` with a new sequence number (one atomic store: a client never
    /// reads half of it), open for clients' swaps only if `open` (the file has appenders; a
    /// word stays frozen otherwise, so a client that lost its append lease cannot grow the
    /// file). While clients append, only under the inode lock with the word frozen
    /// ([`SizeBoard::freeze`]), so no client's swap is overwritten.
    pub fn publish(&self, ino: u64, size: u64, open: bool) {
        let at = ino as usize * 16;
        if at + 16 <= self.len {
            let w = size_word::published(vm::load_u64(self.addr + at), size);
            vm::store_u64(self.addr + at, if open { w } else { w | size_word::FROZEN });
        }
    }

    /// Freeze the size word of `ino` so no client grows the file until the next
    /// [`SizeBoard::publish`] or [`SizeBoard::thaw`]; returns the word it held.
    pub fn freeze(&self, ino: u64) -> u64 {
        let at = ino as usize * 16;
        if at + 16 > self.len {
            return 0;
        }
        loop {
            let w = vm::load_u64(self.addr + at);
            if size_word::frozen(w) || vm::cas_u64(self.addr + at, w, w | size_word::FROZEN) {
                return w;
            }
        }
    }

    /// Put back word `w` that [`SizeBoard::freeze`] returned, sequence number and all: the
    /// daemon only looked, so a client's swap from `w` is still right.
    pub fn thaw(&self, ino: u64, w: u64) {
        let at = ino as usize * 16;
        if at + 16 <= self.len {
            vm::store_u64(self.addr + at, w);
        }
    }

    /// Bump the layout generation of `ino`: blocks a client may map left the file. A
    /// client's [`size_word::WRITTEN`] in the same word stays.
    pub fn bump(&self, ino: u64) {
        let at = ino as usize * 16 + 8;
        if at + 8 <= self.len {
            loop {
                let w = vm::load_u64(self.addr + at);
                let next = (w & size_word::WRITTEN) | size_word::generation(w.wrapping_add(1));
                if vm::cas_u64(self.addr + at, w, next) {
                    break;
                }
            }
        }
    }

    /// Whether a client wrote `ino` directly since the last call (the flag is cleared).
    pub fn take_written(&self, ino: u64) -> bool {
        let at = ino as usize * 16 + 8;
        if at + 8 > self.len {
            return false;
        }
        loop {
            let w = vm::load_u64(self.addr + at);
            if w & size_word::WRITTEN == 0 {
                return false;
            }
            if vm::cas_u64(self.addr + at, w, w & !size_word::WRITTEN) {
                return true;
            }
        }
    }

    /// The memory file, for a client, and its length.
    pub fn fd(&self) -> (RawFd, u64) {
        (self.fd.as_raw_fd(), self.len as u64)
    }
}

impl Drop for SizeBoard {
    fn drop(&mut self) {
        vm::unmap(self.addr, self.len);
    }
}

/// Direct-path leases of a mount.
#[derive(Default)]
pub(crate) struct Leases {
    /// Leases held on all files (a cheap test before any per-file work).
    pub held: AtomicU64,
    /// Append leases held on all files (`state::appends`).
    pub appending: AtomicU64,
    /// Made by the first client.
    board: OnceLock<SizeBoard>,
    /// Serialises making the board.
    making: Mutex<()>,
}

impl Leases {
    /// The size board, made on first use.
    pub fn board(&self, max_ino: u64) -> Result<&SizeBoard> {
        if let Some(b) = self.board.get() {
            return Ok(b);
        }
        let _g = self.making.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = self.board.get() {
            return Ok(b);
        }
        let b = SizeBoard::new(max_ino)?;
        Ok(self.board.get_or_init(|| b))
    }

    /// Publish `size` for `ino` if a board exists (`open`: see [`SizeBoard::publish`]).
    pub fn publish(&self, ino: u64, size: u64, open: bool) {
        if let Some(b) = self.board.get() {
            b.publish(ino, size, open);
        }
    }

    /// Freeze the size word of `ino` if a board exists; the word it held (None: no board).
    pub fn freeze(&self, ino: u64) -> Option<u64> {
        self.board.get().map(|b| b.freeze(ino))
    }

    /// Put back a word [`Leases::freeze`] returned.
    pub fn thaw(&self, ino: u64, w: u64) {
        if let Some(b) = self.board.get() {
            b.thaw(ino, w);
        }
    }

    /// Whether a client wrote `ino` directly since the last call ([`SizeBoard::take_written`]).
    pub fn take_written(&self, ino: u64) -> bool {
        self.board.get().is_some_and(|b| b.take_written(ino))
    }

    /// Note that leased file `ino` gave blocks up (into its quarantine).
    pub fn bump(&self, ino: u64) {
        if let Some(b) = self.board.get() {
            b.bump(ino);
        }
    }

    /// Whether any lease is held anywhere.
    pub fn any(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }
}
