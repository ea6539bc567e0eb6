//! Virtual-memory system calls behind file mappings: address-space reservation, `MAP_FIXED`
//! placement of pool ranges, atomic range replacement with `mremap`, and userfaultfd. Every
//! `unsafe` block of the mmap path lives here; `mmap` is safe code on top of these calls.
//!
//! The userfaultfd ABI (Linux `include/uapi/linux/userfaultfd.h`) is not in the `libc` crate,
//! so its structures and ioctl numbers are declared here; their sizes are checked at compile
//! time against the ioctl encodings.
#![allow(unsafe_code)] // one of the few modules allowed `unsafe` (Cargo.toml [lints])

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Page size the file system maps at (the block size).
pub const PAGE: usize = 4096;
/// Huge (PMD) page size.
pub const HUGE: usize = 2 << 20;

fn os_err(what: impl Into<String>) -> Error {
    Error::io(what, io::Error::last_os_error())
}

/// Reserve `len` bytes of address space whose start is congruent to `phase` modulo 2 MiB, as
/// private anonymous read-write memory that commits nothing until touched. The caller owns the
/// range and must release it with [`unmap`].
pub fn reserve(len: usize, phase: usize) -> Result<usize> {
    let span = len
        .checked_add(HUGE)
        .ok_or_else(|| Error::Invalid("mapping length overflows the address space".into()))?;
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(os_err(format!("reserve {len} bytes of address space")));
    }
    let raw = raw as usize;
    // The first address at or after `raw` with the wanted phase; less than 2 MiB away.
    let start = raw + (phase % HUGE + HUGE - raw % HUGE) % HUGE;
    // Give back the slack on both sides; it was ours and nobody else holds it.
    if start > raw {
        unmap(raw, start - raw);
    }
    let end = start + len;
    if raw + span > end {
        unmap(end, raw + span - end);
    }
    Ok(start)
}

/// Release address space this module handed out.
pub fn unmap(addr: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: callers pass ranges they reserved themselves and no longer hand out references
    // into; unmapping them cannot invalidate memory Rust code still borrows.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Map `len` bytes of the pool file `fd` at `pool_off` read-write at exactly `addr`,
/// replacing whatever was mapped there in one step: shared, or (`private`) copy-on-write, so
/// stores stay in private pages until written back.
pub fn map_pool_fixed(
    addr: usize,
    len: usize,
    fd: RawFd,
    pool_off: u64,
    private: bool,
) -> Result<()> {
    let share = if private {
        libc::MAP_PRIVATE
    } else {
        libc::MAP_SHARED
    };
    // SAFETY: `addr..addr+len` lies inside a mapping region owned by the caller (a reservation
    // from `reserve`), which no Rust reference points into; MAP_FIXED replaces only that range.
    let r = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            share | libc::MAP_FIXED,
            fd,
            pool_off as libc::off_t,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(os_err(format!(
            "map pool range {pool_off:#x}+{len:#x} at {addr:#x}"
        )));
    }
    Ok(())
}

/// Map `len` bytes of the file `fd` from offset 0, shared and read-write, at a 2 MiB-aligned
/// address (a plain file mapping, the baseline of `winefs bench mmap`). Release with [`unmap`].
pub fn map_file_shared(fd: RawFd, len: usize) -> Result<usize> {
    let addr = reserve(len, 0)?;
    if let Err(e) = map_pool_fixed(addr, len, fd, 0, false) {
        unmap(addr, len);
        return Err(e);
    }
    Ok(addr)
}

