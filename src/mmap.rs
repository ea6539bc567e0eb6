//! Memory-mapped files: pool extents placed side by side in the caller's address space, so that
//! every 2 MiB logical unit backed by an aligned 2 MiB extent is mapped with one PMD (hugepage).
//!
//! A mapping is one address range, congruent to its file offset modulo 2 MiB. Each page of it
//! is in one of three states, kept in step with the file under the inode lock:
//!
//! * **installed**: a shared `MAP_FIXED` mapping of the pool file at the block's pool offset;
//!   loads and stores go straight to the pool, with no winefs code on the path;
//! * **missing** (inside the file size, not installed): private anonymous memory registered with
//!   the fault service's userfaultfd. The first touch blocks the thread; a worker allocates the
//!   whole 2 MiB unit (an aligned extent when the unit is empty), zeroes it, commits it, installs
//!   it and wakes the thread. Sparse files (ftruncate, then touch) get hugepages this way;
//! * **beyond EOF**: anonymous memory registered with a second userfaultfd made with
//!   `UFFD_FEATURE_SIGBUS`, so a touch raises SIGBUS as POSIX asks.
//!
//! Ranges are switched between states with `mremap` of a freshly registered scratch range over
//! them, which replaces the old pages atomically (a thread never sees the range unmapped).
//! Operations that move a mapped file's blocks (truncate, punch hole, rewrite) first turn the
//! affected pages missing, so no store can land in a block after it is freed; strict-mode
//! writes to a mapped file are journaled in place rather than copied on write for the same
//! reason. See docs/DESIGN.md, "Memory mappings".

use crate::error::{Error, Result};
use crate::file::File;
use crate::fs::{Fs, Inner, Node, wlock};
use crate::layout::{BLOCK_SIZE, FileKind};
use crate::pool::Category;
use crate::vm::{self, HUGE, PAGE, Uffd, UffdEvent, Wakeup};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};

pub use crate::vm::{page_faults, thread_page_faults};

/// Blocks per 2 MiB unit.
const UNIT_BLOCKS: u64 = (HUGE as u64) / BLOCK_SIZE;
/// Threads serving page faults (faults on different files are served in parallel).
const FAULT_WORKERS: usize = 2;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The address-space side of one mapping.
pub(crate) struct MapState {
    ino: u64,
    /// Address of file offset `off`.
    base: usize,
    /// File offset of `base` (page-aligned).
    off: u64,
    /// Length in bytes (whole pages).
    len: usize,
    /// Atomic mapping: pages are copy-on-write views of the pool, written back by `msync`
    /// in one journal transaction.
    atomic: bool,
    va: Mutex<VaState>,
    /// Fault workers currently serving this mapping; teardown waits for zero, so no worker
    /// still holds the mount (or touches the range) once the mapping is gone.
    in_flight: AtomicUsize,
}

