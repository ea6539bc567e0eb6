//! The workload benchmark (`winefs bench workload`): the system-call side of the WineFS paper's
//! evaluation, on winefs and on the host's file systems in one run.
//!
//! - Filebench-like personalities (paper §5.5, Table 1): varmail, fileserver, webserver and
//!   webproxy, each a loop of the flow Filebench defines for it, run by many threads for a
//!   fixed time; every call is one operation, timed on its own (p50, p99, p99.9).
//! - The microbenchmarks of Fig. 6 (b, c): 4 KiB appends with an fsync every ten, sequential
//!   and random 4 KiB reads and in-place writes of one file, one thread.
//! - Scalability (§5.6, Fig. 10): each thread creates a file, appends 4 KiB pieces, fsyncs,
//!   closes and unlinks it, for 1..N threads.
//!
//! Each runs on every setup of [`Setup`] with a fresh file system each time (the aged ones on
//! a copy of one pool aged per workload). File counts are scaled down from the paper's to fit
//! this machine; the report prints both. Nothing here asserts on time: the report gives ratios
//! against tmpfs and libfuse's `passthrough_ll` measured in the same run.

use super::fuse::{FuseServed, check_and_unmount};
use super::syscall::{TempDir, default_dir, fs_type, io_err};
use super::workload_flows::{Measured, measure};
use super::workload_plan::Plan;
pub use super::workload_plan::{Setup, Workload, WorkloadBenchConfig};
use super::syscall::mount_pool;
pub use super::workload_setups::FilePieces;
use super::workload_setups::{LibTarget, LoopFs, PosixTarget, file_pieces, passthrough};
use crate::age::profile::Profile;
use crate::age::{AgeConfig, Ager, CreateMethod, LibraryTarget};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::types::{Consistency, MkfsOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One workload on one setup (at one thread count).
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadRun {
    /// What ran.
    pub workload: Workload,
    /// Where it ran.
    pub setup: Setup,
    /// Threads (the thread count of a scalability point).
    pub threads: usize,
    /// Files of the file set (the Filebench personalities; 1 otherwise).
    pub files: u64,
    /// Operations (calls) timed.
    pub ops: u64,
    /// Wall-clock seconds of the timed part.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median latency of one operation, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile, microseconds.
    pub p999_us: f64,
    /// Why it did not run (a tool or privilege missing); not a failure.
    pub skipped: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// For winefs FUSE mounts: how requests travelled.
    pub transport: Option<String>,
    /// For winefs setups running a Filebench personality: how many pieces the file set's
    /// files were in after the run.
    pub pieces: Option<FilePieces>,
    /// Operations per second of each round, in round order (`WorkloadBenchConfig::rounds`);
    /// the fields above are the median round's.
    pub round_ops_per_s: Vec<f64>,
}

impl WorkloadRun {
    pub(super) fn measured(&self) -> bool {
        self.skipped.is_none() && self.error.is_none() && self.ops > 0
    }
}

/// What one run of the benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadBenchReport {
    /// Every run, in report order.
    pub runs: Vec<WorkloadRun>,
    /// Directory that held the pools, the tmpfs baseline and the images.
    pub dir: PathBuf,
    /// File system type of that directory.
    pub dir_fs: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// Timed seconds per run.
    pub seconds: f64,
    /// Multiplier of the default file counts.
    pub scale: f64,
    /// Size of the microbenchmarks' file.
    pub micro_size: u64,
    /// Utilization of the aged pools, percent.
    pub util_pct: f64,
    /// Rounds per workload (each run reports its median round).
    pub rounds: usize,
    /// The aging runs' summaries, one per workload that ran on an aged pool.
    pub aging: Vec<(Workload, String)>,
}

impl WorkloadBenchReport {
    /// The measured run of `w` on `s` at `threads` (any thread count if None).
    pub fn run(&self, w: Workload, s: Setup, threads: Option<usize>) -> Option<&WorkloadRun> {
        self.runs.iter().find(|r| {
            r.workload == w
                && r.setup == s
                && threads.is_none_or(|t| t == r.threads)
                && r.measured()
        })
    }