/// Move the (scratch) mapping at `from` over `to`, replacing what was there atomically: no
/// thread can observe the range unmapped in between, which `munmap` + `mmap` would allow.
pub fn move_over(from: usize, len: usize, to: usize) -> Result<()> {
    // SAFETY: both ranges belong to the caller's mapping regions; `from` is a scratch mapping
    // it just created, `to` a range of its own region. No Rust reference points into either.
    let r = unsafe {
        libc::mremap(
            from as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    if r == libc::MAP_FAILED {
        let e = os_err(format!("move {len:#x} bytes from {from:#x} to {to:#x}"));
        unmap(from, len);
        return Err(e);
    }
    Ok(())
}

/// Copy `data` into mapped memory at `addr`. The range must lie in a live mapping region; a
/// page there that is not backed yet is faulted in by the fault service.
pub fn copy_in(addr: usize, data: &[u8]) {
    // SAFETY: callers check that `addr..addr+data.len()` lies inside a live mapping region they
    // own; the destination is raw shared memory, never a Rust reference, so aliasing rules are
    // not involved. A byte copy has no alignment requirement.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

/// Copy mapped memory at `addr` into `buf` (same contract as [`copy_in`]).
pub fn copy_out(addr: usize, buf: &mut [u8]) {
    // SAFETY: as for `copy_in`, with the mapped range as the source.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
}

/// Load the 8 bytes at `addr` (same contract as [`copy_in`]): one load instruction, no call.
#[inline]
pub fn read_u64(addr: usize) -> u64 {
    // SAFETY: as for `copy_in`; an unaligned read has no alignment requirement.
    unsafe { std::ptr::read_unaligned(addr as *const u64) }
}

/// Store `v` at `addr` with one atomic 8-byte store (same contract as [`copy_in`]; `addr` is
/// 8-byte aligned), so a reader in another process never sees half of it.
pub fn store_u64(addr: usize, v: u64) {
    debug_assert!(addr.is_multiple_of(8));
    // SAFETY: as for `copy_in`; the address is 8-byte aligned and inside a shared mapping the
    // caller owns, and `AtomicU64` has the layout of `u64`.
    unsafe { (*(addr as *const std::sync::atomic::AtomicU64)).store(v, std::sync::atomic::Ordering::Release) };
}

/// Load the 8 bytes at `addr` with one atomic 8-byte load (same contract as [`store_u64`]).
pub fn load_u64(addr: usize) -> u64 {
    debug_assert!(addr.is_multiple_of(8));
    // SAFETY: as for `store_u64`.
    unsafe { (*(addr as *const std::sync::atomic::AtomicU64)).load(std::sync::atomic::Ordering::Acquire) }
}

/// Replace the 8 bytes at `addr` by `new` if they hold `old`, atomically (same contract as
/// [`store_u64`]); whether it did.
pub fn cas_u64(addr: usize, old: u64, new: u64) -> bool {
    debug_assert!(addr.is_multiple_of(8));
    // SAFETY: as for `store_u64`.
    let w = unsafe { &*(addr as *const std::sync::atomic::AtomicU64) };
    w.compare_exchange(old, new, std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire)
        .is_ok()
}

/// Send SIGBUS to thread `tid` of this process (a fault that cannot be served).
pub fn sigbus_thread(tid: u32) {
    // SAFETY: tgkill only sends a signal; a stale tid makes it fail harmlessly with ESRCH.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            tid as libc::c_int,
            libc::SIGBUS,
        )
    };
}

fn faults(who: libc::c_int) -> u64 {
    // SAFETY: getrusage writes one `rusage` we own; zeroed is a valid initial value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and out pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    (ru.ru_minflt + ru.ru_majflt) as u64
}

/// Minor and major page faults taken by this process so far.
pub fn page_faults() -> u64 {
    faults(libc::RUSAGE_SELF)
}

/// Minor and major page faults taken by the calling thread so far.
pub fn thread_page_faults() -> u64 {
    faults(libc::RUSAGE_THREAD)
}

// ---- userfaultfd ABI ----

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffd_msg`: an event byte, padding, and a 24-byte union; the page-fault arm is
/// (flags, address, thread id), the remap arm (from, to, len).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    arg0: u64,
    arg1: u64,
    arg2: u64,
}

const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

const UFFD_API: u64 = 0xAA;
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: u64 = 0xC018_AA3F;
/// `_IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: u64 = 0xC020_AA00;
/// `_IOR(0xAA, 0x02, struct uffdio_range)`.
const UFFDIO_WAKE: u64 = 0x8010_AA02;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1;

/// What a userfaultfd reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UffdEvent {
    /// A thread touched a missing page at `addr` and waits for a [`Uffd::wake`].
    PageFault {
        addr: usize,
        write: bool,
        tid: u32,
    },
    /// A registered range was moved by `mremap` (ours, when we replace a range).
    Remap,
    Other(u8),
}

/// A userfaultfd. Ranges registered with it report missing-page faults to whoever reads it,
/// or, when made with `sigbus`, deliver SIGBUS to the faulting thread instead.
pub struct Uffd {
    fd: OwnedFd,
    /// Created with `UFFD_USER_MODE_ONLY` (unprivileged): faults taken inside system calls
    /// fail with EFAULT instead of being reported.
    pub user_mode_only: bool,
}

