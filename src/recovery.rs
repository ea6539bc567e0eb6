//! mkfs, mount (validation, journal recovery, DRAM index rebuild, orphan cleanup) and clean
//! unmount (allocator state saved, superblock marked clean).

use crate::alloc::{Allocator, BlockRun};
use crate::dir::DirIndex;
use crate::error::{Error, Result, corrupt};
use crate::fs::{Fs, Inner, MkfsOptions, MountOptions, Node, now_ns};
use crate::inode::FileMap;
use crate::journal::{Journals, Tx};
use crate::layout::{
    self, BLOCK_SIZE, FileKind, Geometry, INODE_IN_USE, INODE_SIZE, InodeHeader,
    JOURNAL_ENTRY_SIZE, ROOT_INO, SbState, Superblock, sb,
};
use crate::pool::{Category, Pool};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Default partition count for a pool of `size` bytes: one per CPU, fewer when journals would
/// take more than a quarter of the pool or a partition would get fewer than four 2 MiB units.
pub fn default_partitions(size: u64) -> u32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 64) as u32;
    let journal =
        Geometry::journal_blocks_each(layout::JOURNAL_ENTRIES, layout::STAGING_BLOCKS) * BLOCK_SIZE;
    let mut p = cpus;
    while p > 1
        && (p as u64 * journal > size / 4 || size / (p as u64) < 4 * layout::HUGE_SIZE + journal)
    {
        p -= 1;
    }
    p
}

fn write_state(pool: &Pool, st: SbState) -> Result<()> {
    pool.write_flush(sb::STATE as u64, &st.encode(), Category::Metadata)?;
    pool.fence();
    Ok(())
}

/// Zero and flush a region (mkfs only; nothing references it yet).
fn zero_region(pool: &Pool, off: u64, len: u64) -> Result<()> {
    let mut o = off;
    while o < off + len {
        let k = (off + len - o).min(8 << 20);
        pool.zero_flush(o, k, Category::Metadata)?;
        o += k;
    }
    Ok(())
}

/// The geometry `mkfs` would give a pool of `size` bytes with `opts`.
fn plan_geometry(size: u64, opts: &MkfsOptions) -> Result<Geometry> {
    let partitions = opts.partitions.unwrap_or_else(|| default_partitions(size));
    let total_inodes = opts
        .inodes
        .unwrap_or(size / 16384)
        .max(64 * partitions as u64);
    let ipp = total_inodes
        .div_ceil(partitions as u64)
        .next_multiple_of(16);
    let ipp = u32::try_from(ipp)
        .map_err(|_| Error::Invalid(format!("too many inodes per partition: {ipp}")))?;
    Geometry::compute(size, partitions, ipp)
}

pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<()> {
    let pool = if std::fs::symlink_metadata(path).is_ok() {
        if !opts.force {
            let what = match Pool::open(path, true) {
                Ok(p) => match p
                    .read_array::<128>(0)
                    .and_then(|b| Superblock::decode(&b, p.len()))
                {
                    Ok(_) => "already holds a winefs pool",
                    Err(_) => "already exists",
                },
                Err(_) => "already exists",
            };
            return Err(Error::Invalid(format!(
                "{} {what}; pass --force to format it (its contents will be lost)",
                path.display()
            )));
        }
        if let Some(size) = opts.size {
            plan_geometry(size, opts)?;
            let meta = std::fs::metadata(path)
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
            if meta.is_file() {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
                f.set_len(size)
                    .map_err(|e| Error::io(format!("resize {}", path.display()), e))?;
            }
        }
        let pool = Pool::open(path, false)?;
        pool.reserve_backing()?;
        pool
    } else {
        let size = opts.size.ok_or_else(|| {
            Error::Invalid(format!(
                "{} does not exist; give a size to create it",
                path.display()
            ))
        })?;
        // Validate before creating anything, so a refused size leaves no file behind.
        plan_geometry(size, opts)?;
        Pool::create(path, size)?
    };
    let size = pool.len();
    let g = plan_geometry(size, opts)?;
    // Superblock block first (so a crashed mkfs leaves no mountable pool), then every region.
    zero_region(&pool, 0, BLOCK_SIZE)?;
    pool.fence();
    for p in 0..g.partitions {
        zero_region(
            &pool,
            g.journal_offset(p),
            g.journal_entries as u64 * JOURNAL_ENTRY_SIZE,
        )?;
    }
    zero_region(
        &pool,
        g.inode_table_start * BLOCK_SIZE,
        g.total_inodes() * INODE_SIZE,
    )?;
    zero_region(
        &pool,
        g.bitmap_start * BLOCK_SIZE,
        g.bitmap_blocks * BLOCK_SIZE,
    )?;
    let now = now_ns();
    let (uid, gid) = crate::sys::real_ids();
    let root = InodeHeader {
        flags: INODE_IN_USE,
        mode: libc::S_IFDIR | 0o755,
        uid,
        gid,
        nlink: 2,
        generation: 1,
        parent: ROOT_INO,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        ..Default::default()
    };
    let roff = g.inode_offset(ROOT_INO)?;
    pool.write_flush(roff, &root.encode(), Category::Metadata)?;
    pool.fence();
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&now.to_le_bytes());
    uuid[8..].copy_from_slice(&(std::process::id() as u64 ^ size).to_le_bytes());
    let sbk = Superblock {
        geometry: g,
        uuid,
        created_ns: now,
    };
    pool.write_flush(0, &sbk.encode(), Category::Metadata)?;
    pool.fence();
    write_state(
        &pool,
        SbState {
            clean: true,
            mount_count: 0,
        },
    )
}

