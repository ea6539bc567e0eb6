//! Every system call and raw-memory access of the preload library, and the only `unsafe` code
//! besides the exported shims in `lib.rs`. The library never calls the libc functions it
//! interposes through their names (that would call itself): it calls the next definition,
//! found with `dlsym(RTLD_NEXT)`, or the raw system call.
#![allow(unsafe_code)]

use libc::{c_int, c_void, off_t, size_t, ssize_t};
use std::ffi::CString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An errno, as the error of every call here.
pub type Errno = c_int;

fn errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// The next definition of an interposed function (libc's), looked up once.
struct Next {
    addr: AtomicUsize,
    name: &'static str,
}

impl Next {
    const fn new(name: &'static str) -> Next {
        Next {
            addr: AtomicUsize::new(0),
            name,
        }
    }
    fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return a;
        }
        let Ok(c) = CString::new(self.name) else {
            return 0;
        };
        // SAFETY: dlsym with RTLD_NEXT and a valid NUL-terminated name only looks a symbol up.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, c.as_ptr()) } as usize;
        self.addr.store(a, Ordering::Release);
        a
    }
}

static NEXT_READ: Next = Next::new("read");
static NEXT_WRITE: Next = Next::new("write");
static NEXT_PREAD: Next = Next::new("pread64");
static NEXT_PWRITE: Next = Next::new("pwrite64");
static NEXT_CLOSE: Next = Next::new("close");
static NEXT_FTRUNCATE: Next = Next::new("ftruncate64");
static NEXT_MSYNC: Next = Next::new("msync");

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;

/// A libc call's return value as a Result (errno kept as libc set it).
fn ret(r: isize) -> Result<usize, Errno> {
    if r < 0 { Err(errno()) } else { Ok(r as usize) }
}

/// libc's `read`.
pub fn next_read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match NEXT_READ.get() {
        // SAFETY: the address is libc's `read`, with its signature; the arguments are the
        // caller's, passed on unchanged.
        a if a != 0 => unsafe { std::mem::transmute::<usize, ReadFn>(a)(fd, buf, n) },
        // SAFETY: the raw system call takes the same arguments.
        _ => unsafe { libc::syscall(libc::SYS_read, fd, buf, n) as ssize_t },
    }
}

/// libc's `write`.
pub fn next_write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    match NEXT_WRITE.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe { std::mem::transmute::<usize, WriteFn>(a)(fd, buf, n) },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_write, fd, buf, n) as ssize_t },
    }
}

/// libc's `pread64`.
pub fn next_pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    match NEXT_PREAD.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe { std::mem::transmute::<usize, PreadFn>(a)(fd, buf, n, off) },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_pread64, fd, buf, n, off) as ssize_t },
    }
}

/// libc's `pwrite64`.
pub fn next_pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    match NEXT_PWRITE.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe { std::mem::transmute::<usize, PwriteFn>(a)(fd, buf, n, off) },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_pwrite64, fd, buf, n, off) as ssize_t },
    }
}

/// libc's `close`.
pub fn next_close(fd: c_int) -> c_int {
    match NEXT_CLOSE.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_int) -> c_int>(a)(fd) },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_close, fd) as c_int },
    }
}

static NEXT_FCLOSE: Next = Next::new("fclose");

/// libc's `fclose` (there is no system call to fall back on: without it, nothing is closed).
pub fn next_fclose(stream: *mut libc::FILE) -> c_int {
    match NEXT_FCLOSE.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut libc::FILE) -> c_int>(a)(stream) },
        _ => -1,
    }
}

/// libc's `ftruncate64`.
pub fn next_ftruncate(fd: c_int, len: off_t) -> c_int {
    match NEXT_FTRUNCATE.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn(c_int, off_t) -> c_int>(a)(fd, len)
        },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_ftruncate, fd, len) as c_int },
    }
}

/// libc's `msync`.
pub fn next_msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    match NEXT_MSYNC.get() {
        // SAFETY: as for `next_read`.
        a if a != 0 => unsafe {
            std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, size_t, c_int) -> c_int>(a)(
                addr, len, flags,
            )
        },
        // SAFETY: as for `next_read`.
        _ => unsafe { libc::syscall(libc::SYS_msync, addr, len, flags) as c_int },
    }
}

/// The `mmap` system call (never libc's `mmap`, which this library replaces).
pub fn sys_mmap(addr: usize, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> Result<usize, Errno> {
    // SAFETY: the raw system call; a MAP_FIXED caller owns the range it replaces (its own
    // reservation, or a range the application asked for).
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if r < 0 && r > -4096 {
        Err(-r as Errno)
    } else if r == -1 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// The `munmap` system call.
pub fn sys_munmap(addr: usize, len: usize) -> Result<(), Errno> {
    // SAFETY: unmapping only ever removes the caller's own (or the application's) mappings.
    let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    if r < 0 { Err(errno()) } else { Ok(()) }
}

/// The `mremap` system call.
pub fn sys_mremap(old: usize, old_len: usize, new_len: usize, flags: c_int, new: usize) -> Result<usize, Errno> {
    // SAFETY: as the application asked (this library only forwards the call).
    let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) };
    if r == -1 { Err(errno()) } else { Ok(r as usize) }
}

