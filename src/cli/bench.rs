//! `winefs bench app` and `winefs bench workload`: their options and how they run.

use crate::fail::{Ctx, Fail, fail};
use std::path::PathBuf;
use winefs::bench::{
    AppBenchConfig, Setup, Workload, WorkloadBenchConfig, app_bench, workload_bench,
};
use winefs::units::{format_size as human, parse_nonzero_size};

/// `winefs bench app`'s options.
#[derive(clap::Args)]
pub(crate) struct AppArgs {
    /// Directory for the benchmark's mounts, logs and compiled helpers (default: /tmp).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// LMDB records loaded.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) records: u64,
    /// LMDB value size in bytes.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) value_size: u64,
    /// LMDB operations per workload (A, B, C, D, F).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) ops: u64,
    /// db_bench --num (keys written; reads of the read benchmarks).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rocksdb_num: u64,
    /// Size of the pool and of the tmpfs (K/M/G/T suffixes).
    #[arg(long, default_value = "3G", value_parser = parse_nonzero_size)]
    pub(crate) pool_size: u64,
    /// Utilization the aged runs age to, in percent.
    #[arg(long, default_value_t = 75.0)]
    pub(crate) util: f64,
    /// Aging writes, as a multiple of the capacity (the fill counts).
    #[arg(long, default_value_t = 1.5)]
    pub(crate) age_writes: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Runs of the programs per setup and state (the best ops/s of each workload is kept).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) repeats: u32,
    /// Clean file systems only.
    #[arg(long)]
    pub(crate) skip_aged: bool,
    /// LMDB only.
    #[arg(long)]
    pub(crate) skip_rocksdb: bool,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

pub(crate) fn bench_app(a: AppArgs) -> Result<u8, Fail> {
    let cfg = AppBenchConfig {
        dir: a.dir,
        records: a.records,
        value_size: a.value_size,
        ops: a.ops,
        rocksdb_num: a.rocksdb_num,
        pool_size: a.pool_size,
        util_pct: a.util,
        age_writes: a.age_writes,
        seed: a.seed,
        repeats: a.repeats,
        skip_aged: a.skip_aged,
        skip_rocksdb: a.skip_rocksdb,
    };
    eprintln!(
        "running: LMDB {} records x {} B, {} ops per workload{}; pool {}{} (a few minutes)...",
        cfg.records,
        cfg.value_size,
        cfg.ops,
        if cfg.skip_rocksdb {
            "; RocksDB skipped".to_string()
        } else {
            format!("; db_bench --num {}", cfg.rocksdb_num)
        },
        human(cfg.pool_size),
        if cfg.skip_aged {
            ", clean only".to_string()
        } else {
            format!(
                ", clean and aged to {}% (--writes {})",
                cfg.util_pct, cfg.age_writes
            )
        }
    );
    let rep = app_bench(&cfg).ctx(|| "bench app".into())?;
    print!("{rep}");
    if let Some(j) = a.json {
        let text = serde_json::to_string_pretty(&rep).map_err(|e| fail("bench app: JSON", e))?;
        std::fs::write(&j, text + "\n").map_err(|e| fail(format!("write {}", j.display()), e))?;
    }
    Ok(0)
}

/// `winefs bench workload`'s options.
#[derive(clap::Args)]
pub(crate) struct WorkloadArgs {
    /// Directory for the pools, the tmpfs baseline and the ext4/xfs images (default: /dev/shm).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Workloads, comma-separated (default: all): varmail, fileserver, webserver, webproxy,
    /// append-fsync, seq-read, rand-read, seq-write, rand-write, scale.
    #[arg(long, value_delimiter = ',', value_parser = Workload::parse)]
    workloads: Vec<Workload>,
    /// Setups, comma-separated (default: all): lib-strict, lib-relaxed, lib-strict-aged,
    /// fuse, fuse-aged, tmpfs, passthrough, ext4, xfs.
    #[arg(long, value_delimiter = ',', value_parser = Setup::parse)]
    setups: Vec<Setup>,
    /// Multiplier of the default file counts (1: about 160 MB of files per personality).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Timed seconds per Filebench run and per point of the scalability run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Threads of the Filebench personalities (default: the paper's, scaled to the CPUs here).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Most threads of the scalability run (default: the CPUs here).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_threads: Option<u64>,
    /// Size of the microbenchmarks' file (K/M/G/T suffixes).
    #[arg(long, default_value = "256M", value_parser = parse_nonzero_size)]
    micro_size: u64,
    /// Utilization the aged pools are aged to, in percent.
    #[arg(long, default_value_t = 75.0)]
    util: f64,
    /// Aging writes, as a multiple of the capacity (the fill counts).
    #[arg(long, default_value_t = 1.5)]
    age_writes: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rounds: each setup runs once per round, the setups in turn; each run reports its median
    /// round and each ratio the median of its rounds' ratios (the host's noise falls on both).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=99))]
    rounds: u64,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Exit status 1 when a winefs run failed (the report says which and why).
pub(crate) fn bench_workload(a: WorkloadArgs) -> Result<u8, Fail> {
    let d = WorkloadBenchConfig::default();
    let cfg = WorkloadBenchConfig {
        dir: a.dir,
        workloads: if a.workloads.is_empty() {
            d.workloads
        } else {
            a.workloads
        },
        setups: if a.setups.is_empty() {
            d.setups
        } else {
            a.setups
        },
        scale: a.scale,
        seconds: a.seconds,
        threads: a.threads.map(|t| t as usize),
        micro_size: a.micro_size,
        max_threads: a.max_threads.map(|t| t as usize),
        util_pct: a.util,
        age_writes: a.age_writes,
        seed: a.seed,
        rounds: a.rounds as usize,
        progress: !a.quiet,
    };
    eprintln!(
        "running: {} workloads on {} setups, {} s per timed run, {} round(s) (several minutes)...",
        cfg.workloads.len(),
        cfg.setups.len(),
        cfg.seconds,
        cfg.rounds
    );
    let rep = workload_bench(&cfg).ctx(|| "bench workload".into())?;
    print!("{rep}");
    if let Some(j) = a.json {
        let text =
            serde_json::to_string_pretty(&rep).map_err(|e| fail("bench workload: JSON", e))?;
        std::fs::write(&j, text + "\n").map_err(|e| fail(format!("write {}", j.display()), e))?;
    }
    Ok(u8::from(rep.winefs_failed()))
}