/// Read and validate the superblock of the pool at `path` without mounting it.
pub fn read_superblock(path: &Path) -> Result<(Superblock, SbState)> {
    let pool = Pool::open(path, true)?;
    let raw: [u8; 256] = pool
        .read_array(0)
        .map_err(|_| Error::Foreign("shorter than a superblock".into()))?;
    let sbk = Superblock::decode(&raw, pool.len())?;
    Ok((sbk, SbState::decode(&raw[sb::STATE..sb::STATE + 32])))
}

/// Load every in-use inode; returns nodes, free inode numbers per partition, and pool offsets of
/// dead extent slots to zero.
#[allow(clippy::type_complexity)]
fn load_inodes(
    pool: &Pool,
    g: &Geometry,
) -> Result<(HashMap<u64, Node>, Vec<BTreeSet<u64>>, Vec<u64>)> {
    let mut nodes = HashMap::new();
    let mut free = vec![BTreeSet::new(); g.partitions as usize];
    let mut dead_offs = Vec::new();
    let per_block = (BLOCK_SIZE / INODE_SIZE) as usize;
    let mut blk = vec![0u8; BLOCK_SIZE as usize];
    let total = g.total_inodes();
    let mut ino = 1u64;
    while ino <= total {
        pool.read(g.inode_offset(ino)?, &mut blk)?;
        for i in 0..per_block {
            let cur = ino + i as u64;
            let raw = &blk[i * INODE_SIZE as usize..(i + 1) * INODE_SIZE as usize];
            let hdr = InodeHeader::decode(raw);
            if !hdr.in_use() {
                free[g.inode_partition(cur) as usize].insert(cur);
                continue;
            }
            let kind = hdr
                .kind()
                .ok_or_else(|| corrupt!("inode {cur}: unknown file type in mode {:o}", hdr.mode))?;
            if hdr.size > crate::file::MAX_FILE_SIZE || hdr.map_end > u32::MAX as u64 {
                return Err(corrupt!(
                    "inode {cur}: size {} / map end {} out of range",
                    hdr.size,
                    hdr.map_end
                ));
            }
            if hdr.index_block != 0 && !g.is_data_block(hdr.index_block) {
                return Err(corrupt!(
                    "inode {cur}: extent index block {} outside the data area",
                    hdr.index_block
                ));
            }
            let (map, dead) = FileMap::load(pool, g, cur, raw, hdr.index_block, hdr.map_end)?;
            let ioff = g.inode_offset(cur)?;
            dead_offs.extend(dead.iter().map(|&s| map.slot_offset(ioff, s)));
            let dir = if kind == FileKind::Dir {
                if !hdr.size.is_multiple_of(BLOCK_SIZE) {
                    return Err(corrupt!(
                        "directory {cur}: size {} is not a whole number of blocks",
                        hdr.size
                    ));
                }
                if hdr.parent == 0 || hdr.parent > total {
                    return Err(corrupt!(
                        "directory {cur}: parent {} out of range",
                        hdr.parent
                    ));
                }
                let mut d = DirIndex::default();
                let mut b = vec![0u8; BLOCK_SIZE as usize];
                for k in 0..hdr.size / BLOCK_SIZE {
                    let (phys, _) = map
                        .lookup(k)
                        .ok_or_else(|| corrupt!("directory {cur}: block {k} is not mapped"))?;
                    pool.read(phys * BLOCK_SIZE, &mut b)?;
                    d.load_block(cur, k as u32, &b)?;
                }
                Some(d)
            } else {
                None
            };
            nodes.insert(
                cur,
                Node {
                    ino: cur,
                    hdr,
                    map,
                    dir,
                    open: 0,
                    maps: Vec::new(),
                    hugepage_hint: None,
                },
            );
        }
        ino += per_block as u64;
    }
    Ok((nodes, free, dead_offs))
}

