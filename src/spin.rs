//! Locks that spin a while before they sleep, and [`CacheAligned`], which keeps per-CPU locks
//! and counters off each other's cache lines. The locks of winefs's DRAM state (inodes, the
//! namespace, allocator partitions) are held for microseconds or less, and a thread that sleeps
//! on one costs the holder a futex wake and itself a trip through the scheduler, several times
//! the wait. Sleeping at once made threads of one directory take turns through the kernel.

use std::sync::{LockResult, TryLockError, TryLockResult};
use std::time::{Duration, Instant};

/// A value alone on its cache lines (128 bytes: two 64-byte lines, which some processors fetch
/// together). Per-CPU or per-thread locks and counters kept side by side in an array would
/// otherwise share lines that different CPUs write, each write taking the line from the
/// others (false sharing).
#[repr(align(128))]
pub(crate) struct CacheAligned<T>(pub T);

/// How long a contended lock is retried before the thread sleeps on it.
/// Measured on varmail (three threads, one directory, two CPUs; docs/EVALUATION.md): 100 µs
/// took the library's median run from 316K to 385K operations per second and its 99th
/// percentile from 115-135 µs to 35-44 µs; 300 µs did no better. On 16 CPUs, 10 µs ran varmail
/// and webproxy (19 and 115 threads, one directory) a third and a half slower than 100 µs. The
/// bound keeps a thread whose holder was preempted from burning more than that.
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(100);

/// Most pauses between two tries of a contended lock. Measured on 16 CPUs (docs/EVALUATION.md,
/// "Waiters that back off"): trying back to back, the scale loop fell from 2.2M operations per
/// second at 11 threads to 1.6M at 16; with 32 it held 1.9M-2.4M. 8 did less, 128 no better.
const MAX_BACKOFF: u32 = 32;

/// Take a lock with `try_take` until it succeeds or [`SPIN_BEFORE_SLEEP`] has passed, then
/// with `take`, which sleeps until the lock is free. A poisoned lock is taken over.
pub(crate) fn spin_then_block<G>(
    try_take: impl Fn() -> TryLockResult<G>,
    take: impl FnOnce() -> LockResult<G>,
) -> G {
    // Between tries the waiter backs off, twice as long each time up to a bound: every try is
    // an atomic write to the lock's cache line, and many waiters trying back to back keep
    // taking that line from the holder, whose release then waits for it.
    let mut since: Option<Instant> = None;
    let mut backoff = 1u32;
    loop {
        if let Some(g) = taken(try_take()) {
            return g;
        }
        if since.get_or_insert_with(Instant::now).elapsed() >= SPIN_BEFORE_SLEEP {
            break;
        }
        for _ in 0..backoff {
            std::hint::spin_loop();
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    take().unwrap_or_else(|e| e.into_inner())
}

/// The guard of a `try_lock`/`try_read`/`try_write` that got the lock (a poisoned lock taken
/// over); None if another holds it.
pub(crate) fn taken<G>(r: TryLockResult<G>) -> Option<G> {
    match r {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
