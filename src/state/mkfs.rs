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

/// Write the superblock's mutable state record and fence.
pub(crate) fn write_state(pool: &Pool, st: SbState) -> Result<()> {
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

/// Format the pool at `path` (see [`MkfsOptions`]).
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