/// Every block owned by an inode: (run, owner), sorted; overlapping ownership is corruption.
pub(crate) fn owned_runs(nodes: &HashMap<u64, Node>) -> Result<Vec<(BlockRun, u64)>> {
    let mut v: Vec<(BlockRun, u64)> = Vec::new();
    for n in nodes.values() {
        v.extend(n.map.owned_runs().into_iter().map(|r| (r, n.ino)));
        if n.hdr.xattr_block != 0 {
            v.push((
                BlockRun {
                    start: n.hdr.xattr_block,
                    len: 1,
                },
                n.ino,
            ));
        }
    }
    v.sort_by_key(|x| x.0.start);
    for w in v.windows(2) {
        if w[0].0.start + w[0].0.len > w[1].0.start {
            return Err(corrupt!(
                "block {} is owned by both inode {} and inode {}",
                w[1].0.start,
                w[0].1,
                w[1].1
            ));
        }
    }
    Ok(v)
}

/// Free runs of the data area given the owned runs (sorted, disjoint).
pub(crate) fn complement(g: &Geometry, owned: &[(BlockRun, u64)]) -> Vec<BlockRun> {
    let mut free = Vec::new();
    let mut cur = g.data_start;
    for (r, _) in owned {
        if r.start > cur {
            free.push(BlockRun {
                start: cur,
                len: r.start - cur,
            });
        }
        cur = cur.max(r.start + r.len);
    }
    let end = g.data_start + g.data_blocks;
    if cur < end {
        free.push(BlockRun {
            start: cur,
            len: end - cur,
        });
    }
    free
}

/// Free runs recorded in the saved allocator bitmap (bit set = block in use).
pub(crate) fn bitmap_free_runs(pool: &Pool, g: &Geometry) -> Result<Vec<BlockRun>> {
    let mut bits = vec![0u8; (g.bitmap_blocks * BLOCK_SIZE) as usize];
    pool.read(g.bitmap_start * BLOCK_SIZE, &mut bits)?;
    let mut free = Vec::new();
    let mut run: Option<u64> = None;
    for i in 0..g.data_blocks {
        let used = bits[(i / 8) as usize] & (1 << (i % 8)) != 0;
        match (used, run) {
            (false, None) => run = Some(i),
            (true, Some(s)) => {
                free.push(BlockRun {
                    start: g.data_start + s,
                    len: i - s,
                });
                run = None;
            }
            _ => {}
        }
    }
    if let Some(s) = run {
        free.push(BlockRun {
            start: g.data_start + s,
            len: g.data_blocks - s,
        });
    }
    Ok(free)
}

pub fn mount(path: &Path, opts: MountOptions) -> Result<Fs> {
    mount_pool(Pool::open(path, opts.private)?, opts)
}

