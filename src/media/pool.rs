//! The pool: one 2 MiB-aligned shared mapping of the backing file or device, and the persistence
//! primitives (cache-line write-back and store fence) with per-category counters.
//!
//! This is the only module that touches raw memory. Every access is bounds-checked against the
//! mapping and copies bytes in or out; no reference into the mapping ever escapes, so concurrent
//! writers to other ranges never alias a Rust reference.
#![allow(unsafe_code)] // one of the few modules allowed `unsafe` (Cargo.toml [lints])
#![deny(clippy::cast_possible_truncation)]

use crate::media::disk_sync::DiskSync;
use crate::media::pool_file::{
    backing_size, check_holes_readable, reserve_backing, reserve_if_sparse, settle_dax_file,
};
use crate::media::persist_stats::Counters;
use crate::media::pool_copy::{
    PersistSrc, copy_out, ix, store_lines_in_order, stream_lines, stream_src_lines,
};
pub use crate::media::persist_stats::{CATEGORIES, Category, PersistStats, thread_stats};
use crate::media::wear::WearCounters;
use crate::error::{Error, Result};
use crate::sys::Backing;
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Cache-line size assumed by the flush loop and the journal entry size.
pub(crate) const CACHE_LINE: u64 = 64;
const _: () = assert!(crate::media::pool_copy::CACHE_LINE == CACHE_LINE);
/// How long a busy pool lock is retried before the pool is refused as in use. The lock belongs
/// to the open file description, so a child forked by another thread (to run `mount`, say)
/// keeps a copy of a pool descriptor, and its lock, from the fork until it execs, even after
/// the parent closed it (every descriptor is close-on-exec): microseconds. A mount holds the
/// lock for its whole life, so waiting this long changes nothing for a real conflict.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
const HUGE: usize = 2 << 20;

/// The cache-line write-back instruction chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushKind {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and evict, weakly ordered.
    ClflushOpt,
    /// `clflush`: write back and evict, strongly ordered.
    Clflush,
    /// Not x86-64: stores are made durable with msync of the touched pages.
    Msync,
}

/// The crash-recording seam: an observer told about every store range, cache-line write-back and
/// fence issued through this pool (the crash explorer, `crash::record`, builds crash images from
/// it). Called after the stores of a range are done and before a flush or fence takes effect;
/// an observer may read the pool (never write it) from inside a call.
pub(crate) trait PersistObserver: Send + Sync {
    /// Bytes `off..off+len` were stored through the cache (not yet written back).
    fn stored(&self, pool: &Pool, off: u64, len: u64);
    /// Every cache line overlapping `off..off+len` was written back (or stored non-temporally):
    /// durable at the next fence.
    fn flushed(&self, pool: &Pool, off: u64, len: u64);
    /// Store fence: what was flushed before it is durable.
    fn fenced(&self, pool: &Pool);
}

/// A mapped pool.
pub struct Pool {
    base: *mut u8,
    len: u64,
    /// A shared mapping of memory (tmpfs, hugetlbfs, a DAX device): faulting it in ahead of
    /// use costs no I/O ([`Pool::populate`]).
    memory_backed: bool,
    flush_kind: FlushKind,
    counters: Counters,
    path: PathBuf,
    private: bool,
    file: File,
    /// Set while an observer is attached; the only cost of the seam on the real path.
    observed: AtomicBool,
    observer: RwLock<Option<Arc<dyn PersistObserver>>>,
    /// Per-block write counters of a pool made with `--wear-stats`, once mount attached them.
    wear: std::sync::OnceLock<Arc<WearCounters>>,
    /// Set for a file on a disk file system without DAX (its mapping is the page cache): fences
    /// write the file to the disk instead of trusting cache-line write-backs.
    disk: Option<DiskSync>,
    /// A file in DAX mode: its blocks are settled before the first store (`settle_backing`).
    dax_file: bool,
    /// Whole lines can be stored with one non-temporal 64-byte instruction each (AVX-512, and a
    /// shared mapping of memory: [`Pool::write_lines_flush`]).
    line_stores: bool,
}

// SAFETY: the mapping is process-wide shared memory that lives as long as `Pool`; all access goes
// through bounds-checked copies (no references into it escape), so sharing across threads is as
// safe as sharing a file descriptor. Ordering between threads is the callers' locking.
unsafe impl Send for Pool {}
// SAFETY: see `Send` above; `&Pool` methods only copy bytes and issue flush instructions.
unsafe impl Sync for Pool {}

