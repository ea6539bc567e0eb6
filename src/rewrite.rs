//! Reactive rewrite (paper §3.6): a file found fragmented when it is memory-mapped, or given
//! the alignment hint after its data was written (`cp --preserve=xattr` and `rsync -X` set
//! attributes after copying data), is queued; a background thread moves each of its 2 MiB
//! units that holds data but is not one aligned extent onto a fresh aligned extent, one unit
//! per transaction (`file::rewrite_unit`), sleeping between units as long as the unit took,
//! so foreground work keeps at least half of the time. `Fs::rewrite` does the same at once.

use crate::error::{Error, Result};
use crate::fs::{Inner, wlock};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a rewrite did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RewriteStats {
    /// Units moved onto aligned extents.
    pub units_rewritten: u64,
    /// Units holding data that were looked at.
    pub units_seen: u64,
}

/// The background rewriter of one mount: a queue of inode numbers and its thread.
#[derive(Default)]
pub(crate) struct Rewriter {
    state: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    order: VecDeque<u64>,
    queued: HashSet<u64>,
    /// An inode being rewritten (or holes being compacted) right now.
    busy: bool,
    /// Hole compaction asked for (free space in holes passed the trigger).
    compact: bool,
    /// After a pass that emptied nothing, requests are ignored until this many more blocks
    /// have been freed: otherwise, with holes above the trigger and no unit worth emptying,
    /// every free would start another scan of every inode.
    compact_quiet_blocks: u64,
    done: RewriteStats,
    compacted: crate::compact::CompactStats,
}

/// Units emptied per compaction pass: a pass ends (and queued rewrites go first) every 64.
const COMPACT_PASS: u64 = 64;
/// After a compaction pass that emptied nothing, requests wait for this many 2 MiB units to
/// be freed (or 1/32 of the free space, if more) before another pass can find something new.
const COMPACT_QUIET_UNITS: u64 = 4;

fn inner_free_blocks(inner: &Weak<Inner>) -> u64 {
    inner.upgrade().map_or(0, |i| i.alloc.free_blocks())
}

/// The background thread of this mount, started on first use.
fn thread_of(inner: &Inner) -> Option<Arc<Rewriter>> {
    let me = inner.me.get().cloned()?;
    let rw = {
        let mut slot = lock(&inner.rewriter);
        if let Some(rw) = slot.as_ref() {
            rw.clone()
        } else {
            let rw = Arc::new(Rewriter::default());
            let (weak, thread_rw) = (me, rw.clone());
            let started = std::thread::Builder::new()
                .name("winefs-rewrite".into())
                .spawn(move || run(weak, &thread_rw));
            if let Err(e) = started {
                eprintln!("winefs: cannot start the rewrite thread: {e}");
                return None;
            }
            *slot = Some(rw.clone());
            rw
        }
    };
    Some(rw)
}

/// Ask the background thread to compact holes (docs: `compact`), once free space in holes
/// passes the trigger. Cheap when it has not: two counter sums.
pub(crate) fn maybe_compact(inner: &Inner, freed_blocks: u64) {
    if !inner.background_rewrite
        || inner.pool.is_private()
        || !crate::compact::holes_exceed(inner, crate::compact::TRIGGER_SHARE)
    {
        return;
    }
    if let Some(rw) = thread_of(inner) {
        let mut q = lock(&rw.state);
        if q.compact_quiet_blocks > 0 {
            q.compact_quiet_blocks = q.compact_quiet_blocks.saturating_sub(freed_blocks);
            return;
        }
        if !q.compact {
            q.compact = true;
            rw.changed.notify_all();
        }
    }
}

/// Queue `ino` for a background rewrite (starting the thread on first use).
pub(crate) fn queue(inner: &Inner, ino: u64) {
    if !inner.background_rewrite {
        return;
    }
    let Some(rw) = thread_of(inner) else {
        return;
    };
    let mut q = lock(&rw.state);
    if q.queued.insert(ino) {
        q.order.push_back(ino);
        rw.changed.notify_all();
    }
}

