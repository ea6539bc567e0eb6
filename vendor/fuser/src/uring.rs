//! FUSE over io_uring (Linux 6.14+ with `CONFIG_FUSE_IO_URING`, switched on by root through
//! `/sys/module/fuse/parameters/enable_uring`). Added for winefs; see WINEFS.md.
//!
//! The kernel keeps one queue per possible CPU and sends a request to the queue of the CPU its
//! caller runs on. A server gives each queue ring entries: a header buffer and a payload
//! buffer, handed over with `FUSE_IO_URING_CMD_REGISTER` (an `IORING_OP_URING_CMD` on the
//! `/dev/fuse` descriptor, in a 128-byte SQE). The command completes when a request has been
//! copied into the entry: the `fuse_in_header` into `in_out`, the request's first argument (its
//! per-operation header) into `op_in`, the rest (names, write data) into the payload. The
//! server answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the `fuse_out_header` in
//! `in_out`, the reply's body in the payload, and the same command waits for the next request.
//! One system call answers a request and fetches the next, with no read or write on
//! `/dev/fuse`. Until every queue has an entry, and afterwards for FORGET and INTERRUPT, the
//! kernel keeps using `/dev/fuse`, so the usual event loops run beside the queues.
//!
//! Requests are dispatched exactly as those read from `/dev/fuse`: the entry's buffer keeps
//! room in front of the payload where the in-header and the per-operation header are copied,
//! so the request reads as one slice (the write data is not copied again). A reply goes into
//! the entry's buffers; when the request's payload is still borrowed by the dispatch (a write's
//! data, a name), it is staged and moved in after the dispatch returns. A reply sent later from
//! another thread is handed to the queue's thread through an eventfd (the ring is
//! single-issuer).
//!
//! A queue thread that has just answered polls for the next request for up to `SPIN` before it
//! sleeps, yielding its CPU between looks: the kernel flags pending work in the ring's shared memory (`TASKRUN_FLAG`), so a
//! caller that comes back quickly wakes nobody, at the price of CPU time (winefs's `/dev/fuse`
//! threads poll too: `Config::dev_spin`).
//!
//! A queue thread runs on its queue's CPU (`Placement`): a caller waiting for its reply sleeps,
//! the queue thread runs in its place and wakes it on the same CPU, with no wake-up sent to
//! another CPU (on a 2-CPU VM creates and 4 KiB writes went about 1.8x faster than with the
//! threads free to run anywhere, which were level with polling `/dev/fuse` threads). Readahead
//! is the exception: the kernel sends it while the reader reads on, and served on the reader's
//! CPU it takes turns with the reader (sequential reads 0.33-0.6x). So a thread whose recent
//! requests are mostly large reads (`STREAMING`) moves to the other CPUs it may use, and
//! returns to its own once 64 requests in a row were not; a large read now and then among
//! other requests (whole small files read by many threads) leaves it where it is, since moving
//! costs more than it gains there.

