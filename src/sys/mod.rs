//! The system calls std does not offer, and the only `unsafe` code besides the pool mapping:
//! process-level calls here (ids, the current CPU, the clock, forking a daemon, signal masks,
//! lazy unmount, file-system statistics) and virtual-memory calls in `vm`.
#![allow(unsafe_code)] // one of the few modules allowed `unsafe` (Cargo.toml [lints])

pub(crate) mod vm;

pub use vm::{page_faults, pmd_mapped_bytes, thread_page_faults};

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == -1 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// The CPU the calling thread runs on (0 if the kernel cannot say): picks the per-CPU
/// journal, allocator partition and inode free list.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).unwrap_or(0)
}

/// The time now, in nanoseconds since the Unix epoch (0 before it; saturating in 2262).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The real user and group ids (owner of a new pool's root directory).
pub fn real_ids() -> (u32, u32) {
    // SAFETY: getuid/getgid have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Restore the default SIGPIPE disposition, so a closed output pipe ends the process quietly
/// instead of making `println!` panic. Call before any thread starts.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Which side of a [`fork`] this process is.
pub enum Forked {
    /// The original process.
    Parent {
        /// Process id of the child.
        child: i32,
    },
    /// The new process.
    Child,
}

/// Fork the process. Only call while the process has a single thread: the child gets a copy of
/// the calling thread alone, so a lock held by another thread would stay locked forever.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: fork has no memory-safety preconditions of its own; the single-thread rule above
    // is what keeps the child's copy of every lock consistent, and callers uphold it.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        child => Ok(Forked::Parent { child }),
    }
}

/// Start a new session, detaching from the controlling terminal.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid has no preconditions; failure is reported through errno.
    check(unsafe { libc::setsid() }, "setsid")
}

/// Point stdin at /dev/null and stdout and stderr at `log` (appended to).
pub fn redirect_stdio(log: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let null = std::fs::File::open("/dev/null")?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| io::Error::new(e.kind(), format!("open log {}: {e}", log.display())))?;
    for (src, dst) in [
        (null.as_raw_fd(), 0),
        (out.as_raw_fd(), 1),
        (out.as_raw_fd(), 2),
    ] {
        // SAFETY: both descriptors are open (owned by the Files above) and dup2 only replaces
        // the standard descriptors, which no Rust object owns exclusively.
        check(unsafe { libc::dup2(src, dst) }, "dup2")?;
    }
    Ok(())
}

fn sigset(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set fully before it is read; sigaddset only writes
    // inside it and the signal numbers are valid constants.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block `signals` in the calling thread and every thread it starts afterwards, so that only
/// [`wait_signal`] receives them.
pub fn block_signals(signals: &[i32]) -> io::Result<()> {
    let set = sigset(signals);
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Wait until one of `signals` (blocked beforehand with [`block_signals`]) arrives.
pub fn wait_signal(signals: &[i32]) -> io::Result<i32> {
    let set = sigset(signals);
    let mut sig = 0;
    // SAFETY: `set` is initialised and `sig` is a valid place for the result.
    let rc = unsafe { libc::sigwait(&set, &mut sig) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(sig)
}

/// Send `sig` to process `pid`.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    check(unsafe { libc::kill(pid, sig) }, "kill")
}

/// Detach the mount at `path` now; the kernel finishes it when the last user lets go.
pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    check(
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) },
        "umount2",
    )
}

/// The `f_type` magic number of the file system holding `path`.
pub fn fs_magic(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_type as i64)
}

/// Space of the file system holding `path`, from statvfs(3): (fragment size, total blocks,
/// free blocks), blocks in units of the fragment size.
pub fn space(path: &Path) -> io::Result<(u64, u64, u64)> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, "statvfs")?;
    Ok((st.f_frsize as u64, st.f_blocks as u64, st.f_bfree as u64))
}

/// fallocate(2) mode 0 on an open file: allocate [off, off+len) and grow the size to cover it.
pub fn fallocate(file: &std::fs::File, off: u64, len: u64) -> io::Result<()> {
    fallocate_mode(file, 0, off, len)
}

/// fallocate(2) with any `mode` (`libc::FALLOC_FL_*`) on an open file.
pub fn fallocate_mode(file: &std::fs::File, mode: i32, off: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (off, len) = (
        i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?,
        i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?,
    );
    // SAFETY: the descriptor belongs to `file`, open for the duration of the call; fallocate
    // reads no memory of ours.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