impl Uffd {
    pub fn new(sigbus: bool) -> Result<Uffd> {
        let open = |flags: libc::c_int| -> io::Result<OwnedFd> {
            // SAFETY: userfaultfd takes only flags and returns a new descriptor or -1.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_userfaultfd,
                    libc::O_CLOEXEC | libc::O_NONBLOCK | flags,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a descriptor we just opened and nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        };
        // Without privilege (vm.unprivileged_userfaultfd=0) only user-mode faults may be handled.
        let (fd, user_mode_only) = match open(0) {
            Ok(fd) => (fd, false),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => match open(UFFD_USER_MODE_ONLY) {
                Ok(fd) => (fd, true),
                Err(e) => return Err(Error::io("userfaultfd (user mode only)", e)),
            },
            Err(e) => return Err(Error::io("userfaultfd", e)),
        };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_EVENT_REMAP
                | UFFD_FEATURE_THREAD_ID
                | if sigbus { UFFD_FEATURE_SIGBUS } else { 0 },
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one `uffdio_api`, which `api` is.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(os_err(
                "userfaultfd API handshake (needs Linux 4.14 or later)",
            ));
        }
        Ok(Uffd { fd, user_mode_only })
    }

    /// Report missing-page faults in `addr..addr+len` (page-aligned, private anonymous).
    pub fn register(&self, addr: usize, len: usize) -> Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `uffdio_register`.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) } != 0 {
            return Err(os_err(format!("userfaultfd register {addr:#x}+{len:#x}")));
        }
        Ok(())
    }

    /// Wake threads waiting on faults in `addr..addr+len`; they retry their access.
    pub fn wake(&self, addr: usize, len: usize) {
        let r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads one `uffdio_range`. Waking a range with no waiters is a no-op.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE as _, &r) };
    }

    /// Next event, if one is pending (the descriptor is non-blocking).
    pub fn read_event(&self) -> Result<Option<UffdEvent>> {
        let mut m = UffdMsg::default();
        // SAFETY: reads at most one 32-byte message into `m`, which is 32 bytes of plain data.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut m as *mut UffdMsg).cast(),
                std::mem::size_of::<UffdMsg>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(Error::io("read userfaultfd", e)),
            };
        }
        if n as usize != std::mem::size_of::<UffdMsg>() {
            return Ok(None);
        }
        Ok(Some(match m.event {
            UFFD_EVENT_PAGEFAULT => UffdEvent::PageFault {
                addr: m.arg1 as usize,
                write: m.arg0 & UFFD_PAGEFAULT_FLAG_WRITE != 0,
                tid: m.arg2 as u32,
            },
            UFFD_EVENT_REMAP => UffdEvent::Remap,
            other => UffdEvent::Other(other),
        }))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A fresh private anonymous scratch range registered with `uffd`: moved over a mapped range
/// with [`move_over`], it makes every page there missing again (faults report to `uffd`).
pub fn registered_scratch(uffd: &Uffd, len: usize) -> Result<usize> {
    // SAFETY: a new anonymous mapping at a kernel-chosen address touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(os_err("map scratch range"));
    }
    let addr = raw as usize;
    if let Err(e) = uffd.register(addr, len) {
        unmap(addr, len);
        return Err(e);
    }
    Ok(addr)
}

/// An eventfd used to stop a thread that polls userfaultfds.
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    pub fn new() -> Result<Wakeup> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(os_err("eventfd"));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Wakeup { fd })
    }
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Wait until one of `fds` is readable (or `timeout_ms` passes); returns which are.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a valid array of `p.len()` pollfd structures.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter()
        .map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0)
        .collect()
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

    #[test]
    fn reserve_honours_the_phase() {
        for phase in [0, PAGE, HUGE - PAGE, 5 * PAGE] {
            let a = reserve(3 * HUGE, phase).unwrap();
            assert_eq!(a % HUGE, phase % HUGE);
            copy_in(a, &[7u8; 16]);
            let mut b = [0u8; 16];
            copy_out(a, &mut b);
            assert_eq!(b, [7u8; 16]);
            unmap(a, 3 * HUGE);
        }
    }
}