use std::alloc::Layout;
use std::io;
use std::io::IoSlice;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::ll::fuse_abi as abi;
use crate::passthrough::BackingId;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd` (include/uapi/linux/fuse.h).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then
/// `struct fuse_uring_ent_in_out { flags: u64, commit_id: u64, payload_sz: u32, padding: u32,
/// reserved: u64 }`.
const IN_OUT: usize = 0;
const IN_OUT_SIZE: usize = 128;
const OP_IN: usize = IN_OUT + IN_OUT_SIZE;
const OP_IN_SIZE: usize = 128;
const ENT_IN_OUT: usize = OP_IN + OP_IN_SIZE;
const COMMIT_ID: usize = ENT_IN_OUT + 8;
const PAYLOAD_SZ: usize = ENT_IN_OUT + 16;
const HEADER_SIZE: usize = ENT_IN_OUT + 32;
const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();
/// Room in front of the payload for the in-header and the largest per-operation header.
const PREFIX: usize = IN_HEADER + OP_IN_SIZE;
/// The smallest payload buffer the kernel accepts (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;
/// Entries per queue: the kernel queues further requests until one is committed.
const DEPTH: usize = 2;
/// How long a queue thread that has just answered looks for the next request before it sleeps
/// (measured on a 2-CPU VM: 20-200 us all gave the same gain over sleeping at once, about 1.3x
/// on creates; 50 us bounds the CPU time a burst's end costs).
const SPIN: Duration = Duration::from_micros(50);
/// How often an idle queue thread looks whether the session has ended.
const POLL: Duration = Duration::from_secs(1);
/// A READ of at least this much is taken for readahead (which asks for up to the mount's
/// 1 MiB at a time).
const LARGE_READ: u32 = 64 * 1024;
/// Large reads among a queue's last 16 requests from which its thread serves away from its
/// CPU (a reader streaming a file sends nothing else).
const STREAMING: u32 = 12;

const _: () = assert!(IN_HEADER == 40 && OUT_HEADER == 16);
const _: () = assert!(PREFIX % 8 == 0);
const _: () = assert!(size_of::<squeue::Entry128>() == 128);

/// What a queue's thread is given to start serving: how to dispatch, and when to stop.
type Start<FS> = (SessionEventLoop<FS>, Arc<AtomicBool>);

/// The queues of a session, registered, each on its own thread (which owns its ring:
/// `IORING_SETUP_SINGLE_ISSUER` and `DEFER_TASKRUN`, so the kernel copies requests in when the
/// thread waits, not by interrupting it), waiting for the session to start serving.
pub(crate) struct Rings<FS: Filesystem> {
    queues: Vec<(u16, mpsc::Sender<Start<FS>>, JoinHandle<io::Result<()>>)>,
}

impl<FS: Filesystem> std::fmt::Debug for Rings<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rings({} queues)", self.queues.len())
    }
}

impl<FS: Filesystem> Rings<FS> {
    /// Register `DEPTH` entries with a `payload`-byte buffer on each of the kernel's queues (one
    /// per possible CPU) of the connection behind `dev`. An error (io_uring refused, the kernel
    /// refusing a registration) leaves the connection on `/dev/fuse`: the kernel turns its
    /// io_uring mode off when a registration fails, and the queues registered so far are
    /// closed.
    pub(crate) fn register(dev: ChannelSender, payload: usize) -> io::Result<Rings<FS>> {
        let payload = payload.max(MIN_PAYLOAD);
        let count = possible_cpus()?;
        let mut queues = Vec::with_capacity(count);
        for qid in 0..count {
            let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
            let (registered_tx, registered_rx) = mpsc::channel::<io::Result<()>>();
            let (start_tx, start_rx) = mpsc::channel::<Start<FS>>();
            let dev = dev.clone();
            let thread = thread::Builder::new()
                .name(format!("fuser-uring-{qid}"))
                .spawn(move || {
                    let queue = Queue::new(dev, qid, payload).and_then(|q| {
                        q.register()?;
                        Ok(q)
                    });
                    let queue = match queue {
                        Ok(q) => {
                            let _ = registered_tx.send(Ok(()));
                            Arc::new(q)
                        }
                        Err(e) => {
                            let _ = registered_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    // The session dropped without serving: closing the ring ends the entries.
                    let Ok((se, stop)) = start_rx.recv() else {
                        return Ok(());
                    };
                    queue.serve(&se, &stop)
                })?;
            let registered = registered_rx
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("io_uring queue thread ended")));
            if let Err(e) = registered {
                let _ = thread.join();
                return Err(e);
            }
            queues.push((qid, start_tx, thread));
        }
        debug!("FUSE over io_uring: {count} queues of {DEPTH} entries, {payload}-byte payloads");
        Ok(Rings { queues })
    }

    /// Number of queues.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Start serving on every queue's thread until the kernel ends the connection or `stop`
    /// is set; the threads to join.
    pub(crate) fn serve(
        self,
        make_loop: impl Fn(String) -> SessionEventLoop<FS>,
        stop: &Arc<AtomicBool>,
    ) -> Vec<JoinHandle<io::Result<()>>> {
        let mut threads = Vec::with_capacity(self.queues.len());
        for (qid, start, thread) in self.queues {
            // A thread that has already ended (its ring failed) just joins.
            let _ = start.send((make_loop(format!("fuser-uring-{qid}")), Arc::clone(stop)));
            threads.push(thread);
        }
        threads
    }
}

/// Number of the kernel's queues: `nr_cpu_ids`, one more than the highest possible CPU.
fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    text.trim()
        .split([',', '-'])
        .filter_map(|n| n.parse::<usize>().ok())
        .max()
        .map(|m| m + 1)
        .ok_or_else(|| io::Error::other(format!("cannot read possible CPUs from {text:?}")))
}

