//! Open handles of the facade: [`File`] (a position and an open count on an inode, with
//! `std::io` traits) and [`Mapping`] (a memory mapping of a file range, see `ops::mmap`).

use crate::error::{Error, Result};
use crate::fs::api::Fs;
use crate::ops::mmap;
use crate::state::mappings::MapState;
use crate::sys::vm;
use crate::types::Attr;
use std::sync::Arc;

/// An open file: a position plus a handle that keeps an unlinked file alive until dropped.
pub struct File {
    fs: Fs,
    ino: u64,
    pos: u64,
}

impl File {
    /// Open inode `ino` (counted until the handle is dropped).
    pub(crate) fn open(fs: Fs, ino: u64) -> Result<File> {
        fs.open(ino)?;
        Ok(File { fs, ino, pos: 0 })
    }
    /// The inode this handle has open.
    pub fn ino(&self) -> u64 {
        self.ino
    }
    /// Read from `off` (the handle's position does not move); short at the end of file.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.fs.read(self.ino, off, buf)
    }
    /// Write at `off` (the handle's position does not move).
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        self.fs.write(self.ino, off, data)
    }
    /// Append atomically at the end of file; returns the bytes written and the offset written
    /// at. Short of space the count is short, as for [`File::write_at`] (`Fs::write`).
    pub fn append(&mut self, data: &[u8]) -> Result<(usize, u64)> {
        let (n, at) = self.fs.append(self.ino, data)?;
        self.pos = at + n as u64;
        Ok((n, at))
    }
    /// Truncate or extend (with a hole) to `size` bytes.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.fs.truncate(self.ino, size)
    }
    /// Allocate zeroed blocks under [off, off+len), extending the size to cover them.
    pub fn fallocate(&self, off: u64, len: u64) -> Result<()> {
        self.fs.fallocate(self.ino, off, len, false)
    }
    /// The file's attributes.
    pub fn metadata(&self) -> Result<Attr> {
        self.fs.getattr(self.ino)
    }
    /// Order this call after every earlier write (see [`Fs::fsync`]).
    pub fn fsync(&self) -> Result<()> {
        self.fs.fsync(self.ino)
    }
    /// Map `len` bytes of the file from `off` (a multiple of 4 KiB) into memory; see
    /// [`Mapping`] (every mapping is writable, so a read-only mount refuses it). Aligned 2 MiB
    /// extents are mapped with hugepages on a hugepage pool.
    pub fn mmap(&self, off: u64, len: usize) -> Result<Mapping> {
        Mapping::new(File::open(self.fs.clone(), self.ino)?, off, len, false)
    }
    /// Map like [`File::mmap`], but atomically: stores stay private to the mapping until
    /// [`Mapping::msync`] writes the pages dirtied since the last msync into the file in one
    /// journal transaction (strict mode only). Dirty pages are 4 KiB copies, so stored-to
    /// pages lose their hugepage mapping until written back.
    pub fn mmap_atomic(&self, off: u64, len: usize) -> Result<Mapping> {
        Mapping::new(File::open(self.fs.clone(), self.ino)?, off, len, true)
    }
    /// Read the whole file.
    pub fn read_all(&self) -> Result<Vec<u8>> {
        let size = self.metadata()?.size as usize;
        let mut v = vec![0u8; size];
        let n = self.read_at(0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

fn to_io(e: Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

impl std::io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.read_at(self.pos, buf).map_err(to_io)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Write for File {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.write_at(self.pos, buf).map_err(to_io)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::io::Seek for File {
    fn seek(&mut self, p: std::io::SeekFrom) -> std::io::Result<u64> {
        let base = match p {
            std::io::SeekFrom::Start(o) => Some(o),
            std::io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            std::io::SeekFrom::End(d) => self.metadata().map_err(to_io)?.size.checked_add_signed(d),
        };
        self.pos = base.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(self.pos)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = self.fs.release(self.ino);
    }
}

/// A memory mapping of a file range. The file stays open (and alive, even if unlinked) while
/// the mapping exists; dropping the mapping unmaps it.
///
/// Loads and stores through [`Mapping::as_ptr`] reach the pool directly. Touching a page
/// beyond the end of the file raises SIGBUS; touching an unbacked page inside the file
/// allocates its 2 MiB unit. Stores are durable after [`Mapping::msync`] (or `fsync`).
pub struct Mapping {
    st: Arc<MapState>,
    file: File,
}

impl Mapping {
    fn new(file: File, off: u64, len: usize, atomic: bool) -> Result<Mapping> {
        // Stores through a mapping reach the pool: none on a read-only mount.
        file.fs.state.check_writable()?;
        let st = mmap::map(&file.fs.state, file.ino, off, len, atomic)?;
        Ok(Mapping { st, file })
    }

    /// Start of the mapping: file offset [`Mapping::offset`] is at this address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.st.base as *mut u8
    }
    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.st.len
    }
    /// Never true: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.st.len == 0
    }
    /// File offset of the first mapped byte.
    pub fn offset(&self) -> u64 {
        self.st.off
    }
    /// The mapped file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Check that [at, at+n) lies in the mapping and inside the file (so a copy cannot fault
    /// with SIGBUS, nor store bytes past EOF that the file would not keep).
    fn check_range(&self, at: usize, n: usize) -> Result<()> {
        let end = self.within(at, n)?;
        let size = self.file.metadata()?.size;
        if n > 0 && self.st.off + end as u64 > size {
            return Err(Error::NoSuchOffset);
        }
        Ok(())
    }

    /// Check that [at, at+n) lies in the mapping; returns its end.
    #[inline]
    fn within(&self, at: usize, n: usize) -> Result<usize> {
        at.checked_add(n)
            .filter(|&e| e <= self.st.len)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "range {at}+{n} is outside the {}-byte mapping",
                    self.st.len
                ))
            })
    }

    /// Store `data` at byte `at` of the mapping (a memcpy through the mapping).
    pub fn write(&self, at: usize, data: &[u8]) -> Result<()> {
        self.check_range(at, data.len())?;
        vm::copy_in(self.st.base + at, data);
        Ok(())
    }

    /// Store `data` at byte `at` like a plain memcpy into the mapping: only the mapping's bounds
    /// are checked, so a store past the end of the file raises SIGBUS, as it would through
    /// [`Mapping::as_ptr`].
    pub fn store(&self, at: usize, data: &[u8]) -> Result<()> {
        self.within(at, data.len())?;
        vm::copy_in(self.st.base + at, data);
        Ok(())
    }

    /// Load like a plain memcpy from the mapping (the counterpart of [`Mapping::store`]).
    pub fn load(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        self.within(at, buf.len())?;
        vm::copy_out(self.st.base + at, buf);
        Ok(())
    }

    /// Load the 8 bytes at byte `at` of the mapping (native endian), like a plain load.
    #[inline]
    pub fn load_u64(&self, at: usize) -> Result<u64> {
        self.within(at, 8)?;
        Ok(vm::read_u64(self.st.base + at))
    }

    /// Load `buf.len()` bytes from byte `at` of the mapping.
    pub fn read(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        self.check_range(at, buf.len())?;
        vm::copy_out(self.st.base + at, buf);
        Ok(())
    }

    /// Make stores to [at, at+len) of the mapping durable. A plain mapping writes back the
    /// cache lines of the installed pages there and fences (pages never touched hold nothing
    /// to write back). An atomic mapping writes the pages dirtied since the last msync into
    /// the file in one journal transaction: after a crash the range holds either all of them
    /// or none. Returns the bytes written back (atomic) or flushed (plain).
    pub fn msync(&self, at: usize, len: usize) -> Result<u64> {
        mmap::msync(&self.file.fs.state, &self.st, at, len)
    }

    /// Bytes of this mapping the kernel maps with 2 MiB page-table entries right now (from
    /// `/proc/self/smaps`; a page counts once it has been touched).
    pub fn pmd_mapped_bytes(&self) -> Result<u64> {
        vm::pmd_mapped_bytes(self.st.base, self.st.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        mmap::unmap(&self.file.fs.state, &self.st);
    }
}
