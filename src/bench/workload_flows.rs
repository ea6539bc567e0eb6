//! The loops of `winefs bench workload` ([`super::workload`]): each thread's share of the file
//! set, one Filebench flow, the Fig. 6 microbenchmarks and the Fig. 10 scalability loop, all
//! generic over [`Target`] and timed call by call.

use super::workload_hist::Hist;
use super::workload_plan::{Plan, Workload};
use super::workload_setups::{FileRef, OpenFor, Target};
use crate::rng::Rng;
use crate::error::{Error, Result};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Bytes per read of a whole file and per write of a new one (Filebench's `iosize`).
const IO_SIZE: usize = 1 << 20;
/// The unit of the microbenchmarks and of the scalability run.
const SMALL_IO: usize = 4096;
/// Appends per file in the scalability run (64 KiB files).
const SCALE_APPENDS: usize = 16;
/// The webserver's shared log is cut back to empty once about this much was appended to it
/// (Filebench lets it grow, which on a fast setup fills any pool within a timed run).
const LOG_MAX: u64 = 64 << 20;
/// A size uniform in 1..=2*mean (so its mean is about `mean`).
fn size(rng: &mut Rng, mean: u64) -> usize {
    (1 + rng.below(2 * mean)) as usize
}

/// Times calls: one histogram and one count per thread.
struct Rec {
    hist: Hist,
    ops: u64,
}

impl Rec {
    fn op<R>(&mut self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let t = Instant::now();
        let r = f()?;
        self.hist.record(t.elapsed().as_nanos() as u64);
        self.ops += 1;
        Ok(r)
    }
}

/// One thread's share of the file set: the files it owns (numbers t, t+T, t+2T, ...) that
/// exist and that do not.
struct Share {
    live: Vec<u64>,
    dead: Vec<u64>,
    rng: Rng,
}

impl Share {
    fn new(p: &Plan, t: usize) -> Share {
        let mine: Vec<u64> = (t as u64..p.files).step_by(p.threads).collect();
        let made = (mine.len() as u64 * p.prealloc_pct).div_ceil(100) as usize;
        Share {
            live: mine[..made].to_vec(),
            dead: mine[made..].to_vec(),
            rng: Rng(p.seed ^ ((t as u64 + 1) << 32)),
        }
    }

    /// A random existing file (staying existing).
    fn any_live(&mut self) -> Option<u64> {
        let i = self.rng.pick(self.live.len());
        self.live.get(i).copied()
    }

    /// A random file moved from `live` to `dead` (to be unlinked), or the other way.
    fn take(&mut self, from_live: bool) -> Option<u64> {
        let (from, to) = if from_live {
            (&mut self.live, &mut self.dead)
        } else {
            (&mut self.dead, &mut self.live)
        };
        if from.is_empty() {
            return None;
        }
        let f = from.swap_remove(self.rng.pick(from.len()));
        to.push(f);
        Some(f)
    }
}

/// Per-thread buffers.
struct Bufs {
    read: Vec<u8>,
    data: Vec<u8>,
    /// Bytes this thread appended to the shared log since it last cut it.
    logged: u64,
}

impl Bufs {
    fn new() -> Bufs {
        Bufs {
            read: vec![0; IO_SIZE],
            data: vec![0x5a; IO_SIZE],
            logged: 0,
        }
    }
}

/// Write `len` bytes at the end of `h` in pieces of at most `IO_SIZE`.
fn append_len<T: Target>(t: &T, h: &mut T::File, data: &[u8], len: usize) -> Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(data.len());
        t.append(h, &data[..n])?;
        left -= n;
    }
    Ok(())
}

/// Read `h` to its end in `buf`-sized pieces.
fn read_whole<T: Target>(t: &T, h: &T::File, buf: &mut [u8]) -> Result<()> {
    let mut off = 0u64;
    loop {
        match t.read_at(h, off, buf)? {
            0 => return Ok(()),
            n => off += n as u64,
        }
    }
}

/// Open a random existing file, read it whole and close it: three operations.
fn open_read_close<T: Target>(
    t: &T,
    p: &Plan,
    s: &mut Share,
    b: &mut Bufs,
    r: &mut Rec,
) -> Result<()> {
    let Some(f) = s.any_live() else { return Ok(()) };
    let h = r.op(|| t.open(p.file(f), OpenFor::Read))?;
    r.op(|| read_whole(t, &h, &mut b.read))?;
    r.op(|| t.close(h))
}

