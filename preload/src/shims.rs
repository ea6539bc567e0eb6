//! The functions this library exports in place of libc's: each passes the call on unless
//! `direct` serves it. `unsafe` by nature (they take the application's raw pointers and are
//! exported by symbol name).
#![allow(unsafe_code)]

use crate::{direct, stats, sys};
use libc::{c_int, c_void, off_t, size_t, ssize_t};
use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

thread_local! {
    /// Set while this library works on a call: calls it makes itself pass straight through.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` unless this thread is already inside the library (then None: pass through).
fn guarded<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    if BUSY.with(|b| b.replace(true)) {
        return None;
    }
    let r = f();
    BUSY.with(|b| b.set(false));
    r
}

/// Set errno and return the failure value of a call.
fn fail<T>(e: c_int, v: T) -> T {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
    v
}

extern "C" fn before_fork() {
    // Offset locks first: a `read` holds one while it takes the mappings' lock.
    let held: Vec<_> = OFFSET_LOCKS.iter().map(|l| l.lock().unwrap_or_else(|e| e.into_inner())).collect();
    FORK_OFFSET_LOCKS.with(|f| *f.borrow_mut() = held);
    direct::before_fork();
}

extern "C" fn after_fork() {
    FORK_OFFSET_LOCKS.with(|f| f.borrow_mut().clear());
    sys::forget_pid();
    direct::after_fork();
}

extern "C" fn init() {
    sys::at_fork(before_fork, after_fork);
    sys::refresh_fsize_limit();
    guarded(|| {
        direct::announce_to_mounts();
        Some(())
    });
}

extern "C" fn fini() {
    guarded(|| {
        stats::at_exit();
        Some(())
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = fini;

/// `mmap`: direct for a shared mapping of a winefs file.
///
/// # Safety
/// As libc's `mmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 {
        let r = guarded(|| direct::mmap(addr as usize, len, prot, flags, fd, off));
        match r {
            Some(Ok(a)) => return a as *mut c_void,
            Some(Err(e)) => return fail(e, libc::MAP_FAILED),
            None => {}
        }
    }
    match sys::sys_mmap(addr as usize, len, prot, flags, fd, off) {
        Ok(a) => {
            if flags & libc::MAP_FIXED != 0 && direct::live() {
                guarded(|| {
                    direct::unmapped(a, len);
                    Some(())
                });
            }
            a as *mut c_void
        }
        Err(e) => fail(e, libc::MAP_FAILED),
    }
}

/// `mmap64` (the same call on 64-bit systems).
///
/// # Safety
/// As libc's `mmap64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// `munmap`: also forgets direct mappings (and gives their leases back).
///
/// # Safety
/// As libc's `munmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // No copy through a direct mapping may be in flight while one goes (the gate).
    let _gate = direct::live().then(direct::exclusive);
    match sys::sys_munmap(addr as usize, len) {
        Ok(()) => {
            if direct::live() {
                guarded(|| {
                    direct::unmapped(addr as usize, len);
                    Some(())
                });
            }
            0
        }
        Err(e) => fail(e, -1),
    }
}

/// `mremap`: a direct mapping can only shrink in place.
///
/// # Safety
/// As libc's `mremap`. libc declares it variadic (the fifth argument, the new address, only
/// with MREMAP_FIXED); on the Linux calling conventions this library builds for, a variadic
/// pointer argument travels exactly as a fixed one, so it is declared fixed here (stable Rust
/// cannot define variadic functions) and read only with MREMAP_FIXED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    let new = if flags & libc::MREMAP_FIXED != 0 { new_addr as usize } else { 0 };
    if direct::live() {
        match guarded(|| direct::mremap(old as usize, old_len, new_len, flags)) {
            Some(Ok(a)) => return a as *mut c_void,
            Some(Err(e)) => return fail(e, libc::MAP_FAILED),
            None => {}
        }
    }
    match sys::sys_mremap(old as usize, old_len, new_len, flags, new) {
        Ok(a) => a as *mut c_void,
        Err(e) => fail(e, libc::MAP_FAILED),
    }
}

/// `msync`: writes back the cache lines of direct mappings too.
///
/// # Safety
/// As libc's `msync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    if direct::live() {
        guarded(|| {
            direct::msync(addr as usize, len);
            Some(())
        });
    }
    sys::next_msync(addr, len, flags)
}

fn after_write(fd: c_int, r: ssize_t) -> ssize_t {
    if r > 0 && direct::live() {
        guarded(|| {
            if direct::is_winefs(fd) {
                direct::grown(fd);
            }
            Some(())
        });
    }
    r
}