fn detect_flush() -> FlushKind {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 7 sub-leaf 0, EBX bit 24 = CLWB, bit 23 = CLFLUSHOPT.
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        if leaf7.ebx & (1 << 24) != 0 {
            FlushKind::Clwb
        } else if leaf7.ebx & (1 << 23) != 0 {
            FlushKind::ClflushOpt
        } else {
            FlushKind::Clflush
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        FlushKind::Msync
    }
}

/// Whether this processor stores a whole cache line with one instruction (AVX-512F), unless
/// `WINEFS_LINE_STORES=0` asks for the word stores of processors without it (so that a machine
/// with AVX-512 can test them under kills: docs/TESTING.md).
fn has_line_stores() -> bool {
    if std::env::var_os("WINEFS_LINE_STORES").is_some_and(|v| v == "0") {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Take the pool lock on `file`: exclusive for a writer, shared for a private (read-only)
/// mapping, so fsck and info refuse a pool that is mounted and two writers never meet (two
/// processes mounting one pool would corrupt it). A lock held only briefly is waited out
/// ([`LOCK_RETRY`]); taking it again through the same descriptor succeeds at once.
fn take_lock(path: &Path, file: &File, private: bool) -> Result<()> {
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        let locked = if private {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match locked {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Busy(format!(
                    "pool {} is in use by another winefs mount",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io(format!("lock pool {}", path.display()), e));
            }
        }
    }
}

impl Pool {
    /// Create a pool file of `size` bytes (it must not exist yet, so nothing is ever overwritten
    /// by accident) and map it.
    pub fn create(path: &Path, size: u64) -> Result<Pool> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io(format!("create pool {}", path.display()), e))?;
        // Locked before it is sized, like every pool a writer touches.
        take_lock(path, &file, false)?;
        let made = file
            .set_len(size)
            .map_err(|e| Error::io(format!("size pool {} to {size} bytes", path.display()), e))
            .and_then(|()| reserve_backing(path, &file, size));
        if let Err(e) = made {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Self::map(path, file, size, false)
    }

    /// Reserve backing storage for every byte of a regular pool file, so that a full host file
    /// system is reported now rather than as SIGBUS on a later store (mkfs of an existing file).
    pub(crate) fn reserve_backing(&self) -> Result<()> {
        reserve_backing(&self.path, &self.file, self.len)
    }

    /// Open an existing pool file or device to format it: the pool lock is taken first, so a
    /// pool in use (mounted) is refused before anything changes; then a regular file is resized
    /// to `size`, if given.
    pub fn open_for_format(path: &Path, size: Option<u64>) -> Result<Pool> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("open pool {}", path.display()), e))?;
        take_lock(path, &file, false)?;
        let is_file = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .is_file();
        if let Some(size) = size.filter(|_| is_file) {
            file.set_len(size)
                .map_err(|e| Error::io(format!("resize {}", path.display()), e))?;
        }
        let size = backing_size(path, &file)?;
        Self::map(path, file, size, false)
    }

    /// Open an existing pool file or device. `private` maps it copy-on-write: every store stays in
    /// this process and the media is never modified (used by fsck).
    pub fn open(path: &Path, private: bool) -> Result<Pool> {
        let file = OpenOptions::new()
            .read(true)
            .write(!private)
            .open(path)
            .map_err(|e| Error::io(format!("open pool {}", path.display()), e))?;
        let size = backing_size(path, &file)?;
        Self::map(path, file, size, private)
    }

    fn map(path: &Path, file: File, size: u64, private: bool) -> Result<Pool> {
        take_lock(path, &file, private)?;
        // Before anything is read: on tmpfs a read of a hole allocates a page too.
        if private {
            check_holes_readable(path, &file, size)?;
        } else {
            reserve_if_sparse(path, &file, size)?;
        }
        Self::map_locked(path, file, size, private)
    }

    /// A copy-on-write mapping of this pool: stores to it never reach the media. Mount
    /// validates what recovery would leave on such a view before it writes anything. It takes
    /// no lock of its own (this pool holds it).
    pub(crate) fn private_view(&self) -> Result<Pool> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io(format!("reopen pool {}", self.path.display()), e))?;
        Self::map_locked(&self.path, file, self.len, true)
    }

    /// Map `file` (whose lock the caller holds) at a 2 MiB-aligned address.
    fn map_locked(path: &Path, file: File, size: u64, private: bool) -> Result<Pool> {
        let len = size & !4095;
        if len == 0 {
            return Err(Error::PoolTooSmall { size, min: 4096 });
        }
        let ulen = usize::try_from(len)
            .map_err(|_| Error::Invalid("pool larger than address space".into()))?;
        // SAFETY: an anonymous PROT_NONE reservation has no effect on existing memory; it only
        // finds a free virtual range large enough to hold a 2 MiB-aligned window of `ulen` bytes.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ulen + HUGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(Error::io(
                "reserve address space for the pool",
                std::io::Error::last_os_error(),
            ));
        }
        let aligned = ((reserve as usize + HUGE - 1) & !(HUGE - 1)) as *mut libc::c_void;
        let flags = if private {
            libc::MAP_PRIVATE
        } else {
            libc::MAP_SHARED
        };
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: `aligned..aligned+ulen` lies inside the reservation made above, which this
        // function owns, so MAP_FIXED replaces only our own PROT_NONE pages.
        let base = unsafe {
            libc::mmap(
                aligned,
                ulen,
                prot,
                flags | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            // SAFETY: unmapping our own reservation, which nothing else references.
            unsafe { libc::munmap(reserve, ulen + HUGE) };
            return Err(Error::io(format!("map pool {}", path.display()), err));
        }
        // Give back the unused head and tail of the reservation.
        let head = aligned as usize - reserve as usize;
        let tail = HUGE - head;
        // SAFETY: both ranges are parts of our reservation outside the pool mapping.
        unsafe {
            if head > 0 {
                libc::munmap(reserve, head);
            }
            if tail > 0 {
                libc::munmap((aligned as usize + ulen) as *mut libc::c_void, tail);
            }
        }
        let backing = crate::sys::backing(path, &file);
        let memory_backed =
            !private && matches!(backing, Backing::DeviceDax | Backing::Memory);
        let page_cache = !private && backing == Backing::PageCache;
        Ok(Pool {
            base: base as *mut u8,
            len,
            memory_backed,
            flush_kind: detect_flush(),
            counters: Counters::default(),
            path: path.to_path_buf(),
            private,
            file,
            observed: AtomicBool::new(false),
            observer: RwLock::new(None),
            wear: std::sync::OnceLock::new(),
            disk: page_cache.then(DiskSync::default),
            dax_file: backing == Backing::DaxFile,
            line_stores: !private && !page_cache && has_line_stores(),
        })
    }

    /// Before the first store of a writer to a DAX file: make its every block written and its
    /// own (`pool_file::settle_dax_file`), so no store faults in a block whose allocation is not
    /// durable yet. Nothing for other pools.
    pub(crate) fn settle_backing(&self) -> Result<()> {
        if !self.private && self.dax_file {
            settle_dax_file(&self.path, &self.file, self.len)?;
        }
        Ok(())
    }

    /// Count every store from now on in `wear` (a pool's counters are attached once).
    pub(crate) fn set_wear(&self, wear: Arc<WearCounters>) {
        let _ = self.wear.set(wear);
    }

    /// The per-block write counters, if attached.
    pub fn wear(&self) -> Option<&Arc<WearCounters>> {
        self.wear.get()
    }

    fn count_wear(&self, off: u64, len: u64) {
        if let Some(w) = self.wear.get() {
            w.count(off, len);
        }
    }

    /// Attach (or with `None` detach) the persistence observer of the crash explorer.
    pub(crate) fn set_observer(&self, obs: Option<Arc<dyn PersistObserver>>) {
        let mut slot = self.observer.write().unwrap_or_else(|e| e.into_inner());
        self.observed.store(obs.is_some(), Ordering::SeqCst);
        *slot = obs;
    }

    /// Run `f` on the attached observer, if any (one relaxed load when none is).
    #[inline]
    fn observe(&self, f: impl FnOnce(&dyn PersistObserver)) {
        if self.observed.load(Ordering::Relaxed) {
            let slot = self.observer.read().unwrap_or_else(|e| e.into_inner());
            if let Some(o) = slot.as_ref() {
                f(o.as_ref());
            }
        }
    }

    /// Usable length in bytes (the backing size rounded down to 4 KiB).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a pool has at least one block.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The backing path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when opened copy-on-write (nothing reaches the media).
    pub(crate) fn is_private(&self) -> bool {
        self.private
    }

    /// Whether [`Pool::populate`] is worth calling: a shared, writable mapping of memory, whose
    /// pages cost a fault on first touch (on a 4 KiB-page tmpfs, about 1.5 µs for every 4 KiB:
    /// more than the store that takes it) and no I/O to fault in ahead of use.
    pub(crate) fn prefault_useful(&self) -> bool {
        self.memory_backed
    }

    /// Fault the pages of `off..off+len` into this mapping, writable, without changing a byte
    /// (`MADV_POPULATE_WRITE`), so later stores there take no page fault.
    pub(crate) fn populate(&self, off: u64, len: u64) -> std::io::Result<()> {
        self.check(off, len)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let first = off & !4095;
        let n = (off + len).next_multiple_of(4096).min(self.len) - first;
        // SAFETY: the page-aligned range lies inside our own shared writable mapping (checked
        // above); MADV_POPULATE_WRITE only faults pages in, as a write fault would, and changes
        // no byte of them.
        let rc = unsafe {
            libc::madvise(self.base.add(ix(first)).cast(), ix(n), libc::MADV_POPULATE_WRITE)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The flush instruction in use.
    pub fn flush_kind(&self) -> FlushKind {
        self.flush_kind
    }

    /// The open pool file, for mapping its ranges into other address ranges (file mappings).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
    }

    /// Virtual address of the mapping (2 MiB aligned); for the mmap layer and tests.
    pub fn base_addr(&self) -> usize {
        self.base as usize
    }

    fn check(&self, off: u64, len: u64) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Corrupted(format!(
                "access to pool bytes {off}..{} beyond the pool end {}",
                off.saturating_add(len),
                self.len
            ))),
        }
    }

    /// [`Pool::check`] for a store, which a pool whose write to the disk failed refuses (see
    /// `disk_sync`: no store may reach the disk after one that was lost).
    fn check_store(&self, off: u64, len: u64) -> Result<()> {
        self.check_durable()?;
        self.check(off, len)
    }

    /// Copy `buf.len()` bytes at `off` out of the pool.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len() as u64)?;
        // SAFETY: the range was bounds-checked against the live mapping; `buf` is a distinct
        // Rust allocation, so source and destination cannot overlap.
        unsafe { copy_out(self.base.add(ix(off)), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Read a fixed-size array at `off`.
    pub fn read_array<const N: usize>(&self, off: u64) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.read(off, &mut b)?;
        Ok(b)
    }

    /// CRC32C of `len` pool bytes at `off`. The caller must own the range (hold the locks that
    /// keep other threads from writing it) for the result to mean anything.
    pub fn crc32c(&self, off: u64, len: u64) -> Result<u32> {
        self.check(off, len)?;
        // SAFETY: bounds-checked; the shared slice lives only for this call, and the caller's
        // locking keeps the range free of concurrent writers while it is read.
        let s = unsafe { std::slice::from_raw_parts(self.base.add(ix(off)), ix(len)) };
        Ok(crate::media::crc::crc32c(s))
    }

    /// Store `data` at `off` (not yet durable: flush and fence make it so).
    pub fn write(&self, off: u64, data: &[u8], cat: Category) -> Result<()> {
        self.check_store(off, data.len() as u64)?;
        // SAFETY: bounds-checked range of our writable mapping; `data` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(ix(off)), data.len()) };
        self.counters.bytes(cat, data.len() as u64);
        self.count_wear(off, data.len() as u64);
        self.observe(|o| o.stored(self, off, data.len() as u64));
        Ok(())
    }

    /// Fill `len` bytes at `off` with zeros (not yet durable).
    pub fn zero(&self, off: u64, len: u64, cat: Category) -> Result<()> {
        self.check_store(off, len)?;
        // SAFETY: bounds-checked range of our writable mapping.
        unsafe { std::ptr::write_bytes(self.base.add(ix(off)), 0, ix(len)) };
        self.counters.bytes(cat, len);
        self.count_wear(off, len);
        self.observe(|o| o.stored(self, off, len));
        Ok(())
    }

    /// Copy `len` bytes inside the pool from `src` to `dst` (ranges must not overlap).
    pub fn copy_within(&self, src: u64, dst: u64, len: u64, cat: Category) -> Result<()> {
        self.check(src, len)?;
        self.check_store(dst, len)?;
        if src < dst + len && dst < src + len {
            return Err(Error::Invalid(format!(
                "overlapping pool copy {src}->{dst} of {len} bytes"
            )));
        }
        // SAFETY: both ranges are bounds-checked and, as just verified, disjoint.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(ix(src)), self.base.add(ix(dst)), ix(len))
        };
        self.counters.bytes(cat, len);
        self.count_wear(dst, len);
        self.observe(|o| o.stored(self, dst, len));
        Ok(())
    }

    /// Write back every cache line overlapping `off..off+len` (ordered by the next `fence`).
    pub fn flush(&self, off: u64, len: u64, cat: Category) {
        if len == 0 || self.check(off, len).is_err() {
            return;
        }
        let first = off & !(CACHE_LINE - 1);
        let end = off + len;
        let lines = (end - first).div_ceil(CACHE_LINE);
        self.counters.lines(cat, lines);
        self.observe(|o| o.flushed(self, off, len));
        if self.private {
            return; // nothing reaches media in a private mapping
        }
        if let Some(disk) = &self.disk {
            disk.note(); // the next fence writes it to the disk; a write-back would reach DRAM
            return;
        }
        match self.flush_kind {
            #[cfg(target_arch = "x86_64")]
            FlushKind::Clwb | FlushKind::ClflushOpt | FlushKind::Clflush => {
                let mut line = first;
                while line < end {
                    // SAFETY: `line` lies within the mapping (bounds-checked above); the
                    // instructions only write back a cache line and have no other effect on memory.
                    unsafe {
                        let p = self.base.add(ix(line));
                        match self.flush_kind {
                            FlushKind::Clwb => {
                                std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                            }
                            FlushKind::ClflushOpt => {
                                std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                            }
                            _ => std::arch::x86_64::_mm_clflush(p),
                        }
                    }
                    line += CACHE_LINE;
                }
            }
            _ => {
                let page = first & !4095;
                // SAFETY: msync on a page range inside our mapping only schedules write-back.
                unsafe {
                    libc::msync(
                        self.base.add(ix(page)) as *mut _,
                        ix(end - page),
                        libc::MS_SYNC,
                    )
                };
            }
        }
    }

    /// Store fence: every flush issued before it is durable before any store after it.
    pub fn fence(&self) {
        self.counters.fence();
        self.observe(|o| o.fenced(self));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: sfence has no memory operands.
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(disk) = &self.disk {
            disk.fence(&self.file);
        }
    }

    /// Whether fences write the pool file to the disk (`fdatasync`): a file on a disk file
    /// system without DAX, whose mapping is the page cache.
    pub fn syncs_to_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Writes of the pool file to the disk since open (0 unless [`Pool::syncs_to_disk`]).
    pub fn disk_syncs(&self) -> u64 {
        self.disk.as_ref().map_or(0, DiskSync::syncs)
    }

    /// The error of the first write of the pool to the disk that failed: nothing stored since
    /// is known to be durable.
    pub fn disk_failure(&self) -> Option<std::io::Error> {
        self.disk.as_ref().and_then(DiskSync::failure)
    }

    /// Refuse to report success once a write of the pool to the disk has failed.
    pub(crate) fn check_durable(&self) -> Result<()> {
        match self.disk_failure() {
            Some(e) => Err(Error::io(
                format!("write the pool {} to the disk", self.path.display()),
                e,
            )),
            None => Ok(()),
        }
    }

    /// Store the 8-byte word `v` at `off` (a multiple of 8) with one atomic store, so a crash
    /// leaves the old word or the new one, never a mix; then write its line back (no fence).
    pub(crate) fn store_u64_flush(&self, off: u64, v: u64, cat: Category) -> Result<()> {
        self.store_u64(off, v, cat)?;
        self.flush(off, 8, cat);
        Ok(())
    }

    /// Store the 8-byte word `v` at `off` (a multiple of 8) with one atomic store and no
    /// write-back of its own: for a word that shares its cache line with a later store that is
    /// written back (stores to one line reach media in program order, so the later one is
    /// never durable without it).
    pub(crate) fn store_u64(&self, off: u64, v: u64, cat: Category) -> Result<()> {
        self.check_store(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(Error::Invalid(format!("unaligned atomic store at pool offset {off}")));
        }
        // SAFETY: bounds-checked, 8-byte aligned (the mapping is page aligned) and inside our
        // writable mapping; every access to this word goes through atomics or plain copies
        // made while the caller holds the locks that own it.
        let word = unsafe { &*(self.base.add(ix(off)) as *const std::sync::atomic::AtomicU64) };
        word.store(v.to_le(), Ordering::Release);
        self.counters.bytes(cat, 8);
        self.count_wear(off, 8);
        self.observe(|o| o.stored(self, off, 8));
        Ok(())
    }

    /// Store then flush (no fence). Large stores bypass the cache (see `persist_from`).
    pub(crate) fn write_flush(&self, off: u64, data: &[u8], cat: Category) -> Result<()> {
        self.check_store(off, data.len() as u64)?;
        self.persist_from(off, PersistSrc::Bytes(data), cat);
        Ok(())
    }

    /// Store whole cache lines (`off` and the length multiples of 64), durable after the next
    /// fence, for records that recovery takes as written whole or not at all (journal entries:
    /// a line torn by a killed process would read as damage). Where the processor has AVX-512,
    /// each line is one non-temporal 64-byte store: no write-back for the fence to wait for (a
    /// fence after one line took about 100 ns instead of 165 on the AMD host, docs/BENCHMARKS.md,
    /// "Journal lines stored non-temporally"). Elsewhere eight-byte stores in an order that
    /// leaves a line a kill or power failure cuts short with a zero check word (its last eight
    /// bytes: `pool_copy::line_store_order`), then a write-back; never the 16-byte
    /// non-temporal stores of [`Pool::write_flush`], which a kill can leave half done.
    pub(crate) fn write_lines_flush(&self, off: u64, data: &[u8], cat: Category) -> Result<()> {
        let len = data.len() as u64;
        if !off.is_multiple_of(CACHE_LINE) || !len.is_multiple_of(CACHE_LINE) {
            return Err(Error::Invalid(format!(
                "a store of whole lines at pool offset {off}, {len} bytes, is not whole lines"
            )));
        }
        if !self.line_stores {
            self.check_store(off, len)?;
            self.count_wear(off, len);
            self.counters.bytes(cat, len);
            // SAFETY: `off..off + len` was bounds-checked, is inside our writable mapping and
            // 64-byte aligned (the mapping is page aligned); `data` is a separate slice.
            unsafe { store_lines_in_order(self.base.add(ix(off)), data) };
            self.observe(|o| o.stored(self, off, len));
            self.flush(off, len, cat);
            return Ok(());
        }
        self.check_store(off, len)?;
        self.count_wear(off, len);
        self.counters.bytes(cat, len);
        self.counters.lines(cat, len / CACHE_LINE);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `line_stores` is set only where the processor has AVX-512F; `off..off + len`
        // was bounds-checked, is inside our writable shared mapping and 64-byte aligned (the
        // mapping is page aligned), and `data` is a separate slice of exactly `len` bytes.
        unsafe {
            stream_lines(self.base.add(ix(off)), data)
        };
        self.observe(|o| {
            o.stored(self, off, len);
            o.flushed(self, off, len);
        });
        Ok(())
    }

    /// [`Pool::write_flush`] without counting wear (the wear counters' own save).
    pub(crate) fn write_flush_uncounted(&self, off: u64, data: &[u8], cat: Category) -> Result<()> {
        self.check_store(off, data.len() as u64)?;
        if !data.is_empty() {
            self.persist_uncounted(off, PersistSrc::Bytes(data), cat);
        }
        Ok(())
    }

    /// Copy inside the pool so that the destination is durable after the next fence.
    pub(crate) fn copy_flush(&self, src: u64, dst: u64, len: u64, cat: Category) -> Result<()> {
        self.check(src, len)?;
        self.check_store(dst, len)?;
        if src < dst + len && dst < src + len {
            return Err(Error::Invalid(format!(
                "overlapping pool copy {src}->{dst} of {len} bytes"
            )));
        }
        self.persist_from(dst, PersistSrc::Pool(src, len), cat);
        Ok(())
    }

    /// Zero a range so that it is durable after the next fence.
    pub(crate) fn zero_flush(&self, off: u64, len: u64, cat: Category) -> Result<()> {
        self.check_store(off, len)?;
        self.persist_from(off, PersistSrc::Zero(len), cat);
        Ok(())
    }

    /// Store bytes at `off` (already bounds-checked) so that they are durable after the next
    /// fence: whole cache lines with non-temporal stores, which go straight to memory (on this
    /// class of machine a 4 KiB copy plus write-back costs twice as much through the cache),
    /// partial lines with ordinary stores and a write-back.
    fn persist_from(&self, off: u64, src: PersistSrc<'_>, cat: Category) {
        let len = src.len();
        if len == 0 {
            return;
        }
        self.count_wear(off, len);
        self.persist_uncounted(off, src, cat);
    }

    /// [`Pool::persist_from`] without counting wear.
    fn persist_uncounted(&self, off: u64, src: PersistSrc<'_>, cat: Category) {
        let len = src.len();
        self.persist_stores(off, src, cat);
        // The whole range is stored, then written back (non-temporal lines count as written
        // back: they too are durable at the next fence).
        self.observe(|o| {
            o.stored(self, off, len);
            o.flushed(self, off, len);
        });
    }

    fn persist_stores(&self, off: u64, src: PersistSrc<'_>, cat: Category) {
        let len = src.len();
        self.counters.bytes(cat, len);
        let end = off + len;
        let a = off.next_multiple_of(CACHE_LINE).min(end);
        let b = (end & !(CACHE_LINE - 1)).max(a);
        // Non-temporal stores bypass `flush`, which a disk-backed pool's fences count on.
        let nt = cfg!(target_arch = "x86_64")
            && !self.private
            && self.disk.is_none()
            && b > a
            && len >= 256;
        if !nt {
            src.copy_to(self.base, off, 0, len);
            self.flush_uncounted(off, len, cat);
            return;
        }
        // Head and tail partial lines through the cache.
        if a > off {
            src.copy_to(self.base, off, 0, a - off);
            self.flush_uncounted(off, a - off, cat);
        }
        if end > b {
            src.copy_to(self.base, b, b - off, end - b);
            self.flush_uncounted(b, end - b, cat);
        }
        self.counters.lines(cat, (b - a) / CACHE_LINE);
        #[cfg(target_arch = "x86_64")]
        {
            // Where the processor has them, one 64-byte store per line: 15-20% faster than
            // four 16-byte ones for 4-32 KiB on the Intel host (docs/BENCHMARKS.md, "Metadata
            // paths on a diet").
            if self.line_stores {
                // SAFETY: `line_stores` is set only where the processor has AVX-512F; `a..b`
                // lies inside the checked range and is 64-byte aligned; the source is a
                // checked pool range or a slice of at least `len` bytes (see `PersistSrc`).
                unsafe { stream_src_lines(self.base, a, b, off, src) };
                return;
            }
            use std::arch::x86_64::{
                __m128i, _mm_loadu_si128, _mm_setzero_si128, _mm_stream_si128,
            };
            let mut o = a;
            while o < b {
                // SAFETY: `a..b` lies inside the checked range and is 64-byte aligned, so each
                // 16-byte non-temporal store is aligned and inside the mapping; the source is a
                // checked pool range or a slice of at least `len` bytes (see `PersistSrc`).
                unsafe {
                    let d = self.base.add(ix(o)) as *mut __m128i;
                    for k in 0..4 {
                        let v = match src {
                            PersistSrc::Zero(_) => _mm_setzero_si128(),
                            PersistSrc::Bytes(s) => _mm_loadu_si128(
                                s.as_ptr().add(ix(o - off) + 16 * k) as *const __m128i,
                            ),
                            PersistSrc::Pool(so, _) => _mm_loadu_si128(
                                self.base.add(ix(so + o - off) + 16 * k) as *const __m128i,
                            ),
                        };
                        _mm_stream_si128(d.add(k), v);
                    }
                }
                o += CACHE_LINE;
            }
        }
    }

    fn flush_uncounted(&self, off: u64, len: u64, cat: Category) {
        self.flush(off, len, cat);
    }

    /// Counters since open.
    pub fn stats(&self) -> PersistStats {
        self.counters.stats()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `map`; no references into it exist.
        unsafe { libc::munmap(self.base as *mut libc::c_void, ix(self.len)) };
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
