//! The direct path of one process (docs/DESIGN.md §7b): which descriptors are winefs files,
//! the direct mappings this process made (each one a kernel mapping of the FUSE file with the
//! leased pool extents placed over it; a hidden one, for a descriptor's data calls, has only
//! the extents), and the data calls served from them, appends included.
//!
//! Every decision falls back to the kernel (FUSE) when anything is off: a file that is not on
//! winefs, a daemon that refuses or has gone, a private mapping, a range that is not wholly
//! leased, a write past a gap or on an `O_APPEND` descriptor, an append the daemon raced with,
//! a file whose layout changed since its lease.

use crate::client::Client;
use crate::proto;
use crate::size_word;
use crate::stats::{self, Counter};
use crate::sys::{self, Errno};
use libc::c_int;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

const PAGE: u64 = 4096;
const HUGE: usize = 2 << 20;
/// Address space a writable descriptor's hidden mapping reserves at least, so appends go on
/// directly to this size (past it, through FUSE).
const APPEND_SPAN: u64 = 1 << 30;
/// `FUSE_SUPER_MAGIC`.
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Direct mappings alive in this process (read without a lock by every data call).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Bumped before every fork: leases made before it are shared with a child and are never
/// given back early (the connection's close gives them back).
pub static FORK_EPOCH: AtomicU64 = AtomicU64::new(0);

/// What a descriptor number is, as far as this library knows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Unknown = 0,
    Other = 1,
    /// A regular file on a FUSE mount, with its access mode.
    ReadOnly = 2,
    WriteOnly = 3,
    ReadWrite = 4,
    /// As `ReadWrite`/`WriteOnly`, opened O_APPEND (writes never go direct).
    Append = 5,
}

/// Descriptor classes by number (descriptors past the table are classified on every call).
const CLASSES: usize = 1 << 16;

/// The leases of one mapping, shared by the parts a partial munmap leaves; the last part to
/// go gives them back.
struct LeaseSet {
    client: Arc<Client>,
    ids: Mutex<Vec<u64>>,
    /// A private one-page mapping of the FUSE file: keeps the file open (and the mount busy)
    /// for as long as the mapping lives, as a kernel mapping would.
    anchor: usize,
    epoch: u64,
    pid: u32,
}

impl Drop for LeaseSet {
    fn drop(&mut self) {
        if self.anchor != 0 {
            let _ = sys::sys_munmap(self.anchor, PAGE as usize);
        }
        let mine = self.pid == sys::pid() && self.epoch == FORK_EPOCH.load(Ordering::Acquire);
        if mine && !self.client.dead.load(Ordering::Acquire) {
            for id in self.ids.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                self.client.unmap(id);
            }
        }
    }
}

/// One direct mapping (or what a partial munmap left of one). A clone shares the lease set.
#[derive(Clone)]
struct DirectMap {
    len: usize,
    /// File offset of the start.
    off: u64,
    dev: u64,
    ino: u64,
    prot: c_int,
    /// [off, direct_end) is pool-backed; the rest is the kernel's mapping of the FUSE file.
    direct_end: u64,
    /// The file's layout generation when it was leased.
    generation: u64,
    revoked: bool,
    /// A mapping this library made for the data calls of this descriptor (not the
    /// application's): it goes when the descriptor is closed.
    hidden: Option<c_int>,
    /// The file size at the last lease of its growth (a hole stops `direct_end` short of it:
    /// the same size is not asked about again).
    leased_to: u64,
    /// Holds an append lease (this process may grow the file: `append_room`).
    appending: bool,
    /// Made for a descriptor opened read-only: from the read-only pool descriptor.
    read_only: bool,
    /// The file carries privileges a write drops (`proto::LEASE_PRIVILEGED`): `write` and
    /// `pwrite` go through FUSE, where the daemon drops them as the kernel would.
    privileged: bool,
    leases: Arc<LeaseSet>,
}

struct State {
    /// Direct mappings by start address.
    maps: Mutex<BTreeMap<usize, DirectMap>>,
    /// Connected clients by mount device; None: that mount offers no direct path to us.
    clients: Mutex<HashMap<u64, Option<Arc<Client>>>>,
    classes: Box<[AtomicU8]>,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| State {
        maps: Mutex::new(BTreeMap::new()),
        clients: Mutex::new(HashMap::new()),
        classes: (0..CLASSES).map(|_| AtomicU8::new(0)).collect(),
    })
}

fn maps() -> MutexGuard<'static, BTreeMap<usize, DirectMap>> {
    state().maps.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held shared by every copy to or from a direct mapping and every write-back of one (from
/// finding the mapping to the last byte), and exclusively by whatever unmaps or replaces one:
/// the application's `munmap`, `mremap` and `MAP_FIXED` `mmap`, the drop of hidden mappings,
/// revocation. The data calls copy through any mapping of the file in the process, the
/// application's too, so without it another thread's `munmap` (or an `mmap` of the same file,
/// which drops the hidden mappings) could pull the memory from under a copy in flight: it
/// faulted, and a copy into memory mapped again at that address would have written there.
/// Taken before the other locks (clients, then mappings).
static GATE: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|e| e.into_inner())
}