/// One entry's memory: the header buffer and, `PREFIX` bytes into the data buffer, the payload.
struct Buffers {
    header: *mut u8,
    data: *mut u8,
    payload: usize,
    /// The two iovecs of the registration; the kernel reads them while it registers.
    iov: [libc::iovec; 2],
}

// SAFETY: the buffers are plain memory owned by the entry; who may touch them when is decided
// by the entry's state (in the kernel's hands, dispatching, awaiting a reply), under its lock
// or by the one queue thread that owns the dispatch.
unsafe impl Send for Buffers {}
// SAFETY: as for Send.
unsafe impl Sync for Buffers {}

impl Buffers {
    fn new(payload: usize) -> io::Result<Buffers> {
        let header_layout = Layout::from_size_align(HEADER_SIZE, 64).map_err(io::Error::other)?;
        let data_layout =
            Layout::from_size_align(PREFIX + payload, 4096).map_err(io::Error::other)?;
        // SAFETY: both layouts have a non-zero size.
        let header = unsafe { std::alloc::alloc_zeroed(header_layout) };
        // SAFETY: as above.
        let data = unsafe { std::alloc::alloc_zeroed(data_layout) };
        if header.is_null() || data.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let iov = [
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                // SAFETY: PREFIX is inside the allocation of PREFIX + payload bytes.
                iov_base: unsafe { data.add(PREFIX) }.cast(),
                iov_len: payload,
            },
        ];
        Ok(Buffers {
            header,
            data,
            payload,
            iov,
        })
    }

    fn header_u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        // SAFETY: `at + 4 <= HEADER_SIZE` for every caller's constant offset.
        unsafe { std::ptr::copy_nonoverlapping(self.header.add(at), b.as_mut_ptr(), 4) };
        u32::from_ne_bytes(b)
    }

    /// Whether the request the entry holds is a READ of at least `LARGE_READ` bytes (the
    /// opcode in the `fuse_in_header`, the size in the `fuse_read_in`); read before dispatch,
    /// while only the queue's thread touches the buffers.
    fn is_large_read(&self) -> bool {
        const OPCODE: usize = 4;
        const READ_SIZE: usize = 16;
        const _: () = assert!(OP_IN + READ_SIZE + 4 <= HEADER_SIZE);
        self.header_u32(IN_OUT + OPCODE) == abi::fuse_opcode::FUSE_READ as u32
            && self.header_u32(OP_IN + READ_SIZE) >= LARGE_READ
    }

    fn header_u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: `at + 8 <= HEADER_SIZE` for every caller's constant offset.
        unsafe { std::ptr::copy_nonoverlapping(self.header.add(at), b.as_mut_ptr(), 8) };
        u64::from_ne_bytes(b)
    }

    /// Put a reply (`fuse_out_header` then the body, in any number of pieces) where the kernel
    /// reads it. A body too large for the payload becomes an EIO reply.
    fn write_reply(&self, pieces: &[&[u8]]) -> io::Result<()> {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        if total < OUT_HEADER {
            return Err(io::Error::other("a FUSE reply shorter than its header"));
        }
        let body = total - OUT_HEADER;
        if body > self.payload {
            let mut head = [0u8; OUT_HEADER];
            let mut at = 0;
            for p in pieces {
                let n = p.len().min(OUT_HEADER - at);
                head[at..at + n].copy_from_slice(&p[..n]);
                at += n;
                if at == OUT_HEADER {
                    break;
                }
            }
            let unique = u64::from_ne_bytes(head[8..16].try_into().unwrap_or_default());
            self.write_error(unique, libc::EIO);
            return Err(io::Error::other(format!(
                "a FUSE reply of {body} bytes does not fit the {}-byte ring payload",
                self.payload
            )));
        }
        let mut at = 0usize;
        for p in pieces {
            let mut p = *p;
            if at < OUT_HEADER {
                let n = p.len().min(OUT_HEADER - at);
                // SAFETY: `at + n <= OUT_HEADER <= IN_OUT_SIZE`, inside the header buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(p.as_ptr(), self.header.add(IN_OUT + at), n)
                };
                at += n;
                p = &p[n..];
            }
            if !p.is_empty() {
                let off = at - OUT_HEADER;
                // SAFETY: `off + p.len() <= body <= payload`, inside the payload; the request
                // slice does not cover it (a request with a payload stages its reply).
                unsafe {
                    std::ptr::copy_nonoverlapping(p.as_ptr(), self.data.add(PREFIX + off), p.len())
                };
                at += p.len();
            }
        }
        self.set_payload_size(body);
        Ok(())
    }

    fn write_error(&self, unique: u64, errno: i32) {
        self.write_out_header(unique, -errno, 0);
    }

    /// The `fuse_out_header` of a reply with `body` bytes in the payload, and its size.
    fn write_out_header(&self, unique: u64, error: i32, body: usize) {
        let mut head = [0u8; OUT_HEADER];
        head[0..4].copy_from_slice(&((OUT_HEADER + body) as u32).to_ne_bytes());
        head[4..8].copy_from_slice(&error.to_ne_bytes());
        head[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: OUT_HEADER bytes at the start of the header buffer.
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), self.header.add(IN_OUT), OUT_HEADER) };
        self.set_payload_size(body);
    }

    fn set_payload_size(&self, n: usize) {
        let n = n as u32;
        // SAFETY: PAYLOAD_SZ + 4 <= HEADER_SIZE.
        unsafe {
            std::ptr::copy_nonoverlapping(n.to_ne_bytes().as_ptr(), self.header.add(PAYLOAD_SZ), 4)
        };
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these layouts; the ring that could still write into
        // them is closed first (a queue drops its ring before its entries).
        unsafe {
            std::alloc::dealloc(
                self.header,
                Layout::from_size_align_unchecked(HEADER_SIZE, 64),
            );
            std::alloc::dealloc(
                self.data,
                Layout::from_size_align_unchecked(PREFIX + self.payload, 4096),
            );
        }
    }
}

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Registered or committed: the kernel owns the buffers.
    InKernel,
    /// A request is being dispatched on the queue's thread; `borrowed`: its slice covers the
    /// payload, so a reply is staged.
    Dispatching { borrowed: bool, replied: bool },
    /// Dispatched without a reply yet: the reply, when it comes, commits the entry.
    AwaitingReply,
}

