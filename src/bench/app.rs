//! The application benchmark (`winefs bench app`): real programs, unmodified, on three setups
//! in one run, each on a clean and on an aged file system:
//!
//! - **tmpfs**: a directory on a `huge=always` tmpfs (the upper bound);
//! - **FUSE**: a winefs pool on a hugepage tmpfs, mounted with `winefs mount POOL MNT -f`;
//! - **preload**: the same mount, the programs run with `LD_PRELOAD=libwinefs_preload.so` (found
//!   beside the `winefs` executable), which sends their data calls on winefs files to the pool.
//!
//! Aged: the tmpfs directory is aged with `winefs age --dir` and the pool with `winefs age POOL`
//! (both to `util_pct`, `age_writes` times the capacity written), then the same programs run in
//! the space left.
//!
//! Programs: an LMDB YCSB-like driver in C (`lmdb_ycsb.c`, compiled at run time against the
//! Debian liblmdb; `MDB_WRITEMAP`, so the database is one ftruncated file used through a shared
//! mapping) running load, then A, B, C, F and D, each in a process of its own, so each opens
//! and maps the database afresh; and RocksDB's `db_bench` (Debian
//! rocksdb-tools) fillrandom, readrandom and readwhilewriting with `--mmap_read=1`, then
//! readrandom again with `--mmap_read=0` (RocksDB's default: tables read with pread), each its
//! own process run under `app_run.c`, which reports its page faults (wait4). Ratios are printed
//! against the targets: preload/tmpfs ≥ 0.9, preload/FUSE ≥ 3 on read-heavy workloads, aged/clean
//! ops ≥ 0.95 and aged/clean page faults ≤ 1.2.

use super::app_env::{AgeTarget, AppEnv};
use super::syscall::{fmt_rate, io_err};
use crate::error::{Error, Result};
use crate::units::format_size;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The LMDB phases, in the order they run, one driver process each (D inserts, so it runs last).
pub const LMDB_PHASES: &str = "LABCFD";
/// The db_bench runs, one process each, in order: (workload name, benchmark, `--mmap_read`).
pub const ROCKSDB_BENCHES: [(&str, &str, u8); 4] = [
    ("fillrandom", "fillrandom", 1),
    ("readrandom", "readrandom", 1),
    ("readwhilewriting", "readwhilewriting", 1),
    ("readrandom pread", "readrandom", 0),
];
/// Workloads held to preload/FUSE ≥ 3 (read-heavy).
pub const READ_HEAVY: [&str; 5] =
    ["lmdb B", "lmdb C", "lmdb D", "rocksdb readrandom", "rocksdb readrandom pread"];
/// The preload library's file name, looked for beside the `winefs` executable.
pub const PRELOAD_LIB: &str = "libwinefs_preload.so";

/// What to run.
#[derive(Clone, Debug)]
pub struct AppBenchConfig {
    /// Where the benchmark makes its directory (mountpoints, logs, compiled helpers).
    pub dir: Option<PathBuf>,
    /// LMDB records loaded.
    pub records: u64,
    /// LMDB value size in bytes.
    pub value_size: u64,
    /// LMDB operations per workload (A, B, C, D, F).
    pub ops: u64,
    /// db_bench `--num` (keys written by fillrandom; also the reads of the read benchmarks).
    pub rocksdb_num: u64,
    /// Size of the winefs pool, and of the tmpfs the tmpfs setup runs on.
    pub pool_size: u64,
    /// Utilization the aged runs age to, in percent.
    pub util_pct: f64,
    /// Bytes the ager writes, as a multiple of the capacity (the fill counts).
    pub age_writes: f64,
    /// Seed of the drivers and the ager.
    pub seed: u64,
    /// Runs of the programs per setup and state (the best ops/s of each workload is kept).
    pub repeats: u32,
    /// Clean runs only.
    pub skip_aged: bool,
    /// LMDB only.
    pub skip_rocksdb: bool,
}