/// A worker's claim on a mapping while it serves one of its faults.
struct InFlight(Arc<MapState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

struct VaState {
    /// 2 MiB units whose pages inside the file size (and the mapping) are all installed.
    installed: BTreeSet<u64>,
    /// The mapping is being torn down: install nothing more.
    dead: bool,
}

impl MapState {
    fn first_block(&self) -> u64 {
        self.off / BLOCK_SIZE
    }
    fn end_block(&self) -> u64 {
        self.first_block() + (self.len / PAGE) as u64
    }
    fn va_of_block(&self, b: u64) -> usize {
        self.base + ((b - self.first_block()) as usize) * PAGE
    }
    /// Blocks of `unit` inside both the mapping and the first `eof_blocks` blocks of the file.
    fn unit_valid(&self, unit: u64, eof_blocks: u64) -> (u64, u64) {
        let a = (unit * UNIT_BLOCKS).max(self.first_block());
        let b = ((unit + 1) * UNIT_BLOCKS)
            .min(self.end_block())
            .min(eof_blocks);
        (a, b.max(a))
    }
    /// The address range of `unit` inside the mapping.
    fn unit_va(&self, unit: u64) -> (usize, usize) {
        let a = (unit * UNIT_BLOCKS).max(self.first_block());
        let b = ((unit + 1) * UNIT_BLOCKS).min(self.end_block());
        (self.va_of_block(a), (b - a) as usize * PAGE)
    }
    /// Clip blocks [a, b) to the mapping.
    fn clip(&self, a: u64, b: u64) -> Option<(u64, u64)> {
        let a = a.max(self.first_block());
        let b = b.min(self.end_block());
        (a < b).then_some((a, b))
    }
}

/// What the fault workers share with the service.
struct Shared {
    main: Uffd,
    sigbus: Uffd,
    /// Mapping start address → (length, state), to find the mapping of a faulting address.
    regions: Mutex<BTreeMap<usize, (usize, Weak<MapState>)>>,
}

impl Shared {
    fn lookup(&self, addr: usize) -> Option<InFlight> {
        let r = lock(&self.regions);
        let (&start, (len, st)) = r.range(..=addr).next_back()?;
        let st = (addr < start + len).then(|| st.upgrade()).flatten()?;
        // Counted under the regions lock: teardown removes the region under it first.
        st.in_flight.fetch_add(1, Ordering::Acquire);
        Some(InFlight(st))
    }

    /// Turn blocks [a, b) of a mapping missing (`sigbus` false) or beyond-EOF (`sigbus` true),
    /// atomically replacing whatever pages were there.
    fn replace(&self, st: &MapState, a: u64, b: u64, sigbus: bool) -> Result<()> {
        let Some((a, b)) = st.clip(a, b) else {
            return Ok(());
        };
        let len = (b - a) as usize * PAGE;
        let uffd = if sigbus { &self.sigbus } else { &self.main };
        let scratch = vm::registered_scratch(uffd, len)?;
        vm::move_over(scratch, len, st.va_of_block(a))?;
        // A unit cut off at EOF keeps its valid pages installed (the caller drops units left
        // with none); pages made missing leave their units not fully installed.
        if !sigbus {
            let mut va = lock(&st.va);
            for unit in a / UNIT_BLOCKS..b.div_ceil(UNIT_BLOCKS) {
                va.installed.remove(&unit);
            }
        }
        Ok(())
    }
}

/// The page-fault service of one mount: a reader thread that drains the userfaultfds and
/// workers that serve faults. Dropping it (with the mount) stops the threads.
pub(crate) struct FaultService {
    shared: Arc<Shared>,
    stop: Arc<Wakeup>,
}

impl Drop for FaultService {
    fn drop(&mut self) {
        self.stop.signal();
    }
}

impl FaultService {
    fn start(inner: Weak<Inner>) -> Result<FaultService> {
        let shared = Arc::new(Shared {
            main: Uffd::new(false)?,
            sigbus: Uffd::new(true)?,
            regions: Mutex::new(BTreeMap::new()),
        });
        if shared.main.user_mode_only {
            eprintln!(
                "winefs: userfaultfd is limited to user-mode faults here (vm.unprivileged_userfaultfd=0 \
                 and no CAP_SYS_PTRACE): a system call that reads or writes an untouched page of a \
                 sparse mapping fails with EFAULT; touch or fallocate such ranges first"
            );
        }
        let stop = Arc::new(Wakeup::new()?);
        let (tx, rx) = mpsc::channel::<(usize, u32)>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..FAULT_WORKERS {
            let (shared, rx, inner) = (shared.clone(), rx.clone(), inner.clone());
            std::thread::Builder::new()
                .name(format!("winefs-fault-{i}"))
                .spawn(move || {
                    loop {
                        let next = lock(&rx).recv();
                        let Ok((addr, tid)) = next else { break };
                        serve_fault(&inner, &shared, addr, tid);
                    }
                })
                .map_err(|e| Error::io("start a page-fault worker", e))?;
        }
        let (sh, st) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("winefs-uffd".into())
            .spawn(move || read_events(&sh, &st, tx))
            .map_err(|e| Error::io("start the userfaultfd reader", e))?;
        Ok(FaultService { shared, stop })
    }
}

/// Drain both userfaultfds until stopped. Never blocks on anything but `poll`, because
/// `mremap` over a registered range waits until its remap event has been read here.
fn read_events(sh: &Shared, stop: &Wakeup, tx: mpsc::Sender<(usize, u32)>) {
    loop {
        let ready = vm::poll_readable(&[sh.main.raw_fd(), sh.sigbus.raw_fd(), stop.raw_fd()], -1);
        if ready[2] {
            return;
        }
        for (i, uffd) in [&sh.main, &sh.sigbus].into_iter().enumerate() {
            if !ready[i] {
                continue;
            }
            loop {
                match uffd.read_event() {
                    Ok(Some(UffdEvent::PageFault { addr, tid, .. })) => {
                        let _ = tx.send((addr, tid));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("winefs: page-fault service stopped: {e}");
                        return;
                    }
                }
            }
        }
    }
}

/// Serve a missing-page fault at `addr`: allocate and install its 2 MiB unit, then wake.
fn serve_fault(inner: &Weak<Inner>, sh: &Shared, addr: usize, tid: u32) {
    let Some(claim) = sh.lookup(addr) else {
        // The mapping is gone; the thread retries and meets whatever is there now.
        sh.main.wake(addr & !(PAGE - 1), PAGE);
        return;
    };
    let st = &claim.0;
    let block = st.first_block() + ((addr - st.base) / PAGE) as u64;
    let unit = block / UNIT_BLOCKS;
    // The live mapping holds the mount, so this upgrade succeeds; it is dropped before the
    // claim, so the mount never outlives its last mapping and handle because of a worker.
    let served = match inner.upgrade() {
        Some(inner) => fault_in_unit(&inner, st, unit),
        None => Ok(()),
    };
    if let Err(e) = served {
        eprintln!(
            "winefs: cannot serve a page fault of inode {} at file offset {}: {e}; sending SIGBUS",
            st.ino,
            block * BLOCK_SIZE
        );
        vm::sigbus_thread(tid);
    }
    let (va, len) = st.unit_va(unit);
    sh.main.wake(va, len);
}

fn fault_in_unit(inner: &Inner, st: &MapState, unit: u64) -> Result<()> {
    let n = inner.node(st.ino)?;
    let mut g = wlock(&n);
    {
        let va = lock(&st.va);
        if va.dead || va.installed.contains(&unit) {
            return Ok(());
        }
    }
    let eof_blocks = g.hdr.size.div_ceil(BLOCK_SIZE);
    let (a, b) = st.unit_valid(unit, eof_blocks);
    if a >= b {
        return Ok(()); // beyond EOF by now: the range is a SIGBUS range
    }
    inner.check_alive()?;
    let (u0, u1) = (unit * UNIT_BLOCKS, (unit + 1) * UNIT_BLOCKS);
    // An empty unit inside the file gets a whole aligned extent; a partly backed unit, or the
    // last unit of a file that ends inside it, only fills its holes inside the file (a small
    // mapped file does not take 2 MiB).
    let fill_end = if g.map.segments(u0, u1).is_empty() && u1 <= eof_blocks {
        u1
    } else {
        u1.min(eof_blocks)
    };
    crate::file::fill_gaps(inner, &mut g, u0, fill_end)?;
    install(inner, &g, st, a, b)?;
    lock(&st.va).installed.insert(unit);
    Ok(())
}

/// Map the backed blocks of [a, b) (inside the mapping and the file) at their addresses,
/// merging physically contiguous runs into one mapping. Returns whether [a, b) had no holes.
fn install(inner: &Inner, g: &Node, st: &MapState, a: u64, b: u64) -> Result<bool> {
    let fd = inner.pool.raw_fd();
    let mut covered = 0;
    let mut run: Option<(u64, u64, u64)> = None; // (logical, phys, len)
    let flush = |r: (u64, u64, u64)| {
        vm::map_pool_fixed(
            st.va_of_block(r.0),
            r.2 as usize * PAGE,
            fd,
            r.1 * BLOCK_SIZE,
            st.atomic,
        )
    };
    for (l, p, len) in g.map.segments(a, b) {
        covered += len;
        run = match run {
            Some(r) if r.0 + r.2 == l && r.1 + r.2 == p => Some((r.0, r.1, r.2 + len)),
            Some(r) => {
                flush(r)?;
                Some((l, p, len))
            }
            None => Some((l, p, len)),
        };
    }
    if let Some(r) = run {
        flush(r)?;
    }
    Ok(covered == b - a)
}

/// The mount's fault service, started on first use.
fn service(fs: &Fs) -> Result<Arc<FaultService>> {
    let mut s = lock(&fs.inner.faults);
    if let Some(svc) = s.as_ref() {
        return Ok(svc.clone());
    }
    let svc = Arc::new(FaultService::start(Arc::downgrade(&fs.inner))?);
    *s = Some(svc.clone());
    Ok(svc)
}

fn shared_of(inner: &Inner) -> Option<Arc<Shared>> {
    lock(&inner.faults).as_ref().map(|s| s.shared.clone())
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
    pub(crate) fn new(file: File, off: u64, len: usize, atomic: bool) -> Result<Mapping> {
        let fs = file.fs().clone();
        if atomic && fs.inner.mode != crate::fs::Mode::Strict {
            return Err(Error::Invalid(
                "atomic mappings need a strict-mode mount".into(),
            ));
        }
        if fs.inner.pool.is_private() {
            return Err(Error::NoDevice(
                "a read-only (private) pool mount cannot be memory-mapped".into(),
            ));
        }
        if len == 0 {
            return Err(Error::Invalid("mapping length must be positive".into()));
        }
        if !off.is_multiple_of(PAGE as u64) {
            return Err(Error::Invalid(format!(
                "mapping offset {off} is not a multiple of the page size {PAGE}"
            )));
        }
        let len = len
            .checked_next_multiple_of(PAGE)
            .filter(|&l| {
                off.checked_add(l as u64)
                    .is_some_and(|e| e <= crate::file::MAX_FILE_SIZE)
            })
            .ok_or(Error::FileTooBig)?;
        let svc = service(&fs)?;
        let sh = &svc.shared;
        let inner = &fs.inner;
        inner.check_alive()?;
        let n = inner.node(file.ino())?;
        let mut g = wlock(&n);
        match g.kind() {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::IsDir),
            _ => return Err(Error::NoDevice("only regular files can be mapped".into())),
        }
        let base = vm::reserve(len, (off % HUGE as u64) as usize)?;
        let st = Arc::new(MapState {
            ino: file.ino(),
            base,
            off,
            len,
            atomic,
            va: Mutex::new(VaState {
                installed: BTreeSet::new(),
                dead: false,
            }),
            in_flight: AtomicUsize::new(0),
        });
        let eof_blocks = g.hdr.size.div_ceil(BLOCK_SIZE);
        let built = (|| -> Result<()> {
            let valid_end = eof_blocks.clamp(st.first_block(), st.end_block());
            let split = st.va_of_block(valid_end);
            if split > base {
                sh.main.register(base, split - base)?;
            }
            if base + len > split {
                sh.sigbus.register(split, base + len - split)?;
            }
            install(inner, &g, &st, st.first_block(), valid_end)?;
            // Units with no holes inside the file are fully installed.
            let mut units: Vec<u64> = g
                .map
                .segments(st.first_block(), valid_end)
                .iter()
                .flat_map(|&(l, _, n)| l / UNIT_BLOCKS..(l + n).div_ceil(UNIT_BLOCKS))
                .collect();
            units.dedup();
            let mut va = lock(&st.va);
            for u in units {
                let (a, b) = st.unit_valid(u, eof_blocks);
                let backed: u64 = g.map.segments(a, b).iter().map(|s| s.2).sum();
                if backed == b - a {
                    va.installed.insert(u);
                }
            }
            Ok(())
        })();
        if let Err(e) = built {
            vm::unmap(base, len);
            return Err(e);
        }
        lock(&sh.regions).insert(base, (len, Arc::downgrade(&st)));
        g.maps.push(st.clone());
        // A file mapped while fragmented is queued for a rewrite onto aligned extents.
        let fragmented = g
            .map
            .segments(st.first_block(), st.end_block())
            .iter()
            .flat_map(|&(l, _, n)| l / UNIT_BLOCKS..(l + n).div_ceil(UNIT_BLOCKS))
            .any(|u| crate::file::unit_fragmented(&g, u));
        drop(g);
        if fragmented {
            crate::rewrite::queue(&fs.inner, file.ino());
        }
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
        let end = at
            .checked_add(n)
            .filter(|&e| e <= self.st.len)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "range {at}+{n} is outside the {}-byte mapping",
                    self.st.len
                ))
            })?;
        let size = self.file.metadata()?.size;
        if n > 0 && self.st.off + end as u64 > size {
            return Err(Error::NoSuchOffset);
        }
        Ok(())
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
        if at.checked_add(data.len()).is_none_or(|e| e > self.st.len) {
            return Err(Error::Invalid(format!(
                "range {at}+{} is outside the {}-byte mapping",
                data.len(),
                self.st.len
            )));
        }
        vm::copy_in(self.st.base + at, data);
        Ok(())
    }

    /// Load like a plain memcpy from the mapping (the counterpart of [`Mapping::store`]).
    pub fn load(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        if at.checked_add(buf.len()).is_none_or(|e| e > self.st.len) {
            return Err(Error::Invalid(format!(
                "range {at}+{} is outside the {}-byte mapping",
                buf.len(),
                self.st.len
            )));
        }
        vm::copy_out(self.st.base + at, buf);
        Ok(())
    }

    /// Load the 8 bytes at byte `at` of the mapping (native endian), like a plain load.
    #[inline]
    pub fn load_u64(&self, at: usize) -> Result<u64> {
        if at.checked_add(8).is_none_or(|e| e > self.st.len) {
            return Err(Error::Invalid(format!(
                "range {at}+8 is outside the {}-byte mapping",
                self.st.len
            )));
        }
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
        let end = at
            .checked_add(len)
            .filter(|&e| e <= self.st.len)
            .ok_or_else(|| {
                Error::Invalid(format!("msync range {at}+{len} is outside the mapping"))
            })?;
        let fs = self.file.fs();
        let inner = &fs.inner;
        inner.check_alive()?;
        let n = inner.node(self.st.ino)?;
        let a = self.st.first_block() + (at / PAGE) as u64;
        let b = self.st.first_block() + end.div_ceil(PAGE) as u64;
        if !self.st.atomic {
            let g = crate::fs::rlock(&n);
            flush_blocks(inner, &g, a, b);
            return Ok(g.map.segments(a, b).iter().map(|s| s.2 * BLOCK_SIZE).sum());
        }
        // The inode lock keeps the block map (and the pages' pool offsets) still.
        let g = wlock(&n);
        let dirty = private_pages(&self.st, a, b)?;
        // Runs of dirty blocks that are contiguous in the file and in the pool.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for blk in dirty {
            let Some((phys, _)) = g.map.lookup(blk) else {
                continue; // cannot happen: only installed (backed) pages are copied on write
            };
            match runs.last_mut() {
                Some(r) if r.0 + r.2 == blk && r.1 + r.2 == phys => r.2 += 1,
                _ => runs.push((blk, phys, 1)),
            }
        }
        let bytes: u64 = runs.iter().map(|r| r.2 * BLOCK_SIZE).sum();
        let cap = inner.journals.staging_capacity();
        if bytes > cap || runs.len() + 2 > inner.journals.entry_capacity() {
            return Err(Error::NoSpace(format!(
                "an atomic msync of {bytes} dirty bytes in {} runs exceeds one journal \
                 transaction ({cap} bytes of undo staging); msync smaller ranges more often",
                runs.len()
            )));
        }
        let mut tx = crate::journal::Tx::new();
        for &(blk, phys, nb) in &runs {
            let mut data = vec![0u8; (nb * BLOCK_SIZE) as usize];
            vm::copy_out(self.st.va_of_block(blk), &mut data);
            tx.write(phys * BLOCK_SIZE, data, Category::Data);
        }
        if !tx.is_empty() {
            inner.commit(tx)?;
        }
        // Start tracking afresh: the written-back pages become clean views of the pool again.
        let fd = inner.pool.raw_fd();
        for &(blk, phys, nb) in &runs {
            vm::map_pool_fixed(
                self.st.va_of_block(blk),
                nb as usize * PAGE,
                fd,
                phys * BLOCK_SIZE,
                true,
            )?;
        }
        drop(g);
        Ok(bytes)
    }

    /// Bytes of this mapping the kernel maps with 2 MiB page-table entries right now (from
    /// `/proc/self/smaps`; a page counts once it has been touched).
    pub fn pmd_mapped_bytes(&self) -> Result<u64> {
        pmd_mapped_bytes(self.st.base, self.st.len)
    }
}

