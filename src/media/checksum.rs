//! Checksums of on-media structures whose definition is more than "crc32c of these bytes".
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::{
    BLOCK_BYTES, CHECKED_SIZE_MASK, DIR_MAGIC, EXTENT_BYTES, ExtentRecord, INDEX_SLOTS,
    INLINE_SLOTS, INODE_BYTES, INODE_SIZE_CHECKED, checked_size_word, dir_block, get_u32, get_u64,
    index_block, ino,
};

/// The checksum of an in-use inode's 256 bytes `raw`: crc32c over the inode with the times
/// (bytes 64..96, updated in place without journaling; any value is a valid time), the checksum
/// field itself, the size field of an inode with `INODE_SIZE_CHECKED` (a checked size word,
/// which carries its own check bits and is stored alone by appends), and every extent slot that
/// is not live (length 0, or at or beyond `map_end`: dead slots are zeroed after the
/// transaction that killed them, without journaling) taken as zero. Every journaled change to
/// an inode carries the new checksum in the same transaction.
pub fn inode_checksum(raw: &[u8]) -> u32 {
    let mut b = [0u8; INODE_BYTES];
    let n = raw.len().min(INODE_BYTES);
    b[..n].copy_from_slice(&raw[..n]);
    b[ino::ATIME..ino::RDEV].fill(0);
    b[ino::CRC..ino::CRC + 4].fill(0);
    if get_u32(&b, ino::FLAGS) & INODE_SIZE_CHECKED != 0 {
        b[ino::SIZE..ino::SIZE + 8].fill(0);
    }
    let map_end = get_u64(&b, ino::MAP_END);
    zero_dead_slots(&mut b[ino::SLOTS..ino::SLOTS + INLINE_SLOTS * EXTENT_BYTES], map_end);
    crate::media::crc::crc32c(&b)
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
    crate::media::crc::crc32c_append(crate::media::crc::crc32c(&block.to_le_bytes()), &b)
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
    crate::media::crc::crc32c(&b)
}

/// Whether the directory block `raw` (block `index` of directory `dir_ino`) has a header that
/// matches its checksum.
pub fn dir_header_checksum_ok(dir_ino: u64, index: u32, raw: &[u8]) -> bool {
    raw.len() >= dir_block::SLOT
        && get_u32(raw, dir_block::MAGIC) == DIR_MAGIC
        && get_u32(raw, dir_block::CRC)
            == dir_header_checksum(dir_ino, index, get_u64(raw, dir_block::STARTS))
}

/// Whether the in-use inode `raw` matches its checksum (and, with `INODE_SIZE_CHECKED`, its
/// size word its check bits).
pub fn inode_checksum_ok(raw: &[u8]) -> bool {
    raw.len() >= INODE_BYTES
        && get_u32(raw, ino::CRC) == inode_checksum(raw)
        && size_word_ok(raw)
}

/// Whether the size field of inode `raw` is sound: any value in an inode without
/// `INODE_SIZE_CHECKED` (the inode checksum covers it), else a checked size word that matches
/// its check bits.
pub fn size_word_ok(raw: &[u8]) -> bool {
    if get_u32(raw, ino::FLAGS) & INODE_SIZE_CHECKED == 0 {
        return true;
    }
    let w = get_u64(raw, ino::SIZE);
    w == checked_size_word(get_u32(raw, ino::GENERATION), w & CHECKED_SIZE_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::layout::{INODE_IN_USE, InodeHeader, put_u64};

    fn inode(flags: u32, size: u64) -> [u8; INODE_BYTES] {
        let h = InodeHeader { flags, generation: 77, size, map_end: 3, ..Default::default() };
        let mut raw = [0u8; INODE_BYTES];
        raw[..ino::HEADER].copy_from_slice(&h.encode());
        let crc = inode_checksum(&raw);
        raw[ino::CRC..ino::CRC + 4].copy_from_slice(&crc.to_le_bytes());
        raw
    }

    #[test]
    fn a_checked_size_word_is_outside_the_checksum_and_checks_itself() {
        let flags = INODE_IN_USE | INODE_SIZE_CHECKED;
        let mut raw = inode(flags, 5000);
        assert!(inode_checksum_ok(&raw));
        assert_eq!(InodeHeader::decode(&raw).size, 5000);
        // An append's one store: a new word, the checksum untouched.
        put_u64(&mut raw, ino::SIZE, checked_size_word(77, 1 << 40));
        assert!(inode_checksum_ok(&raw));
        assert_eq!(InodeHeader::decode(&raw).size, 1 << 40);
        // Every single-bit flip of the word is caught, in the size bits and the check bits.
        for bit in 0..64 {
            let mut bad = raw;
            put_u64(&mut bad, ino::SIZE, get_u64(&raw, ino::SIZE) ^ (1 << bit));
            assert!(!inode_checksum_ok(&bad), "bit {bit}");
        }
        // A word of another inode's generation (misdirected) is caught.
        let mut other = raw;
        put_u64(&mut other, ino::SIZE, checked_size_word(78, 1 << 40));
        assert!(!inode_checksum_ok(&other));
        // Dropping the flag puts the size word back under the checksum: caught.
        let mut unflagged = raw;
        unflagged[ino::FLAGS..ino::FLAGS + 4].copy_from_slice(&INODE_IN_USE.to_le_bytes());
        assert!(!inode_checksum_ok(&unflagged));
    }

    #[test]
    fn a_plain_size_is_covered_by_the_checksum() {
        let raw = inode(INODE_IN_USE, 5000);
        assert_eq!(get_u64(&raw, ino::SIZE), 5000, "a plain size, no check bits");
        assert!(inode_checksum_ok(&raw));
        let mut bad = raw;
        put_u64(&mut bad, ino::SIZE, 5001);
        assert!(!inode_checksum_ok(&bad));
    }
}