impl Default for AppBenchConfig {
    fn default() -> Self {
        AppBenchConfig {
            dir: None,
            records: 200_000,
            value_size: 1000,
            ops: 100_000,
            rocksdb_num: 200_000,
            pool_size: 3 << 30,
            util_pct: 75.0,
            age_writes: 1.5,
            seed: 1,
            repeats: 1,
            skip_aged: false,
            skip_rocksdb: false,
        }
    }
}

/// Where a program ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Setup {
    /// A directory on a hugepage tmpfs.
    Tmpfs,
    /// A winefs FUSE mount, the program run plain.
    Fuse,
    /// The same mount, the program run with the preload library.
    Preload,
}

impl Setup {
    /// All three, in report order.
    pub const ALL: [Setup; 3] = [Setup::Tmpfs, Setup::Fuse, Setup::Preload];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Setup::Tmpfs => "tmpfs",
            Setup::Fuse => "FUSE",
            Setup::Preload => "preload",
        }
    }
}

/// Whether the file system was fresh or aged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    /// Fresh.
    Clean,
    /// Aged by `winefs age`.
    Aged,
}

impl PoolState {
    pub(crate) fn label(self) -> &'static str {
        match self {
            PoolState::Clean => "clean",
            PoolState::Aged => "aged",
        }
    }
}

/// One workload on one setup and state.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// "lmdb A", "rocksdb readrandom", ...
    pub workload: String,
    /// Where it ran.
    pub setup: Setup,
    /// On a clean or an aged file system.
    pub state: PoolState,
    /// Operations done.
    pub ops: u64,
    /// Seconds they took.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Minor page faults (LMDB: the driver's own, over the phase; db_bench: the process's).
    pub minflt: u64,
    /// Major page faults.
    pub majflt: u64,
}

impl Measurement {
    /// Minor and major page faults.
    pub fn faults(&self) -> u64 {
        self.minflt + self.majflt
    }
}

/// The preload library's counters, summed over the JSON lines of its stats file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PreloadStats {
    /// mmap calls on winefs files served from the pool.
    pub mmap_direct: u64,
    /// mmap calls on winefs files left to FUSE.
    pub mmap_fuse: u64,
    /// read/pread calls served from the pool.
    pub read_direct: u64,
    /// read/pread calls left to FUSE.
    pub read_fuse: u64,
    /// write/pwrite calls served from the pool.
    pub write_direct: u64,
    /// write/pwrite calls left to FUSE.
    pub write_fuse: u64,
}

impl PreloadStats {
    /// Calls that went direct.
    pub fn direct(&self) -> u64 {
        self.mmap_direct + self.read_direct + self.write_direct
    }

    /// All counted calls.
    pub fn total(&self) -> u64 {
        self.direct() + self.mmap_fuse + self.read_fuse + self.write_fuse
    }

    fn add(&mut self, o: &PreloadStats) {
        self.mmap_direct += o.mmap_direct;
        self.mmap_fuse += o.mmap_fuse;
        self.read_direct += o.read_direct;
        self.read_fuse += o.read_fuse;
        self.write_direct += o.write_direct;
        self.write_fuse += o.write_fuse;
    }
}