/// Blocks in [a, b) whose pages in an atomic mapping hold private copies (written since they
/// were installed). From `/proc/self/pagemap`: a present page (bit 63) that is not a file page
/// (bit 61) is the copy-on-write copy of a store. The copy-on-write fault the kernel takes on
/// the first store to a page is the tracking, so stores cost nothing extra and nothing
/// process-wide (like soft-dirty's clear_refs) is touched.
fn private_pages(st: &MapState, a: u64, b: u64) -> Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let Some((a, b)) = st.clip(a, b) else {
        return Ok(Vec::new());
    };
    let pm = std::fs::File::open("/proc/self/pagemap")
        .map_err(|e| Error::io("open /proc/self/pagemap", e))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    let mut blk = a;
    while blk < b {
        let n = ((b - blk) as usize).min(4096);
        let vpn = st.va_of_block(blk) / PAGE;
        pm.read_exact_at(&mut buf[..n * 8], vpn as u64 * 8)
            .map_err(|e| Error::io("read /proc/self/pagemap", e))?;
        for (i, e) in buf[..n * 8].chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
            if e & (1 << 63) != 0 && e & (1 << 61) == 0 {
                out.push(blk + i as u64);
            }
        }
        blk += n as u64;
    }
    Ok(out)
}

/// Write back the cache lines of the backed blocks of [a, b) and fence.
fn flush_blocks(inner: &Inner, g: &Node, a: u64, b: u64) {
    for (_, p, n) in g.map.segments(a, b) {
        inner
            .pool
            .flush(p * BLOCK_SIZE, n * BLOCK_SIZE, Category::Data);
    }
    inner.pool.fence();
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let inner = &self.file.fs().inner;
        if let Ok(node) = inner.node(self.st.ino) {
            // Under the inode lock: a worker that takes it later sees `dead` and installs
            // nothing; one holding it now finishes first.
            let mut g = wlock(&node);
            lock(&self.st.va).dead = true;
            g.maps.retain(|m| !Arc::ptr_eq(m, &self.st));
        } else {
            lock(&self.st.va).dead = true;
        }
        let sh = shared_of(inner);
        if let Some(sh) = &sh {
            lock(&sh.regions).remove(&self.st.base);
        }
        // No new worker can find the mapping now; wait out those already serving it, so the
        // range is not released (and perhaps reused) under them.
        while self.st.in_flight.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
        vm::unmap(self.st.base, self.st.len);
        if let Some(sh) = &sh {
            // Threads still blocked on a fault here retry and find the range unmapped.
            sh.main.wake(self.st.base, self.st.len);
        }
    }
}

