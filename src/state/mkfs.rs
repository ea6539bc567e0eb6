//! mkfs: format a pool (geometry, zeroed journals, inode table and bitmap, the root directory,
//! the superblock last), refusing to touch an existing file unless asked to.

use crate::error::{Error, Result};
use crate::media::checksum;
use crate::media::layout::{
    self, BLOCK_SIZE, Geometry, INODE_IN_USE, INODE_SIZE, InodeHeader, JOURNAL_ENTRY_SIZE,
    ROOT_INO, SbState, Superblock, sb,
};
use crate::media::alloc::BlockRun;
use crate::media::pool::{Category, Pool};
use crate::state::alloc_snapshot;
use crate::sys::now_ns;
use crate::types::MkfsOptions;
use std::path::Path;

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

/// Write the superblock's mutable state record and fence; an error if the pool did not reach
/// its disk.
pub(crate) fn write_state(pool: &Pool, st: SbState) -> Result<()> {
    pool.write_flush(sb::STATE as u64, &st.encode(), Category::Metadata)?;
    pool.fence();
    pool.check_durable()
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

/// Explicit options that no pool could have, refused before anything is looked at or
/// touched: an invalid value is an error, never silently rounded.
fn check_options(opts: &MkfsOptions) -> Result<()> {
    if let Some(size) = opts.size
        && !size.is_multiple_of(BLOCK_SIZE)
    {
        return Err(Error::Invalid(format!(
            "size {size} is not a multiple of the 4096-byte block size"
        )));
    }
    if let Some(p) = opts.partitions
        && !(1..=MAX_PARTITIONS).contains(&p)
    {
        return Err(Error::Invalid(format!(
            "partitions must be 1..={MAX_PARTITIONS}, got {p}"
        )));
    }
    if opts.inodes == Some(0) {
        return Err(Error::Invalid(
            "inodes must be at least 1 (the root directory takes one), got 0".into(),
        ));
    }
    Ok(())
}

/// Most partitions a pool may have (`Geometry::compute` checks the same bound).
const MAX_PARTITIONS: u32 = 256;

/// The geometry `mkfs` would give a pool of `size` bytes with `opts` (already checked by
/// [`check_options`]). An explicit inode count is split evenly over the partitions and each
/// share rounded up to a multiple of 16 (the inode table is laid out in groups of 16); the
/// default is one inode per 16 KiB, at least 64 per partition.
fn plan_geometry(size: u64, opts: &MkfsOptions) -> Result<Geometry> {
    let partitions = opts.partitions.unwrap_or_else(|| default_partitions(size));
    let total_inodes = opts
        .inodes
        .unwrap_or_else(|| (size / 16384).max(64 * u64::from(partitions)));
    let too_many = || Error::Invalid(format!("too many inodes: {total_inodes}"));
    let ipp = total_inodes
        .div_ceil(u64::from(partitions))
        .checked_next_multiple_of(16)
        .ok_or_else(too_many)?;
    let ipp = u32::try_from(ipp).map_err(|_| too_many())?;
    let zoned = Geometry::compute(size, partitions, ipp)?;
    Geometry::compute_full(size, partitions, ipp, zoned.zone_slots, opts.wear_stats)
}

/// Format the pool at `path` (see [`MkfsOptions`]).
pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<()> {
    check_options(opts)?;
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
                Err(e @ Error::Busy(_)) => return Err(e),
                Err(_) => "already exists",
            };
            return Err(Error::Invalid(format!(
                "{} {what}; pass --force to format it (its contents will be lost)",
                path.display()
            )));
        }
        if let Some(size) = opts.size {
            plan_geometry(size, opts)?;
        }
        // The pool lock comes before any change: a mounted pool is refused as it is.
        let pool = Pool::open_for_format(path, opts.size)?;
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
    pool.settle_backing()?;
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
    // Slot descriptors (a formatted-over pool may have left live ones) and wear counters.
    for p in 0..g.partitions {
        zero_region(&pool, g.zone_desc_offset(p, 0), u64::from(g.zone_slots) * 16)?;
        if g.zone_growth {
            zero_region(&pool, g.zone_table_offset(p), BLOCK_SIZE)?;
        }
    }
    zero_region(&pool, g.wear_start * BLOCK_SIZE, g.wear_blocks * BLOCK_SIZE)?;
    // The allocator snapshot of an empty pool: every data block free.
    let bitmap_crc = alloc_snapshot::save(
        &pool,
        &g,
        &[BlockRun {
            start: g.data_start,
            len: g.data_blocks,
        }],
    )?;
    let now = now_ns();
    let (uid, gid) = crate::sys::real_ids();
    let root = InodeHeader {
        flags: INODE_IN_USE | if g.checked_sizes { layout::INODE_SIZE_CHECKED } else { 0 },
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
    let mut raw = [0u8; layout::INODE_BYTES];
    raw[..layout::ino::HEADER].copy_from_slice(&root.encode());
    let crc = checksum::inode_checksum(&raw);
    raw[layout::ino::CRC..layout::ino::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    pool.write_flush(roff, &raw, Category::Metadata)?;
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
            bitmap_crc,
            ..SbState::default()
        },
    )
}