/// The preload statistics of one program's preloaded runs in one state.
#[derive(Clone, Debug, Serialize)]
pub struct StatsRow {
    /// "lmdb" or "rocksdb".
    pub program: String,
    /// Clean or aged.
    pub state: PoolState,
    /// Processes that wrote a line (0: the stats file never appeared).
    pub processes: u64,
    /// The counters, summed (None when no process wrote any).
    pub stats: Option<PreloadStats>,
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct AppBenchReport {
    /// LMDB records.
    pub records: u64,
    /// LMDB value size.
    pub value_size: u64,
    /// LMDB operations per workload.
    pub ops: u64,
    /// db_bench `--num` (0: RocksDB skipped).
    pub rocksdb_num: u64,
    /// Pool (and tmpfs) size.
    pub pool_size: u64,
    /// Aging: utilization in percent (None: aged runs skipped).
    pub util_pct: Option<f64>,
    /// Aging: writes as a multiple of the capacity.
    pub age_writes: f64,
    /// Seed.
    pub seed: u64,
    /// Runs per setup and state (best ops/s kept).
    pub repeats: u32,
    /// The preload library used.
    pub preload_lib: PathBuf,
    /// What the ager reported, per aged file system.
    pub aging: Vec<String>,
    /// Every measurement.
    pub results: Vec<Measurement>,
    /// The preload library's counters per program and state.
    pub preload_stats: Vec<StatsRow>,
}

// ----- parsing -----

/// The `key=value` fields of a line.
fn fields(line: &str) -> impl Iterator<Item = (&str, &str)> {
    line.split_whitespace().filter_map(|f| f.split_once('='))
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    fields(line).find(|(k, _)| *k == key)?.1.parse().ok()
}

/// One phase line of the LMDB driver.
#[derive(Clone, Debug, PartialEq)]
pub struct LmdbPhase {
    /// L (load), A, B, C, D or F.
    pub phase: char,
    /// Operations.
    pub ops: u64,
    /// Seconds.
    pub secs: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Minor page faults over the phase.
    pub minflt: u64,
    /// Major page faults over the phase.
    pub majflt: u64,
}

/// Parse `phase=A ops=N secs=S ops_per_s=X minflt=N majflt=N` (None for any other line).
pub fn parse_lmdb_phase(line: &str) -> Option<LmdbPhase> {
    let phase: String = field(line, "phase")?;
    let mut chars = phase.chars();
    let (Some(p), None) = (chars.next(), chars.next()) else {
        return None;
    };
    Some(LmdbPhase {
        phase: p,
        ops: field(line, "ops")?,
        secs: field(line, "secs")?,
        ops_per_s: field(line, "ops_per_s")?,
        minflt: field(line, "minflt")?,
        majflt: field(line, "majflt")?,
    })
}

/// From db_bench's output, the result line of `bench`: (ops/s, operations, seconds), e.g.
/// `readrandom   :       6.661 micros/op 150129 ops/sec 1.332 seconds 200000 operations; ...`.
/// Operations and seconds are 0 when the line lacks them.
pub fn parse_db_bench(output: &str, bench: &str) -> Option<(f64, u64, f64)> {
    output.split(['\n', '\r']).find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != bench {
            return None;
        }
        let t: Vec<&str> = rest.split_whitespace().collect();
        let before = |word: &str| {
            t.iter()
                .position(|w| w.trim_end_matches(';') == word)
                .and_then(|i| i.checked_sub(1))
                .map(|i| t[i])
        };
        let ops_per_s: f64 = before("ops/sec")?.parse().ok()?;
        let ops = before("operations")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let secs = before("seconds")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        Some((ops_per_s, ops, secs))
    })
}

/// The runner's line: (exit status, minor faults, major faults).
pub fn parse_rusage(line: &str) -> Option<(i32, u64, u64)> {
    Some((
        field(line, "status")?,
        field(line, "minflt")?,
        field(line, "majflt")?,
    ))
}

/// Sum a stats file's JSON lines; (processes, counters). Lines that are not such JSON objects
/// are skipped.
pub fn parse_preload_stats(text: &str) -> (u64, PreloadStats) {
    let mut sum = PreloadStats::default();
    let mut n = 0;
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Ok(s) = serde_json::from_str::<PreloadStats>(l) {
            sum.add(&s);
            n += 1;
        }
    }
    (n, sum)
}

// ----- running -----

/// The programs and the library the runs use.
struct Tools {
    lmdb: PathBuf,
    run: PathBuf,
    preload: PathBuf,
}

/// One run of the programs, on one directory.
struct Run<'a> {
    tools: &'a Tools,
    cfg: &'a AppBenchConfig,
    dir: PathBuf,
    setup: Setup,
    state: PoolState,
    /// Where the helper files go (outside the measured file system).
    scratch: &'a Path,
}