/// The gate, held exclusively (also by the `munmap` shim while it unmaps).
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The locks the forking thread holds across `fork` (taken before, released after in
    /// parent and child), so the child never inherits them held by a thread it does not have.
    static FORK_LOCKS: std::cell::RefCell<Option<ForkLocks>> = const { std::cell::RefCell::new(None) };
}

type ForkLocks = (
    RwLockWriteGuard<'static, ()>,
    MutexGuard<'static, HashMap<u64, Option<Arc<Client>>>>,
    MutexGuard<'static, BTreeMap<usize, DirectMap>>,
);

/// Before `fork`: take the library's locks (in their order: the gate, clients, then mappings)
/// and start a new fork epoch.
pub fn before_fork() {
    FORK_EPOCH.fetch_add(1, Ordering::AcqRel);
    if let Some(st) = STATE.get() {
        let g = exclusive();
        let c = st.clients.lock().unwrap_or_else(|e| e.into_inner());
        let m = st.maps.lock().unwrap_or_else(|e| e.into_inner());
        FORK_LOCKS.with(|l| *l.borrow_mut() = Some((g, c, m)));
    }
}

/// After `fork`, in parent and child: let the locks go.
pub fn after_fork() {
    FORK_LOCKS.with(|l| drop(l.borrow_mut().take()));
}

/// Whether any direct mapping exists (the data calls' fast test).
pub fn live() -> bool {
    LIVE.load(Ordering::Acquire) > 0
}

fn classify(fd: c_int) -> Class {
    let slot = usize::try_from(fd).ok().and_then(|i| state().classes.get(i));
    if let Some(s) = slot {
        match s.load(Ordering::Relaxed) {
            1 => return Class::Other,
            2 => return Class::ReadOnly,
            3 => return Class::WriteOnly,
            4 => return Class::ReadWrite,
            5 => return Class::Append,
            _ => {}
        }
    }
    let c = match (sys::fs_type(fd), sys::identity(fd), sys::status_flags(fd)) {
        (Ok(FUSE_MAGIC), Ok((_, _, mode)), Ok(fl)) if mode & libc::S_IFMT == libc::S_IFREG => {
            match (fl & libc::O_ACCMODE, fl & libc::O_APPEND != 0) {
                (_, true) => Class::Append,
                (libc::O_RDONLY, _) => Class::ReadOnly,
                (libc::O_WRONLY, _) => Class::WriteOnly,
                _ => Class::ReadWrite,
            }
        }
        (Ok(_), _, _) => Class::Other,
        _ => return Class::Unknown,
    };
    if let Some(s) = slot {
        s.store(c as u8, Ordering::Relaxed);
    }
    c
}

/// Record what descriptor `fd` is.
fn set_class(fd: c_int, c: Class) {
    if let Some(s) = STATE.get().and_then(|st| usize::try_from(fd).ok().and_then(|i| st.classes.get(i))) {
        s.store(c as u8, Ordering::Relaxed);
    }
}

/// Forget what descriptor `fd` was (it is being closed or replaced).
pub fn forget_fd(fd: c_int) {
    // Never makes the state (a forked child closing descriptors before exec must not allocate).
    set_class(fd, Class::Unknown);
}

/// The client of the mount holding `fd`, connecting on first use; None when the mount offers
/// this process no direct path.
fn client_for(fd: c_int, dev: u64) -> Option<Arc<Client>> {
    let mut clients = state().clients.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = clients.get(&dev) {
        match c {
            Some(c) if c.pid == sys::pid() && !c.dead.load(Ordering::Acquire) => return Some(c.clone()),
            None => return None,
            _ => {} // made before a fork, or its daemon died: connect anew
        }
    }
    let name = match sys::fgetxattr(fd, crate::proto::CHANNEL_XATTR) {
        Ok(n) => n,
        Err(e) => {
            stats::log(&format!("device {dev:#x}: no direct-path channel (errno {e}): using FUSE"));
            clients.insert(dev, None);
            return None;
        }
    };
    match Client::connect(dev, &name) {
        Ok(c) => {
            let c = Arc::new(c);
            let w = c.clone();
            let spawned = std::thread::Builder::new()
                .name("winefs-preload".into())
                .spawn(move || {
                    w.wait_hangup();
                    revoke(&w);
                });
            if spawned.is_err() {
                stats::log("cannot start the watcher thread: using FUSE");
                clients.insert(dev, None);
                return None;
            }
            stats::log(&format!("device {dev:#x}: direct path through {}", String::from_utf8_lossy(&name)));
            clients.insert(dev, Some(c.clone()));
            Some(c)
        }
        Err(e) => {
            stats::log(&format!("device {dev:#x}: the daemon refused the direct path (errno {e}): using FUSE"));
            clients.insert(dev, None);
            None
        }
    }
}