/// `pread64`: from the pool inside a direct mapping.
///
/// # Safety
/// As libc's `pread64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    match guarded(|| direct::pread(fd, buf, n, off)) {
        Some(Ok(got)) => got as ssize_t,
        Some(Err(e)) => fail(e, -1),
        None => sys::next_pread(fd, buf, n, off),
    }
}

/// `pread`.
///
/// # Safety
/// As libc's `pread`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { pread64(fd, buf, n, off) }
}

/// `pwrite64`: into the pool inside a direct mapping, when the size does not change.
///
/// # Safety
/// As libc's `pwrite64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    match guarded(|| direct::pwrite(fd, buf, n, off)) {
        Some(Ok(got)) => got as ssize_t,
        Some(Err(e)) => fail(e, -1),
        None => after_write(fd, sys::next_pwrite(fd, buf, n, off)),
    }
}

/// `pwrite`.
///
/// # Safety
/// As libc's `pwrite`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { pwrite64(fd, buf, n, off) }
}

/// `pwritev`: through FUSE; a direct mapping then covers what the file grew into.
///
/// # Safety
/// As libc's `pwritev`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the raw system call with the caller's arguments (offset split as the ABI wants).
    let r = unsafe { libc::syscall(libc::SYS_pwritev, fd, iov, n, off, 0) } as ssize_t;
    after_write(fd, r)
}

/// `pwritev64`.
///
/// # Safety
/// As libc's `pwritev64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { pwritev(fd, iov, n, off) }
}

/// `writev`: through FUSE; a direct mapping then covers what the file grew into.
///
/// # Safety
/// As libc's `writev`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    // SAFETY: the raw system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_writev, fd, iov, n) } as ssize_t;
    after_write(fd, r)
}

/// Claim [pos, pos+n) of the offset of `fd` for a write that may go direct: one `lseek` moves
/// the offset past it, so writers sharing the descriptor get distinct ranges, as the kernel
/// gives them. None: not such a write (it goes to the kernel whole).
fn claim(fd: c_int, n: usize) -> Option<u64> {
    if n == 0 || !direct::writes_direct(fd) {
        return None;
    }
    let _g = offset_lock(fd);
    let end = sys::lseek(fd, i64::try_from(n).ok()?, libc::SEEK_CUR).ok()?;
    Some(end - n as u64)
}

/// Locks, by descriptor number, that make a direct `read`'s look at the offset and its move
/// past the bytes read one step against this process's other reads and writes' claims.
static OFFSET_LOCKS: [Mutex<()>; 64] = [const { Mutex::new(()) }; 64];

fn offset_lock(fd: c_int) -> MutexGuard<'static, ()> {
    OFFSET_LOCKS[fd.unsigned_abs() as usize % OFFSET_LOCKS.len()]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The offset locks the forking thread holds across `fork`, so a child never inherits one
    /// held by a thread it does not have.
    static FORK_OFFSET_LOCKS: std::cell::RefCell<Vec<MutexGuard<'static, ()>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A claimed write of `n` bytes at `pos` wrote only `done`: give the rest of the range back,
/// unless another writer claimed past it meanwhile (then the offset stays where it is).
fn unclaim(fd: c_int, pos: u64, n: usize, done: usize) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let saved = unsafe { *libc::__errno_location() };
    if sys::lseek(fd, 0, libc::SEEK_CUR) == Ok(pos + n as u64) {
        let _ = sys::lseek(fd, (pos + done as u64) as i64, libc::SEEK_SET);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Serve `read`/`write` at the descriptor's offset through `io`, moving the offset after.
fn at_offset(fd: c_int, io: impl FnOnce(i64) -> Option<Result<usize, c_int>>) -> Option<Result<usize, c_int>> {
    if !direct::is_winefs(fd) {
        return None;
    }
    let _g = offset_lock(fd);
    let pos = sys::lseek(fd, 0, libc::SEEK_CUR).ok()?;
    let r = io(pos as i64)?;
    if let Ok(n) = r
        && sys::lseek(fd, (pos + n as u64) as i64, libc::SEEK_SET).is_err()
    {
        return Some(Err(libc::EIO));
    }
    Some(r)
}

/// `read`: from the pool inside a direct mapping.
///
/// # Safety
/// As libc's `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match guarded(|| at_offset(fd, |pos| direct::pread(fd, buf, n, pos))) {
        Some(Ok(got)) => got as ssize_t,
        Some(Err(e)) => fail(e, -1),
        None => sys::next_read(fd, buf, n),
    }
}