/// Create a file that does not exist, append to it (then fsync it if `sync`) and close it.
fn create_append<T: Target>(
    t: &T,
    p: &Plan,
    s: &mut Share,
    b: &Bufs,
    r: &mut Rec,
    sync: bool,
) -> Result<()> {
    let Some(f) = s.take(false) else {
        return Ok(());
    };
    let mut h = r.op(|| t.create(p.file(f)))?;
    let n = size(&mut s.rng, p.append_mean);
    r.op(|| append_len(t, &mut h, &b.data, n))?;
    if sync {
        r.op(|| t.fsync(&h))?;
    }
    r.op(|| t.close(h))
}

/// One loop of a Filebench personality's flow (see [`Spec::flow`]).
fn flow<T: Target>(
    t: &T,
    p: &Plan,
    s: &mut Share,
    b: &mut Bufs,
    r: &mut Rec,
    log: &mut Option<T::File>,
) -> Result<()> {
    match p.workload {
        Workload::Varmail => {
            if let Some(f) = s.take(true) {
                r.op(|| t.unlink(p.file(f)))?;
            }
            create_append(t, p, s, b, r, true)?;
            if let Some(f) = s.any_live() {
                let mut h = r.op(|| t.open(p.file(f), OpenFor::Append))?;
                r.op(|| read_whole(t, &h, &mut b.read))?;
                let n = size(&mut s.rng, p.append_mean);
                r.op(|| append_len(t, &mut h, &b.data, n))?;
                r.op(|| t.fsync(&h))?;
                r.op(|| t.close(h))?;
            }
            open_read_close(t, p, s, b, r)
        }
        Workload::Fileserver => {
            if let Some(f) = s.take(false) {
                let mut h = r.op(|| t.create(p.file(f)))?;
                let n = size(&mut s.rng, p.mean_size);
                r.op(|| append_len(t, &mut h, &b.data, n))?;
                r.op(|| t.close(h))?;
            }
            if let Some(f) = s.any_live() {
                let mut h = r.op(|| t.open(p.file(f), OpenFor::Append))?;
                let n = size(&mut s.rng, p.append_mean);
                r.op(|| append_len(t, &mut h, &b.data, n))?;
                r.op(|| t.close(h))?;
            }
            open_read_close(t, p, s, b, r)?;
            if let Some(f) = s.take(true) {
                r.op(|| t.unlink(p.file(f)))?;
            }
            match s.any_live() {
                Some(f) => r.op(|| t.stat(p.file(f))).map(drop),
                None => Ok(()),
            }
        }
        Workload::Webserver => {
            for _ in 0..10 {
                open_read_close(t, p, s, b, r)?;
            }
            let Some(h) = log else { return Ok(()) };
            let n = size(&mut s.rng, p.append_mean);
            r.op(|| append_len(t, h, &b.data, n))?;
            // Each thread's share of the bound: the log never holds much more than LOG_MAX.
            b.logged += n as u64;
            if b.logged > LOG_MAX / p.threads as u64 {
                b.logged = 0;
                t.truncate(h, 0)?;
            }
            Ok(())
        }
        Workload::Webproxy => {
            if let Some(f) = s.take(true) {
                r.op(|| t.unlink(p.file(f)))?;
            }
            create_append(t, p, s, b, r, false)?;
            for _ in 0..5 {
                open_read_close(t, p, s, b, r)?;
            }
            Ok(())
        }
        _ => Err(Error::Invalid(format!(
            "{} is not a Filebench personality",
            p.workload.name()
        ))),
    }
}

/// The shared log of the webserver personality: the file after the set.
fn log_file(p: &Plan) -> FileRef {
    FileRef {
        dir: 0,
        idx: p.files,
    }
}

/// Make the directories and the files each thread starts with (not timed).
fn prepare<T: Target>(t: &mut T, p: &Plan) -> Result<()> {
    t.make_dirs(p.dirs.max(1))?;
    let t = &*t;
    if p.workload == Workload::Webserver {
        t.close(t.create(log_file(p))?)?;
    }
    std::thread::scope(|sc| {
        let jobs: Vec<_> = (0..p.threads)
            .map(|i| {
                sc.spawn(move || -> Result<()> {
                    let mut s = Share::new(p, i);
                    let data = vec![0xa5u8; IO_SIZE];
                    for f in s.live.clone() {
                        let mut h = t.create(p.file(f))?;
                        let n = size(&mut s.rng, p.mean_size);
                        append_len(t, &mut h, &data, n)?;
                        t.close(h)?;
                    }
                    Ok(())
                })
            })
            .collect();
        jobs.into_iter().try_for_each(|j| {
            j.join()
                .unwrap_or_else(|_| Err(Error::Invalid("a preparing thread panicked".into())))
        })
    })
}

