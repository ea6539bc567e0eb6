//! The `winefs` command: mkfs, fsck, info, bench and a guided demo.

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use winefs::bench::{SyscallBenchConfig, syscall_bench};
use winefs::layout::{BLOCK_SIZE, BLOCKS_PER_HUGE, FORMAT_VERSION};
use winefs::{Error, FileKind, Fs, MkfsOptions, Mode, MountOptions, XattrSet};

#[derive(Parser)]
#[command(
    name = "winefs",
    version,
    about = "A hugepage-aware persistent-memory file system in user space (after WineFS, SOSP'21)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a pool (a default one if none is given), take a short tour, check it.
    Demo {
        /// Pool file (default: /mnt/winefs-huge/demo.pool on a hugepage tmpfs, else /dev/shm).
        #[arg(long)]
        pool: Option<PathBuf>,
        /// Size of a new pool (K/M/G/T suffixes, binary).
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        size: u64,
    },
    /// Format a pool file or device.
    Mkfs {
        pool: PathBuf,
        /// Pool size (K/M/G/T suffixes, binary); required for a new file.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Per-CPU allocation partitions (default: one per CPU, fewer for small pools).
        #[arg(long)]
        partitions: Option<u32>,
        /// Total inodes (default: one per 16 KiB).
        #[arg(long)]
        inodes: Option<u64>,
        /// Format even if POOL exists (its contents are lost).
        #[arg(long)]
        force: bool,
    },
    /// Check a pool offline (nothing is written). Exit 0 clean, 1 problems, 2 cannot check.
    Fsck { pool: PathBuf },
    /// Show a pool's geometry, state and free space (nothing is written).
    Info { pool: PathBuf },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// 4 KiB append/overwrite/read and create/unlink: winefs library vs std::fs on tmpfs.
    Syscall {
        /// Directory for the pool and the host files (default: /dev/shm).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Operations per measurement.
        #[arg(long, default_value_t = 20_000)]
        ops: u64,
        /// Size of the overwrite/read file (K/M/G/T suffixes).
        #[arg(long, default_value = "64M", value_parser = parse_size)]
        size: u64,
        /// Size of the winefs pool.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        pool_size: u64,
        /// Timed repetitions per measurement (the best is reported).
        #[arg(long, default_value_t = 3)]
        repeats: u32,
    },
}

/// Parse "4096", "64K", "256M", "4G", "1T" (binary; optional trailing "B" or "iB").
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .unwrap_or(t);
    let t = if t.len() > 1 {
        t.strip_suffix(['B', 'b']).unwrap_or(t)
    } else {
        t
    };
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| {
        format!("bad size {s:?}: expected a number with an optional K/M/G/T suffix")
    })?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A failure: what was being done, and the library's error.
struct Fail {
    what: String,
    err: String,
    code: u8,
}

fn fail(what: impl Into<String>, e: impl std::fmt::Display) -> Fail {
    Fail {
        what: what.into(),
        err: e.to_string(),
        code: 1,
    }
}

trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail>;
}

impl<T> Ctx<T> for winefs::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail> {
        self.map_err(|e| fail(what(), e))
    }
}