// ---- hooks called by the data path with the inode lock held ----

/// Before a file shrinks to `new_size`: pages past the new end turn SIGBUS pages, before the
/// blocks behind them are freed.
pub(crate) fn before_shrink(inner: &Inner, g: &Node, new_size: u64) -> Result<()> {
    if g.maps.is_empty() {
        return Ok(());
    }
    let Some(sh) = shared_of(inner) else {
        return Ok(());
    };
    let (a, b) = (
        new_size.div_ceil(BLOCK_SIZE),
        g.hdr.size.div_ceil(BLOCK_SIZE),
    );
    for st in &g.maps {
        sh.replace(st, a, b, true)?;
        let mut va = lock(&st.va);
        // Units wholly past the new end hold no valid pages any more.
        let first_gone = a.div_ceil(UNIT_BLOCKS);
        let gone: Vec<u64> = va.installed.range(first_gone..).copied().collect();
        for u in gone {
            va.installed.remove(&u);
        }
    }
    Ok(())
}

/// Before a file grows from its current size: the bytes past the old end in its last block
/// are zeroed (a store through a mapping may have put something there, and the file system
/// promises zeros past EOF). Needs no journal: zeros past EOF are always consistent.
pub(crate) fn before_grow(inner: &Inner, g: &Node) -> Result<()> {
    if g.maps.is_empty() || g.hdr.size.is_multiple_of(BLOCK_SIZE) {
        return Ok(());
    }
    if let Some((phys, _)) = g.map.lookup(g.hdr.size / BLOCK_SIZE) {
        let inblk = g.hdr.size % BLOCK_SIZE;
        inner.pool.zero_flush(
            phys * BLOCK_SIZE + inblk,
            BLOCK_SIZE - inblk,
            Category::Data,
        )?;
        inner.pool.fence();
    }
    Ok(())
}