/// `write`: into the pool inside a direct mapping, when the size does not change.
///
/// # Safety
/// As libc's `write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(pos) = guarded(|| claim(fd, n)) else {
        return after_write(fd, sys::next_write(fd, buf, n));
    };
    // The range is claimed: the bytes go there, directly or through FUSE.
    let r = match guarded(|| direct::pwrite(fd, buf, n, pos as i64)) {
        Some(Ok(got)) => got as ssize_t,
        Some(Err(e)) => fail(e, -1),
        None => after_write(fd, sys::next_pwrite(fd, buf, n, pos as off_t)),
    };
    if r < n as ssize_t {
        guarded(|| {
            unclaim(fd, pos, n, r.max(0) as usize);
            Some(())
        });
    }
    r
}

/// `ftruncate64`: through FUSE; a direct mapping then covers what the file grew into.
///
/// # Safety
/// As libc's `ftruncate64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    let r = sys::next_ftruncate(fd, len);
    after_write(fd, if r == 0 { 1 } else { -1 });
    r
}

/// `ftruncate`.
///
/// # Safety
/// As libc's `ftruncate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the same contract.
    unsafe { ftruncate64(fd, len) }
}

/// Write back this process's stores through direct mappings of the file, then make system
/// call `nr` (`fsync` or `fdatasync`) on it.
fn sync_then(fd: c_int, nr: libc::c_long) -> c_int {
    guarded(|| {
        direct::sync_file(fd);
        Some(())
    });
    // SAFETY: the raw system call with the caller's descriptor.
    unsafe { libc::syscall(nr, fd) as c_int }
}

/// `fsync`: first writes back this process's stores through direct mappings of the file.
///
/// # Safety
/// As libc's `fsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    sync_then(fd, libc::SYS_fsync)
}

/// `fdatasync`: as `fsync`.
///
/// # Safety
/// As libc's `fdatasync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    sync_then(fd, libc::SYS_fdatasync)
}

/// Descriptor `fd` is about to be closed or replaced: forget what it was, and drop the hidden
/// mapping made for it.
fn descriptor_gone(fd: c_int) {
    direct::forget_fd(fd);
    guarded(|| {
        direct::drop_hidden(fd);
        Some(())
    });
}

/// `close`: forgets what the descriptor was.
///
/// # Safety
/// As libc's `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    descriptor_gone(fd);
    sys::next_close(fd)
}

/// `fclose`: libc closes the stream's descriptor internally, past `close` above.
///
/// # Safety
/// As libc's `fclose`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut libc::FILE) -> c_int {
    if !stream.is_null() {
        // SAFETY: a stream the caller passes to fclose is valid until fclose returns.
        let fd = unsafe { libc::fileno(stream) };
        if fd >= 0 {
            descriptor_gone(fd);
        }
    }
    sys::next_fclose(stream)
}

/// `dup2`: the target descriptor is replaced.
///
/// # Safety
/// As libc's `dup2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    descriptor_gone(new);
    // SAFETY: the raw system call with the caller's arguments.
    let r = unsafe { libc::syscall(libc::SYS_dup3, old, new, 0) } as c_int;
    if r < 0 && old == new {
        // dup2 of a descriptor onto itself is valid (dup3 refuses it): check it is open.
        return sys::status_flags(old).map_or(-1, |_| new);
    }
    r
}

/// `dup3`.
///
/// # Safety
/// As libc's `dup3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    descriptor_gone(new);
    // SAFETY: the raw system call with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) as c_int }
}

/// `prlimit64`: passed on; a new `RLIMIT_FSIZE` is noted, since direct writes must keep to it
/// as the kernel's writes do.
///
/// # Safety
/// As libc's `prlimit64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn prlimit64(pid: libc::pid_t, res: c_int, new: *const libc::rlimit64, old: *mut libc::rlimit64) -> c_int {
    let r = sys::prlimit(pid, res, new, old);
    if r == 0 && res == libc::RLIMIT_FSIZE as c_int && !new.is_null() {
        sys::refresh_fsize_limit();
    }
    r
}

/// `prlimit`.
///
/// # Safety
/// As libc's `prlimit` (its `rlimit` is `rlimit64` on 64-bit Linux).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn prlimit(pid: libc::pid_t, res: c_int, new: *const libc::rlimit64, old: *mut libc::rlimit64) -> c_int {
    // SAFETY: the same contract.
    unsafe { prlimit64(pid, res, new, old) }
}

/// `setrlimit`: `prlimit64` of this process.
///
/// # Safety
/// As libc's `setrlimit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit(res: c_int, new: *const libc::rlimit64) -> c_int {
    // SAFETY: the same contract.
    unsafe { prlimit64(0, res, new, std::ptr::null_mut()) }
}

/// `setrlimit64`.
///
/// # Safety
/// As libc's `setrlimit64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit64(res: c_int, new: *const libc::rlimit64) -> c_int {
    // SAFETY: the same contract.
    unsafe { prlimit64(0, res, new, std::ptr::null_mut()) }
}