fn private_mount(pool: &Path) -> winefs::Result<Fs> {
    Fs::mount(
        pool,
        MountOptions {
            private: true,
            ..Default::default()
        },
    )
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`winefs info POOL | head`) instead of panicking in println!.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Demo { pool, size } => demo(pool, size),
        Cmd::Mkfs {
            pool,
            size,
            partitions,
            inodes,
            force,
        } => mkfs(&pool, size, partitions, inodes, force),
        Cmd::Fsck { pool } => fsck(&pool),
        Cmd::Info { pool } => info(&pool),
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
) -> Result<u8, Fail> {
    let p = pool.display();
    let opts = MkfsOptions {
        size,
        partitions,
        inodes,
        force,
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
    println!(
        "  inodes        {} ({} per partition)",
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

fn fsck(pool: &Path) -> Result<u8, Fail> {
    let p = pool.display();
    let rep = winefs::fsck::check_pool(pool).map_err(|e| Fail {
        code: 2,
        ..fail(format!("fsck {p}"), e)
    })?;
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

fn info(pool: &Path) -> Result<u8, Fail> {
    let p = pool.display();
    let (sb, state) =
        winefs::recovery::read_superblock(pool).ctx(|| format!("read superblock of {p}"))?;
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
    println!(
        "state         {} unmount, mounted {} time(s)",
        if state.clean { "clean" } else { "NOT clean" },
        state.mount_count
    );
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

fn bench(cfg: SyscallBenchConfig) -> Result<u8, Fail> {
    eprintln!(
        "running: {} ops per measurement, best of {} (this takes a little while)...",
        cfg.ops, cfg.repeats
    );
    let rep = syscall_bench(&cfg).ctx(|| "bench syscall".into())?;
    print!("{rep}");
    Ok(0)
}

// ----- demo -----

const HUGE_DIR: &str = "/mnt/winefs-huge";

/// Whether `dir` is a mount point of a hugepage-capable file system.
fn hugepage_mount(dir: &str) -> Option<bool> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut found = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 4 && f[1] == dir {
            let huge = f[2] == "hugetlbfs"
                || (f[2] == "tmpfs"
                    && f[3]
                        .split(',')
                        .any(|o| o == "huge=always" || o == "huge=within_size"));
            found = Some(huge);
        }
    }
    found
}

/// Pick the default demo pool: a hugepage tmpfs if one is (or can be) mounted, else /dev/shm.
fn default_demo_pool() -> (PathBuf, Option<String>) {
    match hugepage_mount(HUGE_DIR) {
        Some(true) => return (Path::new(HUGE_DIR).join("demo.pool"), None),
        Some(false) => {
            return (
                PathBuf::from("/dev/shm/winefs-demo.pool"),
                Some(format!(
                    "{HUGE_DIR} is mounted without huge=always; using /dev/shm, the pool is 4 KiB-mapped"
                )),
            );
        }
        None => {}
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        let _ = std::fs::create_dir_all(HUGE_DIR);
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1G,huge=always", "none", HUGE_DIR])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok && hugepage_mount(HUGE_DIR) == Some(true) {
            println!("mounted a hugepage tmpfs (huge=always, 1 GiB) on {HUGE_DIR}");
            return (Path::new(HUGE_DIR).join("demo.pool"), None);
        }
        let _ = std::fs::remove_dir(HUGE_DIR);
    }
    let why = if root {
        "could not mount a huge=always tmpfs"
    } else {
        "not root, cannot mount a huge=always tmpfs"
    };
    (
        PathBuf::from("/dev/shm/winefs-demo.pool"),
        Some(format!(
            "hugepages unavailable ({why}); using /dev/shm, the pool is 4 KiB-mapped"
        )),
    )
}

/// KiB of this process's mappings of `pool` that are backed by 2 MiB pages, and in total.
fn pmd_mapped_kib(pool: &Path) -> Option<(u64, u64)> {
    let canon = std::fs::canonicalize(pool).ok()?;
    let want = canon.to_string_lossy().into_owned();
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut inside, mut huge, mut total) = (false, 0u64, 0u64);
    for l in smaps.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = l.ends_with(&want);
            continue;
        }
        if !inside {
            continue;
        }
        let kib = |l: &str| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if l.starts_with("Rss:") {
            total += kib(l);
        } else if l.starts_with("FilePmdMapped:") || l.starts_with("ShmemPmdMapped:") {
            huge += kib(l);
        }
    }
    Some((huge, total))
}

/// Remove everything under directory `dir` (then `dir` itself from `parent`).
fn remove_tree(fs: &Fs, parent: u64, name: &[u8]) -> winefs::Result<u64> {
    let a = fs.lookup(parent, name)?;
    let mut removed = 0;
    if a.kind == FileKind::Dir {
        for e in fs.readdir(a.ino, 2)? {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            removed += remove_tree(fs, a.ino, &e.name)?;
        }
        fs.rmdir(parent, name)?;
    } else {
        fs.unlink(parent, name)?;
    }
    Ok(removed + 1)
}

fn demo(pool: Option<PathBuf>, size: u64) -> Result<u8, Fail> {
    let (pool, warning) = match pool {
        Some(p) => (p, None),
        None => default_demo_pool(),
    };
    if let Some(w) = &warning {
        println!("warning: {w}");
    }
    let p = pool.display().to_string();
    if pool.exists() {
        println!("reusing pool {p}");
    } else {
        Fs::mkfs(
            &pool,
            &MkfsOptions {
                size: Some(size),
                ..Default::default()
            },
        )
        .ctx(|| format!("mkfs {p}"))?;
        println!("created pool {p} ({})", human(size));
    }
    let fs = Fs::mount(
        &pool,
        MountOptions {
            mode: Mode::Strict,
            private: false,
        },
    )
    .ctx(|| format!("mount {p}"))?;
    let g = fs.geometry();
    let rec = fs.recovery_report();
    println!(
        "mounted (strict mode): {} partitions, {} inodes, mount #{}{}",
        g.partitions,
        g.total_inodes(),
        winefs::recovery::read_superblock(&pool)
            .map(|(_, s)| s.mount_count)
            .unwrap_or(0),
        if rec.rolled_back.is_empty() {
            String::new()
        } else {
            format!(
                ", recovery rolled back {} transaction(s)",
                rec.rolled_back.len()
            )
        }
    );
    tour(&fs, &pool).ctx(|| format!("demo on {p}"))?;

    let rep = fs.check();
    let clean = rep.is_clean();
    if clean {
        println!(
            "fsck: clean ({} inodes, {} directories, {} used blocks)",
            rep.inodes, rep.directories, rep.used_blocks
        );
    } else {
        println!("fsck: {} problem(s):", rep.problems.len());
        for prob in &rep.problems {
            println!("  {prob}");
        }
    }
    fs.unmount().ctx(|| format!("unmount {p}"))?;
    println!("unmounted cleanly.");
    println!();
    println!("The pool is at {p}; it keeps /demo until the next demo run. Inspect it with:");
    println!("  winefs info {p}");
    println!("  winefs fsck {p}");
    println!("(from the source tree: cargo run --release -- info {p})");
    if clean {
        Ok(0)
    } else {
        Err(Fail {
            code: 1,
            ..fail(format!("fsck {p}"), "problems found (listed above)")
        })
    }
}