/// `lseek`.
pub fn lseek(fd: c_int, off: i64, whence: c_int) -> Result<u64, Errno> {
    // SAFETY: lseek only changes the descriptor's offset.
    let r = unsafe { libc::lseek(fd, off, whence) };
    if r < 0 { Err(errno()) } else { Ok(r as u64) }
}

/// `fcntl(F_GETFL)`.
pub fn status_flags(fd: c_int) -> Result<c_int, Errno> {
    // SAFETY: F_GETFL reads the descriptor's flags.
    let r = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// A new read-only descriptor of the file `fd` is open on (through `/proc/self/fd`), closed on
/// exec.
pub fn reopen_read_only(fd: c_int) -> Result<c_int, Errno> {
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(|_| libc::EINVAL)?;
    // SAFETY: openat with a NUL-terminated path the kernel only reads.
    let r = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if r < 0 { Err(errno()) } else { Ok(r as c_int) }
}

/// The file system type of `fd` (`fstatfs`).
pub fn fs_type(fd: c_int) -> Result<i64, Errno> {
    // SAFETY: an all-zero statfs is valid; the kernel fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    let r = unsafe { libc::fstatfs(fd, &mut st) };
    if r < 0 { Err(errno()) } else { Ok(st.f_type as i64) }
}

/// (device, inode, mode) of `fd` from the kernel's cached attributes (`statx` with
/// `AT_STATX_DONT_SYNC`: never a round trip to a FUSE daemon).
pub fn identity(fd: c_int) -> Result<(u64, u64, u32), Errno> {
    // SAFETY: an all-zero statx is valid; the kernel fills it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names `fd` itself; `st` is
    // valid for writes.
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO | libc::STATX_TYPE,
            &mut st,
        )
    };
    if r < 0 {
        return Err(errno());
    }
    let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
    Ok((dev, st.stx_ino, st.stx_mode as u32))
}

/// The size of the file behind `fd` as the kernel knows it (no round trip to a FUSE daemon).
pub fn file_size(fd: c_int) -> Option<u64> {
    // SAFETY: an all-zero statx is valid; the kernel fills it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as in `identity`.
    let r = unsafe {
        libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC, libc::STATX_SIZE, &mut st)
    };
    (r == 0).then_some(st.stx_size)
}

/// The value of extended attribute `name` of `fd`.
pub fn fgetxattr(fd: c_int, name: &str) -> Result<Vec<u8>, Errno> {
    let c = CString::new(name).map_err(|_| libc::EINVAL)?;
    let mut buf = vec![0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes of writes; the name is NUL-terminated.
    let r = unsafe { libc::fgetxattr(fd, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(ret(r)?);
    Ok(buf)
}

/// A connected stream socket to the abstract Unix address `name`, closed on exec.
/// The user id of the process at the other end of the connected Unix socket `fd`.
pub fn peer_uid(fd: c_int) -> Result<u32, Errno> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the kernel fills them.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if r < 0 {
        return Err(errno());
    }
    Ok(cred.uid)
}

pub fn connect_abstract(name: &[u8]) -> Result<c_int, Errno> {
    // SAFETY: socket only creates a descriptor.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > addr.sun_path.len() {
        next_close(fd);
        return Err(libc::ENAMETOOLONG);
    }
    for (i, b) in name.iter().enumerate() {
        addr.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: `addr` is a valid sockaddr_un and `len` covers the family and the name.
    let r = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t) };
    if r < 0 {
        let e = errno();
        next_close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Send all of `data` on socket `fd`.
pub fn send_all(fd: c_int, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: `data` is valid for reads of its length.
        let r = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) };
        match ret(r) {
            Ok(n) => data = &data[n..],
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Receive exactly `buf.len()` bytes from socket `fd`, collecting descriptors passed with
/// them (`SCM_RIGHTS`, closed on exec) into `fds`.
pub fn recv_exact(fd: c_int, buf: &mut [u8], fds: &mut Vec<c_int>) -> Result<(), Errno> {
    let mut got = 0;
    while got < buf.len() {
        let mut cbuf = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: buf.len() - got,
        };
        // SAFETY: an all-zero msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: the iovec and control buffer are valid for writes of the lengths given.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        match ret(r) {
            Ok(0) => return Err(libc::ECONNRESET),
            Ok(n) => got += n,
            Err(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        // SAFETY: the CMSG macros walk the control buffer the kernel filled, within
        // `msg_controllen`; each SCM_RIGHTS payload is a whole number of descriptors.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let p = libc::CMSG_DATA(c).cast::<c_int>();
                    for i in 0..bytes / std::mem::size_of::<c_int>() {
                        fds.push(p.add(i).read_unaligned());
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    Ok(())
}

/// Block until the peer of socket `fd` hangs up.
pub fn wait_hangup(fd: c_int) {
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
        if r < 0 && errno() != libc::EINTR {
            return;
        }
    }
}

/// Copy `n` bytes from mapped memory at `src` into `dst` (application memory).
pub fn copy_from_map(src: usize, dst: *mut c_void, n: usize) {
    // SAFETY: the caller checked that `src..src+n` lies in a live direct mapping of this
    // process and the application passed `dst` valid for `n` bytes (as read(2) requires).
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.cast::<u8>(), n) };
}

/// Copy `n` bytes from application memory `src` into mapped memory at `dst`.
pub fn copy_to_map(src: *const c_void, dst: usize, n: usize) {
    // SAFETY: as for `copy_from_map`, the other way.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst as *mut u8, n) };
}

/// Load the 8 bytes at `addr` of a mapping atomically.
pub fn load_u64(addr: usize) -> u64 {
    // SAFETY: the caller checked `addr` lies in a live 8-byte-aligned slot of a mapping;
    // AtomicU64 has the layout of u64.
    unsafe { (*(addr as *const std::sync::atomic::AtomicU64)).load(Ordering::Acquire) }
}

/// Replace the 8 bytes at `addr` of a mapping by `new` if they hold `old`, atomically; whether
/// it did.
pub fn cas_u64(addr: usize, old: u64, new: u64) -> bool {
    // SAFETY: as for `load_u64`.
    let w = unsafe { &*(addr as *const std::sync::atomic::AtomicU64) };
    w.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire).is_ok()
}

