//! winefs: the `/dev/fuse` event-loop threads of a session, and parking those not needed.
//!
//! A thread blocked in `read(2)` on `/dev/fuse` waits in the connection's input queue, and the
//! kernel wakes one such thread for every request it queues, even when a thread that spins on
//! its descriptor (`Config::dev_spin`) takes the request first. With one caller waiting for each
//! reply that is a wake-up and two context switches per request for nothing; on a two-CPU
//! virtual machine it took a round trip from about 17 µs (one event-loop thread) to 26-30 µs
//! (two), and two threads in `read(2)` took turns at one caller's requests, each sleeping once
//! per request. So a thread with nothing to serve parks here, off the input queue, unless it
//! is needed in `read(2)`: as the one reader while no other thread serves or spins, or beside
//! the others while it holds a *lease*. A thread takes a lease (`LEASE`) when several callers'
//! requests come faster than one thread serves them: as the spinner, finding one already
//! waiting when it comes back from serving, made by another caller than the request it served,
//! twice in a row (one caller's next request is there that soon now and then, above all when
//! the spinner was preempted after its reply, and waking a thread for it only has two threads
//! take turns at that caller's requests); or as a reader, whose read came back at once with
//! another caller's request. The spinner's find also wakes a parked thread, which reads with a
//! lease of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Other callers' requests found waiting by the spinner at its first look, in a row, that wake
/// a parked thread. (Counting every caller's, three in a row, woke threads for one caller's
/// requests on a machine busy with other work: 1,100-1,600 sleeps of the daemon's threads per
/// 2,000 requests instead of a handful.)
const BACKLOG_STREAK: u32 = 2;

/// A blocking read that returns sooner than this, with another caller's request than the one
/// before, renews the reader's lease: the requests come fast enough to keep it busy.
pub(crate) const BUSY_READ: Duration = Duration::from_millis(1);

/// How long a lease lets a thread read beside the others after it last saw requests come
/// faster than one thread serves them.
pub(crate) const LEASE: Duration = Duration::from_millis(10);

/// How often a parked thread wakes to look around: it goes to read if no thread reads or spins
/// (the ones serving are taking long: a request may be waiting for another request to be
/// served, as when a handler waits for the kernel, which waits for a request), and it leaves
/// when the session has ended (the end also wakes it).
const RECHECK: Duration = Duration::from_millis(100);

/// What the `/dev/fuse` event loops of one session share.
#[derive(Debug, Default)]
pub(crate) struct DevLoops {
    /// Threads serving a request or spinning.
    active: AtomicUsize,
    /// Threads spinning.
    spinning: AtomicUsize,
    /// Threads in a blocking read.
    readers: AtomicUsize,
    park: Mutex<Park>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Park {
    parked: usize,
    /// Wake-ups sent and not yet taken by a parked thread.
    kicks: usize,
    ended: bool,
}

impl DevLoops {
    fn park_state(&self) -> MutexGuard<'_, Park> {
        self.park.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A thread took a request (or begins to spin): it counts as active.
    pub(crate) fn begin_active(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread counted by [`DevLoops::begin_active`] is about to sleep.
    pub(crate) fn end_active(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// No other thread is serving a request or spinning.
    pub(crate) fn alone(&self) -> bool {
        self.active.load(Ordering::Relaxed) == 1
    }

    pub(crate) fn begin_spin(&self) {
        self.spinning.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn end_spin(&self) {
        self.spinning.fetch_sub(1, Ordering::Relaxed);
    }

    /// A thread with nothing to serve: true if it is to read (blocking; counted as a reader
    /// until [`DevLoops::end_read`]), false if it is to park. `leased`: it holds a lease, or
    /// was just woken to read.
    pub(crate) fn begin_read(&self, leased: bool) -> bool {
        if leased {
            self.readers.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        // A thread serving or spinning spins once it is done: it sees the next request first.
        if self.active.load(Ordering::Relaxed) > 0 {
            return false;
        }
        // The one reader, unless another thread reads already.
        self.readers
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// A read counted by [`DevLoops::begin_read`] returned.
    pub(crate) fn end_read(&self) {
        self.readers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Park until woken by [`DevLoops::backlog`] or the session's end, or until a look
    /// ([`RECHECK`]) finds no thread reading or spinning.
    pub(crate) fn park(&self) {
        let mut p = self.park_state();
        p.parked += 1;
        while p.kicks == 0 && !p.ended {
            let timed_out;
            (p, timed_out) = match self.wake.wait_timeout(p, RECHECK) {
                Ok((g, t)) => (g, t.timed_out()),
                Err(e) => {
                    let (g, t) = e.into_inner();
                    (g, t.timed_out())
                }
            };
            if timed_out
                && self.readers.load(Ordering::Relaxed) == 0
                && self.spinning.load(Ordering::Relaxed) == 0
            {
                p.parked -= 1;
                return;
            }
        }
        p.kicks = p.kicks.saturating_sub(1);
        p.parked -= 1;
    }

    /// The spinner found another caller's request waiting at its first look `streak` times in
    /// a row: once the streak is long enough, wake a parked thread to read beside it, and
    /// return true (the spinner takes a lease too).
    pub(crate) fn backlog(&self, streak: u32) -> bool {
        if streak < BACKLOG_STREAK {
            return false;
        }
        let mut p = self.park_state();
        if p.parked > p.kicks {
            p.kicks += 1;
            self.wake.notify_one();
        }
        true
    }

    /// The connection is gone: parked threads go back to read, and find it gone too.
    pub(crate) fn end(&self) {
        let mut p = self.park_state();
        p.ended = true;
        self.wake.notify_all();
    }
}

/// The thread (the kernel's pid of the task) that made `request`, a request as read from
/// `/dev/fuse` (0 if it is too short to say).
pub(crate) fn caller(request: &[u8]) -> u32 {
    let at = std::mem::offset_of!(crate::ll::fuse_abi::fuse_in_header, pid);
    request
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}
