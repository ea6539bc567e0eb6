//! Taking the mount state's locks. A panic while one was held does not make the state
//! unusable: every change is committed to media before DRAM follows, so the guard is taken
//! over rather than the poison passed on.
//!
//! The inode and namespace locks spin a while before they sleep ([`spin_then_block`]): they
//! are held for a few microseconds (a name change's commit), and a thread that sleeps on one
//! costs the holder a futex wake and itself a trip through the scheduler, several times the
//! wait. Sleeping at once made threads of one directory take turns through the kernel.

use std::sync::{
    LockResult, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError,
    TryLockResult,
};
use std::time::{Duration, Instant};

/// How long a contended inode or namespace lock is retried before the thread sleeps on it.
/// Measured on varmail (three threads, one directory, two CPUs; docs/EVALUATION.md): 100 µs
/// took the library's median run from 316K to 385K operations per second and its 99th
/// percentile from 115-135 µs to 35-44 µs; 300 µs did no better. The bound keeps a thread whose
/// holder was preempted from burning more than that.
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(100);

/// Lock `m`, taking over a poisoned lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock `l` shared, spinning first ([`spin_then_block`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    spin_then_block(|| l.try_read(), || l.read())
}

/// Lock `l` exclusively, spinning first ([`spin_then_block`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    spin_then_block(|| l.try_write(), || l.write())
}

/// Take a lock with `try_take` until it succeeds or [`SPIN_BEFORE_SLEEP`] has passed, then
/// with `take`, which sleeps until the lock is free. A poisoned lock is taken over.
pub(crate) fn spin_then_block<G>(
    try_take: impl Fn() -> TryLockResult<G>,
    take: impl FnOnce() -> LockResult<G>,
) -> G {
    // The clock is read only once the lock was found taken, and then every 32 tries.
    let mut since: Option<Instant> = None;
    let mut tries = 0u32;
    loop {
        match try_take() {
            Ok(g) => return g,
            Err(TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(TryLockError::WouldBlock) => {}
        }
        tries = tries.wrapping_add(1);
        if tries % 32 == 1 && since.get_or_insert_with(Instant::now).elapsed() >= SPIN_BEFORE_SLEEP
        {
            break;
        }
        std::hint::spin_loop();
    }
    take().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_free_lock_is_taken_at_once_and_a_poisoned_one_taken_over() {
        let l = Arc::new(RwLock::new(5));
        *write(&l) += 1;
        assert_eq!(*read(&l), 6);
        let l2 = Arc::clone(&l);
        let _ = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        assert_eq!(*read(&l), 6);
        *write(&l) = 7;
        assert_eq!(*read(&l), 7);
    }

    /// CPU time of the calling thread so far, in clock ticks (user + system).
    fn thread_cpu_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Fields after the command name (which is in parentheses and may hold spaces).
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    #[test]
    fn a_waiter_spins_then_sleeps_until_the_holder_lets_go() {
        // Held for 300 ms, far past the spin: the waiter must give up spinning and sleep (a
        // few ticks of CPU at most, where spinning throughout would take about 30), and still
        // get the lock, with the holder's change, once it is let go.
        let l = Arc::new(RwLock::new(0u32));
        let held = Arc::new(AtomicBool::new(false));
        let (l2, h2) = (Arc::clone(&l), Arc::clone(&held));
        let holder = std::thread::spawn(move || {
            let mut g = l2.write().unwrap();
            h2.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            *g = 1;
        });
        while !held.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let (cpu0, start) = (thread_cpu_ticks(), Instant::now());
        assert_eq!(*read(&l), 1);
        let (cpu, waited) = (thread_cpu_ticks() - cpu0, start.elapsed());
        assert!(waited >= Duration::from_millis(200), "waited {waited:?}");
        assert!(cpu <= 10, "{cpu} ticks of CPU spent waiting {waited:?}");
        holder.join().unwrap();
        *write(&l) += 1;
        assert_eq!(*read(&l), 2);
    }
}