/// At start-up: announce this process to the daemon of every winefs mount it can see, so the
/// daemon knows it before it opens anything there. The daemon opens a client's files
/// direct-I/O and lets the kernel cache everyone else's; a file cached for this process would
/// be refused a lease (docs/DESIGN.md §7b, "Page cache or direct path"). The announcing
/// connection stays open, unused, until the process exits (the daemon forgets it then); it
/// takes no descriptor of the pool and starts no thread (a thread would break programs that
/// change their credentials, such as setpriv). The mounts are not touched: each channel's name
/// comes from the mount table (the mount's source is its pool) and a stat of the pool file,
/// since any open of a mount, however short, makes an unmount that meets it fail with EBUSY,
/// and every process started with the library would do it. A mount that appears later is
/// connected to at first use, as before.
pub fn announce_to_mounts() {
    let mut told: Vec<String> = Vec::new();
    for m in crate::mountinfo::mounts() {
        if m.fstype != "fuse.winefs" {
            continue;
        }
        let Ok(pool) = std::fs::metadata(&m.source) else {
            continue;
        };
        let name = crate::proto::channel_name(pool.dev(), pool.ino());
        // A pool mounted on two points (a bind mount) has one daemon.
        if !told.contains(&name) {
            Client::announce(name.as_bytes(), pool.uid());
            told.push(name);
        }
    }
}

/// The daemon of `c` is gone: every mapping of its mount becomes inaccessible (an access
/// faults, as one to a dead FUSE mount's mapping would) and the pool is let go.
fn revoke(c: &Arc<Client>) {
    c.dead.store(true, Ordering::Release);
    let gate = exclusive();
    let mut m = maps();
    for (&base, d) in m.iter_mut() {
        if Arc::ptr_eq(&d.leases.client, c) && !d.revoked {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE;
            let _ = sys::sys_mmap(base, d.len, libc::PROT_NONE, flags, -1, 0);
            d.revoked = true;
        }
    }
    drop((m, gate));
    sys::next_close(c.pool_fd);
    if c.pool_ro_fd >= 0 {
        sys::next_close(c.pool_ro_fd);
    }
    stats::log(&format!("device {:#x}: the daemon went away; its direct mappings are revoked", c.dev));
}