struct Entry {
    bufs: Buffers,
    state: Mutex<(Phase, Vec<u8>)>,
    /// The unique id of the request the entry holds, which its commit names.
    commit_id: AtomicU64,
}

/// The user data of the completion that wakes a queue's thread for replies sent from other
/// threads (a read of its eventfd).
const WAKE: u64 = u64::MAX;

/// Where a queue's thread runs: on its queue's CPU (the kernel sends the queue the requests
/// made there), or, while its requests are mostly large reads, on the other CPUs it was allowed
/// when it started (module documentation). Only the queue's own thread uses it.
struct Placement {
    /// The queue's CPU; `None` where the thread may not run there (a CPU that is offline or
    /// outside the daemon's affinity, as under `taskset`) or pinning failed: then the thread
    /// stays where it started.
    cpu: Option<usize>,
    /// Where the thread serves large reads: the CPUs it was allowed when it started but its
    /// queue's, so that the reader, on the queue's CPU, reads on meanwhile (all of them where
    /// that leaves none).
    away: libc::cpu_set_t,
    pinned: bool,
    /// The last 64 requests, newest in the lowest bit: 1 for a large read.
    history: u64,
}

impl Placement {
    /// Pin the calling thread, queue `qid`'s, to CPU `qid` where it may run there.
    fn new(qid: u16) -> Placement {
        // SAFETY: an all-zero `cpu_set_t` is the empty set.
        let mut wide: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `wide`.
        let known =
            unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut wide) } == 0;
        let cpu = usize::from(qid);
        let allowed = known
            && cpu < libc::CPU_SETSIZE as usize
            // SAFETY: `cpu` is inside the set (checked just before).
            && unsafe { libc::CPU_ISSET(cpu, &wide) };
        let mut away = wide;
        if allowed {
            // SAFETY: `cpu < CPU_SETSIZE` (checked just before).
            unsafe { libc::CPU_CLR(cpu, &mut away) };
            // SAFETY: `away` is a valid set.
            if unsafe { libc::CPU_COUNT(&away) } == 0 {
                away = wide;
            }
        }
        let mut placement = Placement {
            cpu: allowed.then_some(cpu),
            away,
            pinned: false,
            history: 0,
        };
        placement.move_to(true);
        placement
    }

    /// Account for the next request: `STREAMING` large reads among the last 16 take the
    /// thread off its CPU, 64 other requests in a row bring it back.
    fn on_request(&mut self, large_read: bool) {
        self.history = (self.history << 1) | u64::from(large_read);
        if self.pinned {
            if (self.history & 0xffff).count_ones() >= STREAMING {
                self.move_to(false);
            }
        } else if self.history == 0 {
            self.move_to(true);
        }
    }

    /// Run the thread on its queue's CPU (`pinned`) or away from it.
    fn move_to(&mut self, pinned: bool) {
        let Some(cpu) = self.cpu else { return };
        let set = if pinned {
            // SAFETY: an all-zero `cpu_set_t` is the empty set.
            let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `cpu < CPU_SETSIZE` (checked in `new`).
            unsafe { libc::CPU_SET(cpu, &mut one) };
            one
        } else {
            self.away
        };
        // SAFETY: `set` is a valid `cpu_set_t` of the size passed; thread 0 is the caller.
        if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } == 0 {
            self.pinned = pinned;
        } else {
            // The CPU went offline or the daemon's affinity changed: stop moving.
            debug!(
                "FUSE io_uring queue {cpu}: cannot set the thread's CPUs: {}",
                io::Error::last_os_error()
            );
            self.cpu = None;
        }
    }
}

