//! Mount (superblock validation, journal recovery, DRAM index rebuild, orphan cleanup) and
//! clean unmount (allocator state saved, superblock marked clean).
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::alloc::{Allocator, BlockRun};
use crate::media::journal::Journals;
use crate::media::layout::{
    self, BLOCK_BYTES, BLOCK_SIZE, FileKind, Geometry, INODE_BYTES, INODE_SIZE, InodeHeader,
    MAX_FILE_SIZE, ROOT_INO, SbState, Superblock, bitmap_bit, sb,
};
use crate::media::pool::{Category, Pool};
use crate::meta::dir::DirIndex;
use crate::meta::inode::FileMap;
use crate::state::background::Background;
use crate::state::inode_state::{InodeState, wlock};
use crate::state::mkfs::write_state;
use crate::state::mount_state::MountState;
use crate::sys::now_ns;
use crate::types::MountOptions;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Read and validate the superblock of the pool at `path` without mounting it (nothing is
/// written).
pub fn read_superblock(path: &Path) -> Result<(Superblock, SbState)> {
    let pool = Pool::open(path, true)?;
    decode_superblock(&pool)
}

/// Decode and validate the superblock and its state record at the start of `pool`.
fn decode_superblock(pool: &Pool) -> Result<(Superblock, SbState)> {
    let raw: [u8; sb::STATE + sb::STATE_SIZE] = pool
        .read_array(0)
        .map_err(|_| Error::Foreign("shorter than a superblock".into()))?;
    let sbk = Superblock::decode(&raw, pool.len())?;
    Ok((sbk, SbState::decode(&raw[sb::STATE..])))
}

/// What the inode tables hold, as found at mount.
struct LoadedInodes {
    inodes: HashMap<u64, InodeState>,
    /// Free inode numbers per partition.
    free: Vec<BTreeSet<u64>>,
    /// Pool offsets of dead extent slots, to zero.
    dead_slots: Vec<u64>,
}

/// Load every in-use inode, validating what the DRAM indexes are built from.
fn load_inodes(pool: &Pool, g: &Geometry) -> Result<LoadedInodes> {
    let mut nodes = HashMap::new();
    let mut free = vec![BTreeSet::new(); g.partitions as usize];
    let mut dead_offs = Vec::new();
    let mut blk = vec![0u8; BLOCK_BYTES];
    let per_block = BLOCK_SIZE / INODE_SIZE;
    let total = g.total_inodes();
    let mut ino = 1u64;
    while ino <= total {
        pool.read(g.inode_offset(ino)?, &mut blk)?;
        for (cur, raw) in (ino..).zip(blk.chunks_exact(INODE_BYTES)) {
            let hdr = InodeHeader::decode(raw);
            if !hdr.in_use() {
                free[g.inode_partition(cur) as usize].insert(cur);
                continue;
            }
            let kind = hdr
                .kind()
                .ok_or_else(|| corrupt!("inode {cur}: unknown file type in mode {:o}", hdr.mode))?;
            if hdr.size > MAX_FILE_SIZE || hdr.map_end > u64::from(u32::MAX) {
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
                let mut b = vec![0u8; BLOCK_BYTES];
                for k in 0..hdr.size / BLOCK_SIZE {
                    let (phys, _) = map
                        .lookup(k)
                        .ok_or_else(|| corrupt!("directory {cur}: block {k} is not mapped"))?;
                    pool.read(phys * BLOCK_SIZE, &mut b)?;
                    let block = u32::try_from(k)
                        .map_err(|_| corrupt!("directory {cur}: block {k} beyond 2^32 blocks"))?;
                    d.load_block(cur, block, &b)?;
                }
                Some(d)
            } else {
                None
            };
            nodes.insert(cur, InodeState::new(cur, hdr, map, dir));
        }
        ino += per_block;
    }
    Ok(LoadedInodes {
        inodes: nodes,
        free,
        dead_slots: dead_offs,
    })
}

/// Every block owned by an inode: (run, owner), sorted; overlapping ownership is corruption.
fn owned_runs(nodes: &HashMap<u64, InodeState>) -> Result<Vec<(BlockRun, u64)>> {
    let v = InodeState::owned_runs_of(nodes.values());
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
fn complement(g: &Geometry, owned: &[(BlockRun, u64)]) -> Vec<BlockRun> {
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

/// A buffer as long as the allocator bitmap, every byte `fill`.
fn bitmap_buffer(g: &Geometry, fill: u8) -> Result<Vec<u8>> {
    let len = usize::try_from(g.bitmap_blocks * BLOCK_SIZE).map_err(|_| {
        corrupt!(
            "allocator bitmap of {} blocks does not fit in memory",
            g.bitmap_blocks
        )
    })?;
    Ok(vec![fill; len])
}

/// Whether bit `i` of the allocator bitmap `bits` is set (the data block is in use).
fn bitmap_get(bits: &[u8], i: u64) -> Result<bool> {
    let (byte, mask) = bitmap_bit(i)?;
    let b = bits
        .get(byte)
        .ok_or_else(|| corrupt!("data block index {i} is past the allocator bitmap"))?;
    Ok(b & mask != 0)
}

/// Free runs recorded in the saved allocator bitmap (bit set = block in use).
fn bitmap_free_runs(pool: &Pool, g: &Geometry) -> Result<Vec<BlockRun>> {
    let mut bits = bitmap_buffer(g, 0)?;
    pool.read(g.bitmap_start * BLOCK_SIZE, &mut bits)?;
    let mut free = Vec::new();
    let mut run: Option<u64> = None;
    for i in 0..g.data_blocks {
        let used = bitmap_get(&bits, i)?;
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

/// Mount the pool at `path`: validate the superblock, roll back unfinished transactions,
/// rebuild the DRAM indexes, free orphans.
pub(crate) fn mount(path: &Path, opts: &MountOptions) -> Result<Arc<MountState>> {
    mount_pool(Pool::open(path, opts.private)?, opts)
}

/// Mount an already mapped pool (the crash explorer patches a private mapping of a crash image
/// before recovery runs on it).
pub(crate) fn mount_pool(pool: Pool, opts: &MountOptions) -> Result<Arc<MountState>> {
    let (sbk, sb_state) = decode_superblock(&pool)?;
    let g = sbk.geometry.clone();
    let mount_count = sb_state.mount_count + 1;
    write_state(
        &pool,
        SbState {
            clean: false,
            mount_count,
        },
    )?;
    let recovery = Journals::recover(&pool, &g)?;
    let loaded = load_inodes(&pool, &g)?;
    match loaded.inodes.get(&ROOT_INO) {
        Some(n) if n.is_dir() => {}
        Some(_) => return Err(corrupt!("inode 1 (the root) is not a directory")),
        None => return Err(corrupt!("inode 1 (the root) is not in use")),
    }
    let free = if sb_state.clean && recovery.rolled_back.is_empty() {
        bitmap_free_runs(&pool, &g)?
    } else {
        complement(&g, &owned_runs(&loaded.inodes)?)
    };
    let alloc = Allocator::from_free_runs(&g.partition_ranges(), free)
        .map_err(|e| corrupt!("saved allocator state: {e}"))?;
    for off in loaded.dead_slots {
        pool.zero(off, layout::EXTENT_SIZE, Category::Metadata)?;
        pool.flush(off, layout::EXTENT_SIZE, Category::Metadata);
    }
    pool.fence();
    let orphans: Vec<u64> = loaded
        .inodes
        .values()
        .filter(|n| n.hdr.nlink == 0)
        .map(|n| n.ino)
        .collect();
    let background = Background::new(
        !opts.no_background_rewrite,
        !opts.no_background_rewrite && !pool.is_private(),
    );
    let state = MountState {
        journals: Journals::new(&g),
        alloc,
        inode_free: loaded.free.into_iter().map(Mutex::new).collect(),
        inodes: RwLock::new(
            loaded
                .inodes
                .into_iter()
                .map(|(k, v)| (k, Arc::new(RwLock::new(v))))
                .collect(),
        ),
        namespace: RwLock::new(()),
        consistency: opts.consistency,
        poisoned: AtomicBool::new(false),
        unmounted: AtomicBool::new(false),
        mount_count,
        // Seeded from the low 32 bits of the clock.
        generation: AtomicU32::new(
            u32::try_from(now_ns() & i64::from(u32::MAX)).expect("masked to 32 bits"),
        ),
        recovery,
        faults: Mutex::new(None),
        background: Arc::new(background),
        pool,
        geo: g,
        sb: sbk,
    };
    // Inodes whose last link went away while open (or mid-removal) are freed now, the way the
    // last release of an unlinked file frees it.
    for ino in orphans {
        let n = state.inode(ino)?;
        state.free_inode(&mut wlock(&n))?;
    }
    Ok(Arc::new(state))
}

/// Clean unmount: save the allocator state and mark the superblock clean (not for a poisoned
/// mount, which the next mount recovers). Runs once; later calls do nothing.
pub(crate) fn unmount(state: &MountState) -> Result<()> {
    if state.unmounted.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    if state.poisoned.load(Ordering::SeqCst) {
        return Err(corrupt!(
            "not marking the pool clean: an internal failure poisoned this mount; the next mount recovers"
        ));
    }
    if state.pool.is_private() {
        return Ok(());
    }
    let g = &state.geo;
    let mut bits = bitmap_buffer(g, 0xff)?;
    for r in state.alloc.free_runs() {
        for b in r.start - g.data_start..r.start + r.len - g.data_start {
            let (byte, mask) = bitmap_bit(b)?;
            bits[byte] &= !mask;
        }
    }
    state
        .pool
        .write_flush(g.bitmap_start * BLOCK_SIZE, &bits, Category::Metadata)?;
    state.pool.fence();
    write_state(
        &state.pool,
        SbState {
            clean: true,
            mount_count: state.mount_count,
        },
    )
}

impl Drop for MountState {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Relaxed) {
            let _ = unmount(self);
        }
    }
}