    /// ops/s of `a` over ops/s of `b` for `w` (same thread count where both exist): with
    /// several rounds, the median of the rounds' ratios (each round ran both in turn).
    pub fn ratio(&self, w: Workload, a: Setup, b: Setup, threads: Option<usize>) -> Option<f64> {
        let x = self.run(w, a, threads)?;
        let y = self.run(w, b, Some(x.threads))?;
        let (xs, ys) = (&x.round_ops_per_s, &y.round_ops_per_s);
        if xs.len() > 1 && xs.len() == ys.len() && ys.iter().all(|&v| v > 0.0) {
            let by_round: Vec<f64> = xs.iter().zip(ys).map(|(a, b)| a / b).collect();
            return Some(lower_median(by_round));
        }
        (y.ops_per_s > 0.0).then(|| x.ops_per_s / y.ops_per_s)
    }

    /// Whether any winefs run failed.
    pub fn winefs_failed(&self) -> bool {
        self.runs.iter().any(|r| {
            r.error.is_some()
                && matches!(
                    r.setup,
                    Setup::LibStrict
                        | Setup::LibRelaxed
                        | Setup::LibStrictAged
                        | Setup::Fuse
                        | Setup::FuseAged
                )
        })
    }
}

/// Why a setup gave no measurement.
enum NotRun {
    /// It cannot run here (privilege or tool missing): reported, not a failure.
    Skip(String),
    Fail(Error),
}

impl From<Error> for NotRun {
    fn from(e: Error) -> NotRun {
        NotRun::Fail(e)
    }
}

/// Paths and sizes every setup of one workload shares.
struct Place<'a> {
    root: &'a Path,
    pool_size: u64,
    inodes: u64,
    /// The aged pool copied for the aged setups (None: none asked for).
    aged: Option<&'a Path>,
}

impl Place<'_> {
    /// A new pool (or a copy of the aged one) at `root/pool`.
    fn pool(&self, aged: bool) -> Result<PathBuf> {
        let pool = self.root.join("pool");
        let _ = std::fs::remove_file(&pool);
        match (aged, self.aged) {
            (true, Some(a)) => {
                std::fs::copy(a, &pool).map_err(io_err(format!("copy {}", a.display())))?;
            }
            (true, None) => return Err(Error::Invalid("no aged pool was made".into())),
            (false, _) => Fs::mkfs(
                &pool,
                &MkfsOptions {
                    size: Some(self.pool_size),
                    inodes: Some(self.inodes),
                    ..Default::default()
                },
            )?,
        }
        Ok(pool)
    }

    /// A mountpoint outside `root`, so that removing `root` never walks into a live mount.
    fn mountpoint(&self, what: &str) -> Result<TempDir> {
        let m = TempDir(
            std::env::temp_dir().join(format!("winefs-workload-{what}-{}", std::process::id())),
        );
        std::fs::create_dir_all(&m.0).map_err(io_err(format!("mkdir {}", m.0.display())))?;
        Ok(m)
    }
}

/// What one setup's run of a workload gave.
struct SetupRun {
    measured: Vec<Measured>,
    /// For FUSE mounts of winefs: the transport.
    transport: Option<String>,
    /// For winefs and a Filebench personality: the file set's pieces after the run.
    pieces: Option<FilePieces>,
}

/// The file set's pieces on `fs` after workload `p`, for the Filebench personalities (the
/// other workloads' files are gone or one big file).
fn pieces_after(fs: &Fs, p: &Plan) -> Result<Option<FilePieces>> {
    match p.workload.is_filebench() {
        true => file_pieces(fs).map(Some),
        false => Ok(None),
    }
}