/// After a file grew from `old_size`: the new pages stop being SIGBUS pages and become
/// missing pages (installed on first touch).
pub(crate) fn after_grow(inner: &Inner, g: &Node, old_size: u64) -> Result<()> {
    if g.maps.is_empty() {
        return Ok(());
    }
    let Some(sh) = shared_of(inner) else {
        return Ok(());
    };
    let (a, b) = (
        old_size.div_ceil(BLOCK_SIZE),
        g.hdr.size.div_ceil(BLOCK_SIZE),
    );
    if a >= b {
        return Ok(());
    }
    for st in &g.maps {
        sh.replace(st, a, b, false)?;
    }
    Ok(())
}

/// Before blocks [a, b) of the file are unmapped or moved (punch hole, rewrite): their pages
/// turn missing, so no store reaches a block after it has left the file.
pub(crate) fn before_move(inner: &Inner, g: &Node, a: u64, b: u64) -> Result<()> {
    if g.maps.is_empty() {
        return Ok(());
    }
    let Some(sh) = shared_of(inner) else {
        return Ok(());
    };
    let b = b.min(g.hdr.size.div_ceil(BLOCK_SIZE));
    if a >= b {
        return Ok(());
    }
    for st in &g.maps {
        sh.replace(st, a, b, false)?;
    }
    Ok(())
}