fn run(inner: Weak<Inner>, rw: &Rewriter) {
    loop {
        let ino = {
            let mut q = lock(&rw.state);
            loop {
                if inner.strong_count() == 0 {
                    return;
                }
                if let Some(i) = q.order.pop_front() {
                    q.queued.remove(&i);
                    q.busy = true;
                    break Some(i);
                }
                if q.compact {
                    q.compact = false;
                    q.busy = true;
                    break None;
                }
                q = rw
                    .changed
                    .wait_timeout(q, Duration::from_millis(200))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let Some(ino) = ino else {
            let r = crate::compact::compact(&inner, crate::compact::GOAL_SHARE, COMPACT_PASS, true);
            let mut q = lock(&rw.state);
            q.busy = false;
            match r {
                Ok(s) => {
                    q.compacted.units_freed += s.units_freed;
                    q.compacted.blocks_moved += s.blocks_moved;
                    // A full pass may have more to do: go on after anything queued meanwhile.
                    // Requests made during the pass (its own moves free blocks) are covered by
                    // it; a pass that emptied nothing quiets requests for a while.
                    q.compact = s.units_freed == COMPACT_PASS;
                    if s.units_freed == 0 {
                        q.compact_quiet_blocks =
                            COMPACT_QUIET_UNITS.max(inner_free_blocks(&inner) / 32 / 512) * 512;
                    }
                }
                Err(e) => eprintln!("winefs: background hole compaction stopped: {e}"),
            }
            rw.changed.notify_all();
            continue;
        };
        let r = rewrite_file(&inner, ino, true);
        let mut q = lock(&rw.state);
        q.busy = false;
        match r {
            Ok(s) => {
                q.done.units_rewritten += s.units_rewritten;
                q.done.units_seen += s.units_seen;
            }
            Err(e) => eprintln!("winefs: background rewrite of inode {ino} stopped: {e}"),
        }
        rw.changed.notify_all();
    }
}

/// Rewrite every fragmented unit of `ino`, taking the mount and the inode lock one unit at a
/// time (so neither a foreground writer nor an unmount waits long for it).
pub(crate) fn rewrite_file(inner: &Weak<Inner>, ino: u64, throttle: bool) -> Result<RewriteStats> {
    let mut stats = RewriteStats::default();
    let mut next = Some(0u64);
    while let Some(lb) = next {
        let Some(inner) = inner.upgrade() else {
            break;
        };
        let node = match inner.node(ino) {
            Ok(n) => n,
            Err(Error::Stale(_)) => break, // deleted meanwhile
            Err(e) => return Err(e),
        };
        let start = Instant::now();
        let moved = {
            // Like any foreground operation: fsck (which takes it for writing) sees no unit
            // half moved.
            let _ns = inner.ns.read().unwrap_or_else(|e| e.into_inner());
            let mut g = wlock(&node);
            // Freed after the lookup: its DRAM map still lists blocks that are free now.
            if !crate::compact::still_live(&inner, ino, &node) {
                break;
            }
            let Some(first) = g.map.next_mapped(lb) else {
                break;
            };
            inner.check_alive()?;
            let unit = first / 512;
            stats.units_seen += 1;
            next = Some((unit + 1) * 512);
            crate::file::rewrite_unit(&inner, &mut g, unit)?
        };
        drop(inner);
        if moved {
            stats.units_rewritten += 1;
            if throttle {
                std::thread::sleep(start.elapsed());
            }
        }
    }
    Ok(stats)
}

/// Wait until the background queue is empty and idle (or `timeout` passes); returns the
/// totals done by the background thread so far, or None on timeout.
pub(crate) fn settle(inner: &Inner, timeout: Duration) -> Option<RewriteStats> {
    let Some(rw) = lock(&inner.rewriter).clone() else {
        return Some(RewriteStats::default());
    };
    let deadline = Instant::now() + timeout;
    let mut q = lock(&rw.state);
    while q.busy || q.compact || !q.order.is_empty() {
        let left = deadline.checked_duration_since(Instant::now())?;
        q = rw
            .changed
            .wait_timeout(q, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    Some(q.done)
}

/// Blocks relocated per transaction by [`scatter_file`].
const SCATTER_CHUNK: usize = 64;

/// Move every block of `ino` inside its size onto its own 4 KiB block, with a free block
/// between any two: the layout a badly aged file system gives a file. For benchmarks and tests
/// (the "4 KiB-scattered" baseline of `winefs bench mmap`); the content does not change.
pub(crate) fn scatter_file(inner: &Inner, ino: u64) -> Result<u64> {
    let node = inner.node(ino)?;
    let mut g = wlock(&node);
    inner.check_alive()?;
    let blocks = g.hdr.size.div_ceil(crate::layout::BLOCK_SIZE);
    let cpu = crate::fs::current_cpu();
    // Spacers stay allocated until the end, so no later block lands next to an earlier one.
    let mut spacers = Vec::new();
    let mut moved = 0;
    let result = (|| -> Result<()> {
        let mut l = 0;
        while l < blocks {
            let n = (blocks - l).min(SCATTER_CHUNK as u64);
            let mut news = Vec::with_capacity(n as usize);
            let one = || -> Result<u64> {
                let r = inner.alloc.alloc(1, cpu).map_err(|e| {
                    Error::NoSpace(format!("scattering needs twice the file's size free: {e}"))
                })?;
                Ok(r[0].start)
            };
            let got = (|| -> Result<()> {
                for _ in 0..n {
                    news.push(one()?);
                    spacers.push(one()?);
                }
                Ok(())
            })();
            if let Err(e) = got {
                inner.free_runs(&singles(&news));
                return Err(e);
            }
            crate::file::relocate_blocks(inner, &mut g, l, &news)?;
            moved += n;
            l += n;
        }
        Ok(())
    })();
    inner.free_runs(&singles(&spacers));
    result.map(|()| moved)
}

fn singles(blocks: &[u64]) -> Vec<crate::alloc::BlockRun> {
    blocks
        .iter()
        .map(|&b| crate::alloc::BlockRun { start: b, len: 1 })
        .collect()
}
