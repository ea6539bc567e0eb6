//! Taking the mount state's locks. A panic while one was held does not make the state
//! unusable: every change is committed to media before DRAM follows, so the guard is taken
//! over rather than the poison passed on.
//!
//! The inode and namespace locks spin a while before they sleep ([`spin_then_block`]): they
//! are held for a few microseconds (a name change's commit), and a thread that sleeps on one
//! costs the holder a futex wake and itself a trip through the scheduler, several times the
//! wait. Sleeping at once made threads of one directory take turns through the kernel.

pub(crate) use crate::spin::spin_then_block;
use crate::spin::CacheAligned;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `m`, taking over a poisoned lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock `m`, spinning first ([`spin_then_block`]; a poisoned lock is taken over).
pub(crate) fn lock_spinning<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    spin_then_block(|| m.try_lock(), || m.lock())
}

/// Lock `l` shared, spinning first ([`spin_then_block`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    spin_then_block(|| l.try_read(), || l.read())
}

/// Lock `l` exclusively, spinning first ([`spin_then_block`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    spin_then_block(|| l.try_write(), || l.write())
}

/// A reader-writer lock for many readers on many CPUs and a rare writer: a reader takes the
/// shard of the CPU it runs on, the writer takes every shard. Taking an `RwLock` shared writes
/// its reader count, so one lock that every operation takes is one cache line every CPU writes;
/// here readers on different CPUs write different lines. It guards no data (the namespace lock:
/// every name lookup and change takes it shared, renames and fsck exclusively).
pub(crate) struct ShardedRwLock {
    shards: Box<[CacheAligned<RwLock<()>>]>,
}

/// Every shard of a [`ShardedRwLock`], held exclusively, in shard order.
pub(crate) struct ShardedWriteGuard<'a> {
    _held: Vec<RwLockWriteGuard<'a, ()>>,
}

impl ShardedRwLock {
    /// A lock of `shards` shards (at least one).
    pub(crate) fn new(shards: usize) -> ShardedRwLock {
        ShardedRwLock { shards: (0..shards.max(1)).map(|_| CacheAligned(RwLock::new(()))).collect() }
    }

    /// One shard per CPU the process may run on (at most 64).
    pub(crate) fn per_cpu() -> ShardedRwLock {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        ShardedRwLock::new(cpus.min(64))
    }

    /// Take it shared: the calling CPU's shard, spinning first. The guard holds that shard
    /// even if the thread moves to another CPU.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, ()> {
        self.read_shard(crate::sys::current_cpu())
    }

    /// Take shard `i` (modulo the count) shared.
    fn read_shard(&self, i: usize) -> RwLockReadGuard<'_, ()> {
        read(&self.shards[i % self.shards.len()].0)
    }

    /// Take it exclusively: every shard, in order, spinning first on each.
    pub(crate) fn write(&self) -> ShardedWriteGuard<'_> {
        ShardedWriteGuard { _held: self.shards.iter().map(|s| write(&s.0)).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_reader_of_any_shard_keeps_the_writer_out_and_readers_share() {
        let l = Arc::new(ShardedRwLock::new(4));
        for i in 0..4 {
            let r = l.read_shard(i);
            // Readers of the same and of other shards share it.
            let (a, b) = (l.read_shard(i), l.read_shard(i + 1));
            drop((a, b));
            let entered = Arc::new(AtomicBool::new(false));
            let writer = {
                let (l, entered) = (Arc::clone(&l), Arc::clone(&entered));
                std::thread::spawn(move || {
                    let _w = l.write();
                    entered.store(true, Ordering::SeqCst);
                })
            };
            std::thread::sleep(Duration::from_millis(100));
            assert!(!entered.load(Ordering::SeqCst), "writer got in past a reader of shard {i}");
            drop(r);
            writer.join().unwrap();
            assert!(entered.load(Ordering::SeqCst));
        }
        drop(l.read());
    }

    #[test]
    fn a_writer_keeps_readers_of_every_shard_out_until_it_lets_go() {
        let l = Arc::new(ShardedRwLock::new(3));
        let w = l.write();
        let entered = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|i| {
                let (l, entered) = (Arc::clone(&l), Arc::clone(&entered));
                std::thread::spawn(move || {
                    let _g = l.read_shard(i);
                    entered.store(true, Ordering::SeqCst);
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        assert!(!entered.load(Ordering::SeqCst), "a reader got in past the writer");
        drop(w);
        for r in readers {
            r.join().unwrap();
        }
        assert!(entered.load(Ordering::SeqCst));
    }

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