/// Run workload `p` on setup `s`: its measurements and what the setup adds to them.
fn run_setup(
    s: Setup,
    p: &Plan,
    place: &Place<'_>,
    counts: &[usize],
) -> std::result::Result<SetupRun, NotRun> {
    let plain = |measured| SetupRun { measured, transport: None, pieces: None };
    match s {
        Setup::LibStrict | Setup::LibRelaxed | Setup::LibStrictAged => {
            let pool = place.pool(s.aged())?;
            let mode = if s == Setup::LibRelaxed {
                Consistency::Relaxed
            } else {
                Consistency::Strict
            };
            let mut t = LibTarget::new(mount_pool(&pool, mode)?)?;
            let m = measure(&mut t, p, counts);
            let pieces = m.is_ok().then(|| pieces_after(&t.fs, p)).transpose();
            check_and_unmount(t.fs)?;
            let _ = std::fs::remove_file(&pool);
            Ok(SetupRun { measured: m?, transport: None, pieces: pieces?.flatten() })
        }
        Setup::Fuse | Setup::FuseAged => {
            let pool = place.pool(s.aged())?;
            let mnt = place.mountpoint("fuse")?;
            // No FUSE here (no /dev/fuse, no permission) is this machine's limit, not winefs's.
            // As `winefs mount` serves by default: a thread per CPU, io_uring where offered.
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            let fs = mount_pool(&pool, Consistency::Strict)?;
            let served = FuseServed::start(
                fs.clone(),
                &mnt.0,
                threads,
                true,
                false,
            )
            .map_err(|e| NotRun::Skip(format!("no FUSE mount here: {e}")))?;
            let transport = served.transport().to_string();
            let m = PosixTarget::new(&mnt.0).and_then(|mut t| measure(&mut t, p, counts));
            let pieces = m.is_ok().then(|| pieces_after(&fs, p)).transpose();
            drop(fs);
            served.stop()?;
            let _ = std::fs::remove_file(&pool);
            Ok(SetupRun { measured: m?, transport: Some(transport), pieces: pieces?.flatten() })
        }
        Setup::Tmpfs => {
            let dir = TempDir(place.root.join("tmpfs"));
            std::fs::create_dir(&dir.0).map_err(io_err(format!("mkdir {}", dir.0.display())))?;
            let mut t = PosixTarget::new(&dir.0)?;
            Ok(plain(measure(&mut t, p, counts)?))
        }
        Setup::Passthrough => {
            let source = TempDir(place.root.join("passthrough-source"));
            let mnt = place.mountpoint("passthrough")?;
            // It holds a descriptor for every inode the kernel knows.
            let fds = p.files + 4096;
            let m = passthrough(&place.root.join("passthrough_ll"), &source.0, &mnt.0, fds)
                .map_err(NotRun::Skip)?;
            let r = PosixTarget::new(&m.at).and_then(|mut t| measure(&mut t, p, counts));
            drop(m);
            Ok(plain(r?))
        }
        Setup::Ext4 | Setup::Xfs => {
            let kind = s.name();
            let mnt = place.mountpoint(kind)?;
            let image = place.root.join(format!("{kind}.img"));
            let lfs = LoopFs::make(kind, &image, &mnt.0, place.pool_size).map_err(NotRun::Skip)?;
            let r = PosixTarget::new(&lfs.mnt).and_then(|mut t| measure(&mut t, p, counts));
            drop(lfs);
            Ok(plain(r?))
        }
    }
}

/// The largest share of a pool the workload's data takes (see [`workload_bench`]).
const DATA_SHARE: f64 = 0.12;

/// Make `path` a pool of `size` aged to `util_pct` (agrawal profile) through the library;
/// its summary in one line.
fn age_pool(path: &Path, size: u64, inodes: u64, cfg: &WorkloadBenchConfig) -> Result<String> {
    Fs::mkfs(
        path,
        &MkfsOptions {
            size: Some(size),
            inodes: Some(inodes),
            ..Default::default()
        },
    )?;
    let fs = Fs::mount(path, Default::default())?;
    let mut acfg = AgeConfig::new(Profile::load("agrawal")?);
    acfg.utilization = cfg.util_pct / 100.0;
    acfg.writes = cfg.age_writes;
    acfg.seed = cfg.seed;
    let target = LibraryTarget {
        fs: fs.clone(),
        method: CreateMethod::default(),
    };
    let rep = Ager::new(&acfg, target)?.run()?;
    let _ = fs.settle_rewrites(Duration::from_secs(600));
    fs.unmount()?;
    Ok(format!(
        "{:.1}% full ({} files), {:.1}x the capacity written",
        rep.usage.utilization() * 100.0,
        rep.live_files,
        rep.written as f64 / rep.usage.capacity.max(1) as f64
    ))
}

