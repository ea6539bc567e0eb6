//! Memory-mapped files: pool extents placed side by side in the caller's address space, so that
//! every 2 MiB logical unit backed by an aligned 2 MiB extent is mapped with one PMD (hugepage).
//!
//! A mapping is one address range, congruent to its file offset modulo 2 MiB, whose pages are
//! installed, missing or beyond EOF (`state::mappings`). The first touch of a missing page blocks
//! the thread; a fault worker allocates the whole 2 MiB unit (an aligned extent when the unit is
//! empty), zeroes it, commits it, installs it and wakes the thread. Sparse files (ftruncate, then
//! touch) get hugepages this way. Ranges are switched between states with `mremap` of a freshly
//! registered scratch range over them, which replaces the old pages atomically. Operations that
//! move a mapped file's blocks first turn the affected pages missing (`state::map_hooks`), so no
//! store can land in a block after it is freed; strict-mode writes to a mapped file are journaled
//! in place rather than copied on write for the same reason. See docs/DESIGN.md §7a.
//!
//! This module makes, serves, writes back and tears down mappings; the public handle is
//! `fs::Mapping`.

use crate::error::{Error, Result};
use crate::media::journal::Tx;
use crate::media::layout::{BLOCK_SIZE, FileKind, INODE_TAIL_UNSETTLED, MAX_FILE_SIZE};
use crate::media::pool::Category;
use crate::meta::inode_flags::{self, Change};
use crate::ops::file::{fill_gaps, fill_unit_aligned, unit_fragmented};
use crate::ops::xattr;
use crate::state::slots;
use crate::state::inode_state::{InodeState, rlock, wlock};
use crate::state::locks::lock;
use crate::state::map_hooks::{flush_blocks, shared_of, zero_last_block_tail};
use crate::state::mappings::{FaultService, MapState, Shared, UNIT_BLOCKS};
use crate::state::mount_state::MountState;
use crate::sys::vm::{self, HUGE, PAGE, Uffd, UffdEvent, Wakeup};
use crate::types::Consistency;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak, mpsc};

/// Threads serving page faults (faults on different files are served in parallel).
const FAULT_WORKERS: usize = 2;

/// Start the fault service of a mount: the userfaultfd reader and its workers.
fn start_service(state: Weak<MountState>) -> Result<FaultService> {
    let shared = Arc::new(Shared {
        main: Uffd::new(false)?,
        sigbus: Uffd::new(true)?,
        regions: Mutex::new(BTreeMap::new()),
    });
    if shared.main.user_mode_only {
        log::warn!(
            "userfaultfd is limited to user-mode faults here (vm.unprivileged_userfaultfd=0 \
             and no CAP_SYS_PTRACE): a system call that reads or writes an untouched page of a \
             sparse mapping fails with EFAULT; touch or fallocate such ranges first"
        );
    }
    let stop = Arc::new(Wakeup::new()?);
    let (tx, rx) = mpsc::channel::<(usize, u32)>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..FAULT_WORKERS {
        let (shared, rx, state) = (shared.clone(), rx.clone(), state.clone());
        std::thread::Builder::new()
            .name(format!("winefs-fault-{i}"))
            .spawn(move || {
                loop {
                    let next = lock(&rx).recv();
                    let Ok((addr, tid)) = next else { break };
                    serve_fault(&state, &shared, addr, tid);
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
                        log::error!("page-fault service stopped: {e}");
                        return;
                    }
                }
            }
        }
    }
}

/// Serve a missing-page fault at `addr`: allocate and install its 2 MiB unit, then wake.
fn serve_fault(state: &Weak<MountState>, sh: &Shared, addr: usize, tid: u32) {
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
    let served = match state.upgrade() {
        Some(state) => fault_in(&state, st, block),
        None => Ok(()),
    };
    if let Err(e) = served {
        log::error!(
            "cannot serve a page fault of inode {} at file offset {}: {e}; sending SIGBUS",
            st.ino,
            block * BLOCK_SIZE
        );
        vm::sigbus_thread(tid);
    }
    let (va, len) = st.unit_va(unit);
    sh.main.wake(va, len);
}