fn tour(fs: &Fs, pool: &Path) -> winefs::Result<()> {
    let root = fs.root();
    match remove_tree(fs, root, b"demo") {
        Ok(n) => println!(
            "  found /demo from an earlier run ({} entries survived the remount); replacing it",
            n - 1
        ),
        Err(Error::NotFound) => {}
        Err(e) => return Err(e),
    }
    let d = fs.mkdir(root, b"demo", 0o755, 0, 0)?.ino;
    println!("  mkdir   /demo");

    // One 4 MiB write: the allocator hands out whole aligned 2 MiB extents.
    let big = fs.create(d, b"big.bin", 0o644, 0, 0)?.ino;
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let n = fs.write(big, 0, &data)?;
    let ext = fs.extents(big)?;
    let aligned: Vec<_> = ext
        .iter()
        .filter(|&&(_, phys, len)| phys % BLOCKS_PER_HUGE == 0 && len >= BLOCKS_PER_HUGE)
        .collect();
    let huge_units: u64 = aligned
        .iter()
        .map(|&&(_, _, len)| len / BLOCKS_PER_HUGE)
        .sum();
    println!(
        "  write   /demo/big.bin: {} in one call -> {} extent(s), {} hugepage-aligned ({} x 2 MiB)",
        human(n as u64),
        ext.len(),
        aligned.len(),
        huge_units
    );
    for (l, phys, len) in &ext {
        println!(
            "            file block {l:>5} -> pool block {phys:>7} x {len} blocks{}",
            if phys % BLOCKS_PER_HUGE == 0 {
                "  (2 MiB-aligned)"
            } else {
                ""
            }
        );
    }
    let mut back = vec![0u8; data.len()];
    fs.read(big, 0, &mut back)?;
    if back != data {
        return Err(Error::Corrupted(
            "read-back of /demo/big.bin differs".into(),
        ));
    }

    // Small appends: each is atomic and durable when it returns (strict mode).
    let log = fs.create(d, b"log.txt", 0o644, 0, 0)?.ino;
    for i in 1..=5 {
        fs.append(log, format!("record {i}: hello from winefs\n").as_bytes())?;
    }
    println!(
        "  append  /demo/log.txt: 5 records, size {} B",
        fs.getattr(log)?.size
    );
    fs.rename_path("/demo/log.txt", "/demo/journal.log")?;
    println!("  rename  /demo/log.txt -> /demo/journal.log");
    fs.symlink(d, b"latest", b"big.bin", 0, 0)?;
    let target = fs.readlink(fs.resolve("/demo/latest", false)?)?;
    println!(
        "  symlink /demo/latest -> {}",
        String::from_utf8_lossy(&target)
    );
    fs.setxattr(big, b"user.origin", b"winefs demo", XattrSet::Any)?;
    let v = fs.getxattr(big, b"user.origin")?;
    println!(
        "  xattr   /demo/big.bin user.origin = {:?}",
        String::from_utf8_lossy(&v)
    );
    println!("  ls /demo:");
    for e in fs.readdir(d, 2)? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let a = fs.getattr(e.ino)?;
        let kind = match a.kind {
            FileKind::Dir => "dir ",
            FileKind::Symlink => "link",
            FileKind::File => "file",
            _ => "node",
        };
        println!(
            "    {kind} {:>9} B  {}",
            a.size,
            String::from_utf8_lossy(&e.name)
        );
    }
    let st = fs.statfs();
    println!(
        "  statfs: {} free of {}, {} free aligned 2 MiB extents, {} of {} inodes free",
        human(st.free_blocks * st.block_size),
        human(st.blocks * st.block_size),
        st.free_aligned_extents,
        st.free_inodes,
        st.inodes
    );
    if let Some((huge, total)) = pmd_mapped_kib(pool) {
        println!(
            "  mapping: {} of {} resident pool memory is mapped with 2 MiB pages",
            human(huge << 10),
            human(total << 10)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("8MB"), Ok(8 << 20));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999T").is_err());
    }
}
