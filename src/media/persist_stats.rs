//! Persistence accounting: what each store, write-back and fence is for ([`Category`]), and the
//! counters a pool keeps of them, per pool (`Counters`, summed over threads) and per thread
//! ([`thread_stats`]).
//!
//! Counting must not slow what it counts. A pool's counters are sharded by thread: a thread
//! adds to its own shard with a plain load and store, not a locked read-modify-write, because
//! a locked instruction waits for the thread's pending non-temporal stores to drain — after
//! each 4 KiB copy, that made every counted copy wait for the one before it.
#![deny(clippy::cast_possible_truncation)]

use crate::spin::CacheAligned;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a write or flush is for, so write amplification can be measured per kind of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// File contents written by the caller, at their place in the file.
    Data = 0,
    /// Inodes, extent records, directory, xattr and index blocks, the superblock, the bitmap.
    Metadata = 1,
    /// Journal entries and undo staging.
    Journal = 2,
    /// Bytes a copy-on-write stores that the caller did not write: old content copied into the
    /// new blocks, and the zeros that fill new blocks around a write.
    Cow = 3,
    /// Alternate slots: file contents stored in a slot, and the slot descriptors.
    Slot = 4,
    /// Slot contents written back to their place in the file.
    WriteBack = 5,
}

/// Number of [`Category`] values.
pub const CATEGORIES: usize = 6;

impl Category {
    /// Every category, in index order.
    pub const ALL: [Category; CATEGORIES] = [
        Category::Data,
        Category::Metadata,
        Category::Journal,
        Category::Cow,
        Category::Slot,
        Category::WriteBack,
    ];

    /// Short name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Category::Data => "data",
            Category::Metadata => "metadata",
            Category::Journal => "journal",
            Category::Cow => "cow",
            Category::Slot => "slot",
            Category::WriteBack => "writeback",
        }
    }
}

/// Bytes written and cache lines flushed per category, and fences issued: since the pool was
/// opened (`Pool::stats`) or by the calling thread ([`thread_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PersistStats {
    /// Bytes stored, indexed by `Category as usize`.
    pub bytes_written: [u64; CATEGORIES],
    /// Cache lines written back (or stored non-temporally), indexed by `Category as usize`.
    pub lines_flushed: [u64; CATEGORIES],
    /// Store fences issued.
    pub fences: u64,
}

impl PersistStats {
    /// Counters from `earlier` to `self` (both from the same source).
    pub fn since(&self, earlier: &PersistStats) -> PersistStats {
        let mut d = PersistStats {
            fences: self.fences.saturating_sub(earlier.fences),
            ..Default::default()
        };
        for i in 0..CATEGORIES {
            d.bytes_written[i] = self.bytes_written[i].saturating_sub(earlier.bytes_written[i]);
            d.lines_flushed[i] = self.lines_flushed[i].saturating_sub(earlier.lines_flushed[i]);
        }
        d
    }

    /// Bytes stored in every category together.
    pub fn total_bytes(&self) -> u64 {
        self.bytes_written.iter().sum()
    }
}

/// One thread's counters: bytes and lines per category, then fences.
type ThreadCounters = [std::cell::Cell<u64>; 2 * CATEGORIES + 1];

thread_local! {
    /// What this thread has written through any pool, so an operation can count its own
    /// traffic while other threads write concurrently.
    static THREAD_STATS: ThreadCounters = const {
        [const { std::cell::Cell::new(0) }; 2 * CATEGORIES + 1]
    };
}

/// Persistence traffic of the calling thread, through every pool, since it started.
pub fn thread_stats() -> PersistStats {
    THREAD_STATS.with(|c| {
        let mut s = PersistStats {
            fences: c[2 * CATEGORIES].get(),
            ..Default::default()
        };
        for i in 0..CATEGORIES {
            s.bytes_written[i] = c[i].get();
            s.lines_flushed[i] = c[CATEGORIES + i].get();
        }
        s
    })
}

/// Add `n` to this thread's counter `i` (see [`ThreadCounters`]).
fn thread_count(i: usize, n: u64) {
    THREAD_STATS.with(|c| c[i].set(c[i].get() + n));
}

/// Counters per shard: bytes and lines per category, then fences (as [`ThreadCounters`]).
const FIELDS: usize = 2 * CATEGORIES + 1;
/// Shards owned by one thread each: a thread takes one at its first count and gives it back
/// when it exits, so up to this many threads counting at once have one apiece; more share the
/// last shard, which they update with atomic adds.
const OWNED_SHARDS: usize = 32;

/// One shard of `N` counters, on cache lines of its own so threads never write each other's
/// lines.
type Shard<const N: usize> = CacheAligned<[AtomicU64; N]>;

/// The owned shards not held by a live thread.
struct ShardPool {
    /// Shards given back by threads that exited.
    freed: Vec<usize>,
    /// Shards `next..OWNED_SHARDS` were never handed out.
    next: usize,
}

