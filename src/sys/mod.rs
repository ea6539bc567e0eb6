//! The system calls std does not offer, and the only `unsafe` code besides the pool mapping:
//! process-level calls here (ids, the current CPU and running on one, the clock, forking a
//! daemon, signal masks, lazy unmount, file-system statistics, file handles, a file's extents)
//! and virtual-memory calls in `vm`.
#![allow(unsafe_code)] // one of the few modules allowed `unsafe` (Cargo.toml [lints])

pub mod mountinfo;
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

/// Run the calling thread on CPU `cpu` only (tests and tools that must place a thread:
/// the per-CPU journal, partition and inode free list follow the CPU it runs on).
pub fn run_only_on_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no CPU {cpu}")));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (cpu is below
    // CPU_SETSIZE), and sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    check(rc, &format!("run on CPU {cpu}"))
}

/// The time now, in nanoseconds since the Unix epoch (0 before it; saturating in 2262), to the
/// clock's full resolution.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time now at clock-tick resolution (`CLOCK_REALTIME_COARSE`, a few milliseconds): cheaper
/// than [`now_ns`], and equal across the calls of one tick, so a stream of writes within one
/// tick stores its times once. The mount keeps it from going back behind a fine time it gave
/// (`MountState::now_coarse`).
pub fn coarse_now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    match rc {
        0 => ts.tv_sec
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec),
        _ => now_ns(),
    }
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

/// The per-mount flags a remount sets: it replaces every one, so those to keep are given too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemountFlags {
    /// `ro`
    pub read_only: bool,
    /// `nosuid`: set-user-ID and set-group-ID bits are ignored.
    pub nosuid: bool,
    /// `nodev`: device files cannot be opened.
    pub nodev: bool,
    /// `noexec`: nothing is executed from the mount.
    pub noexec: bool,
    /// `noatime` (else `relatime`).
    pub noatime: bool,
}

impl RemountFlags {
    /// mount(2)'s flag bits for these.
    fn bits(self) -> libc::c_ulong {
        [
            (self.read_only, libc::MS_RDONLY),
            (self.nosuid, libc::MS_NOSUID),
            (self.nodev, libc::MS_NODEV),
            (self.noexec, libc::MS_NOEXEC),
            (self.noatime, libc::MS_NOATIME),
        ]
        .into_iter()
        .filter(|&(on, _)| on)
        .fold(0, |acc, (_, bit)| acc | bit)
    }
}

/// Change the flags of the mount at `path` in place (mount(2) with `MS_REMOUNT`); access times
/// are `relatime` unless `noatime`.
pub fn remount(path: &Path, f: RemountFlags) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let flags = libc::MS_REMOUNT | f.bits();
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; the source, type
    // and data may be null for a remount.
    check(
        unsafe { libc::mount(std::ptr::null(), c.as_ptr(), std::ptr::null(), flags, std::ptr::null()) },
        "mount(MS_REMOUNT)",
    )
}

/// Mount the tree mounted at `from` on `to` as well (mount(2) with `MS_BIND`: one file system,
/// two mount points), then give the new mount point flags `f` (a bind mount takes them only
/// by a remount of its own).
pub fn bind_mount(from: &Path, to: &Path, f: RemountFlags) -> io::Result<()> {
    let path = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
    };
    let (src, dst) = (path(from)?, path(to)?);
    // SAFETY: `src` and `dst` are valid NUL-terminated strings that outlive the call; a bind
    // mount takes no type and no data.
    let bound = unsafe {
        libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
    };
    check(bound, "mount(MS_BIND)")?;
    let flags = libc::MS_REMOUNT | libc::MS_BIND | f.bits();
    // SAFETY: as above; a remount of a bind mount takes only the target and the flags.
    let flagged = check(
        unsafe { libc::mount(std::ptr::null(), dst.as_ptr(), std::ptr::null(), flags, std::ptr::null()) },
        "mount(MS_REMOUNT | MS_BIND)",
    );
    if flagged.is_err() {
        // Not left mounted with flags other than those asked for.
        let _ = lazy_unmount(to);
    }
    flagged
}

/// Send `file` the ioctl `cmd`, which carries no data (an `_IO` number).
pub fn ioctl_no_data(file: &std::fs::File, cmd: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // _IOC: no direction and no size (bits 16-31) is an `_IO` number.
    if cmd >> 16 != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "ioctl number carries data"));
    }
    // SAFETY: the descriptor is open for the call (borrowed from `file`); an `_IO` request
    // (checked above) reads and writes no memory of ours, and the third argument is a zero.
    check(unsafe { libc::ioctl(file.as_raw_fd(), cmd as _, 0) }, "ioctl")
}

