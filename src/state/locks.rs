//! Taking the mount state's locks. A panic while one was held does not make the state
//! unusable: every change is committed to media before DRAM follows, so the guard is taken
//! over rather than the poison passed on.
//!
//! The inode and namespace locks spin a while before they sleep ([`spin_then_block`]): they
//! are held for a few microseconds (a name change's commit), and a thread that sleeps on one
//! costs the holder a futex wake and itself a trip through the scheduler, several times the
//! wait. Sleeping at once made threads of one directory take turns through the kernel.

pub(crate) use crate::spin::spin_then_block;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
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