impl ShardPool {
    /// A free owned shard, or `OWNED_SHARDS` (the shared one) when none is.
    fn take(&mut self) -> usize {
        self.freed.pop().unwrap_or_else(|| {
            let s = self.next.min(OWNED_SHARDS);
            self.next = s + 1;
            s
        })
    }

    /// Shard `s`'s thread exited.
    fn give_back(&mut self, s: usize) {
        if s < OWNED_SHARDS {
            self.freed.push(s);
        }
    }
}

static SHARDS: Mutex<ShardPool> = Mutex::new(ShardPool {
    freed: Vec::new(),
    next: 0,
});

/// A thread's shard, given back when the thread exits. The mutex orders the last owner's
/// stores before the next owner's.
struct ShardClaim(usize);

impl Drop for ShardClaim {
    fn drop(&mut self) {
        SHARDS.lock().unwrap_or_else(|e| e.into_inner()).give_back(self.0);
    }
}

/// The shard of the calling thread (process-wide, the same in every pool). Counts made while
/// the thread is being torn down, after its claim was given back, go to the shared shard.
fn my_shard() -> usize {
    thread_local! {
        static SHARD: ShardClaim =
            ShardClaim(SHARDS.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
    SHARD.try_with(|s| s.0).unwrap_or(OWNED_SHARDS)
}

/// `N` counters that threads add to without a locked instruction: each thread adds to its own
/// shard with a plain load and store (see the module doc); reads sum the shards.
pub(crate) struct ThreadSharded<const N: usize> {
    shards: Box<[Shard<N>]>,
}

impl<const N: usize> Default for ThreadSharded<N> {
    fn default() -> Self {
        let shard = || CacheAligned(std::array::from_fn(|_| AtomicU64::new(0)));
        ThreadSharded { shards: (0..=OWNED_SHARDS).map(|_| shard()).collect() }
    }
}

impl<const N: usize> ThreadSharded<N> {
    /// Add `n` to counter `i` (< `N`).
    pub(crate) fn add(&self, i: usize, n: u64) {
        let s = my_shard();
        let c = &self.shards[s].0[i];
        if s < OWNED_SHARDS {
            // Only this thread writes this shard: no other update can slip in between.
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counter `i` summed over every thread.
    pub(crate) fn sum(&self, i: usize) -> u64 {
        self.shards.iter().map(|s| s.0[i].load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
    }
}

/// A pool's counters: sums over every thread that wrote through it.
#[derive(Default)]
pub(crate) struct Counters {
    shards: ThreadSharded<FIELDS>,
}

impl Counters {
    fn add(&self, i: usize, n: u64) {
        self.shards.add(i, n);
        thread_count(i, n);
    }
    pub(crate) fn bytes(&self, cat: Category, n: u64) {
        self.add(cat as usize, n);
    }
    pub(crate) fn lines(&self, cat: Category, n: u64) {
        self.add(CATEGORIES + cat as usize, n);
    }
    pub(crate) fn fence(&self) {
        self.add(2 * CATEGORIES, 1);
    }
    /// The sums over all threads.
    pub(crate) fn stats(&self) -> PersistStats {
        let sum = |i: usize| self.shards.sum(i);
        let mut s = PersistStats { fences: sum(2 * CATEGORIES), ..Default::default() };
        for i in 0..CATEGORIES {
            s.bytes_written[i] = sum(i);
            s.lines_flushed[i] = sum(CATEGORIES + i);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_of_exited_threads_are_handed_out_again() {
        let mut p = ShardPool {
            freed: Vec::new(),
            next: 0,
        };
        let taken: Vec<usize> = (0..OWNED_SHARDS).map(|_| p.take()).collect();
        assert_eq!(taken, (0..OWNED_SHARDS).collect::<Vec<_>>());
        // All owned: the next thread shares the last shard.
        assert_eq!(p.take(), OWNED_SHARDS);
        // A thread exits: its shard is the next one handed out, and only once.
        p.give_back(7);
        p.give_back(OWNED_SHARDS); // the shared shard is never handed out as owned
        assert_eq!(p.take(), 7);
        assert_eq!(p.take(), OWNED_SHARDS);
    }

    #[test]
    fn counts_from_many_threads_add_up_exactly() {
        // More threads than owned shards: the late ones share the last shard atomically.
        let c = Counters::default();
        std::thread::scope(|s| {
            for _ in 0..OWNED_SHARDS + 8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.bytes(Category::Slot, 3);
                        c.lines(Category::Data, 1);
                        c.fence();
                    }
                });
            }
        });
        let st = c.stats();
        let n = (OWNED_SHARDS as u64 + 8) * 1000;
        assert_eq!(st.bytes_written[Category::Slot as usize], 3 * n);
        assert_eq!(st.lines_flushed[Category::Data as usize], n);
        assert_eq!(st.fences, n);
        assert_eq!(st.total_bytes(), 3 * n);
    }
}
