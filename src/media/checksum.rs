//! Checksums of on-media structures whose definition is more than "crc32c of these bytes".
#![deny(clippy::cast_possible_truncation)]

use crate::media::layout::{
    EXTENT_BYTES, ExtentRecord, INLINE_SLOTS, INODE_BYTES, get_u32, get_u64, ino,
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
    for s in 0..INLINE_SLOTS {
        let o = ino::SLOTS + s * EXTENT_BYTES;
        let r = ExtentRecord::decode(&b[o..o + EXTENT_BYTES]);
        if r.len == 0 || u64::from(r.logical) >= map_end {
            b[o..o + EXTENT_BYTES].fill(0);
        }
    }
    crc32c::crc32c(&b)
}

/// Whether the in-use inode `raw` matches its checksum.
pub fn inode_checksum_ok(raw: &[u8]) -> bool {
    raw.len() >= INODE_BYTES && get_u32(raw, ino::CRC) == inode_checksum(raw)
}
