//! The recording side of the crash explorer: a `PersistObserver` that follows, per cache line,
//! what is guaranteed on media and what may or may not have reached it, and freezes a crash
//! point just before every fence.
//!
//! The model (docs/TESTING.md): media starts as the base image. A line stored to is *dirty*:
//! its current (cache) content may or may not be on media — a write-back cache can evict any
//! dirty line at any moment, flushed or not. A flush (or non-temporal store) snapshots the
//! line; the next fence makes that snapshot the line's guaranteed media content. A crash point
//! is taken at each fence, before it takes effect: the guaranteed image plus, per dirty line
//! whose content differs from it, either value.

use crate::media::pool::{CACHE_LINE, PersistObserver, Pool};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

pub type Line = [u8; CACHE_LINE as usize];

/// The media at one moment: the guaranteed lines (as a prefix of the durable log) and the lines
/// that may or may not have reached media, with their cache content.
#[derive(Clone, Debug)]
pub struct CrashPoint {
    /// Index of the operation in progress; the workload's length for the final point.
    pub op: usize,
    /// Ordinal of the fence this point precedes, counted from the start of the recording.
    pub fence: usize,
    /// How many entries of the durable log are on media.
    pub durable_len: usize,
    /// Lines that may have reached media: (pool offset, content in the cache).
    pub pending: Vec<(u64, Line)>,
}

#[derive(Default)]
struct State {
    op: usize,
    fences: usize,
    /// Guaranteed content of every line that differs from the base image.
    durable: HashMap<u64, Line>,
    /// Every change to `durable`, in order.
    log: Vec<(u64, Line)>,
    dirty: BTreeSet<u64>,
    /// Snapshots taken by flushes since the last fence.
    flushed: BTreeMap<u64, Line>,
    points: Vec<CrashPoint>,
}

/// Records crash points of everything done through one pool.
pub struct Recorder {
    base: Vec<u8>,
    st: Mutex<State>,
}

fn lines(off: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = off & !(CACHE_LINE - 1);
    (first..off + len).step_by(CACHE_LINE as usize)
}

fn read_line(pool: &Pool, line: u64) -> Line {
    // A line inside the pool (every recorded range was bounds-checked by the pool).
    pool.read_array(line).unwrap_or([0; CACHE_LINE as usize])
}

impl Recorder {
    /// A recorder whose media starts as `base` (the pool's bytes when recording starts).
    pub fn new(base: Vec<u8>) -> Recorder {
        Recorder {
            base,
            st: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn base_line(&self, line: u64) -> Line {
        let mut l = [0u8; CACHE_LINE as usize];
        if let Some(b) = self.base.get(line as usize..(line + CACHE_LINE) as usize) {
            l.copy_from_slice(b);
        }
        l
    }

    /// The guaranteed media content of `line`.
    fn durable_line(&self, st: &State, line: u64) -> Line {
        st.durable
            .get(&line)
            .copied()
            .unwrap_or_else(|| self.base_line(line))
    }

    /// Operations from now on belong to operation `op` of the workload.
    pub fn set_op(&self, op: usize) {
        self.lock().op = op;
    }

    fn point(&self, st: &State, pool: &Pool) -> CrashPoint {
        let mut pending = Vec::new();
        for &line in &st.dirty {
            let cur = read_line(pool, line);
            if cur != self.durable_line(st, line) {
                pending.push((line, cur));
            }
        }
        CrashPoint {
            op: st.op,
            fence: st.fences,
            durable_len: st.log.len(),
            pending,
        }
    }

    /// Take the final crash point (after the last operation) and hand over everything.
    pub fn finish(&self, pool: &Pool) -> (Vec<(u64, Line)>, Vec<CrashPoint>) {
        let mut st = self.lock();
        let p = self.point(&st, pool);
        st.points.push(p);
        (std::mem::take(&mut st.log), std::mem::take(&mut st.points))
    }
}

impl PersistObserver for Recorder {
    fn stored(&self, _pool: &Pool, off: u64, len: u64) {
        let mut st = self.lock();
        st.dirty.extend(lines(off, len));
    }

    fn flushed(&self, pool: &Pool, off: u64, len: u64) {
        let mut st = self.lock();
        for line in lines(off, len) {
            st.flushed.insert(line, read_line(pool, line));
            // A line stored through a memory mapping is first seen here, at its write-back:
            // from now on it may or may not be on media, like any line stored through `Pool`.
            st.dirty.insert(line);
        }
    }

    fn fenced(&self, pool: &Pool) {
        let mut st = self.lock();
        let p = self.point(&st, pool);
        st.points.push(p);
        st.fences += 1;
        let flushed = std::mem::take(&mut st.flushed);
        for (line, v) in flushed {
            if self.durable_line(&st, line) != v {
                st.durable.insert(line, v);
                st.log.push((line, v));
            }
            if read_line(pool, line) == v {
                st.dirty.remove(&line);
            }
        }
    }
}