/// Run every workload of `cfg` on every setup of it (see the module docs).
pub fn workload_bench(cfg: &WorkloadBenchConfig) -> Result<WorkloadBenchReport> {
    if !(cfg.util_pct > 0.0 && cfg.util_pct < 100.0) {
        return Err(Error::Invalid(format!(
            "--util {} is not a percentage between 0 and 100",
            cfg.util_pct
        )));
    }
    if !(cfg.seconds > 0.0 && cfg.scale > 0.0) {
        return Err(Error::Invalid("seconds and scale must be positive".into()));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let root = TempDir(base.join(format!("winefs-workload-{}", std::process::id())));
    std::fs::create_dir_all(&root.0).map_err(io_err(format!("mkdir {}", root.0.display())))?;
    let max_threads = cfg.max_threads.unwrap_or(cpus).max(1);
    let bar = progress_bar(cfg);
    let mut runs = Vec::new();
    let mut aging = Vec::new();
    for &w in &cfg.workloads {
        let p = Plan::new(w, cfg, cpus);
        // The workload's data takes 12% of the pool, as the paper's 60 GB data sets did of its
        // 500 GB partition aged to 75%, or what the aging leaves free less five points if that
        // is less (the ager holds utilization within about a point of its target).
        let share = (1.0 - cfg.util_pct / 100.0 - 0.05).clamp(0.05, DATA_SHARE);
        let pool_size = ((p.data_bytes() as f64 / share) as u64)
            .max(512 << 20)
            .next_multiple_of(2 << 20);
        let inodes = (p.files * 2 + 8192).max(pool_size / (16 << 10));
        let aged_pool = root.0.join("aged.pool");
        let aged = if cfg.setups.iter().any(|s| s.aged()) {
            bar.set_message(format!(
                "{}: aging a {} MiB pool",
                w.name(),
                pool_size >> 20
            ));
            aging.push((w, age_pool(&aged_pool, pool_size, inodes, cfg)?));
            Some(aged_pool.as_path())
        } else {
            None
        };
        let place = Place {
            root: &root.0,
            pool_size,
            inodes,
            aged,
        };
        let counts: Vec<usize> = if w == Workload::Scale {
            (1..=max_threads).collect()
        } else {
            vec![p.threads]
        };
        // Each round runs every setup in turn; a setup that was skipped or failed is not run
        // again, and its reason is what the report shows.
        let mut rounds: Vec<Vec<Vec<WorkloadRun>>> = vec![Vec::new(); cfg.setups.len()];
        let mut not_run: Vec<Option<WorkloadRun>> = vec![None; cfg.setups.len()];
        for _ in 0..cfg.rounds.max(1) {
            for (k, &s) in cfg.setups.iter().enumerate() {
                if not_run[k].is_some() {
                    bar.inc(1);
                    continue;
                }
                bar.set_message(format!("{} on {}", w.name(), s.label()));
                let base_run = WorkloadRun {
                    workload: w,
                    setup: s,
                    threads: p.threads,
                    files: p.files,
                    ops: 0,
                    seconds: 0.0,
                    ops_per_s: 0.0,
                    p50_us: 0.0,
                    p99_us: 0.0,
                    p999_us: 0.0,
                    skipped: None,
                    error: None,
                    transport: None,
                    pieces: None,
                    round_ops_per_s: Vec::new(),
                };
                match run_setup(s, &p, &place, &counts) {
                    Ok(SetupRun { measured, transport, pieces }) => rounds[k].push(
                        measured
                            .into_iter()
                            .map(|m| WorkloadRun {
                                threads: m.threads,
                                ops: m.ops,
                                seconds: m.seconds,
                                ops_per_s: m.ops as f64 / m.seconds.max(1e-9),
                                p50_us: m.hist.quantile(0.5) as f64 / 1e3,
                                p99_us: m.hist.quantile(0.99) as f64 / 1e3,
                                p999_us: m.hist.quantile(0.999) as f64 / 1e3,
                                transport: transport.clone(),
                                pieces,
                                ..base_run.clone()
                            })
                            .collect(),
                    ),
                    Err(NotRun::Skip(why)) => {
                        not_run[k] = Some(WorkloadRun { skipped: Some(why), ..base_run })
                    }
                    Err(NotRun::Fail(e)) => {
                        not_run[k] = Some(WorkloadRun { error: Some(e.to_string()), ..base_run })
                    }
                }
                bar.inc(1);
            }
        }
        for (k, done) in rounds.into_iter().enumerate() {
            match not_run[k].take() {
                Some(r) => runs.push(r),
                None => runs.extend(median_rounds(done)),
            }
        }
        let _ = std::fs::remove_file(&aged_pool);
    }
    bar.finish_and_clear();
    Ok(WorkloadBenchReport {
        runs,
        dir_fs: fs_type(&base),
        dir: base,
        cpus,
        seconds: cfg.seconds,
        scale: cfg.scale,
        micro_size: cfg.micro_size,
        util_pct: cfg.util_pct,
        rounds: cfg.rounds.max(1),
        aging,
    })
}

/// The lower median of `v` (the middle value; of the two middle ones, the lower).
fn lower_median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

/// One run per thread count from every round's runs (`rounds[i]`: round i's, one per thread
/// count, the same counts each round): the round with the median ops/s, with every round's ops/s.
fn median_rounds(rounds: Vec<Vec<WorkloadRun>>) -> Vec<WorkloadRun> {
    let points = rounds.first().map_or(0, Vec::len);
    (0..points)
        .filter_map(|i| {
            let all: Vec<&WorkloadRun> = rounds.iter().filter_map(|r| r.get(i)).collect();
            let ops: Vec<f64> = all.iter().map(|r| r.ops_per_s).collect();
            let mid = lower_median(ops.clone());
            let pick = all.iter().find(|r| r.ops_per_s == mid)?;
            Some(WorkloadRun { round_ops_per_s: ops, ..(*pick).clone() })
        })
        .collect()
}

fn progress_bar(cfg: &WorkloadBenchConfig) -> indicatif::ProgressBar {
    if !cfg.progress {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(
        (cfg.workloads.len() * cfg.setups.len() * cfg.rounds.max(1)) as u64,
    );
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs: {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With rounds, every setup runs once per round; each run is its median round, with every
    /// round's ops/s, and a ratio is the median of the rounds' ratios.
    #[test]
    fn rounds_report_the_median_round_and_the_median_ratio() {
        let d = tempfile::tempdir().unwrap();
        let cfg = WorkloadBenchConfig {
            dir: Some(d.path().to_path_buf()),
            workloads: vec![Workload::AppendFsync],
            setups: vec![Setup::LibStrict, Setup::Tmpfs],
            micro_size: 1 << 20,
            rounds: 3,
            ..Default::default()
        };
        let rep = workload_bench(&cfg).unwrap();
        let w = Workload::AppendFsync;
        let (lib, tmp) = (
            rep.run(w, Setup::LibStrict, None).unwrap(),
            rep.run(w, Setup::Tmpfs, None).unwrap(),
        );
        for r in [lib, tmp] {
            assert_eq!(r.round_ops_per_s.len(), 3, "{r:?}");
            let mut v = r.round_ops_per_s.clone();
            v.sort_by(f64::total_cmp);
            assert_eq!(r.ops_per_s, v[1], "{r:?}");
        }
        let mut by_round: Vec<f64> = (0..3)
            .map(|i| lib.round_ops_per_s[i] / tmp.round_ops_per_s[i])
            .collect();
        by_round.sort_by(f64::total_cmp);
        assert_eq!(
            rep.ratio(w, Setup::LibStrict, Setup::Tmpfs, None),
            Some(by_round[1])
        );
        assert!(rep.to_string().contains("3 rounds, the setups in turn"));
        let j = serde_json::to_value(&rep).unwrap();
        assert_eq!(j["runs"][0]["round_ops_per_s"].as_array().unwrap().len(), 3);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "left behind");
    }

    /// Every workload kind runs on every setup that can run here, each measured or skipped
    /// for a stated reason; nothing is left behind; the report and its JSON name every run.
    #[test]
    fn every_setup_measures_every_kind_of_workload() {
        // In memory, as the benchmark's default directory: a pool on a disk file system
        // offers no direct path.
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let workloads = vec![
            Workload::Varmail,
            Workload::Webserver,
            Workload::AppendFsync,
            Workload::RandRead,
            Workload::Scale,
        ];
        let cfg = WorkloadBenchConfig {
            dir: Some(d.path().to_path_buf()),
            workloads: workloads.clone(),
            scale: 0.01,
            seconds: 0.2,
            threads: Some(3),
            micro_size: 4 << 20,
            max_threads: Some(2),
            ..Default::default()
        };
        let rep = workload_bench(&cfg).unwrap();
        assert!(!rep.winefs_failed(), "{rep}");
        let root = crate::sys::euid() == 0;
        let floor = Path::new(super::super::fuse::PASSTHROUGH_EXAMPLES)
            .join("passthrough_ll.c")
            .exists();
        for &w in &workloads {
            for s in Setup::ALL {
                let runs: Vec<&WorkloadRun> = rep
                    .runs
                    .iter()
                    .filter(|r| r.workload == w && r.setup == s)
                    .collect();
                let must = match s {
                    // Where loop devices and the mkfs tool are there too.
                    Setup::Ext4 | Setup::Xfs => {
                        root && Path::new("/dev/loop-control").exists()
                            && ["/usr/sbin", "/sbin"]
                                .iter()
                                .any(|d| Path::new(d).join(format!("mkfs.{}", s.name())).exists())
                    }
                    Setup::Passthrough => floor,
                    Setup::Fuse | Setup::FuseAged => Path::new("/dev/fuse").exists(),
                    _ => true,
                };
                if !must {
                    assert!(
                        runs.iter().all(|r| r.skipped.is_some()),
                        "{w:?} {s:?}: {runs:?}"
                    );
                    continue;
                }
                let want = if w == Workload::Scale {
                    vec![1, 2]
                } else if w.is_filebench() {
                    vec![3]
                } else {
                    vec![1]
                };
                assert_eq!(
                    runs.iter().map(|r| r.threads).collect::<Vec<_>>(),
                    want,
                    "{w:?} {s:?}"
                );
                for r in runs {
                    assert!(r.measured(), "{r:?}");
                    assert!(
                        r.p50_us > 0.0 && r.p50_us <= r.p99_us && r.p99_us <= r.p999_us,
                        "{r:?}"
                    );
                    if w.is_filebench() || w == Workload::Scale {
                        assert!(r.seconds >= cfg.seconds, "{r:?}");
                    }
                    // A micro run is one pass over the file, one call per 4 KiB.
                    if !w.is_filebench() && w != Workload::Scale {
                        assert_eq!(r.ops, 1024, "{r:?}");
                    }
                    assert_eq!(
                        r.transport.is_some(),
                        matches!(s, Setup::Fuse | Setup::FuseAged),
                        "{r:?}"
                    );
                    // The file set's pieces are counted on winefs after a personality's run:
                    // every file at least one run, none in more than the allocator allows
                    // (small files, a few pieces each).
                    let winefs = !matches!(
                        s,
                        Setup::Tmpfs | Setup::Passthrough | Setup::Ext4 | Setup::Xfs
                    );
                    match r.pieces {
                        Some(p) => {
                            assert!(winefs && w.is_filebench(), "{r:?}");
                            assert!(p.files > 0 && p.pieces >= p.files, "{r:?}");
                        }
                        None => assert!(!winefs || !w.is_filebench(), "{r:?}"),
                    }
                }
            }
        }
        assert_eq!(rep.aging.len(), workloads.len());
        assert!(
            rep.ratio(Workload::Varmail, Setup::LibStrict, Setup::Tmpfs, None)
                .is_some()
        );
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            0,
            "left behind"
        );
        let text = rep.to_string();
        for w in &workloads {
            assert!(text.contains(&format!("\n{}: ", w.name())), "{text}");
        }
        assert!(
            text.contains("varmail: winefs FUSE / passthrough_ll >= 1"),
            "{text}"
        );
        let j = serde_json::to_value(&rep).unwrap();
        let runs = j["runs"].as_array().unwrap();
        assert_eq!(runs.len(), rep.runs.len());
        assert!(
            runs.iter()
                .any(|r| r["workload"] == "append-fsync" && r["setup"] == "lib-strict-aged")
        );
    }
}