/// Serve a fault on file block `block`. An empty unit of a mapping of 2 MiB or more, or of a
/// file with the alignment hint, gets a whole aligned extent, installed at once (one fault per
/// 2 MiB, the LMDB pattern of ftruncate then touch; blocks past EOF are speculative
/// preallocation). Otherwise, and when no aligned extent is free, only the faulting block is
/// allocated and installed: a small mapping (fsstress's map-and-store of a few pages of a
/// large sparse file) takes what it touches.
fn fault_in(state: &MountState, st: &MapState, block: u64) -> Result<()> {
    let unit = block / UNIT_BLOCKS;
    let n = state.inode(st.ino)?;
    let mut g = wlock(&n);
    {
        let va = lock(&st.va);
        if va.dead || va.installed.contains(&unit) || va.pages.contains(&block) {
            return Ok(());
        }
    }
    let eof_blocks = g.eof_block();
    let (a, b) = st.unit_valid(unit, eof_blocks);
    if !(a..b).contains(&block) {
        return Ok(()); // beyond EOF by now: the range is a SIGBUS range
    }
    state.check_alive()?;
    let (u0, u1) = (unit * UNIT_BLOCKS, (unit + 1) * UNIT_BLOCKS);
    let whole = g.map.segments(u0, u1).is_empty()
        && (st.len >= HUGE || xattr::hinted(state, &mut g)?)
        && fill_unit_aligned(state, &mut g, u0)?;
    // A unit on one aligned extent is installed whole (it is all backed); on a plain mapping
    // re-installing pages already there changes nothing.
    if whole || (g.map.in_aligned_unit(u0) && !st.atomic) {
        install(state, &g, st, a, b)?;
        lock(&st.va).installed.insert(unit);
    } else {
        fill_gaps(state, &mut g, block, block + 1)?;
        install(state, &g, st, block, block + 1)?;
        lock(&st.va).pages.insert(block);
    }
    Ok(())
}

/// Map the backed blocks of [a, b) (inside the mapping and the file) at their addresses,
/// merging physically contiguous runs into one mapping. Returns whether [a, b) had no holes.
fn install(state: &MountState, g: &InodeState, st: &MapState, a: u64, b: u64) -> Result<bool> {
    let fd = state.pool.raw_fd();
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
fn service(state: &Arc<MountState>) -> Result<Arc<FaultService>> {
    let mut s = lock(&state.faults);
    if let Some(svc) = s.as_ref() {
        return Ok(svc.clone());
    }
    let svc = Arc::new(start_service(Arc::downgrade(state))?);
    *s = Some(svc.clone());
    Ok(svc)
}

/// Map `len` bytes of file `ino` from `off` (see `fs::Mapping`); `atomic` for a mapping whose
/// stores stay private until msync. The caller holds the file open for the mapping's life and
/// ends it with [`unmap`].
pub(crate) fn map(
    state: &Arc<MountState>,
    ino: u64,
    off: u64,
    len: usize,
    atomic: bool,
) -> Result<Arc<MapState>> {
    if atomic && state.consistency != Consistency::Strict {
        return Err(Error::Invalid(
            "atomic mappings need a strict-mode mount".into(),
        ));
    }
    if state.pool.is_private() {
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
                .is_some_and(|e| e <= MAX_FILE_SIZE)
        })
        .ok_or(Error::FileTooBig)?;
    let svc = service(state)?;
    let sh = &svc.shared;
    state.check_alive()?;
    let n = state.inode(ino)?;
    let mut g = wlock(&n);
    match g.kind() {
        FileKind::File => {}
        FileKind::Dir => return Err(Error::IsDir),
        _ => return Err(Error::NoDevice("only regular files can be mapped".into())),
    }
    // Every mapping may be stored into.
    inode_flags::allow(g.hdr.flags, Change::Contents)?;
    // A mapping sees the blocks themselves: their newest bytes go home first, and while it
    // lives no write takes a slot.
    slots::fold_all(state, &mut g)?;
    // A file whose bytes past its end may not be zero (`INODE_TAIL_UNSETTLED`: an append cut
    // by a crash before its size commit, a client's, a fresh unit a write took and zeroed only
    // before its first byte) has the rest of its last block zeroed
    // first: a mapping must read zeros past the end, as a read does.
    if g.hdr.flags & INODE_TAIL_UNSETTLED != 0 {
        zero_last_block_tail(state, &g)?;
    }
    let base = vm::reserve(len, (off % HUGE as u64) as usize)?;
    let st = Arc::new(MapState::new(ino, base, off, len, atomic));
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
        install(state, &g, &st, st.first_block(), valid_end)?;
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
        .any(|u| unit_fragmented(&g, u));
    drop(g);
    if fragmented {
        state.background.queue_rewrite(ino);
    }
    Ok(st)
}