/// Which cache-line write-back the CPU has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    Clwb,
    Clflushopt,
    Clflush,
}

fn flush_kind() -> Flush {
    static KIND: OnceLock<Flush> = OnceLock::new();
    *KIND.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
            if ebx & (1 << 24) != 0 {
                return Flush::Clwb;
            }
            if ebx & (1 << 23) != 0 {
                return Flush::Clflushopt;
            }
        }
        Flush::Clflush
    })
}

/// Write back every cache line of [addr, addr+len) of a mapping, then fence: stores there
/// are durable on persistent memory (a no-op in effect on DRAM-backed pools).
pub fn persist(addr: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let kind = flush_kind();
        let mut line = addr & !63;
        while line < addr + len {
            // SAFETY: the caller checked the range lies in a live mapping; these instructions
            // only write back (or evict) the cache line, never change memory.
            unsafe {
                match kind {
                    Flush::Clwb => std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)),
                    Flush::Clflushopt => std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags)),
                    Flush::Clflush => std::arch::x86_64::_mm_clflush(line as *const u8),
                }
            }
            line += 64;
        }
        // SAFETY: a store fence has no memory operands.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = next_msync(addr as *mut c_void, len, libc::MS_SYNC);
    }
}

/// This process's id.
pub fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// This process's id, once asked (a system call per data call otherwise).
static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// After `fork`: the process id is asked again.
pub fn forget_pid() {
    PID.store(0, Ordering::Relaxed);
}

/// This process's `RLIMIT_FSIZE` (u64::MAX: none), read at start and after every change this
/// process makes through `setrlimit`/`prlimit` (a system call per write otherwise).
static FSIZE_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The largest file size this process may write to (`RLIMIT_FSIZE`), as last read.
pub fn fsize_limit() -> u64 {
    FSIZE_LIMIT.load(Ordering::Relaxed)
}

/// Read `RLIMIT_FSIZE` again.
pub fn refresh_fsize_limit() {
    let mut r = libc::rlimit64 { rlim_cur: libc::RLIM64_INFINITY, rlim_max: libc::RLIM64_INFINITY };
    // SAFETY: prlimit64 of this process with no new limit only fills `r`, which is ours.
    let ok = unsafe {
        libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_FSIZE, std::ptr::null::<libc::rlimit64>(), &mut r)
    } == 0;
    if ok {
        FSIZE_LIMIT.store(r.rlim_cur, Ordering::Relaxed);
    }
}

/// The `prlimit64` system call (what libc's `setrlimit` and `prlimit` make); errno set on
/// failure.
pub fn prlimit(pid: libc::pid_t, res: c_int, new: *const libc::rlimit64, old: *mut libc::rlimit64) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to the system call that checks them.
    unsafe { libc::syscall(libc::SYS_prlimit64, pid, res, new, old) as c_int }
}

/// Run `prepare` before every `fork`, and `after` after it in parent and child.
pub fn at_fork(prepare: extern "C" fn(), after: extern "C" fn()) {
    // SAFETY: registers plain functions with no captured state.
    unsafe { libc::pthread_atfork(Some(prepare), Some(after), Some(after)) };
}

/// Append `line` to the file at `path` (one `write` of an O_APPEND descriptor).
pub fn append_line(path: &std::path::Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}