/// Send `file` the ioctl `cmd`, which reads `buf.len()` bytes into `buf` (an `_IOR` number
/// whose size is `buf.len()`).
pub fn ioctl_read(file: &std::fs::File, cmd: u32, buf: &mut [u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // _IOC: direction in bits 30-31 (2: the kernel writes), size in bits 16-29.
    if cmd >> 30 != 2 || (cmd >> 16) & 0x3fff != buf.len() as u32 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "ioctl number does not read buf.len() bytes"));
    }
    // SAFETY: the descriptor is open for the call; the kernel writes at most the size the
    // request number encodes, which the caller makes `buf.len()`, into `buf`, which outlives
    // the call.
    check(unsafe { libc::ioctl(file.as_raw_fd(), cmd as _, buf.as_mut_ptr()) }, "ioctl")
}

/// The value of extended attribute `name` of `path` (following symlinks).
pub fn get_xattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: both strings are NUL-terminated and outlive the call; the kernel writes at most
    // `buf.len()` bytes into `buf`.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = usize::try_from(r).map_err(|_| io::Error::last_os_error())?;
    buf.truncate(len);
    Ok(buf)
}

/// Bytes a file handle may take (`MAX_HANDLE_SZ`).
const MAX_HANDLE: usize = 128;

/// A file handle (`name_to_handle_at`): what an NFS server hands its clients to name a file
/// without a path. Opaque: the file system's type tag and bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHandle {
    /// `handle_type`.
    pub kind: i32,
    /// `f_handle`, `handle_bytes` long.
    pub bytes: Vec<u8>,
}

/// `struct file_handle` in 8-byte words: the header (`handle_bytes`, `handle_type`) then the
/// bytes, with room for `MAX_HANDLE` of them.
fn handle_words(kind: i32, bytes: &[u8]) -> Vec<u64> {
    let mut raw = Vec::with_capacity(8 + MAX_HANDLE);
    raw.extend_from_slice(&(bytes.len() as u32).to_ne_bytes());
    raw.extend_from_slice(&kind.to_ne_bytes());
    raw.extend_from_slice(bytes);
    raw.resize(8 + MAX_HANDLE, 0);
    raw.chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

/// The file handle of `path` (symlinks not followed). Errors keep their errno.
pub fn file_handle(path: &Path) -> io::Result<FileHandle> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut words = handle_words(0, &[0u8; MAX_HANDLE]);
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `words` is 8-byte aligned and holds a `file_handle` header saying `MAX_HANDLE`
    // bytes follow, which they do; the kernel writes at most that many. `c` is NUL-terminated
    // and outlives the call.
    let rc = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            words.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    let raw: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let len = u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize;
    let kind = i32::from_ne_bytes([raw[4], raw[5], raw[6], raw[7]]);
    Ok(FileHandle {
        kind,
        bytes: raw[8..8 + len.min(MAX_HANDLE)].to_vec(),
    })
}

/// Open for reading the file `handle` names on the file system of `mount` (any open file or
/// directory of it). Needs `CAP_DAC_READ_SEARCH`. Errors keep their errno (ESTALE: the file is
/// gone).
pub fn open_by_handle(mount: &std::fs::File, handle: &FileHandle) -> io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    if handle.bytes.len() > MAX_HANDLE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "file handle too long"));
    }
    let mut words = handle_words(handle.kind, &handle.bytes);
    // SAFETY: `words` is an 8-byte aligned `file_handle` whose header gives the length of the
    // bytes that follow it; `mount` is an open descriptor for the duration of the call.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            words.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened by the kernel for us and nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Give the calling thread the lowest scheduling priority (nice 19), for background work that
/// must not slow the threads serving requests. Best effort: a failure changes nothing.
pub fn lower_thread_priority() {
    // SAFETY: gettid takes no arguments; setpriority on our own thread id changes only that
    // thread's nice value.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// What a shared mapping of a pool file reaches (docs/DESIGN.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A character device (device DAX): the media itself.
    DeviceDax,
    /// A file on tmpfs, hugetlbfs or ramfs: memory, gone at a reboot.
    Memory,
    /// A file in DAX mode (`STATX_ATTR_DAX`): the media itself.
    DaxFile,
    /// Anything else (a file on a disk file system, a block device): the page cache, which the
    /// kernel writes to the disk when it pleases or when asked (`fdatasync`).
    PageCache,
}

/// What `file` (at `path`) is backed by.
pub fn backing(path: &Path, file: &std::fs::File) -> Backing {
    use std::os::unix::fs::FileTypeExt;
    const MEMORY_FS: [i64; 3] = [0x0102_1994, 0x9584_58f6, 0x8584_58f6];
    match file.metadata() {
        Ok(m) if m.file_type().is_char_device() => Backing::DeviceDax,
        Ok(m) if m.is_file() && fs_magic(path).is_some_and(|t| MEMORY_FS.contains(&t)) => {
            Backing::Memory
        }
        _ if is_dax_file(file) => Backing::DaxFile,
        _ => Backing::PageCache,
    }
}