/// Whether the file has an atomic mapping (whose private, not yet msynced pages a move of
/// its blocks would discard).
pub(crate) fn has_atomic(g: &Node) -> bool {
    g.maps.iter().any(|m| m.atomic)
}

/// Write back every installed page of every plain mapping of the file (fsync of a mapped
/// file; atomic mappings reach the file only through their own msync).
pub(crate) fn flush_mapped(inner: &Inner, g: &Node) {
    for st in g.maps.iter().filter(|m| !m.atomic) {
        flush_blocks(inner, g, st.first_block(), st.end_block());
    }
}

/// Sum of `FilePmdMapped` and `ShmemPmdMapped` over the VMAs inside [addr, addr+len).
pub fn pmd_mapped_bytes(addr: usize, len: usize) -> Result<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .map_err(|e| Error::io("read /proc/self/smaps", e))?;
    let mut inside = false;
    let mut kb = 0u64;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = head.split_once('-')
            && let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
        {
            inside = s < addr + len && e > addr;
            continue;
        }
        if inside && (head == "FilePmdMapped:" || head == "ShmemPmdMapped:") {
            kb += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(off: u64, len: usize) -> MapState {
        MapState {
            ino: 2,
            base: 0x4000_0000 + (off % HUGE as u64) as usize,
            off,
            len,
            atomic: false,
            va: Mutex::new(VaState {
                installed: BTreeSet::new(),
                dead: false,
            }),
            in_flight: AtomicUsize::new(0),
        }
    }

    #[test]
    fn unit_geometry_clips_to_mapping_and_eof() {
        // Mapping file bytes [12 KiB, 12 KiB + 5 MiB): blocks 3..1283.
        let st = state(3 * 4096, 5 << 20);
        assert_eq!((st.first_block(), st.end_block()), (3, 1283));
        // Unit 0 starts before the mapping; unit 2 ends after it; EOF cuts unit 1.
        assert_eq!(st.unit_valid(0, 10_000), (3, 512));
        assert_eq!(st.unit_valid(1, 700), (512, 700));
        assert_eq!(st.unit_valid(2, 10_000), (1024, 1283));
        assert_eq!(st.unit_valid(2, 900), (1024, 1024), "past EOF: empty");
        // Addresses: file unit boundaries fall on 2 MiB-aligned addresses.
        assert_eq!(st.va_of_block(512) % HUGE, 0);
        assert_eq!(st.unit_va(0), (st.base, 509 * PAGE));
        assert_eq!(st.unit_va(1), (st.va_of_block(512), HUGE));
        assert_eq!(st.clip(0, 5), Some((3, 5)));
        assert_eq!(st.clip(2000, 3000), None);
    }
}