/// Make stores to [at, at+len) of the mapping durable (see `fs::Mapping::msync`). Returns the
/// bytes written back (atomic) or flushed (plain).
pub(crate) fn msync(state: &MountState, st: &MapState, at: usize, len: usize) -> Result<u64> {
    let end = at
        .checked_add(len)
        .filter(|&e| e <= st.len)
        .ok_or_else(|| Error::Invalid(format!("msync range {at}+{len} is outside the mapping")))?;
    state.check_alive()?;
    let n = state.inode(st.ino)?;
    let a = st.first_block() + (at / PAGE) as u64;
    let b = st.first_block() + end.div_ceil(PAGE) as u64;
    if !st.atomic {
        let g = rlock(&n);
        flush_blocks(state, &g, a, b);
        state.pool.check_durable()?;
        return Ok(g.map.segments(a, b).iter().map(|s| s.2 * BLOCK_SIZE).sum());
    }
    // The inode lock keeps the block map (and the pages' pool offsets) still.
    let g = wlock(&n);
    let dirty = private_pages(st, a, b)?;
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
    let cap = state.journals.staging_capacity();
    if bytes > cap || runs.len() + 2 > state.journals.entry_capacity() {
        return Err(Error::NoSpace(format!(
            "an atomic msync of {bytes} dirty bytes in {} runs exceeds one journal \
             transaction ({cap} bytes of undo staging); msync smaller ranges more often",
            runs.len()
        )));
    }
    let mut tx = Tx::new();
    for &(blk, phys, nb) in &runs {
        let mut data = vec![0u8; (nb * BLOCK_SIZE) as usize];
        vm::copy_out(st.va_of_block(blk), &mut data);
        tx.write(phys * BLOCK_SIZE, data, Category::Data);
    }
    if !tx.is_empty() {
        state.commit(tx)?;
    }
    // Start tracking afresh: the written-back pages become clean views of the pool again.
    let fd = state.pool.raw_fd();
    for &(blk, phys, nb) in &runs {
        vm::map_pool_fixed(
            st.va_of_block(blk),
            nb as usize * PAGE,
            fd,
            phys * BLOCK_SIZE,
            true,
        )?;
    }
    drop(g);
    Ok(bytes)
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

/// Tear a mapping down: detach it from its file, wait out fault workers serving it, release
/// the address range.
pub(crate) fn unmap(state: &MountState, st: &Arc<MapState>) {
    if let Ok(node) = state.inode(st.ino) {
        // Under the inode lock: a worker that takes it later sees `dead` and installs
        // nothing; one holding it now finishes first.
        let mut g = wlock(&node);
        lock(&st.va).dead = true;
        g.maps.retain(|m| !Arc::ptr_eq(m, st));
    } else {
        lock(&st.va).dead = true;
    }
    let sh = shared_of(state);
    if let Some(sh) = &sh {
        lock(&sh.regions).remove(&st.base);
    }
    // No new worker can find the mapping now; wait out those already serving it, so the
    // range is not released (and perhaps reused) under them.
    while st.in_flight.load(Ordering::Acquire) > 0 {
        std::thread::yield_now();
    }
    vm::unmap(st.base, st.len);
    if let Some(sh) = &sh {
        // Threads still blocked on a fault here retry and find the range unmapped.
        sh.main.wake(st.base, st.len);
    }
}