/// Whether `file` is in DAX mode (`STATX_ATTR_DAX`): its mapping reaches the media directly, with
/// no page cache between. False where the kernel cannot say.
fn is_dax_file(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let empty = c"";
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is an open descriptor, `empty` a valid NUL-terminated string (AT_EMPTY_PATH
    // makes statx describe the descriptor itself) and `st` a properly sized out-parameter.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS,
            &mut st,
        )
    };
    rc == 0
        && st.stx_attributes_mask & libc::STATX_ATTR_DAX as u64 != 0
        && st.stx_attributes & libc::STATX_ATTR_DAX as u64 != 0
}

/// Pages of `file` in the page cache that are dirty or under write-back (`cachestat(2)`, Linux
/// 6.5+): what the kernel has not yet written to the disk.
pub fn unwritten_pages(file: &std::fs::File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    /// `cachestat(2)`'s number on every Linux architecture that has it.
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // A length of 0 covers the whole file.
    let range = Range { off: 0, len: 0 };
    let mut st = Stat::default();
    // SAFETY: `range` and `st` are the kernel's `struct cachestat_range` and `struct cachestat`
    // (five u64), live for the call; the flags argument must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.nr_dirty + st.nr_writeback)
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

/// posix_fallocate(3) over the first `len` bytes of `file`: every block allocated (written by
/// the C library where the file system has no fallocate).
pub fn posix_fallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: posix_fallocate only reads the descriptor, which `file` keeps open for the call.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
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

/// One extent of a file as FIEMAP reports it, in bytes of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileExtent {
    /// Where it starts in the file.
    pub start: u64,
    /// Its length.
    pub len: u64,
    /// `FIEMAP_EXTENT_*` flags.
    pub flags: u32,
}

/// The last extent of the file.
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// Where the data lies is not known yet.
pub const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
/// Delayed allocation: no blocks yet.
pub const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;
/// Allocated, not written: reads as zeros until a write converts it.
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
/// Shared with another file (a reflink): a write copies it first.
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// The extents of `file` in [0, len), after the kernel wrote its dirty pages
/// (`FIEMAP_FLAG_SYNC`); the gaps between them are holes. The FIEMAP structures
/// (`include/uapi/linux/fiemap.h`) are not in the `libc` crate, so they are declared here.
pub fn file_extents(file: &std::fs::File, len: u64) -> io::Result<Vec<FileExtent>> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct RawExtent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    const BATCH: usize = 64;
    #[repr(C)]
    struct Request {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
        extents: [RawExtent; BATCH],
    }
    const _: () = assert!(std::mem::size_of::<RawExtent>() == 56);
    const _: () = assert!(std::mem::offset_of!(Request, extents) == 32);
    // _IOWR('f', 11, struct fiemap): the header is 32 bytes, the extents follow it.
    const FS_IOC_FIEMAP: u32 = (3 << 30) | (32 << 16) | ((b'f' as u32) << 8) | 11;
    const FIEMAP_FLAG_SYNC: u32 = 0x1;
    let empty = RawExtent {
        logical: 0,
        physical: 0,
        length: 0,
        reserved64: [0; 2],
        flags: 0,
        reserved: [0; 3],
    };
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        let mut req = Request {
            start: at,
            length: len - at,
            flags: FIEMAP_FLAG_SYNC,
            mapped: 0,
            count: BATCH as u32,
            reserved: 0,
            extents: [empty; BATCH],
        };
        // SAFETY: the descriptor is open for the call; the kernel reads the header and writes
        // at most `count` extents after it, all inside `req`, which outlives the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, &mut req) };
        check(rc, "FIEMAP")?;
        let got = &req.extents[..(req.mapped as usize).min(BATCH)];
        out.extend(got.iter().map(|e| FileExtent {
            start: e.logical,
            len: e.length,
            flags: e.flags,
        }));
        match got.last() {
            Some(e) if e.flags & FIEMAP_EXTENT_LAST == 0 && e.logical + e.length > at => {
                at = e.logical + e.length;
            }
            _ => break,
        }
    }
    Ok(out)
}

/// A memory file (`memfd_create`) of `len` bytes, closed on exec.
pub fn memfd(name: &str, len: u64) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the name is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    check(fd, "memfd_create")?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(owned);
    file.set_len(len)?;
    Ok(file.into())
}

/// The user id and process id of the process at the other end of a connected Unix socket, as
/// it connected (`SO_PEERCRED`).
pub fn peer_cred(fd: std::os::fd::RawFd) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the kernel fills them.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    check(rc, "getsockopt(SO_PEERCRED)")?;
    Ok((cred.uid, cred.pid as u32))
}

/// Send `data` on a connected Unix socket with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: std::os::fd::RawFd, data: &[u8], fds: &[std::os::fd::RawFd]) -> io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer is `space` bytes, enough for one header with `fds`; the
    // CMSG macros stay inside it, and the copy writes exactly `fd_bytes` bytes of data.
    let rc = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes as usize);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if rc as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
    }
    Ok(())
}

/// Shut a socket down both ways (wakes a thread blocked in `accept` or `read` on it).
pub fn shutdown_socket(fd: std::os::fd::RawFd) {
    // SAFETY: shutdown only changes the socket's state; a bad descriptor fails harmlessly.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
