//! The `winefs` command: mount (FUSE), mkfs, fsck, info, bench and a guided demo.
//!
//! What goes where: a command's output (reports, tables) on standard output; its failure as
//! one line `winefs: <what>: <why>` on standard error with a non-zero exit; progress the
//! user asked for on standard error; diagnostics (the core's warnings and errors, the mount
//! daemon's life) through the `log` macros, which [`init_logging`] sends to standard error
//! (a background mount's log file) as `winefs: [level: ]message` lines.

mod age;
mod bench;
mod bind;
mod crashtest;
mod demo;
mod fail;
mod fresh;
mod helper;
mod mount;
mod stat;

use clap::{Parser, Subcommand};
use fail::{Ctx, Fail, fail};
use log::{Level, LevelFilter};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use winefs::bench::{
    FuseBenchConfig, MmapBenchConfig, SmallBenchConfig, SpaceBenchConfig,
    SyscallBenchConfig, WearBenchConfig, fuse_bench, mmap_bench, small_bench,
    space_bench, syscall_bench, wear_bench,
};
use winefs::media::layout::{BLOCK_SIZE, FORMAT_VERSION};
use winefs::report::{FileMapReport, FragReport};
use winefs::units::{format_size as human, parse_nonzero_size, parse_size};
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

#[derive(Parser)]
#[command(
    name = "winefs",
    version,
    about = "A hugepage-aware persistent-memory file system in user space (after WineFS, SOSP'21)"
)]
struct Cli {
    /// More diagnostics on standard error: -v debug, -vv trace (default: info; other crates'
    /// error, warn, info). RUST_LOG, if set, refines them per module.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a pool with FUSE (with no arguments: a default pool on a hugepage tmpfs, at
    /// /mnt/winefs as root or ~/winefs otherwise). Runs in the background unless -f.
    Mount {
        /// Pool file or device (omit both POOL and MOUNTPOINT for the default pool).
        pool: Option<PathBuf>,
        /// Directory to mount on.
        mountpoint: Option<PathBuf>,
        /// Every write atomic and durable when it returns (the default).
        #[arg(long, conflicts_with = "relaxed")]
        strict: bool,
        /// Metadata atomic and durable; data written in place.
        #[arg(long)]
        relaxed: bool,
        /// Threads serving FUSE requests, 1-64 (default: one per CPU, at most 64).
        #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
        threads: Option<usize>,
        /// Stay in the foreground (stop with Ctrl-C).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Mount even if MOUNTPOINT is not empty (its entries are hidden while mounted).
        #[arg(long)]
        nonempty: bool,
        /// Serve reads only: nothing is written to the pool, writes fail with EROFS (the one
        /// way to mount a pool flagged "needs fsck").
        #[arg(long)]
        read_only: bool,
        /// Offer no direct path: processes with the preload library keep using FUSE for data
        /// (docs/DESIGN.md §7b).
        #[arg(long)]
        no_direct: bool,
        /// Let the kernel cache file data and write it back later (FUSE writeback cache):
        /// faster small writes, durable at fsync (and close), not when write(2) returns. Only
        /// with --relaxed; no direct path.
        #[arg(long, requires = "relaxed", conflicts_with = "read_only")]
        writeback_cache: bool,
        /// How requests travel between the kernel and the daemon: `uring` (FUSE over io_uring,
        /// Linux 6.14+ with /sys/module/fuse/parameters/enable_uring = Y; refused where the
        /// kernel does not offer it), `dev` (reads and writes on /dev/fuse), or `auto` (io_uring
        /// where offered, else /dev/fuse). The environment variable sets the default.
        #[arg(long, value_enum, env = "WINEFS_TRANSPORT", default_value_t = mount::Transport::Auto)]
        transport: mount::Transport,
        /// Wear-aware allocation: small allocations spread over every hole (next fit) instead
        /// of reusing the lowest ones; aligned extents are handed out as before.
        #[arg(long)]
        wear_aware: bool,
        /// Store no access times (as `mount -o noatime`); without it, reads and directory
        /// listings store them as Linux's default `relatime` does.
        #[arg(long)]
        noatime: bool,
        /// Keep no POSIX ACLs (as ext4's `noacl`): setfacl is refused, and `ls -l` and other
        /// ACL lookups cost no request per file (the kernel forgets ACLs it cached at every
        /// directory listing with attributes).
        #[arg(long)]
        noacl: bool,
        /// Idle file states kept in DRAM at most (1 or more; default 65536, about 18 MiB): a
        /// file's state is built from its inode on first use and dropped again, oldest first,
        /// once this many are loaded and nothing holds it (open, mapped, leased).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        cached_inodes: Option<u64>,
        /// Size of the default pool when it is created (K/M/G/T suffixes, binary; default 1G);
        /// refused with POOL and MOUNTPOINT or when the default pool exists.
        #[arg(long, value_parser = parse_nonzero_size)]
        size: Option<u64>,
        /// Daemon log file (default: in the temporary directory, named after the mountpoint).
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Create a pool (a default one if none is given), take a short tour, check it.
    Demo {
        /// Pool file (default: /mnt/winefs-huge/demo.pool on a hugepage tmpfs, else /dev/shm).
        #[arg(long)]
        pool: Option<PathBuf>,
        /// Size of a new pool (K/M/G/T suffixes, binary).
        #[arg(long, default_value = "256M", value_parser = parse_nonzero_size)]
        size: u64,
    },
    /// Format a pool file or device.
    Mkfs {
        pool: PathBuf,
        /// Pool size (K/M/G/T suffixes, binary); required for a new file.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Per-CPU allocation partitions, 1-256 (default: one per CPU, fewer for small pools).
        #[arg(long)]
        partitions: Option<u32>,
        /// Total inodes, at least 1; each partition's share is rounded up to a multiple of 16
        /// (default: one per 16 KiB, at least 64 per partition).
        #[arg(long)]
        inodes: Option<u64>,
        /// Format even if POOL exists (its contents are lost).
        #[arg(long)]
        force: bool,
        /// Keep a write counter per block (`winefs wear`): 4 bytes per 4 KiB block, counted in
        /// memory and saved at clean unmount.
        #[arg(long)]
        wear_stats: bool,
    },
    /// Writes per block of a pool made with --wear-stats, as its last clean unmount saved them:
    /// per region max and mean, the data blocks by writes, the hottest blocks (read-only).
    Wear {
        pool: PathBuf,
        /// Hottest blocks listed.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Check a pool offline (nothing is written). Exit 0 clean, 1 problems, 2 cannot check.
    /// With --repair: fix what can be fixed without guessing, report every change; exit 0
    /// nothing to do, 1 repaired (now clean), 2 cannot check, 3 problems left.
    Fsck {
        pool: PathBuf,
        /// Repair the pool (it is written; every change is journaled and reported).
        #[arg(long)]
        repair: bool,
    },
    /// Show a pool's geometry, state and free space (nothing is written).
    Info { pool: PathBuf },
    /// A mounted pool's write accounting since mount: bytes stored per kind of operation and
    /// per category (data, metadata, journal, copy-on-write, alternate slots, write-back).
    Stat {
        /// The mount point, or the pool file of a mounted pool.
        target: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Free space by extent size and free aligned 2 MiB extents per partition (read-only).
    Frag { pool: PathBuf },
    /// A file's extents and the share of its bytes that can be mapped with hugepages
    /// (read-only).
    Filemap {
        pool: PathBuf,
        /// Path inside the pool, e.g. /dir/file.
        path: String,
    },
    /// Move a file's fragmented 2 MiB units onto aligned extents now (the pool must not be
    /// mounted; on a FUSE mount, `setfattr -n user.winefs.hugepage -v 1 FILE` queues the same
    /// rewrite in the daemon).
    Rewrite {
        pool: PathBuf,
        /// Path inside the pool.
        path: String,
    },
    /// Age a pool (through the library) or a directory (through POSIX calls) like Geriatrix:
    /// fill to a utilization with a profile's file sizes, ages and directory depths, then
    /// churn until a volume of writes has passed. Resumable.
    Age(age::AgeArgs),
    /// Allocate a fresh large file in a pool the way an application would (fallocate, 4 KiB
    /// writes, or ftruncate + stores through a mapping) and report its hugepage-mappable share.
    Fresh(fresh::FreshArgs),
    /// Compact holes now: empty broken 2 MiB units that hold little file data, so free space
    /// returns to aligned extents (a mounted pool does this in the background).
    Compact { pool: PathBuf },
    /// Crash-consistency testing: the persistence-point crash explorer and the FUSE kill
    /// harness, for runs longer than CI's.
    Crashtest {
        #[command(subcommand)]
        which: crashtest::CrashCmd,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// memcpy through mmap of an aligned, a 4 KiB-scattered and a plain hugepage tmpfs file.
    Mmap {
        /// Directory on a hugepage tmpfs (default: /mnt/winefs-huge, mounted as root).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// File size (K/M/G/T suffixes; a multiple of 2 MiB).
        #[arg(long, default_value = "1G", value_parser = parse_nonzero_size)]
        size: u64,
        /// Fresh mappings measured per case (the best is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        /// Random 8-byte reads per measurement.
        #[arg(long, default_value_t = 4_000_000, value_parser = clap::value_parser!(u64).range(1..))]
        reads: u64,
    },
    /// The mmap benchmark over given layouts in one run: files of winefs pools, and layouts
    /// of other file systems' files replayed onto a hugepage tmpfs at their physical offsets.
    Layout {
        /// NAME=winefs:POOL:PATH or NAME=replay:LAYOUT_FILE:DEVICE_BYTES (repeatable); a layout
        /// file has lines "file_offset physical_offset length" in bytes.
        #[arg(long = "case", required = true)]
        cases: Vec<String>,
        /// Bytes of each file mapped (a multiple of 2 MiB).
        #[arg(long, value_parser = parse_nonzero_size)]
        size: u64,
        /// Directory on a hugepage tmpfs for replay images (default: /mnt/winefs-huge).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
        reads: u64,
        /// Also write one JSON object per case here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// LMDB (a YCSB-like C driver) and RocksDB db_bench on a hugepage tmpfs, a winefs FUSE
    /// mount, and that mount with the preload library; clean and aged (root).
    App(bench::AppArgs),
    /// Filebench-like personalities (varmail, fileserver, webserver, webproxy), the paper's
    /// Fig. 6 microbenchmarks and Fig. 10 scalability on the winefs library (strict, relaxed,
    /// aged), a winefs FUSE mount (clean, aged), tmpfs, passthrough_ll, ext4 and xfs (root).
    Workload(bench::WorkloadArgs),
    /// create/unlink, 4 KiB / 1 MiB sequential I/O and a many-files directory (create, cached
    /// stat, ls -l, unlink): a FUSE mount of winefs vs libfuse's passthrough_ll and tmpfs.
    Fuse {
        /// Directory for the pool and the tmpfs files (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Files created and unlinked per run.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
        files: u64,
        /// Files of the many-files directory (0 leaves those rows out).
        #[arg(long, default_value_t = 100_000)]
        dir_files: u64,
        /// Size of the sequentially written and read file (K/M/G/T suffixes).
        #[arg(long, default_value = "64M", value_parser = parse_nonzero_size)]
        size: u64,
        /// FUSE worker threads, 1-64.
        #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
        threads: usize,
        /// Timed repetitions per measurement (the best is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        /// Mount winefs as `mount --no-direct` does: no direct path, file data cached by the
        /// kernel.
        #[arg(long)]
        no_direct: bool,
    },
    /// Space used by a seeded fsstress-style workload: tmpfs vs the winefs library (and FUSE).
    Space {
        /// Directory for the pool and the tmpfs tree (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Seed of the operation sequence.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Operations.
        #[arg(long, default_value_t = 20_000)]
        ops: u64,
        /// Bound on the live files' total size (K/M/G/T suffixes).
        #[arg(long, default_value = "512M", value_parser = parse_size)]
        max_bytes: u64,
        /// Size of the winefs pool.
        #[arg(long, default_value = "2G", value_parser = parse_size)]
        pool_size: u64,
        /// File-size profile: agrawal, wang, meyer or a profile file.
        #[arg(long, default_value = "agrawal")]
        profile: String,
        /// Also run the workload on a FUSE mount of winefs (root or /dev/fuse access).
        #[arg(long)]
        fuse: bool,
    },
    /// Block wear under a varmail-like churn on a half-full pool, with the default and with
    /// wear-aware allocation: most and mean writes per block.
    Wear {
        /// Directory for the pool (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Pool size (K/M/G/T suffixes).
        #[arg(long, default_value = "256M", value_parser = parse_nonzero_size)]
        pool_size: u64,
        /// Small files churned.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        files: u64,
        /// Churn iterations.
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
        ops: u64,
    },
    /// Small strict overwrites (64 B to 4 KiB, and a 70/30 read/write mix) on a large file by
    /// alternate writing, undo journaling and copy-on-write: ops/s and bytes stored per op.
    Small {
        /// Directory for the pools (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Size of the file (K/M/G/T suffixes).
        #[arg(long, default_value = "1G", value_parser = parse_nonzero_size)]
        size: u64,
        /// Operations per case.
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
        ops: u64,
    },
    /// 4 KiB append/overwrite/read and create/unlink: winefs library vs std::fs on tmpfs.
    Syscall {
        /// Directory for the pool and the host files (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Operations per measurement.
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
        ops: u64,
        /// Size of the overwrite/read file (K/M/G/T suffixes).
        #[arg(long, default_value = "64M", value_parser = parse_nonzero_size)]
        size: u64,
        /// Size of the winefs pool.
        #[arg(long, default_value = "256M", value_parser = parse_nonzero_size)]
        pool_size: u64,
        /// Timed repetitions per measurement (the best is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
    },
}

fn compact(pool: &Path) -> Result<u8, Fail> {
    let p = pool.display();
    let fs = Fs::mount(
        pool,
        MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        },
    )
    .ctx(|| format!("mount {p}"))?;
    let before = FragReport::new(&fs);
    let st = fs.compact().ctx(|| format!("compact {p}"))?;
    let after = FragReport::new(&fs);
    fs.unmount().ctx(|| format!("unmount {p}"))?;
    println!(
        "{} of {} candidate units emptied, {} moved; free space in aligned 2 MiB extents {:.1}% -> {:.1}%",
        st.units_freed,
        st.candidates,
        human(st.blocks_moved * BLOCK_SIZE),
        before.aligned_share() * 100.0,
        after.aligned_share() * 100.0
    );
    Ok(0)
}

fn bench_layout(
    cases: Vec<String>,
    size: u64,
    dir: Option<PathBuf>,
    repeats: u32,
    reads: u64,
    json: Option<PathBuf>,
) -> Result<u8, Fail> {
    use winefs::bench::layout::{LayoutCase, layout_bench, table};
    let cases: Vec<LayoutCase> = cases
        .iter()
        .map(|c| LayoutCase::parse(c))
        .collect::<winefs::Result<_>>()
        .ctx(|| "bench layout".into())?;
    let cfg = MmapBenchConfig {
        dir,
        size,
        repeats,
        reads,
    };
    let r = layout_bench(&cfg, &cases).ctx(|| "bench layout".into())?;
    println!("{}", table(&cfg, &r));
    if let Some(j) = json {
        std::fs::write(&j, winefs::bench::layout::json(&r))
            .map_err(|e| fail(format!("write {}", j.display()), e))?;
    }
    Ok(0)
}

fn private_mount(pool: &Path) -> winefs::Result<Fs> {
    Fs::mount(
        pool,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
}

/// Send the `log` macros' records (the core's, the front end's, this binary's) to standard
/// error, one line each: `winefs: message` for info, `winefs: warning: message`, `winefs:
/// error: message`, and `winefs: debug: module: message` below that. winefs's own modules log
/// at info and up, or debug/trace with -v/-vv; other crates (fuser warns about every request
/// it answers with ENOSYS) at error, warn with -v, info with -vv. RUST_LOG's directives come
/// last and win (`RUST_LOG=fuser=debug`, `RUST_LOG=winefs::fuse=trace`).
fn init_logging(verbose: u8) {
    let (own, others) = match verbose {
        0 => (LevelFilter::Info, LevelFilter::Error),
        1 => (LevelFilter::Debug, LevelFilter::Warn),
        _ => (LevelFilter::Trace, LevelFilter::Info),
    };
    let mut b = env_logger::Builder::new();
    b.filter_level(others).filter_module("winefs", own);
    if let Ok(spec) = std::env::var("RUST_LOG") {
        b.parse_filters(&spec);
    }
    b.target(env_logger::Target::Stderr)
        .write_style(env_logger::WriteStyle::Never)
        .format(|out, r| {
            let level = match r.level() {
                Level::Info => "",
                Level::Warn => "warning: ",
                Level::Error => "error: ",
                Level::Debug => "debug: ",
                Level::Trace => "trace: ",
            };
            // Another crate's record, or a debug or trace one, says where it comes from.
            let own = r.target() == "winefs" || r.target().starts_with("winefs::");
            if own && r.level() <= Level::Info {
                writeln!(out, "winefs: {level}{}", r.args())
            } else {
                writeln!(out, "winefs: {level}{}: {}", r.target(), r.args())
            }
        })
        .init();
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`winefs info POOL | head`) instead of panicking in println!.
    winefs::sys::default_sigpipe();
    // Run by mount(8) as /sbin/mount.winefs: its argument form, not the subcommands.
    if let Some(name) = helper::invoked_as() {
        init_logging(0);
        return exit(helper::run(name));
    }
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let res = match cli.cmd {
        Cmd::Mount {
            pool,
            mountpoint,
            strict: _,
            relaxed,
            threads,
            foreground,
            nonempty,
            read_only,
            no_direct,
            writeback_cache,
            transport,
            wear_aware,
            noatime,
            noacl,
            cached_inodes,
            size,
            log,
        } => mount::run(mount::MountArgs {
            pool,
            mountpoint,
            consistency: if relaxed {
                Consistency::Relaxed
            } else {
                Consistency::Strict
            },
            threads,
            foreground,
            nonempty,
            read_only,
            no_direct,
            writeback_cache,
            transport,
            wear_aware,
            noatime,
            noacl,
            cached_inodes: cached_inodes.unwrap_or(0),
            size,
            log,
            kernel_flags: Vec::new(),
            quiet: false,
        }),
        Cmd::Demo { pool, size } => demo::demo(pool, size),
        Cmd::Mkfs {
            pool,
            size,
            partitions,
            inodes,
            force,
            wear_stats,
        } => mkfs(&pool, size, partitions, inodes, force, wear_stats),
        Cmd::Wear { pool, top } => wear(&pool, top),
        Cmd::Fsck { pool, repair } => fsck(&pool, repair),
        Cmd::Info { pool } => info(&pool),
        Cmd::Stat { target, json } => stat::stat(&target, json),
        Cmd::Frag { pool } => frag(&pool),
        Cmd::Filemap { pool, path } => filemap(&pool, &path),
        Cmd::Rewrite { pool, path } => rewrite(&pool, &path),
        Cmd::Crashtest { which } => crashtest::run(which, cli.verbose > 0),
        Cmd::Bench {
            which:
                BenchCmd::Layout {
                    cases,
                    size,
                    dir,
                    repeats,
                    reads,
                    json,
                },
        } => bench_layout(cases, size, dir, repeats, reads, json),
        Cmd::Compact { pool } => compact(&pool),
        Cmd::Age(a) => age::age(a),
        Cmd::Fresh(a) => fresh::fresh(a),
        Cmd::Bench {
            which:
                BenchCmd::Mmap {
                    dir,
                    size,
                    repeats,
                    reads,
                },
        } => {
            eprintln!("running: {} file, best of {repeats}...", human(size));
            match mmap_bench(&MmapBenchConfig {
                dir,
                size,
                repeats,
                reads,
            }) {
                Ok(rep) => {
                    println!("{rep}");
                    Ok(0)
                }
                Err(e) => Err(fail("bench mmap", e)),
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Fuse {
                    dir,
                    files,
                    dir_files,
                    size,
                    threads,
                    repeats,
                    no_direct,
                },
        } => {
            let cfg = FuseBenchConfig {
                dir,
                files,
                dir_files,
                file_size: size,
                threads,
                repeats,
                no_direct,
                ..Default::default()
            };
            eprintln!(
                "running: {files} files, {} file, a directory of {dir_files} files, best of \
                 {repeats}...",
                human(size)
            );
            match fuse_bench(&cfg) {
                Ok(rep) => {
                    print!("{rep}");
                    Ok(0)
                }
                Err(e) => Err(fail("bench fuse", e)),
            }
        }
        Cmd::Bench {
            which: BenchCmd::App(a),
        } => bench::bench_app(a),
        Cmd::Bench {
            which: BenchCmd::Workload(a),
        } => bench::bench_workload(a),
        Cmd::Bench {
            which:
                BenchCmd::Space {
                    dir,
                    seed,
                    ops,
                    max_bytes,
                    pool_size,
                    profile,
                    fuse,
                },
        } => bench_space(SpaceBenchConfig {
            dir,
            seed,
            ops,
            max_bytes,
            pool_size,
            profile,
            fuse,
        }),
        Cmd::Bench {
            which:
                BenchCmd::Wear {
                    dir,
                    pool_size,
                    files,
                    ops,
                },
        } => {
            let cfg = WearBenchConfig { dir, pool_size, files, ops };
            eprintln!("running: {ops} churn iterations under each of two allocation policies...");
            match wear_bench(&cfg) {
                Ok(rep) => {
                    print!("{rep}");
                    Ok(0)
                }
                Err(e) => Err(fail("bench wear", e)),
            }
        }
        Cmd::Bench {
            which: BenchCmd::Small { dir, size, ops },
        } => bench_small(SmallBenchConfig {
            dir,
            file_size: size,
            ops,
        }),
        Cmd::Bench {
            which:
                BenchCmd::Syscall {
                    dir,
                    ops,
                    size,
                    pool_size,
                    repeats,
                },
        } => bench(SyscallBenchConfig {
            dir,
            ops,
            file_size: size,
            pool_size,
            repeats,
        }),
    };
    exit(res)
}

/// The exit status of a command; its failure printed as one line.
fn exit(res: Result<u8, Fail>) -> ExitCode {
    match res {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("winefs: {}: {}", f.what, f.err);
            ExitCode::from(f.code)
        }
    }
}

// ----- mkfs -----

fn mkfs(
    pool: &Path,
    size: Option<u64>,
    partitions: Option<u32>,
    inodes: Option<u64>,
    force: bool,
    wear_stats: bool,
) -> Result<u8, Fail> {
    let p = pool.display();
    let opts = MkfsOptions {
        size,
        partitions,
        inodes,
        force,
        wear_stats,
    };
    Fs::mkfs(pool, &opts).ctx(|| format!("mkfs {p}"))?;
    let fs = private_mount(pool).ctx(|| format!("mount {p} after mkfs"))?;
    let g = fs.geometry();
    let st = fs.statfs();
    println!("formatted {p}");
    println!(
        "  pool size     {} ({} bytes)",
        human(g.pool_size),
        g.pool_size
    );
    println!("  partitions    {}", g.partitions);
    // An explicit count is honoured up to whole groups of 16 per partition; say so when the
    // layout needed more.
    let rounded = match inodes {
        Some(n) if n != g.total_inodes() => {
            format!("; --inodes {n} rounded up to whole groups of 16 per partition")
        }
        _ => String::new(),
    };
    println!(
        "  inodes        {} ({} per partition{rounded})",
        g.total_inodes(),
        g.inodes_per_partition
    );
    println!(
        "  data area     {} ({} blocks of {} B from block {})",
        human(g.data_blocks * BLOCK_SIZE),
        g.data_blocks,
        BLOCK_SIZE,
        g.data_start
    );
    println!(
        "  free          {} aligned 2 MiB extents, {} free blocks",
        st.free_aligned_extents, st.free_blocks
    );
    Ok(0)
}

// ----- fsck -----

fn fsck(pool: &Path, repair: bool) -> Result<u8, Fail> {
    let p = pool.display();
    let rep = winefs::state::fsck::check_pool(pool).map_err(|e| Fail {
        code: 2,
        ..fail(format!("fsck {p}"), e)
    })?;
    if repair && !rep.is_clean() {
        for prob in &rep.problems {
            println!("found: {prob}");
        }
        let fixed = Fs::repair_pool(pool).map_err(|e| Fail {
            code: 2,
            ..fail(format!("repair {p}"), e)
        })?;
        for c in &fixed.changes {
            println!("repaired: {c}");
        }
        for l in &fixed.left {
            println!("left: {l}");
        }
        let after = winefs::state::fsck::check_pool(pool).map_err(|e| Fail {
            code: 2,
            ..fail(format!("fsck {p} after repair"), e)
        })?;
        if after.is_clean() && fixed.left.is_empty() {
            println!("clean after {} change(s)", fixed.changes.len());
            return Ok(1);
        }
        eprintln!(
            "winefs: fsck {p}: {} problem(s) left after repair",
            after.problems.len().max(fixed.left.len())
        );
        return Ok(3);
    }
    if rep.is_clean() {
        println!(
            "clean: {} inodes, {} directories, {} used blocks, {} free blocks",
            rep.inodes, rep.directories, rep.used_blocks, rep.free_blocks
        );
        Ok(0)
    } else {
        for prob in &rep.problems {
            println!("{prob}");
        }
        eprintln!("winefs: fsck {p}: {} problem(s) found", rep.problems.len());
        Ok(1)
    }
}

// ----- info -----

fn frag(pool: &Path) -> Result<u8, Fail> {
    let p = pool.display();
    let fs = private_mount(pool).ctx(|| format!("mount {p} (private, read-only)"))?;
    println!("{}", FragReport::new(&fs));
    Ok(0)
}

fn filemap(pool: &Path, path: &str) -> Result<u8, Fail> {
    let p = pool.display();
    let fs = private_mount(pool).ctx(|| format!("mount {p} (private, read-only)"))?;
    let ino = fs.resolve(path, true).ctx(|| format!("{path} in {p}"))?;
    let r = FileMapReport::new(&fs, ino).ctx(|| format!("{path} in {p}"))?;
    println!("{path}");
    println!("{r}");
    Ok(0)
}

fn rewrite(pool: &Path, path: &str) -> Result<u8, Fail> {
    let p = pool.display();
    let fs = Fs::mount(pool, MountOptions::default()).ctx(|| format!("mount {p}"))?;
    let ino = fs.resolve(path, true).ctx(|| format!("{path} in {p}"))?;
    let st = fs.rewrite(ino).ctx(|| format!("rewrite {path}"))?;
    let r = FileMapReport::new(&fs, ino).ctx(|| format!("{path} in {p}"))?;
    fs.unmount().ctx(|| format!("unmount {p}"))?;
    println!(
        "{path}: {} of {} units with data moved onto aligned extents; hugepage-mappable {:.1}%",
        st.units_rewritten,
        st.units_seen,
        r.mappable_share() * 100.0
    );
    Ok(0)
}

/// How a mount of the pool at `path` makes its stores durable (docs/DESIGN.md §1).
fn durability(path: &Path) -> &'static str {
    use winefs::sys::Backing;
    let Ok(file) = std::fs::File::open(path) else {
        return "unknown (the pool cannot be opened)";
    };
    match winefs::sys::backing(path, &file) {
        Backing::DeviceDax => "cache-line write-backs and fences (device DAX)",
        Backing::Memory => "cache-line write-backs and fences; the pool is in memory (tmpfs, hugetlbfs or ramfs) and gone at a reboot",
        Backing::DaxFile => "cache-line write-backs and fences (a DAX file)",
        Backing::PageCache => "every commit waits for fdatasync (a file on a disk file system without DAX)",
    }
}

fn info(pool: &Path) -> Result<u8, Fail> {
    let p = pool.display();
    let (sb, state) =
        winefs::state::mount::read_superblock(pool).ctx(|| format!("read superblock of {p}"))?;
    let fs = private_mount(pool).ctx(|| format!("mount {p} (private, read-only)"))?;
    let g = &sb.geometry;
    let st = fs.statfs();
    let used_inodes = st.inodes - st.free_inodes;
    println!("pool          {p}");
    println!(
        "size          {} ({} bytes)",
        human(g.pool_size),
        g.pool_size
    );
    println!("block size    {BLOCK_SIZE} B");
    println!("format        version {FORMAT_VERSION}");
    println!("partitions    {}", g.partitions);
    println!("inodes        {used_inodes} used / {}", st.inodes);
    match g.zone_slots {
        0 => println!("slot zones    none (a pool made before them: strict overwrites are undo-journaled)"),
        s => println!(
            "slot zones    {s} slots per partition ({}), {}",
            human(u64::from(s) * BLOCK_SIZE),
            match g.zone_growth {
                true => "growing into free 2 MiB units while a sixteenth of the pool stays free (never more units than files have free)",
                false => "fixed (a pool made before zones grew)",
            }
        ),
    }
    println!(
        "size words    {}",
        match g.checked_sizes {
            true => "checked (appends commit their size with one store)",
            false => "plain (a pool made before checked size words: appends commit their size in a transaction)",
        }
    );
    let wear = if g.wear_blocks > 0 { "kept (`winefs wear`)" } else { "not kept" };
    println!("wear counters {wear}");
    println!("durability    {}", durability(pool));
    println!(
        "state         {} unmount, mounted {} time(s)",
        if state.clean { "clean" } else { "NOT clean" },
        state.mount_count
    );
    match state.needs_fsck {
        0 => println!("needs fsck    no"),
        code => println!(
            "needs fsck    YES: {} at run time; run `winefs fsck --repair {p}` (until then it mounts only with --read-only)",
            winefs::state::damage::describe(code)
        ),
    }
    println!(
        "free          {} of {} ({} blocks), {} aligned 2 MiB extents",
        human(st.free_blocks * BLOCK_SIZE),
        human(st.blocks * BLOCK_SIZE),
        st.free_blocks,
        st.free_aligned_extents
    );
    println!("partition  blocks                 free 2MiB  hole blocks  holes  largest hole");
    for (i, s) in fs.alloc_stats().iter().enumerate() {
        println!(
            "{:>9}  {:>10}..{:<10} {:>10} {:>12} {:>6} {:>13}",
            i,
            s.start,
            s.end,
            s.free_aligned_extents,
            s.free_hole_blocks,
            s.hole_count,
            s.largest_hole
        );
    }
    Ok(0)
}

// ----- bench -----

fn bench_space(cfg: SpaceBenchConfig) -> Result<u8, Fail> {
    eprintln!("running: {} operations, seed {}...", cfg.ops, cfg.seed);
    let rep = space_bench(&cfg).ctx(|| "bench space".into())?;
    print!("{rep}");
    Ok(0)
}

fn wear(pool: &Path, top: usize) -> Result<u8, Fail> {
    let p = pool.display();
    let (g, counts) =
        winefs::state::mount::read_wear(pool).ctx(|| format!("read wear counters of {p}"))?;
    println!("writes per block of {p} (as of its last clean unmount):\n");
    print!("{}", winefs::media::wear::WearReport::new(&g, &counts, top));
    Ok(0)
}

fn bench_small(cfg: SmallBenchConfig) -> Result<u8, Fail> {
    eprintln!(
        "running: {} ops per case, three paths (this takes a little while)...",
        cfg.ops
    );
    let rep = small_bench(&cfg).ctx(|| "bench small".into())?;
    print!("{rep}");
    Ok(0)
}

fn bench(cfg: SyscallBenchConfig) -> Result<u8, Fail> {
    eprintln!(
        "running: {} ops per measurement, best of {} (this takes a little while)...",
        cfg.ops, cfg.repeats
    );
    let rep = syscall_bench(&cfg).ctx(|| "bench syscall".into())?;
    print!("{rep}");
    Ok(0)
}