/// `mmap` of a winefs file, direct when possible. None: not ours, pass it to the kernel.
pub fn mmap(addr: usize, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> Option<Result<usize, Errno>> {
    if fd < 0 || flags & libc::MAP_ANONYMOUS != 0 {
        return None;
    }
    let class = classify(fd);
    if matches!(class, Class::Other | Class::Unknown) {
        return None;
    }
    let shared = matches!(flags & 0x0f, libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
    if !shared || len == 0 || off < 0 || !(off as u64).is_multiple_of(PAGE) || flags & libc::MAP_FIXED_NOREPLACE != 0 {
        stats::count(Counter::MmapFuse);
        return None;
    }
    let writable = prot & libc::PROT_WRITE != 0;
    match class {
        Class::WriteOnly => return Some(Err(libc::EACCES)),
        Class::ReadOnly if writable => return Some(Err(libc::EACCES)),
        _ => {}
    }
    let Ok((dev, ino, _)) = sys::identity(fd) else {
        return None;
    };
    let Some(client) = client_for(fd, dev) else {
        stats::count(Counter::MmapFuse);
        set_class(fd, Class::Other);
        return None;
    };
    match establish(fd, dev, ino, &client, addr, len, prot, flags, off as u64, None) {
        Ok(Some(base)) => {
            stats::count(Counter::MmapDirect);
            Some(Ok(base))
        }
        Ok(None) => {
            stats::count(Counter::MmapFuse);
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Lease [off, off+len) of the file and build its direct mapping (at `addr` with MAP_FIXED,
/// else at an address of our choosing); `hidden`: a mapping this library makes for the data
/// calls on descriptor `fd` (no hole filled). Ok(None): no lease, leave it to the kernel.
#[allow(clippy::too_many_arguments)]
fn establish(
    fd: c_int,
    dev: u64,
    ino: u64,
    client: &Arc<Client>,
    addr: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: u64,
    hidden: Option<c_int>,
) -> Result<Option<usize>, Errno> {
    let len = len.next_multiple_of(PAGE as usize);
    let fill = hidden.is_none();
    if fill {
        // This process's own hidden leases would pin the file and keep the daemon from moving
        // a fragmented unit onto an aligned extent for the mapping; they come back on demand.
        let _gate = exclusive();
        for owner in drop_hidden_where(|d| d.dev == dev && d.ino == ino) {
            reset_fallbacks(owner);
        }
    }
    let leased = match client.map(ino, off, len as u64, fill) {
        // No room to fill the holes: lease what the file has; the kernel serves the holes.
        Err(libc::ENOSPC) if fill => client.map(ino, off, len as u64, false),
        r => r,
    };
    let lease = match leased {
        Ok(l) => l,
        Err(e) => {
            stats::log(&format!("inode {ino}: no lease (errno {e}): through FUSE"));
            return Ok(None);
        }
    };
    let generation = client.board(ino).map_or(0, |b| b.1);
    let leases = Arc::new(LeaseSet {
        client: client.clone(),
        ids: Mutex::new(vec![lease.lease]),
        anchor: if hidden.is_some() {
            0 // dropped when the descriptor closes
        } else {
            sys::sys_mmap(0, PAGE as usize, libc::PROT_NONE, libc::MAP_PRIVATE, fd, 0).unwrap_or(0)
        },
        epoch: FORK_EPOCH.load(Ordering::Acquire),
        pid: sys::pid(),
    });
    let fixed = flags & libc::MAP_FIXED != 0;
    // MAP_FIXED replaces what the application had there, which may be a direct mapping. (A
    // hidden mapping, made while a data call holds the gate shared, is never MAP_FIXED.)
    let _gate = fixed.then(exclusive);
    let base = if fixed { addr } else { reserve(len, (off % HUGE as u64) as usize)? };
    // The kernel's mapping of the FUSE file underneath: what lies past the end of the file
    // behaves as the kernel makes it (SIGBUS until the file grows). A hidden mapping is
    // touched only where it is pool-backed and keeps its reservation (which a write-only
    // descriptor could not map anyway).
    let under = libc::MAP_SHARED | libc::MAP_FIXED;
    if hidden.is_some() {
        // nothing underneath
    } else if let Err(e) = sys::sys_mmap(base, len, prot, under, fd, off as i64) {
        if !fixed {
            let _ = sys::sys_munmap(base, len);
        }
        stats::log(&format!("inode {ino}: the kernel refused the mapping (errno {e})"));
        return Err(e);
    }
    let mut m = maps();
    forget_range(&mut m, base, len);
    let end = off + len as u64;
    let read_only = sys::status_flags(fd).is_ok_and(|fl| fl & libc::O_ACCMODE == libc::O_RDONLY);
    let direct_end = match place(pool_for(client, read_only), base, off, end, &lease.extents, prot, flags) {
        Ok(e) => e,
        Err(e) => {
            let _ = sys::sys_munmap(base, len);
            return Err(e);
        }
    };
    m.insert(
        base,
        DirectMap {
            len,
            off,
            dev,
            ino,
            prot,
            direct_end,
            generation,
            revoked: false,
            hidden,
            leased_to: lease.size,
            appending: false,
            read_only,
            privileged: lease.flags & proto::LEASE_PRIVILEGED != 0,
            leases,
        },
    );
    LIVE.store(m.len(), Ordering::Release);
    stats::log(&format!(
        "inode {ino}: {} {len} bytes from {off} directly ({} pool-backed)",
        if hidden.is_some() { "leased for reads and writes" } else { "mapped" },
        direct_end - off
    ));
    Ok(Some(base))
}

/// Address space of `len` bytes starting congruent to `phase` modulo 2 MiB (so aligned
/// extents are mapped with 2 MiB pages).
fn reserve(len: usize, phase: usize) -> Result<usize, Errno> {
    let span = len.checked_add(HUGE).ok_or(libc::ENOMEM)?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let r = sys::sys_mmap(0, span, libc::PROT_NONE, flags, -1, 0)?;
    let start = r + (phase + HUGE - r % HUGE) % HUGE;
    if start > r {
        let _ = sys::sys_munmap(r, start - r);
    }
    if r + span > start + len {
        let _ = sys::sys_munmap(start + len, r + span - start - len);
    }
    Ok(start)
}

/// The pool descriptor the mappings of a file are made from: the read-only one for a file
/// opened read-only (when it could be opened), so `mprotect` refuses to make them writable.
fn pool_for(c: &Client, read_only: bool) -> c_int {
    if read_only && c.pool_ro_fd >= 0 { c.pool_ro_fd } else { c.pool_fd }
}

/// Map the pool extents of file range [off, end) from descriptor `pool` over the mapping at
/// `base`; returns the end of the pool-backed prefix.
fn place(pool: c_int, base: usize, off: u64, end: u64, extents: &[crate::proto::Extent], prot: c_int, flags: c_int) -> Result<u64, Errno> {
    let mut direct_end = off;
    for e in extents {
        let (a, b) = ((e.file_block * PAGE).max(off), ((e.file_block + e.blocks) * PAGE).min(end));
        if a >= b {
            continue;
        }
        let pool_off = e.pool_block * PAGE + (a - e.file_block * PAGE);
        let fl = libc::MAP_SHARED | libc::MAP_FIXED | (flags & libc::MAP_POPULATE);
        sys::sys_mmap(base + (a - off) as usize, (b - a) as usize, prot, fl, pool, pool_off as i64)?;
        if a == direct_end {
            direct_end = b;
        }
    }
    Ok(direct_end)
}

/// Drop the bookkeeping of [addr, addr+len) (the caller unmaps or replaces the memory):
/// mappings wholly inside go, mappings cut keep their other parts.
fn forget_range(m: &mut BTreeMap<usize, DirectMap>, addr: usize, len: usize) {
    // The kernel unmaps whole pages: `munmap(addr, 100)` takes the page, so nothing of it may
    // stay listed (a listed remainder would be written back by msync/fsync and fault).
    let end = addr.saturating_add(len.checked_next_multiple_of(PAGE as usize).unwrap_or(usize::MAX));
    let hit: Vec<usize> = m
        .range(..end)
        .filter(|(b, d)| **b + d.len > addr)
        .map(|(b, _)| *b)
        .collect();
    for b in hit {
        let Some(d) = m.remove(&b) else { continue };
        if b < addr {
            let keep = addr - b;
            m.insert(b, DirectMap { len: keep, direct_end: d.direct_end.min(d.off + keep as u64), ..d.clone() });
        }
        if b + d.len > end {
            let cut = (end - b) as u64;
            let off = d.off + cut;
            m.insert(end, DirectMap { len: b + d.len - end, off, direct_end: d.direct_end.max(off), ..d.clone() });
        }
    }
    LIVE.store(m.len(), Ordering::Release);
}

/// After the application's `munmap` of [addr, addr+len) succeeded.
pub fn unmapped(addr: usize, len: usize) {
    forget_range(&mut maps(), addr, len);
}

/// `mremap` of a direct mapping: shrinking in place is done here; growing or moving one is
/// refused with ENOMEM (allowed by mremap's contract; the caller may map afresh). None: the
/// range is not a direct mapping.
pub fn mremap(old: usize, old_len: usize, new_len: usize, flags: c_int) -> Option<Result<usize, Errno>> {
    let _gate = exclusive();
    let mut m = maps();
    let hit = m.range(..old.saturating_add(old_len.max(1))).any(|(b, d)| *b + d.len > old);
    if !hit {
        return None;
    }
    if new_len <= old_len && flags & libc::MREMAP_FIXED == 0 {
        let tail = old + new_len.next_multiple_of(PAGE as usize);
        if old + old_len > tail {
            if let Err(e) = sys::sys_munmap(tail, old + old_len - tail) {
                return Some(Err(e));
            }
            forget_range(&mut m, tail, old + old_len - tail);
        }
        return Some(Ok(old));
    }
    stats::log("mremap growing or moving a direct mapping: refused (ENOMEM)");
    Some(Err(libc::ENOMEM))
}

/// Before the application's `msync` of [addr, addr+len): write back the cache lines of the
/// pool-backed parts (the kernel's msync does the rest).
pub fn msync(addr: usize, len: usize) {
    let _gate = shared();
    let m = maps();
    let end = addr.saturating_add(len);
    for (&b, d) in m.range(..end) {
        let de = b + (d.direct_end - d.off) as usize;
        let (x, y) = (addr.max(b), end.min(de));
        if x < y && !d.revoked {
            sys::persist(x, y - x);
            // Stores through a writable mapping give the file new times once synced (the
            // kernel would at the first store into each clean page; no fault tells of those).
            if d.prot & libc::PROT_WRITE != 0 && d.hidden.is_none() {
                d.leases.client.mark_written(d.ino);
            }
        }
    }
}

/// Whether data calls may lease files they do not map (`WINEFS_PRELOAD_NO_HIDDEN=1`: no).
fn hidden_allowed() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("WINEFS_PRELOAD_NO_HIDDEN").is_none_or(|v| v == "0"))
}

/// Data calls that went through FUSE per descriptor since its last hidden mapping attempt.
static FALLBACKS: OnceLock<Box<[AtomicU8]>> = OnceLock::new();

/// A second data call through FUSE on a readable winefs descriptor: lease the whole file (no
/// hole filled) and map it for the data calls, so the rest go direct. A file read or written
/// once costs no lease.
fn hidden_for(fd: c_int, class: Class, dev: u64, ino: u64) -> bool {
    if !hidden_allowed() || !matches!(class, Class::ReadOnly | Class::ReadWrite | Class::WriteOnly) {
        return false;
    }
    let counts = FALLBACKS.get_or_init(|| (0..CLASSES).map(|_| AtomicU8::new(0)).collect());
    let Some(slot) = usize::try_from(fd).ok().and_then(|i| counts.get(i)) else {
        return false;
    };
    if slot.fetch_add(1, Ordering::Relaxed) != 1 {
        return false; // the first fallback, or an attempt made already
    }
    let Some(client) = client_for(fd, dev) else {
        // Another FUSE file system, or a mount that offers no direct path: stop looking.
        set_class(fd, Class::Other);
        return false;
    };
    // Room to grow: the lease covers twice the size the kernel knows, and a writable
    // descriptor's at least `APPEND_SPAN` for its appends (past the end nothing is mapped
    // from the pool until the file grows into it or an append reserves it).
    let known = sys::file_size(fd).unwrap_or(0).max(1);
    let writable = class != Class::ReadOnly;
    let len = (known * 2).max(if writable { APPEND_SPAN } else { 0 }).next_multiple_of(HUGE as u64) as usize;
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    matches!(establish(fd, dev, ino, &client, 0, len, prot, libc::MAP_SHARED, 0, Some(fd)), Ok(Some(_)))
}

/// Count descriptor `fd`'s fallbacks afresh (its next two may lease the file again).
fn reset_fallbacks(fd: c_int) {
    if let Some(s) = FALLBACKS.get().and_then(|c| usize::try_from(fd).ok().and_then(|i| c.get(i))) {
        s.store(0, Ordering::Relaxed);
    }
}

/// Descriptor `fd` is being closed or replaced: its hidden mapping goes (and its lease).
pub fn drop_hidden(fd: c_int) {
    reset_fallbacks(fd);
    if !live() {
        return;
    }
    let _gate = exclusive();
    drop_hidden_where(|d| d.hidden == Some(fd));
}

/// Unmap and forget the hidden mappings `which` picks (their leases go with the last part);
/// returns the descriptors they were made for. The caller holds the gate exclusively.
fn drop_hidden_where(which: impl Fn(&DirectMap) -> bool) -> Vec<c_int> {
    let mut m = maps();
    let gone: Vec<(usize, usize, c_int)> = m
        .iter()
        .filter_map(|(&b, d)| Some((b, d.len, d.hidden.filter(|_| which(d))?)))
        .collect();
    for &(b, len, _) in &gone {
        let _ = sys::sys_munmap(b, len);
        forget_range(&mut m, b, len);
    }
    gone.into_iter().map(|g| g.2).collect()
}

/// Before `fsync`/`fdatasync` of `fd`: write back the cache lines of this process's direct
/// mappings of the file (the daemon cannot know which lines a client dirtied; its fsync covers
/// what went through it).
pub fn sync_file(fd: c_int) {
    if !live() {
        return;
    }
    let Ok((dev, ino, _)) = sys::identity(fd) else {
        return;
    };
    let _gate = shared();
    let m = maps();
    for (&b, d) in m.iter() {
        // A hidden mapping is stored into only by direct writes, written back as they return.
        if d.dev == dev && d.ino == ino && !d.revoked && d.prot & libc::PROT_WRITE != 0 && d.hidden.is_none() {
            sys::persist(b, (d.direct_end - d.off) as usize);
            d.leases.client.mark_written(ino);
        }
    }
}

/// Where a direct read or write of part of a file goes.
struct Spot {
    /// The address of the first byte.
    at: usize,
    /// The bytes available there (clipped to the file size for reads).
    len: usize,
    /// A write past the end of the file: the inode, the size word read before the write and
    /// the client to grow it with (`Client::grow`) once the bytes are stored.
    grow: Option<(u64, u64, Arc<Client>)>,
    /// For a write: the inode and the client to tell once the bytes are stored
    /// (`Client::mark_written`: the daemon gives the file new times at its next look).
    written: Option<(u64, Arc<Client>)>,
}

/// Where a direct read or write of [pos, pos+n) of the file behind `fd` can go.
fn locate(fd: c_int, class: Class, pos: u64, n: usize, write: bool) -> Option<Result<Spot, Errno>> {
    let (dev, ino, _) = sys::identity(fd).ok()?;
    let find = || {
        let mut m = maps();
        let usable = |d: &DirectMap| {
            d.dev == dev && d.ino == ino && !d.revoked && (!write || (d.prot & libc::PROT_WRITE != 0 && !d.privileged))
        };
        let hit = m
            .iter()
            .find(|(_, d)| usable(d) && d.off <= pos && pos < d.direct_end)
            .map(|(&b, _)| b);
        if hit.is_some() {
            return hit;
        }
        // The file may have grown into a mapping since it was leased; or this is an append
        // into the descriptor's own hidden mapping, which reserves blocks below.
        let (b, d) = m
            .iter_mut()
            .find(|(_, d)| usable(d) && d.direct_end <= pos && pos < d.off + d.len as u64)?;
        let b = *b;
        ((extend(b, d) && pos < d.direct_end) || (write && d.hidden == Some(fd))).then_some(b)
    };
    let b = match find() {
        Some(b) => b,
        None if hidden_for(fd, class, dev, ino) => find()?,
        None => return None,
    };
    let mut m = maps();
    let d = m.get_mut(&b)?;
    let c = d.leases.client.clone();
    let (word, generation) = c.board_word(ino)?;
    let size = size_word::size(word);
    if generation != d.generation || c.dead.load(Ordering::Acquire) {
        return None;
    }
    if !write && pos >= size {
        return Some(Ok(Spot { at: 0, len: 0, grow: None, written: None }));
    }
    let want = if write { n as u64 } else { (n as u64).min(size - pos) };
    let mut grow = None;
    if write && pos + want > size {
        grow = Some((ino, append_room(b, d, fd, class, pos, pos + want, size)?, c.clone()));
    }
    // The range must be leased (and pool-backed).
    if pos + want > d.direct_end {
        return None;
    }
    let at = b + (pos - d.off) as usize;
    drop(m);
    // Every mapping of this process that shows these bytes must show the pool there: a part
    // still served by the kernel (past the end the mapping saw) keeps a page-cache copy, which
    // a store into the pool would leave stale and which may hold stores the pool lacks. Those
    // parts are leased now, or the call goes through FUSE (whose direct I/O writes that copy
    // back first, or drops it).
    if want > 0 && !pool_backed_everywhere(dev, ino, pos, pos + want) {
        return None;
    }
    let written = write.then_some((ino, c));
    Some(Ok(Spot { at, len: want as usize, grow, written }))
}

/// A write of [pos, end) past the end of the file (`size`) through hidden mapping `d` (at
/// `b`) of descriptor `fd`: make sure blocks are reserved for it under an append lease of this
/// process, and return the size word to grow from. None: the write goes through FUSE — it
/// would leave a gap (which must read as zeros), the descriptor appends (the kernel finds its
/// offset), the mapping is not this descriptor's or was made before a fork, or the range runs
/// past the mapping.
fn append_room(b: usize, d: &mut DirectMap, fd: c_int, class: Class, pos: u64, end: u64, size: u64) -> Option<u64> {
    let own = d.leases.pid == sys::pid() && d.leases.epoch == FORK_EPOCH.load(Ordering::Acquire);
    let map_end = d.off + d.len as u64;
    if pos > size || d.hidden != Some(fd) || class == Class::Append || !own || end > map_end {
        return None;
    }
    // Only past a file with no hole before its last block (an append lease fills every gap).
    if d.direct_end < size / PAGE * PAGE {
        return None;
    }
    if end > d.direct_end || !d.appending {
        // One round trip per 2 MiB of appends: up to the next 2 MiB boundary past `end`.
        let target = (end / HUGE as u64 + 1) * HUGE as u64;
        let (start, target) = (d.direct_end, target.min(map_end));
        let c = d.leases.client.clone();
        let lease = match c.map_append(d.ino, start, target - start) {
            Ok(l) => l,
            Err(e) => {
                stats::log(&format!("inode {}: no room to append (errno {e}): through FUSE", d.ino));
                return None;
            }
        };
        d.leases.ids.lock().unwrap_or_else(|e| e.into_inner()).push(lease.lease);
        d.leased_to = d.leased_to.max(lease.size);
        d.appending = true;
        match place(pool_for(&c, d.read_only), b + (start - d.off) as usize, start, target, &lease.extents, d.prot, 0) {
            Ok(e) if e > start => d.direct_end = e,
            _ => return None,
        }
        if end > d.direct_end {
            return None;
        }
    }
    // The grant published the word anew: read it after.
    let (word, generation) = d.leases.client.board_word(d.ino)?;
    let open = !size_word::frozen(word) && generation == d.generation && size_word::size(word) >= pos;
    open.then_some(word)
}

/// Whether every live mapping of (dev, ino) in this process that covers [a, b) of the file is
/// pool-backed there, extending those that can be.
fn pool_backed_everywhere(dev: u64, ino: u64, a: u64, b: u64) -> bool {
    let mut m = maps();
    m.iter_mut().all(|(&base, d)| {
        // A hidden mapping has nothing of the kernel's underneath: no copy to go stale.
        let covers = d.dev == dev && d.ino == ino && d.off < b && a < d.off + d.len as u64 && d.hidden.is_none();
        !covers || d.revoked || b.min(d.off + d.len as u64) <= d.direct_end || (extend(base, d) && b.min(d.off + d.len as u64) <= d.direct_end)
    })
}

/// `pread` served from a direct mapping. None: go through FUSE.
pub fn pread(fd: c_int, buf: *mut libc::c_void, n: usize, pos: i64) -> Option<Result<usize, Errno>> {
    let class = classify(fd);
    match class {
        Class::ReadOnly | Class::ReadWrite | Class::Append => {}
        Class::WriteOnly => {
            stats::count(Counter::ReadFuse);
            return None;
        }
        _ => return None,
    }
    let _gate = shared();
    let r = (pos >= 0).then(|| locate(fd, class, pos as u64, n, false)).flatten();
    match r {
        Some(Ok(spot)) => {
            if spot.len > 0 {
                sys::copy_from_map(spot.at, buf, spot.len);
            }
            stats::count(Counter::ReadDirect);
            Some(Ok(spot.len))
        }
        Some(Err(e)) => Some(Err(e)),
        None => {
            stats::count(Counter::ReadFuse);
            None
        }
    }
}

/// `pwrite` stored into a direct mapping (and written back: durable when it returns). None:
/// go through FUSE (then [`grown`]).
pub fn pwrite(fd: c_int, buf: *const libc::c_void, n: usize, pos: i64) -> Option<Result<usize, Errno>> {
    let class = classify(fd);
    match class {
        Class::WriteOnly | Class::ReadWrite => {}
        Class::ReadOnly | Class::Append => {
            stats::count(Counter::WriteFuse);
            return None;
        }
        _ => return None,
    }
    // The kernel's word on the access mode, not the table's: a descriptor number closed behind
    // this library's back (a raw system call) and reused read-only must not write directly.
    let writable = sys::status_flags(fd)
        .is_ok_and(|fl| fl & libc::O_ACCMODE != libc::O_RDONLY && fl & libc::O_APPEND == 0);
    // A write reaching past `RLIMIT_FSIZE` goes to the kernel, which cuts it there or refuses
    // it with SIGXFSZ and EFBIG.
    if (pos as u64).saturating_add(n as u64) > sys::fsize_limit() {
        stats::count(Counter::WriteFuse);
        return None;
    }
    let _gate = shared();
    let r = (writable && pos >= 0 && n > 0).then(|| locate(fd, class, pos as u64, n, true)).flatten();
    match r {
        Some(Ok(spot)) => {
            sys::copy_to_map(buf, spot.at, spot.len);
            // Bytes inside the file are written back now (durable on return); appended ones
            // by the daemon when it takes the size in, before it commits it.
            let inside = match &spot.grow {
                Some((_, seen, _)) => (size_word::size(*seen).saturating_sub(pos as u64) as usize).min(spot.len),
                None => spot.len,
            };
            if inside > 0 {
                sys::persist(spot.at, inside);
            }
            if let Some((ino, seen, c)) = spot.grow {
                if !c.grow(ino, seen, pos as u64 + spot.len as u64) {
                    // The daemon changed the file meanwhile: FUSE writes the bytes again, in
                    // order after its change.
                    stats::count(Counter::WriteFuse);
                    return None;
                }
                stats::count(Counter::AppendDirect);
            }
            // After the bytes, so the times the daemon gives at its next look follow them.
            if let Some((ino, c)) = spot.written {
                c.mark_written(ino);
            }
            stats::count(Counter::WriteDirect);
            Some(Ok(spot.len))
        }
        Some(Err(e)) => Some(Err(e)),
        None => {
            stats::count(Counter::WriteFuse);
            None
        }
    }
}

/// Whether writes of `fd` may go direct (a winefs file open for writing without O_APPEND).
pub fn writes_direct(fd: c_int) -> bool {
    matches!(classify(fd), Class::WriteOnly | Class::ReadWrite)
}

/// Whether `fd` is a winefs file (for the calls that must look after a write through FUSE).
pub fn is_winefs(fd: c_int) -> bool {
    !matches!(classify(fd), Class::Other | Class::Unknown)
}

/// Lease and map directly the part of mapping `d` (at `b`) the file has grown into since it
/// was last leased. False when nothing changed.
fn extend(b: usize, d: &mut DirectMap) -> bool {
    let c = d.leases.client.clone();
    let end = d.off + d.len as u64;
    let Some((size, generation)) = c.board(d.ino) else { return false };
    if generation != d.generation || d.direct_end >= end || size <= d.direct_end.max(d.leased_to) || d.revoked {
        return false;
    }
    let Ok(lease) = c.map(d.ino, d.direct_end, end - d.direct_end, d.hidden.is_none()) else {
        return false;
    };
    d.leases.ids.lock().unwrap_or_else(|e| e.into_inner()).push(lease.lease);
    d.leased_to = lease.size;
    d.privileged |= lease.flags & proto::LEASE_PRIVILEGED != 0;
    let start = d.direct_end;
    let at = b + (start - d.off) as usize;
    match place(pool_for(&c, d.read_only), at, start, end, &lease.extents, d.prot, 0) {
        Ok(e) if e > start => {
            d.direct_end = e;
            true
        }
        _ => false,
    }
}

/// After a write or truncate through FUSE of the file behind `fd`: where it grew inside one of
/// the application's direct mappings, lease and map the new part directly at once (its loads
/// and stores do not pass through this library). Hidden mappings grow when a read or write
/// asks for the new part (`locate`), so a file growing by writes costs no extra round trip.
pub fn grown(fd: c_int) {
    if !live() {
        return;
    }
    let Ok((dev, ino, _)) = sys::identity(fd) else {
        return;
    };
    let mut m = maps();
    for (&b, d) in m.iter_mut() {
        if d.dev == dev && d.ino == ino && d.hidden.is_none() {
            extend(b, d);
        }
    }
}