/// One kernel queue: its ring, owned and driven by the queue's thread, and its entries.
pub(crate) struct Queue {
    /// Dropped before `entries` (field order): closing the ring ends the kernel's use of the
    /// buffers.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: ChannelSender,
    fd: RawFd,
    qid: u16,
    entries: Vec<Entry>,
    /// Completions seen while registering (a request may arrive as soon as the last queue is
    /// registered), served first.
    backlog: Mutex<Vec<(usize, i32)>>,
    /// Entries answered from other threads, for the queue's thread to commit (only it may
    /// submit), which `wake` wakes.
    late: Mutex<Vec<usize>>,
    wake: OwnedFd,
    /// Where the read of `wake` lands.
    wake_buf: Box<std::cell::UnsafeCell<u64>>,
}

// SAFETY: `wake_buf` is written only by the kernel, for the read the queue's thread keeps
// armed, and never read; everything else is Sync.
unsafe impl Sync for Queue {}

impl Queue {
    fn new(dev: ChannelSender, qid: u16, payload: usize) -> io::Result<Queue> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(2 * DEPTH as u32 + 2)?;
        let entries = (0..DEPTH)
            .map(|_| {
                Ok(Entry {
                    bufs: Buffers::new(payload)?,
                    state: Mutex::new((Phase::InKernel, Vec::new())),
                    commit_id: AtomicU64::new(0),
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        // SAFETY: eventfd(2) with valid flags; the result is checked before it is owned.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `wake` is a new descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let fd = dev.as_raw_fd();
        Ok(Queue {
            ring,
            dev,
            fd,
            qid,
            entries,
            backlog: Mutex::new(Vec::new()),
            late: Mutex::new(Vec::new()),
            wake,
            wake_buf: Box::new(std::cell::UnsafeCell::new(0)),
        })
    }

    fn cmd(&self, op: u32, commit_id: u64) -> opcode::UringCmd80 {
        let mut cmd = [0u8; 80];
        // struct fuse_uring_cmd_req { flags: u64, commit_id: u64, qid: u16, padding: [u8; 6] }
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        opcode::UringCmd80::new(types::Fd(self.fd), op).cmd(cmd)
    }

    /// Queue an SQE; only the queue's thread calls this (the ring is single-issuer).
    fn push(&self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: only the queue's thread touches the submission queue; the buffers an SQE
        // names belong to an entry (or the queue) that lives as long as the ring.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: as above.
        unsafe { sq.push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        sq.sync();
        Ok(())
    }

    /// Keep a read of the wake eventfd armed.
    fn arm_wake(&self) -> io::Result<()> {
        let sqe: squeue::Entry128 =
            opcode::Read::new(types::Fd(self.wake.as_raw_fd()), self.wake_buf.get().cast(), 8)
                .build()
                .user_data(WAKE)
                .into();
        self.push(sqe)
    }

    /// Hand every entry to the kernel; fail if the kernel refuses one.
    fn register(&self) -> io::Result<()> {
        for (index, entry) in self.entries.iter().enumerate() {
            let sqe = self
                .cmd(CMD_REGISTER, 0)
                .addr(Some(entry.bufs.iov.as_ptr() as u64))
                .build()
                .user_data(index as u64);
            self.push(with_len(sqe, 2))?;
        }
        let mut waited = Duration::ZERO;
        loop {
            self.ring.submit()?;
            let seen = self.reap();
            let again = seen.iter().any(|&(_, r)| r == -libc::EAGAIN);
            if let Some(&(_, r)) = seen.iter().find(|&&(_, r)| r < 0 && r != -libc::EAGAIN) {
                return Err(io::Error::from_raw_os_error(-r));
            }
            let (retry, served): (Vec<_>, Vec<_>) =
                seen.into_iter().partition(|&(_, r)| r == -libc::EAGAIN);
            self.backlog.lock().extend(served);
            if !again {
                return Ok(());
            }
            // The connection is not initialized yet (its INIT reply is being processed).
            if waited > Duration::from_secs(5) {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            thread::sleep(Duration::from_millis(1));
            waited += Duration::from_millis(1);
            for (index, _) in retry {
                let sqe = self
                    .cmd(CMD_REGISTER, 0)
                    .addr(Some(self.entries[index].bufs.iov.as_ptr() as u64))
                    .build()
                    .user_data(index as u64);
                self.push(with_len(sqe, 2))?;
            }
        }
    }

    /// Submit what is queued, then look for completions without sleeping for up to `spin`: the
    /// kernel flags work it has for this thread (a request to copy in) and this thread runs it
    /// with a non-blocking enter. A request that comes within `spin` of the last reply then
    /// costs no wake-up of this thread.
    fn poll(&self, spin: Duration) -> io::Result<Vec<(usize, i32)>> {
        self.ring.submit()?;
        let deadline = std::time::Instant::now() + spin;
        loop {
            // SAFETY: only the queue's thread touches the submission queue (reading its flags).
            let flagged = unsafe { self.ring.submission_shared() }.taskrun();
            if flagged {
                // SAFETY: a plain enter with no argument: IORING_ENTER_GETEVENTS (1), waiting for
                // nothing, runs the work deferred to this thread.
                unsafe { self.ring.submitter().enter::<libc::sigset_t>(0, 0, 1, None) }?;
            }
            // SAFETY: one consumer, the queue's thread; nothing is taken here.
            if !unsafe { self.ring.completion_shared() }.is_empty() {
                return Ok(self.reap());
            }
            if std::time::Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            // The queue serves the callers on this thread's CPU: one its reply has woken runs
            // first (four callers on two CPUs read and wrote 1.2-1.9x faster than spinning on).
            std::thread::yield_now();
        }
    }

    /// Take every completion (only the queue's own thread).
    fn reap(&self) -> Vec<(usize, i32)> {
        // SAFETY: the completion queue has one consumer, the queue's thread.
        let cq = unsafe { self.ring.completion_shared() };
        cq.map(|c| (c.user_data() as usize, c.result())).collect()
    }

    fn serve<FS: Filesystem>(
        self: &Arc<Queue>,
        se: &SessionEventLoop<FS>,
        stop: &AtomicBool,
    ) -> io::Result<()> {
        let mut placement = Placement::new(self.qid);
        self.arm_wake()?;
        let mut live = self.entries.len();
        let mut work = std::mem::take(&mut *self.backlog.lock());
        let timeout = types::Timespec::from(POLL);
        let args = types::SubmitArgs::new().timespec(&timeout);
        let mut scratch: Vec<u64> = Vec::new();
        let mut served = false;
        loop {
            for (index, res) in work.drain(..) {
                if index as u64 == WAKE {
                    // Replies sent from other threads: commit them, and listen again.
                    let late = std::mem::take(&mut *self.late.lock());
                    for index in late {
                        self.commit(index);
                    }
                    if res >= 0 {
                        self.arm_wake()?;
                    }
                    continue;
                }
                if index >= self.entries.len() {
                    continue;
                }
                if res < 0 {
                    // The connection ended (ENOTCONN, ECONNABORTED) or the ring is closing.
                    if ![libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED, libc::ENODEV]
                        .contains(&-res)
                    {
                        warn!(
                            "FUSE io_uring queue {}: entry {index} ended: {}",
                            self.qid,
                            io::Error::from_raw_os_error(-res)
                        );
                    }
                    live -= 1;
                    continue;
                }
                placement.on_request(self.entries[index].bufs.is_large_read());
                self.dispatch(index, se, &mut scratch);
                served = true;
            }
            if live == 0 || stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if served && !SPIN.is_zero() {
                served = false;
                work = self.poll(SPIN)?;
                if !work.is_empty() {
                    continue;
                }
            }
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    error!("FUSE io_uring queue {}: {e}", self.qid);
                    return Err(e);
                }
            }
            work = self.reap();
        }
    }

    /// Dispatch the request entry `index` holds, then commit its reply (or leave that to a
    /// reply sent later).
    fn dispatch<FS: Filesystem>(
        self: &Arc<Queue>,
        index: usize,
        se: &SessionEventLoop<FS>,
        scratch: &mut Vec<u64>,
    ) {
        let entry = &self.entries[index];
        let bufs = &entry.bufs;
        let len = bufs.header_u32(IN_OUT) as usize;
        let commit_id = bufs.header_u64(COMMIT_ID);
        let payload = bufs.header_u32(PAYLOAD_SZ) as usize;
        entry.commit_id.store(commit_id, Ordering::Relaxed);
        let op_len = len
            .checked_sub(IN_HEADER + payload)
            .filter(|&n| n <= OP_IN_SIZE && payload <= bufs.payload);
        let Some(op_len) = op_len else {
            error!(
                "FUSE io_uring queue {}: malformed request (length {len}, payload {payload})",
                self.qid
            );
            bufs.write_error(commit_id, libc::EIO);
            self.commit(index);
            return;
        };
        let start = PREFIX - IN_HEADER - op_len;
        // SAFETY: the kernel has finished with the buffers (the command completed) and only
        // this thread touches them until the commit; the ranges are inside the data buffer
        // (`start >= 0`, `start + IN_HEADER + op_len == PREFIX`) and the header buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(bufs.header.add(IN_OUT), bufs.data.add(start), IN_HEADER);
            std::ptr::copy_nonoverlapping(
                bufs.header.add(OP_IN),
                bufs.data.add(start + IN_HEADER),
                op_len,
            );
        }
        let total = IN_HEADER + op_len + payload;
        // The request is parsed in place unless its headers would sit unaligned (a
        // per-operation header whose size is not a multiple of 8): then from a copy.
        let in_place = start % 8 == 0;
        entry.state.lock().0 = Phase::Dispatching {
            borrowed: in_place && payload > 0,
            replied: false,
        };
        {
            let slice: &[u8] = if in_place {
                // SAFETY: `start..start + total` is inside the data buffer and initialized; it
                // is not written while the slice lives: a reply to a request with a payload is
                // staged (`borrowed`), and other replies go past `PREFIX + 0`, beyond it.
                unsafe { std::slice::from_raw_parts(bufs.data.add(start), total) }
            } else {
                scratch.clear();
                scratch.resize(total.div_ceil(8), 0);
                let dst: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(scratch.as_mut_slice());
                // SAFETY: `total` bytes from `start`, inside the data buffer.
                let src = unsafe { std::slice::from_raw_parts(bufs.data.add(start), total) };
                dst[..total].copy_from_slice(src);
                &zerocopy::IntoBytes::as_bytes(scratch.as_slice())[..total]
            };
            let sender = UringSender {
                queue: Arc::clone(self),
                index,
            };
            match RequestWithSender::new_uring(self.dev.clone(), sender, slice) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(se);
                    }
                }
                None => {
                    let mut st = entry.state.lock();
                    bufs.write_error(commit_id, libc::EIO);
                    st.0 = Phase::Dispatching {
                        borrowed: false,
                        replied: true,
                    };
                }
            }
        }
        let mut st = entry.state.lock();
        match st.0 {
            Phase::Dispatching { borrowed, replied: true } => {
                if borrowed {
                    let staged = std::mem::take(&mut st.1);
                    if let Err(e) = bufs.write_reply(&[&staged]) {
                        error!("{e}");
                    }
                    st.1 = staged;
                }
                st.0 = Phase::InKernel;
                drop(st);
                self.commit(index);
            }
            Phase::Dispatching { replied: false, .. } => st.0 = Phase::AwaitingReply,
            Phase::InKernel | Phase::AwaitingReply => {}
        }
    }

    /// Give entry `index` back with its reply and wait for the next request on it (submitted
    /// when the queue's thread next waits); only the queue's thread calls this.
    fn commit(&self, index: usize) {
        let commit_id = self.entries[index].commit_id.load(Ordering::Relaxed);
        let sqe = self
            .cmd(CMD_COMMIT_AND_FETCH, commit_id)
            .build()
            .user_data(index as u64);
        if let Err(e) = self.push(sqe) {
            error!("FUSE io_uring queue {}: cannot commit a reply: {e}", self.qid);
        }
    }
}

