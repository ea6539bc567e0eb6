//! `winefs demo`: a guided tour of the library on a default (or given) pool.

use crate::fail::{Ctx, Fail, fail};
use std::path::{Path, PathBuf};
use winefs::hugepool::default_pool;
use winefs::media::layout::BLOCKS_PER_HUGE;
use winefs::units::format_size as human;
use winefs::{Consistency, Error, FileKind, Fs, MkfsOptions, MountOptions, XattrSet};

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

pub fn demo(pool: Option<PathBuf>, size: u64) -> Result<u8, Fail> {
    let (pool, warning) = match pool {
        Some(p) => (p, None),
        None => default_pool("demo.pool"),
    };
    if let Some(w) = &warning {
        log::warn!("{w}");
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
            consistency: Consistency::Strict,
            ..Default::default()
        },
    )
    .ctx(|| format!("mount {p}"))?;
    let g = fs.geometry();
    let rec = fs.recovery_report();
    println!(
        "mounted (strict mode): {} partitions, {} inodes, mount #{}{}",
        g.partitions,
        g.total_inodes(),
        winefs::state::mount::read_superblock(&pool)
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
