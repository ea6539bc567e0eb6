//! The allocator snapshot: the bitmap of used data blocks that a clean unmount saves (with its
//! checksum in the superblock's state record) and mkfs writes. Mount never trusts it on its
//! own: it rebuilds free space from the inode tables and reports a snapshot that disagrees.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::alloc::BlockRun;
use crate::media::layout::{BLOCK_SIZE, Geometry, bitmap_bit};
use crate::media::pool::{Category, Pool};

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

/// Compare the allocator bitmap saved by the last clean unmount with the free space rebuilt
/// from the inode tables (`free`, sorted): a line saying what is wrong, or `None` when they
/// agree. The rebuilt free space is what the mount uses either way; the bitmap is never trusted
/// on its own.
pub(crate) fn bitmap_disagreement(
    pool: &Pool,
    g: &Geometry,
    saved_crc: u32,
    free: &[BlockRun],
) -> Result<Option<String>> {
    let mut bits = bitmap_buffer(g, 0)?;
    pool.read(g.bitmap_start * BLOCK_SIZE, &mut bits)?;
    if crate::media::crc::crc32c(&bits) != saved_crc {
        return Ok(Some(
            "the allocator bitmap saved at the last clean unmount fails its checksum".into(),
        ));
    }
    let expect = bitmap_of(g, free)?;
    let differing: u64 = (0..g.data_blocks)
        .map(|i| Ok(u64::from(bitmap_get(&bits, i)? != bitmap_get(&expect, i)?)))
        .sum::<Result<u64>>()?;
    Ok((differing > 0).then(|| {
        format!(
            "the allocator bitmap saved at the last clean unmount disagrees with the inode tables on {differing} blocks"
        )
    }))
}

/// The allocator bitmap describing `free` (bit set = block in use; bits past the data area set).
pub(crate) fn bitmap_of(g: &Geometry, free: &[BlockRun]) -> Result<Vec<u8>> {
    let mut bits = bitmap_buffer(g, 0xff)?;
    for r in free {
        if !g.is_data_block(r.start) || !g.is_data_block(r.start + r.len - 1) {
            return Err(corrupt!(
                "free run {}+{} lies outside the data area",
                r.start,
                r.len
            ));
        }
        for b in r.start - g.data_start..r.start + r.len - g.data_start {
            let (byte, mask) = bitmap_bit(b)?;
            let slot = bits
                .get_mut(byte)
                .ok_or_else(|| corrupt!("data block index {b} is past the allocator bitmap"))?;
            *slot &= !mask;
        }
    }
    Ok(bits)
}

/// Write the bitmap describing `free` and fence; returns its checksum for the state record.
pub(crate) fn save(pool: &Pool, g: &Geometry, free: &[BlockRun]) -> Result<u32> {
    let bits = bitmap_of(g, free)?;
    pool.write_flush(g.bitmap_start * BLOCK_SIZE, &bits, Category::Metadata)?;
    pool.fence();
    Ok(crate::media::crc::crc32c(&bits))
}