impl Run<'_> {
    fn tag(&self) -> String {
        format!("[{} {}]", self.state.label(), self.setup.label())
    }

    fn stats_file(&self, program: &str) -> PathBuf {
        self.scratch.join(format!(
            "stats-{program}-{}-{}.jsonl",
            self.state.label(),
            self.setup.label()
        ))
    }

    fn preload_env(&self, cmd: &mut Command, program: &str) {
        if self.setup == Setup::Preload {
            cmd.env("LD_PRELOAD", &self.tools.preload);
            cmd.env("WINEFS_PRELOAD_STATS", self.stats_file(program));
        } else {
            cmd.env_remove("LD_PRELOAD");
        }
    }

    fn measurement(&self, workload: String, ops: u64, secs: f64, ops_per_s: f64) -> Measurement {
        Measurement {
            workload,
            setup: self.setup,
            state: self.state,
            ops,
            seconds: secs,
            ops_per_s,
            minflt: 0,
            majflt: 0,
        }
    }

    /// The LMDB driver: load, then each workload in a process of its own (as YCSB's load and
    /// run phases), so every workload opens the environment and maps the file afresh.
    fn lmdb(&self) -> Result<Vec<Measurement>> {
        let db = self.dir.join("lmdb");
        std::fs::create_dir_all(&db).map_err(io_err(format!("mkdir {}", db.display())))?;
        eprintln!("bench app: {} lmdb {LMDB_PHASES}...", self.tag());
        let mut ms = Vec::new();
        for (i, phase) in LMDB_PHASES.chars().enumerate() {
            let mut cmd = Command::new(&self.tools.lmdb);
            cmd.arg(&db)
                .args([self.cfg.records, self.cfg.value_size, self.cfg.ops].map(|n| n.to_string()))
                .arg(phase.to_string())
                .arg((self.cfg.seed + i as u64).to_string())
                .stdin(Stdio::null());
            self.preload_env(&mut cmd, "lmdb");
            let out = cmd.output().map_err(io_err("run the LMDB driver".into()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let parsed = text.lines().find_map(parse_lmdb_phase);
            let Some(p) = parsed.filter(|p| out.status.success() && p.phase == phase) else {
                let err = String::from_utf8_lossy(&out.stderr);
                return Err(Error::Invalid(format!(
                    "{} LMDB driver, phase {phase}: {}, no result line ({})",
                    self.tag(),
                    out.status,
                    err.lines().last().unwrap_or("")
                )));
            };
            let name = if phase == 'L' {
                "lmdb load".to_string()
            } else {
                format!("lmdb {phase}")
            };
            let mut m = self.measurement(name, p.ops, p.secs, p.ops_per_s);
            m.minflt = p.minflt;
            m.majflt = p.majflt;
            ms.push(m);
        }
        std::fs::remove_dir_all(&db).map_err(io_err(format!("remove {}", db.display())))?;
        eprintln!("bench app: {} {}", self.tag(), brief(&ms));
        Ok(ms)
    }

    /// db_bench, one process per benchmark on one database.
    fn rocksdb(&self) -> Result<Vec<Measurement>> {
        let db = self.dir.join("rocksdb");
        let mut ms = Vec::new();
        for (i, &(name, bench, mmap_read)) in ROCKSDB_BENCHES.iter().enumerate() {
            eprintln!("bench app: {} rocksdb {name}...", self.tag());
            let ru = self.scratch.join("rusage.txt");
            let _ = std::fs::remove_file(&ru);
            let preload = match self.setup {
                Setup::Preload => self.tools.preload.as_os_str(),
                _ => "-".as_ref(),
            };
            let n = self.cfg.rocksdb_num.to_string();
            let mut cmd = Command::new(&self.tools.run);
            cmd.arg(&ru).arg(preload).arg("db_bench");
            cmd.arg(format!("--benchmarks={bench}"))
                .arg(format!("--db={}", db.display()))
                .arg(format!("--use_existing_db={}", u8::from(i > 0)))
                .args([format!("--num={n}"), format!("--reads={n}")])
                .arg(format!("--seed={}", self.cfg.seed + i as u64))
                .arg(format!("--mmap_read={mmap_read}"))
                .args(["--compression_type=none", "--threads=1"])
                .args(["--progress_reports=0", "--statistics=0"])
                .stdin(Stdio::null())
                .env_remove("LD_PRELOAD");
            if self.setup == Setup::Preload {
                cmd.env("WINEFS_PRELOAD_STATS", self.stats_file("rocksdb"));
            }
            let out = cmd.output().map_err(io_err("run db_bench".into()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let usage = std::fs::read_to_string(&ru).unwrap_or_default();
            let (status, minflt, majflt) = parse_rusage(&usage).unwrap_or((-1, 0, 0));
            let parsed = parse_db_bench(&text, bench);
            let Some((ops_per_s, ops, secs)) = parsed.filter(|_| status == 0) else {
                let err = String::from_utf8_lossy(&out.stderr);
                return Err(Error::Invalid(format!(
                    "{} db_bench {name}: exit {status}, no result line ({})",
                    self.tag(),
                    err.lines().last().unwrap_or("")
                )));
            };
            let mut m = self.measurement(format!("rocksdb {name}"), ops, secs, ops_per_s);
            m.minflt = minflt;
            m.majflt = majflt;
            ms.push(m);
        }
        std::fs::remove_dir_all(&db).map_err(io_err(format!("remove {}", db.display())))?;
        eprintln!("bench app: {} {}", self.tag(), brief(&ms));
        Ok(ms)
    }

    /// Both programs, `repeats` times (the best ops/s of each workload, with that run's page
    /// faults); adds their measurements and (preload) their stats to the report.
    fn all(&self, rep: &mut AppBenchReport) -> Result<()> {
        let mut best: Vec<Measurement> = Vec::new();
        for _ in 0..self.cfg.repeats.max(1) {
            let mut ms = self.lmdb()?;
            if !self.cfg.skip_rocksdb {
                ms.extend(self.rocksdb()?);
            }
            for m in ms {
                match best.iter_mut().find(|b| b.workload == m.workload) {
                    Some(b) if m.ops_per_s > b.ops_per_s => *b = m,
                    Some(_) => {}
                    None => best.push(m),
                }
            }
        }
        rep.results.extend(best);
        let mut programs = vec!["lmdb"];
        if !self.cfg.skip_rocksdb {
            programs.push("rocksdb");
        }
        if self.setup == Setup::Preload {
            for p in programs {
                let text = std::fs::read_to_string(self.stats_file(p)).unwrap_or_default();
                let (n, s) = parse_preload_stats(&text);
                rep.preload_stats.push(StatsRow {
                    program: p.to_string(),
                    state: self.state,
                    processes: n,
                    stats: (n > 0).then_some(s),
                });
            }
        }
        Ok(())
    }
}

/// "load 33k ops/s, A 45k ops/s, ..." for a progress line.
fn brief(ms: &[Measurement]) -> String {
    ms.iter()
        .map(|m| {
            let w = m
                .workload
                .split_once(' ')
                .map_or(m.workload.as_str(), |x| x.1);
            format!(
                "{w} {} ops/s ({} faults)",
                fmt_rate(m.ops_per_s),
                m.faults()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `prog` is an executable file in PATH.
fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Check what the run needs before mounting anything: root, the preload library, db_bench.
fn preflight(cfg: &AppBenchConfig) -> Result<(PathBuf, PathBuf)> {
    if crate::sys::euid() != 0 {
        return Err(Error::NotPermitted(
            "bench app mounts huge=always tmpfs file systems and FUSE: run it as root".into(),
        ));
    }
    if !(cfg.util_pct > 0.0 && cfg.util_pct < 100.0) {
        return Err(Error::Invalid(format!(
            "--util {} is not a percentage between 0 and 100",
            cfg.util_pct
        )));
    }
    let exe = std::env::current_exe().map_err(io_err("find the winefs executable".into()))?;
    let preload = exe
        .parent()
        .map(|d| d.join(PRELOAD_LIB))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{PRELOAD_LIB} not found beside {} (cargo build --release builds it)",
                exe.display()
            ))
        })?;
    if !cfg.skip_rocksdb && !on_path("db_bench") {
        return Err(Error::Invalid(
            "db_bench not found in PATH (apt-get install rocksdb-tools, or pass --skip-rocksdb)"
                .into(),
        ));
    }
    Ok((exe, preload))
}

/// Run everything (see the module docs).
pub fn app_bench(cfg: &AppBenchConfig) -> Result<AppBenchReport> {
    let (exe, preload) = preflight(cfg)?;
    let base = cfg.dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut env = AppEnv::new(&base, exe)?;
    let (lmdb, run) = env.compile_helpers()?;
    let tools = Tools { lmdb, run, preload };
    let mut rep = AppBenchReport {
        records: cfg.records,
        value_size: cfg.value_size,
        ops: cfg.ops,
        rocksdb_num: if cfg.skip_rocksdb { 0 } else { cfg.rocksdb_num },
        pool_size: cfg.pool_size,
        util_pct: (!cfg.skip_aged).then_some(cfg.util_pct),
        age_writes: cfg.age_writes,
        seed: cfg.seed,
        repeats: cfg.repeats.max(1),
        preload_lib: tools.preload.clone(),
        aging: Vec::new(),
        results: Vec::new(),
        preload_stats: Vec::new(),
    };
    let scratch = env.root.clone();
    // The tmpfs setup's file system is as large as the pool, so aging fills it alike.
    let host = env.mount_tmpfs("tmpfs", cfg.pool_size)?;
    let pools = env.mount_tmpfs("pools", 2 * cfg.pool_size + (256 << 20))?;
    let states: &[PoolState] = if cfg.skip_aged {
        &[PoolState::Clean]
    } else {
        &[PoolState::Clean, PoolState::Aged]
    };
    for &state in states {
        let work = host.join(format!("work-{}", state.label()));
        std::fs::create_dir(&work).map_err(io_err(format!("mkdir {}", work.display())))?;
        if state == PoolState::Aged {
            let aged = host.join("aged");
            std::fs::create_dir(&aged).map_err(io_err(format!("mkdir {}", aged.display())))?;
            eprintln!("bench app: aging the tmpfs to {}%...", cfg.util_pct);
            let r = env.age(
                AgeTarget::Dir(&aged),
                cfg.util_pct,
                cfg.age_writes,
                cfg.seed,
            )?;
            rep.aging.push(format!("tmpfs: {r}"));
        }
        let mut run = Run {
            tools: &tools,
            cfg,
            dir: work,
            setup: Setup::Tmpfs,
            state,
            scratch: &scratch,
        };
        run.all(&mut rep)?;
        // One pool per setup, identical at the start: made (or aged) once, then copied.
        let pool = pools.join(format!("pool-{}", state.label()));
        if state == PoolState::Aged {
            eprintln!(
                "bench app: aging a {} pool to {}%...",
                format_size(cfg.pool_size),
                cfg.util_pct
            );
            let r = env.age(
                AgeTarget::Pool(&pool, cfg.pool_size),
                cfg.util_pct,
                cfg.age_writes,
                cfg.seed,
            )?;
            rep.aging.push(format!("pool: {r}"));
        } else {
            env.mkfs(&pool, cfg.pool_size)?;
        }
        let copy = pools.join(format!("pool-{}-copy", state.label()));
        env.copy_pool(&pool, &copy)?;
        for (setup, pool) in [(Setup::Fuse, &pool), (Setup::Preload, &copy)] {
            let mnt = env.mount_fuse(pool)?;
            let work = mnt.join("work");
            std::fs::create_dir(&work).map_err(io_err(format!("mkdir {}", work.display())))?;
            run.dir = work;
            run.setup = setup;
            run.all(&mut rep)?;
            env.unmount_fuse()?;
        }
        // The pool (and the ager's state beside it) is done with; free its memory.
        for f in std::fs::read_dir(&pools).map_err(io_err(format!("list {}", pools.display())))? {
            let p = f
                .map_err(io_err(format!("list {}", pools.display())))?
                .path();
            std::fs::remove_file(&p).map_err(io_err(format!("remove {}", p.display())))?;
        }
    }
    env.unmount_tmpfs(&pools)?;
    env.unmount_tmpfs(&host)?;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lmdb_phase_lines_parse() {
        let p = parse_lmdb_phase(
            "phase=B ops=200000 secs=1.236989 ops_per_s=161683.0 minflt=8755 majflt=3",
        )
        .unwrap();
        assert_eq!(
            p,
            LmdbPhase {
                phase: 'B',
                ops: 200000,
                secs: 1.236989,
                ops_per_s: 161683.0,
                minflt: 8755,
                majflt: 3
            }
        );
        assert_eq!(parse_lmdb_phase("config records=10 value_size=1000"), None);
        assert_eq!(
            parse_lmdb_phase("phase=AB ops=1 secs=1 ops_per_s=1 minflt=0 majflt=0"),
            None
        );
        assert_eq!(
            parse_lmdb_phase("phase=A ops=1 secs=1 ops_per_s=1 minflt=0"),
            None
        );
    }

    #[test]
    fn db_bench_result_lines_parse() {
        let out = "DB path: [/tmp/x]\n... finished 100 ops\r... finished 200 ops\rDB path: [/x]\n\
                   readrandom   :       6.661 micros/op 150129 ops/sec 1.332 seconds 200000 operations;   10.5 MB/s (126733 of 200000 found)\n\
                   readwhilewriting :      25.199 micros/op 39681 ops/sec 5.040 seconds 200000 operations;    3.3 MB/s\n";
        assert_eq!(
            parse_db_bench(out, "readrandom"),
            Some((150129.0, 200000, 1.332))
        );
        assert_eq!(
            parse_db_bench(out, "readwhilewriting"),
            Some((39681.0, 200000, 5.04))
        );
        assert_eq!(parse_db_bench(out, "fillrandom"), None);
        // An older format without seconds and operations still gives ops/s.
        assert_eq!(
            parse_db_bench(
                "fillrandom   :      14.965 micros/op 66821 ops/sec;    7.4 MB/s",
                "fillrandom"
            ),
            Some((66821.0, 0, 0.0))
        );
    }

    #[test]
    fn runner_and_stats_lines_parse() {
        assert_eq!(
            parse_rusage("status=0 minflt=8396 majflt=2 utime=1.2 stime=0.3 maxrss_kb=44084\n"),
            Some((0, 8396, 2))
        );
        assert_eq!(parse_rusage(""), None);
        let (n, s) = parse_preload_stats(
            "{\"pid\":1,\"mmap_direct\":2,\"mmap_fuse\":1,\"read_direct\":5,\"read_fuse\":0,\"write_direct\":3,\"write_fuse\":1}\n\
             garbage\n{\"pid\":2,\"read_direct\":4}\n",
        );
        assert_eq!(n, 2);
        assert_eq!(s.direct(), 14);
        assert_eq!(s.total(), 16);
    }

    #[test]
    fn report_judges_targets() {
        let m = |w: &str, setup, state, ops_per_s, minflt| Measurement {
            workload: w.into(),
            setup,
            state,
            ops: 1,
            seconds: 1.0,
            ops_per_s,
            minflt,
            majflt: 0,
        };
        let mut rep = AppBenchReport {
            records: 1,
            value_size: 1,
            ops: 1,
            rocksdb_num: 0,
            pool_size: 1 << 30,
            util_pct: Some(75.0),
            age_writes: 1.0,
            seed: 1,
            repeats: 1,
            preload_lib: PathBuf::from("/x/libwinefs_preload.so"),
            aging: vec![],
            results: vec![],
            preload_stats: vec![],
        };
        for (st, k) in [(PoolState::Clean, 1.0), (PoolState::Aged, 0.5)] {
            rep.results
                .push(m("lmdb C", Setup::Tmpfs, st, 100.0 * k, 10));
            rep.results
                .push(m("lmdb C", Setup::Fuse, st, 20.0 * k, 1000));
            rep.results
                .push(m("lmdb C", Setup::Preload, st, 95.0 * k, 10));
        }
        assert_eq!(
            rep.ops_ratio("lmdb C", Setup::Preload, Setup::Fuse, PoolState::Clean),
            Some(4.75)
        );
        assert_eq!(
            rep.aged_ratios("lmdb C", Setup::Preload),
            Some((Some(0.5), Some(1.0)))
        );
        let text = rep.to_string();
        assert!(
            text.contains("| lmdb C | clean | 100 | 20 | 95 |"),
            "{text}"
        );
        assert!(text.contains("0.95 ok | 4.75 ok |"), "{text}");
        assert!(text.contains("| 0.50 MISS |"), "{text}");
        assert!(text.contains("lmdb") && !text.contains("n/a"), "{text}");
    }
}
