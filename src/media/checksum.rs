//! Checksums of on-media structures whose definition is more than "crc32c of these bytes".
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::{
    BLOCK_BYTES, DIR_MAGIC, EXTENT_BYTES, ExtentRecord, INDEX_SLOTS, INLINE_SLOTS, INODE_BYTES,
    dir_block, get_u32, get_u64, index_block, ino,
};

/// The checksum of an in-use inode's 256 bytes `raw`: crc32c over the inode with the times
/// (bytes 64..96, updated in place without journaling; any value is a valid time), the checksum
/// field itself, and every extent slot that is not live (length 0, or at or beyond `map_end`:
/// dead slots are zeroed after the transaction that killed them, without journaling) taken as
/// zero. Every journaled change to an inode carries the new checksum in the same transaction.
pub fn inode_checksum(raw: &[u8]) -> u32 {
    let mut b = [0u8; INODE_BYTES];
    let n = raw.len().min(INODE_BYTES);
    b[..n].copy_from_slice(&raw[..n]);
    b[ino::ATIME..ino::RDEV].fill(0);
    b[ino::CRC..ino::CRC + 4].fill(0);
    let map_end = get_u64(&b, ino::MAP_END);
    zero_dead_slots(&mut b[ino::SLOTS..ino::SLOTS + INLINE_SLOTS * EXTENT_BYTES], map_end);
    crc32c::crc32c(&b)
}

/// Zero every extent record of `slots` that is not live (length 0, or at or beyond `map_end`).
fn zero_dead_slots(slots: &mut [u8], map_end: u64) {
    for rec in slots.chunks_exact_mut(EXTENT_BYTES) {
        let r = ExtentRecord::decode(rec);
        if r.len == 0 || u64::from(r.logical) >= map_end {
            rec.fill(0);
        }
    }
}

/// The checksum of the extent-index block at pool block `block` whose 4096 bytes are `raw`,
/// owned by an inode whose `map_end` is `map_end`: crc32c of the block number (8 bytes,
/// little-endian: a block written to the wrong place does not match) followed by the block
/// with the checksum field and every slot that is not live (length 0, or at or beyond
/// `map_end`) taken as zero. So the unjournaled zeroing of dead slots after a truncate never
/// changes it, and lowering `map_end` changes it only for blocks holding records it kills;
/// every transaction that changes a slot or `next` of the block, or kills one of its records,
/// carries the new value (`MountState::commit`).
pub fn index_block_checksum(block: u64, raw: &[u8], map_end: u64) -> u32 {
    let mut b = [0u8; BLOCK_BYTES];
    let n = raw.len().min(BLOCK_BYTES);
    b[..n].copy_from_slice(&raw[..n]);
    b[index_block::CRC..index_block::CRC + 4].fill(0);
    let slots = index_block::SLOTS..index_block::SLOTS + INDEX_SLOTS * EXTENT_BYTES;
    zero_dead_slots(&mut b[slots], map_end);
    crc32c::crc32c_append(crc32c::crc32c(&block.to_le_bytes()), &b)
}

/// Whether the extent-index block `raw` at pool block `block` matches its checksum.
pub fn index_block_checksum_ok(block: u64, raw: &[u8], map_end: u64) -> bool {
    raw.len() >= BLOCK_BYTES && get_u32(raw, index_block::CRC) == index_block_checksum(block, raw, map_end)
}

/// The checksum of a directory block header whose `starts` word is `starts`, for block
/// `index` (logical block) of directory `dir_ino`: crc32c of the magic (4 bytes), `starts`
/// (8), the directory's inode number (8) and `index` (4), all little-endian. The block's
/// place in its directory (not its pool block) is bound in, so a header written into another
/// directory or another block of the same one does not match, while moving a directory's
/// blocks (compaction) keeps it valid.
pub fn dir_header_checksum(dir_ino: u64, index: u32, starts: u64) -> u32 {
    let mut b = [0u8; 24];
    b[..4].copy_from_slice(&DIR_MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&starts.to_le_bytes());
    b[12..20].copy_from_slice(&dir_ino.to_le_bytes());
    b[20..].copy_from_slice(&index.to_le_bytes());
    crc32c::crc32c(&b)
}

/// Whether the directory block `raw` (block `index` of directory `dir_ino`) has a header that
/// matches its checksum.
pub fn dir_header_checksum_ok(dir_ino: u64, index: u32, raw: &[u8]) -> bool {
    raw.len() >= dir_block::SLOT
        && get_u32(raw, dir_block::MAGIC) == DIR_MAGIC
        && get_u32(raw, dir_block::CRC)
            == dir_header_checksum(dir_ino, index, get_u64(raw, dir_block::STARTS))
}

/// Whether the in-use inode `raw` matches its checksum.
pub fn inode_checksum_ok(raw: &[u8]) -> bool {
    raw.len() >= INODE_BYTES && get_u32(raw, ino::CRC) == inode_checksum(raw)
}