/// Write to `bytes` (at most 1 GiB) of fresh memory and free it again, just before a timed run,
/// so that the free pages the run's page cache and files take first are ones the host has
/// backed. This machine is a virtual machine that hands freed memory back to its host (free
/// page reporting: 630 GB reported since boot when this was found), and the first write to a
/// page handed back costs a fault on the host: a FUSE read of 128 KiB into new page-cache pages
/// took about 290 µs instead of 10, so whether a run happened on such pages decided its result
/// (sequential FUSE reads 150K or 800K/s). The guest's allocator gives out the pages just freed
/// before those it has reported. Elsewhere it costs about a tenth of a second and changes
/// nothing.
fn back_free_memory(bytes: u64) {
    const PAGE: usize = 4096;
    let len = usize::try_from(bytes.min(1 << 30)).unwrap_or(1 << 30);
    let mut fresh = vec![0u8; len];
    for i in (0..len).step_by(PAGE) {
        fresh[i] = 1;
    }
    std::hint::black_box(&fresh);
}

/// What a timed run measured.
pub(super) struct Measured {
    pub(super) threads: usize,
    pub(super) ops: u64,
    pub(super) seconds: f64,
    pub(super) hist: Hist,
}

/// Run `threads` threads doing `each` until `seconds` pass; their counts and latencies merged.
fn timed_threads<F>(threads: usize, seconds: f64, each: F) -> Result<Measured>
where
    F: Fn(usize, Instant, &mut Rec) -> Result<()> + Sync,
{
    let start = Barrier::new(threads);
    let recs: Vec<Result<(Rec, Instant, Instant)>> = std::thread::scope(|sc| {
        let jobs: Vec<_> = (0..threads)
            .map(|i| {
                let (start, each) = (&start, &each);
                sc.spawn(move || -> Result<(Rec, Instant, Instant)> {
                    let mut r = Rec {
                        hist: Hist::new(),
                        ops: 0,
                    };
                    start.wait();
                    let t0 = Instant::now();
                    each(i, t0 + Duration::from_secs_f64(seconds), &mut r)?;
                    Ok((r, t0, Instant::now()))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(Error::Invalid("a workload thread panicked".into())))
            })
            .collect()
    });
    let mut m = Measured {
        threads,
        ops: 0,
        seconds: 0.0,
        hist: Hist::new(),
    };
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for r in recs {
        let (r, t0, t1) = r?;
        m.ops += r.ops;
        m.hist.merge(&r.hist);
        first = Some(first.map_or(t0, |f| f.min(t0)));
        last = Some(last.map_or(t1, |l| l.max(t1)));
    }
    // From the first thread's start to the last one's end.
    if let (Some(a), Some(b)) = (first, last) {
        m.seconds = (b - a).as_secs_f64();
    }
    Ok(m)
}

/// Run workload `p` on a target that `prepare` has not touched yet.
fn run_on<T: Target>(t: &mut T, p: &Plan) -> Result<Measured> {
    match p.workload {
        w if w.is_filebench() => {
            prepare(t, p)?;
            back_free_memory(p.files * p.mean_size);
            let t = &*t;
            timed_threads(p.threads, p.seconds, |i, deadline, r| {
                let mut s = Share::new(p, i);
                let mut b = Bufs::new();
                let mut log = if w == Workload::Webserver {
                    Some(t.open(log_file(p), OpenFor::Append)?)
                } else {
                    None
                };
                while Instant::now() < deadline {
                    flow(t, p, &mut s, &mut b, r, &mut log)?;
                }
                log.map_or(Ok(()), |h| t.close(h))
            })
        }
        Workload::Scale => Err(Error::Invalid(
            "the scalability run is measured per thread count".into(),
        )),
        w => micro(t, p, w),
    }
}

/// Every measurement of workload `p` on a fresh target: one, or one per thread count of
/// `counts` for the scalability run (which leaves no files behind, so one target serves all).
pub(super) fn measure<T: Target>(t: &mut T, p: &Plan, counts: &[usize]) -> Result<Vec<Measured>> {
    if p.workload != Workload::Scale {
        return Ok(vec![run_on(t, p)?]);
    }
    t.make_dirs(1)?;
    counts.iter().map(|&n| run_scale(t, p, n)).collect()
}

/// The scalability flow at `threads` threads.
fn run_scale<T: Target>(t: &T, p: &Plan, threads: usize) -> Result<Measured> {
    timed_threads(threads, p.seconds, |i, deadline, r| {
        let data = vec![0x3cu8; SMALL_IO];
        let f = FileRef {
            dir: 0,
            idx: i as u64,
        };
        while Instant::now() < deadline {
            let mut h = r.op(|| t.create(f))?;
            for _ in 0..SCALE_APPENDS {
                r.op(|| t.append(&mut h, &data))?;
            }
            r.op(|| t.fsync(&h))?;
            r.op(|| t.close(h))?;
            r.op(|| t.unlink(f))?;
        }
        Ok(())
    })
}

/// The Fig. 6 microbenchmarks: one file of `micro_size`, one pass of 4 KiB operations.
fn micro<T: Target>(t: &mut T, p: &Plan, w: Workload) -> Result<Measured> {
    t.make_dirs(1)?;
    let t = &*t;
    let f = FileRef { dir: 0, idx: 0 };
    let n = (p.micro_size / SMALL_IO as u64).max(1);
    let data = vec![0x6bu8; IO_SIZE];
    let mut r = Rec {
        hist: Hist::new(),
        ops: 0,
    };
    let t0;
    if w == Workload::AppendFsync {
        let mut h = t.create(f)?;
        back_free_memory(p.micro_size);
        t0 = Instant::now();
        for i in 0..n {
            r.op(|| {
                t.append(&mut h, &data[..SMALL_IO])?;
                if i % 10 == 9 { t.fsync(&h) } else { Ok(()) }
            })?;
        }
        let secs = t0.elapsed().as_secs_f64();
        t.close(h)?;
        return Ok(Measured {
            threads: 1,
            ops: r.ops,
            seconds: secs,
            hist: r.hist,
        });
    }
    let mut h = t.create(f)?;
    append_len(t, &mut h, &data, (n * SMALL_IO as u64) as usize)?;
    t.fsync(&h)?;
    t.close(h)?;
    let how = if matches!(w, Workload::SeqRead | Workload::RandRead) {
        OpenFor::Read
    } else {
        OpenFor::Write
    };
    let h = t.open(f, how)?;
    let mut rng = Rng(p.seed);
    // A page-aligned buffer: where a heap buffer lands against the pool's pages changed a
    // 4 KiB copy's speed up to twofold (between setups of one run, and between builds).
    let mut backing = vec![0u8; 2 * SMALL_IO];
    let skip = backing.as_ptr().align_offset(SMALL_IO).min(SMALL_IO);
    let buf = &mut backing[skip..skip + SMALL_IO];
    back_free_memory(p.micro_size);
    t0 = Instant::now();
    for i in 0..n {
        let off = match w {
            Workload::RandRead | Workload::RandWrite => rng.below(n),
            _ => i,
        } * SMALL_IO as u64;
        match how {
            OpenFor::Read => r.op(|| match t.read_at(&h, off, buf)? {
                SMALL_IO => Ok(()),
                got => Err(Error::Invalid(format!(
                    "read {got} of {SMALL_IO} bytes at {off}"
                ))),
            })?,
            _ => r.op(|| t.write_at(&h, off, &data[..SMALL_IO]))?,
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    t.close(h)?;
    Ok(Measured {
        threads: 1,
        ops: r.ops,
        seconds: secs,
        hist: r.hist,
    })
}

#[cfg(test)]
mod tests {
    use super::super::workload_plan::{Setup, WorkloadBenchConfig};
    use super::*;

    /// Each thread owns its own files, `prealloc_pct` of them made; together they cover the set.
    #[test]
    fn shares_split_the_file_set() {
        let cfg = WorkloadBenchConfig {
            scale: 0.01,
            threads: Some(3),
            ..Default::default()
        };
        let p = Plan::new(Workload::Varmail, &cfg, 2);
        assert_eq!((p.files, p.threads, p.dirs), (100, 3, 1));
        let mut all: Vec<u64> = Vec::new();
        let mut live = 0;
        for t in 0..3 {
            let s = Share::new(&p, t);
            live += s.live.len();
            all.extend(s.live.iter().chain(&s.dead));
        }
        all.sort();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert!((80..=82).contains(&live), "{live}");
        // The paper's thread counts, scaled to the CPUs here (one socket of 14 cores there).
        let d = WorkloadBenchConfig::default();
        assert_eq!(Plan::new(Workload::Webproxy, &d, 2).threads, 15);
        assert_eq!(Plan::new(Workload::Varmail, &d, 2).threads, 3);
        assert_eq!(Plan::new(Workload::Fileserver, &d, 2).dirs, 63);
        assert_eq!(Plan::new(Workload::SeqRead, &d, 16).threads, 1);
        assert_eq!(Workload::parse("webproxy"), Ok(Workload::Webproxy));
        assert!(Workload::parse("mail").unwrap_err().contains("varmail"));
        assert_eq!(Setup::parse("xfs"), Ok(Setup::Xfs));
    }
}