/// Set the SQE's `len`, which `UringCmd80` leaves at 0: a registration names its two iovecs
/// by `addr` and `len`.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]` over a 64-byte `io_uring_sqe` and 64 more bytes, all
    // plain integers (checked: 128 bytes), so it is valid as bytes and back; `len` is the u32
    // at offset 24 of `struct io_uring_sqe`.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// Sends a reply into a ring entry.
#[derive(Clone)]
pub(crate) struct UringSender {
    queue: Arc<Queue>,
    index: usize,
}

impl std::fmt::Debug for UringSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UringSender(queue {}, entry {})", self.queue.qid, self.index)
    }
}

impl UringSender {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let queue = self.queue();
        let entry = &queue.entries[self.index];
        let pieces: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
        let mut st = entry.state.lock();
        match st.0 {
            Phase::Dispatching { borrowed, replied: false } => {
                if borrowed {
                    st.1.clear();
                    for p in &pieces {
                        st.1.extend_from_slice(p);
                    }
                    st.0 = Phase::Dispatching { borrowed, replied: true };
                    Ok(())
                } else {
                    st.0 = Phase::Dispatching { borrowed, replied: true };
                    entry.bufs.write_reply(&pieces)
                }
            }
            Phase::AwaitingReply => {
                let r = entry.bufs.write_reply(&pieces);
                st.0 = Phase::InKernel;
                drop(st);
                // Only the queue's thread may submit: hand it the commit and wake it.
                queue.late.lock().push(self.index);
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live buffer to the eventfd the queue owns.
                let n = unsafe { libc::write(queue.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
                if n != 8 {
                    return Err(io::Error::last_os_error());
                }
                r
            }
            Phase::Dispatching { replied: true, .. } | Phase::InKernel => Err(io::Error::other(
                "a second reply to one FUSE request",
            )),
        }
    }

    /// Whether a reply of up to `size` bytes can be written straight into the entry's payload:
    /// its request is being dispatched, has no payload of its own there, and is unanswered.
    pub(crate) fn can_fill(&self, size: usize) -> bool {
        let entry = &self.queue().entries[self.index];
        size <= entry.bufs.payload
            && entry.state.lock().0
                == (Phase::Dispatching {
                    borrowed: false,
                    replied: false,
                })
    }

    /// Reply to request `unique` with what `fill` writes into the entry's payload (see
    /// `can_fill`, checked by the caller).
    pub(crate) fn send_filled(
        &self,
        unique: u64,
        size: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, crate::Errno>,
    ) {
        let entry = &self.queue().entries[self.index];
        let mut st = entry.state.lock();
        let bufs = &entry.bufs;
        // SAFETY: `size <= payload` (`can_fill`), so the range is inside the data buffer. No
        // other reference covers it: the request being dispatched has no payload there (its
        // slice ends at `PREFIX`, or lives in a copy), and the entry's lock is held.
        let buf = unsafe { std::slice::from_raw_parts_mut(bufs.data.add(PREFIX), size) };
        match fill(buf) {
            Ok(n) if n <= size => bufs.write_out_header(unique, 0, n),
            Ok(n) => {
                error!("a read reply of {n} bytes from a {size}-byte buffer");
                bufs.write_error(unique, libc::EIO);
            }
            Err(e) => bufs.write_error(unique, e.code()),
        }
        st.0 = Phase::Dispatching {
            borrowed: false,
            replied: true,
        };
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        self.queue().dev.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.queue().dev.wrap_backing(id) }
    }
}