/// Mount an already mapped pool (the crash explorer patches a private mapping of a crash image
/// before recovery runs on it).
pub(crate) fn mount_pool(pool: Pool, opts: MountOptions) -> Result<Fs> {
    let raw: [u8; 256] = pool
        .read_array(0)
        .map_err(|_| Error::Foreign("shorter than a superblock".into()))?;
    let sbk = Superblock::decode(&raw, pool.len())?;
    let g = sbk.geometry.clone();
    let state = SbState::decode(&raw[sb::STATE..sb::STATE + 32]);
    let mount_count = state.mount_count + 1;
    write_state(
        &pool,
        SbState {
            clean: false,
            mount_count,
        },
    )?;
    let recovery = Journals::recover(&pool, &g)?;
    let (nodes, free_inodes, dead_offs) = load_inodes(&pool, &g)?;
    match nodes.get(&ROOT_INO) {
        Some(n) if n.is_dir() => {}
        Some(_) => return Err(corrupt!("inode 1 (the root) is not a directory")),
        None => return Err(corrupt!("inode 1 (the root) is not in use")),
    }
    let free = if state.clean && recovery.rolled_back.is_empty() {
        bitmap_free_runs(&pool, &g)?
    } else {
        complement(&g, &owned_runs(&nodes)?)
    };
    let alloc = Allocator::from_free_runs(&g.partition_ranges(), free)
        .map_err(|e| corrupt!("saved allocator state: {e}"))?;
    for off in dead_offs {
        pool.zero(off, layout::EXTENT_SIZE, Category::Metadata)?;
        pool.flush(off, layout::EXTENT_SIZE, Category::Metadata);
    }
    pool.fence();
    let orphans: Vec<u64> = nodes
        .values()
        .filter(|n| n.hdr.nlink == 0)
        .map(|n| n.ino)
        .collect();
    let inner = Inner {
        journals: Journals::new(&g),
        alloc,
        inode_free: free_inodes.into_iter().map(Mutex::new).collect(),
        nodes: RwLock::new(
            nodes
                .into_iter()
                .map(|(k, v)| (k, Arc::new(RwLock::new(v))))
                .collect(),
        ),
        ns: RwLock::new(()),
        mode: opts.mode,
        poisoned: AtomicBool::new(false),
        unmounted: AtomicBool::new(false),
        mount_count,
        generation: AtomicU32::new(now_ns() as u32),
        recovery,
        faults: Mutex::new(None),
        rewriter: Mutex::new(None),
        me: std::sync::OnceLock::new(),
        background_rewrite: !opts.no_background_rewrite,
        pool,
        geo: g,
        sb: sbk,
    };
    // Inodes whose last link went away while open (or mid-removal) are freed now.
    for ino in orphans {
        let n = inner.node(ino)?;
        let g = crate::fs::wlock(&n);
        let mut h = g.hdr.clone();
        h.flags &= !INODE_IN_USE;
        let mut tx = Tx::new();
        inner.header_tx(&mut tx, ino, &g.hdr, &h);
        inner.commit(tx)?;
        let mut runs = g.map.owned_runs();
        if g.hdr.xattr_block != 0 {
            runs.push(BlockRun {
                start: g.hdr.xattr_block,
                len: 1,
            });
        }
        inner.free_runs(&runs);
        drop(g);
        inner
            .nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
        inner.release_inode_number(ino);
    }
    Ok(Fs {
        inner: {
            let inner = Arc::new(inner);
            let _ = inner.me.set(Arc::downgrade(&inner));
            inner
        },
    })
}

pub(crate) fn unmount(inner: &Inner) -> Result<()> {
    if inner.unmounted.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    if inner.poisoned.load(Ordering::SeqCst) {
        return Err(corrupt!(
            "not marking the pool clean: an internal failure poisoned this mount; the next mount recovers"
        ));
    }
    if inner.pool.is_private() {
        return Ok(());
    }
    let g = &inner.geo;
    let mut bits = vec![0xffu8; (g.bitmap_blocks * BLOCK_SIZE) as usize];
    for r in inner.alloc.free_runs() {
        for b in r.start - g.data_start..r.start + r.len - g.data_start {
            bits[(b / 8) as usize] &= !(1 << (b % 8));
        }
    }
    inner
        .pool
        .write_flush(g.bitmap_start * BLOCK_SIZE, &bits, Category::Metadata)?;
    inner.pool.fence();
    write_state(
        &inner.pool,
        SbState {
            clean: true,
            mount_count: inner.mount_count,
        },
    )
}
