//! On-media format: every structure's size, field offsets, encoding and validation.
//!
//! This file and `docs/DESIGN.md` ("On-media format") describe the same bytes; a test in
//! `tests/format_doc.rs` checks the documented offsets against the constants here. All integers
//! are little-endian; all references on media are block numbers or byte offsets, never pointers.
//! Every field offset is named once, in one of the modules below ([`sb`], [`ino`], [`extent`],
//! [`index_block`], [`dir_block`], [`dentry`], [`xattr_block`], [`xattr_entry`]; the journal
//! entry's are in `journal::entry`), and the code reads and writes fields only through them.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
pub use crate::media::geometry::{
    BLOCK_SIZE, BLOCKS_PER_HUGE, Geometry, INODE_SIZE, JOURNAL_ENTRIES, JOURNAL_ENTRY_SIZE,
    STAGING_BLOCKS,
};

/// [`BLOCK_SIZE`] as a `usize`: the length of a block buffer.
pub(crate) const BLOCK_BYTES: usize = const_usize(BLOCK_SIZE);
/// Bytes per 2 MiB hugepage.
pub(crate) const HUGE_SIZE: u64 = BLOCK_SIZE * BLOCKS_PER_HUGE;
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 3;
/// Superblock magic (offset 0).
pub const MAGIC: [u8; 8] = *b"WINEFSPM";
/// Longest file name in bytes (NAME_MAX).
pub(crate) const NAME_MAX: usize = 255;
/// Longest symlink target in bytes.
pub(crate) const SYMLINK_MAX: usize = 4095;
/// Largest file: logical block numbers are 32-bit on media.
pub(crate) const MAX_FILE_SIZE: u64 = u32::MAX as u64 * BLOCK_SIZE;

/// [`JOURNAL_ENTRY_SIZE`] as a `usize`: the length of an entry buffer.
pub(crate) const JOURNAL_ENTRY_BYTES: usize = const_usize(JOURNAL_ENTRY_SIZE);

/// [`INODE_SIZE`] as a `usize`: the length of an inode buffer.
pub(crate) const INODE_BYTES: usize = const_usize(INODE_SIZE);
/// Extent slots held in the inode itself.
pub const INLINE_SLOTS: usize = 8;
/// Size of one extent record.
pub const EXTENT_SIZE: u64 = 16;
/// [`EXTENT_SIZE`] as a `usize`: the stride of extent slots in a buffer.
pub(crate) const EXTENT_BYTES: usize = const_usize(EXTENT_SIZE);
/// Extent slots per extent-index block.
pub const INDEX_SLOTS: usize = 255;
/// Extent-index block magic.
pub const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"WXIB");
/// Directory block magic.
pub const DIR_MAGIC: u32 = u32::from_le_bytes(*b"WDIR");
/// Xattr block magic.
pub const XATTR_MAGIC: u32 = u32::from_le_bytes(*b"WXAT");
/// Slots per directory block (each [`dir_block::SLOT`] bytes; slot 0 is the header).
pub const DIR_SLOTS: u32 = 64;
/// Size of a directory entry header (ino, name length, kind, crc): the name starts here.
pub const DENTRY_HEADER: usize = dentry::NAME;

/// Inode flag: the slot holds a live inode.
pub const INODE_IN_USE: u32 = 1;
/// Inode flag: bytes past the end of the file in its mapped blocks may not be zero (a
/// direct-path client appended there, or a write stored there in place before its size
/// committed: docs/DESIGN.md §5, §7b); whatever extends the file zeroes what it exposes first.
pub const INODE_TAIL_UNSETTLED: u32 = 2;
/// Inode flag: the size field is a *checked size word* ([`checked_size_word`]): the size in its
/// low 48 bits, check bits of the size and the generation in the high 16, and outside the
/// inode checksum. A size change alone then commits with one atomic 8-byte store, no journal
/// (an append into blocks the file already has, docs/DESIGN.md §5). Every inode made on a pool
/// with [`INCOMPAT_CHECKED_SIZES`] carries it.
pub const INODE_SIZE_CHECKED: u32 = 4;
/// Inode flag (`chattr +i`, Linux's `FS_IMMUTABLE_FL`, the same bit): nothing about the inode
/// changes but its access time and these flags; a directory gains and loses no entries.
pub const INODE_IMMUTABLE: u32 = 0x10;
/// Inode flag (`chattr +a`, `FS_APPEND_FL`): a file only grows by writes at its end; a directory
/// gains entries but loses none; neither is renamed, linked or unlinked.
pub const INODE_APPEND_ONLY: u32 = 0x20;
/// Inode flag (`chattr +d`, `FS_NODUMP_FL`): kept for backup tools; winefs gives it no meaning.
pub const INODE_NODUMP: u32 = 0x40;
/// Inode flag (`chattr +A`, `FS_NOATIME_FL`): reads and listings store no access time.
pub const INODE_NOATIME: u32 = 0x80;
/// The flags a user sees and sets (`FS_IOC_GETFLAGS`/`SETFLAGS`); every other bit is winefs's.
pub const INODE_USER_FLAGS: u32 = INODE_IMMUTABLE | INODE_APPEND_ONLY | INODE_NODUMP | INODE_NOATIME;
/// Incompatible feature: the pool has alternate-slot zones (after the allocator bitmap), whose
/// live slots hold the newest bytes of file blocks; a build that does not know them would read
/// stale data, so it must refuse the pool.
pub const INCOMPAT_SLOT_ZONES: u32 = 1;
/// Incompatible feature: the pool keeps a write counter per block after the slot zones
/// (`mkfs --wear-stats`); a build that does not know them would lay out the data area wrong.
pub const INCOMPAT_WEAR_TABLE: u32 = 2;
/// Incompatible feature: inodes made on the pool carry [`INODE_SIZE_CHECKED`]; a build that
/// does not know it would take their check bits for part of the size (and their checksums for
/// damage), so it must refuse the pool.
pub const INCOMPAT_CHECKED_SIZES: u32 = 4;
/// Incompatible feature: the slot zones may grow into 2 MiB units of the data area, listed in
/// an extension table block at the end of each zone; a build that does not know it would lay
/// out the data area wrong and miss the newest bytes in the extensions' slots.
pub const INCOMPAT_ZONE_GROWTH: u32 = 8;
/// Bits of the size in a checked size word.
pub const CHECKED_SIZE_MASK: u64 = (1 << 48) - 1;
const _: () = assert!(MAX_FILE_SIZE <= CHECKED_SIZE_MASK);

/// The checked size word of an inode of generation `generation` and size `size` (at most
/// `MAX_FILE_SIZE`): the size in bits 0..48, and in bits 48..64 the low 16 bits of crc32c of
/// the generation (4 bytes) then the size (8 bytes), little-endian. A torn, misdirected or
/// damaged word fails the check (`checksum::inode_checksum_ok`).
pub fn checked_size_word(generation: u32, size: u64) -> u64 {
    let size = size & CHECKED_SIZE_MASK;
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&generation.to_le_bytes());
    b[4..].copy_from_slice(&size.to_le_bytes());
    let check = u64::from(crate::media::crc::crc32c(&b) & 0xffff);
    check << 48 | size
}
/// Root directory inode number.
pub const ROOT_INO: u64 = 1;

/// `v` as a `usize`, for constants only: it is evaluated at compile time, where a value that does
/// not fit fails the build instead of truncating.
#[allow(clippy::cast_possible_truncation)] // checked by the assert just above the cast
const fn const_usize(v: u64) -> usize {
    assert!(v <= usize::MAX as u64, "constant does not fit a usize");
    v as usize
}

/// Superblock field offsets (block 0).
pub mod sb {
    /// 8 bytes: [`MAGIC`](super::MAGIC).
    pub const MAGIC: usize = 0;
    /// u32: format version, [`FORMAT_VERSION`](super::FORMAT_VERSION).
    pub const VERSION: usize = 8;
    /// u32: block size, must be [`BLOCK_SIZE`](super::BLOCK_SIZE).
    pub const BLOCK_SIZE: usize = 12;
    /// u64: pool size in bytes; at most the backing size.
    pub const POOL_SIZE: usize = 16;
    /// u32: number of partitions P, 1..=256.
    pub const PARTITIONS: usize = 24;
    /// u32: incompatible feature flags; any set bit refuses the mount.
    pub const INCOMPAT: usize = 28;
    /// u32: inodes per partition, a positive multiple of 16.
    pub const INODES_PER_PARTITION: usize = 32;
    /// u32: entries per journal ring.
    pub const JOURNAL_ENTRIES: usize = 36;
    /// u32: alternate slots per partition's zone; 0 in pools made before slot zones, which
    /// have none (and leave [`INCOMPAT_SLOT_ZONES`](super::INCOMPAT_SLOT_ZONES) clear).
    pub const ZONE_SLOTS: usize = 44;
    /// u32: undo staging blocks per journal.
    pub const STAGING_BLOCKS: usize = 40;
    /// u64: first journal block.
    pub const JOURNAL_START: usize = 48;
    /// u64: first inode table block.
    pub const INODE_TABLE_START: usize = 56;
    /// u64: first allocator bitmap block.
    pub const BITMAP_START: usize = 64;
    /// u64: allocator bitmap length in blocks.
    pub const BITMAP_BLOCKS: usize = 72;
    /// u64: first data block (a multiple of 512).
    pub const DATA_START: usize = 80;
    /// u64: blocks in the data area.
    pub const DATA_BLOCKS: usize = 88;
    /// 16 bytes: pool identity, set at mkfs.
    pub const UUID: usize = 96;
    /// i64: mkfs time, ns since the epoch.
    pub const CREATED_NS: usize = 112;
    /// u32: crc32c of bytes `0..CHECKSUMMED`.
    pub const CHECKSUM: usize = 120;
    /// Bytes covered by the checksum.
    pub const CHECKSUMMED: usize = 120;
    /// End of the immutable part (bytes 0..128, written once by mkfs).
    pub(crate) const IMMUTABLE: usize = 128;
    /// The mutable state record (own checksum) starts here, in its own cache line.
    pub const STATE: usize = 192;
    /// Length of the state record as encoded by `SbState::encode`.
    pub(crate) const STATE_SIZE: usize = 32;
    /// u32: 1 = cleanly unmounted (the journals are empty and the allocator bitmap was saved).
    pub const STATE_CLEAN: usize = 192;
    /// u32: 0, or the "needs fsck" flag: the kind of object whose check failed first at run time.
    pub const STATE_NEEDS_FSCK: usize = 196;
    /// u64: mounts since mkfs; its low 32 bits are the epoch stamped on journal entries.
    pub const STATE_MOUNT_COUNT: usize = 200;
    /// u32: crc32c of the allocator bitmap saved by the last clean unmount.
    pub const STATE_BITMAP_CRC: usize = 208;
    /// u32: crc32c of the state record's first `STATE_CHECKSUMMED` bytes.
    pub const STATE_CHECKSUM: usize = 216;
    /// Bytes of the state record covered by its checksum.
    pub const STATE_CHECKSUMMED: usize = 24;
}

/// Inode field offsets.
pub mod ino {
    /// u32: flags; bit 0 is [`INODE_IN_USE`](super::INODE_IN_USE), bit 1
    /// [`INODE_TAIL_UNSETTLED`](super::INODE_TAIL_UNSETTLED), bit 2
    /// [`INODE_SIZE_CHECKED`](super::INODE_SIZE_CHECKED), bits 4-7 the user's
    /// [`INODE_USER_FLAGS`](super::INODE_USER_FLAGS) (Linux's `FS_*_FL` bits).
    pub const FLAGS: usize = 0;
    /// u32: file type (`S_IFMT` bits) and permission bits.
    pub const MODE: usize = 4;
    /// u32: owner.
    pub const UID: usize = 8;
    /// u32: group.
    pub const GID: usize = 12;
    /// u32: link count (0 while in use: an unlinked open file).
    pub const NLINK: usize = 16;
    /// u32: NFS-style generation, set at creation.
    pub const GENERATION: usize = 20;
    /// u64: size in bytes; in an inode with [`INODE_SIZE_CHECKED`](super::INODE_SIZE_CHECKED)
    /// a checked size word (`layout::checked_size_word`), outside the inode checksum.
    pub const SIZE: usize = 24;
    /// u64: logical block bound; extent records at or beyond it are dead.
    pub const MAP_END: usize = 32;
    /// u64: data block holding the xattr block, 0 = none.
    pub const XATTR_BLOCK: usize = 40;
    /// u64: first extent-index block, 0 = none.
    pub const INDEX_BLOCK: usize = 48;
    /// u64: directories: the parent directory's inode; 0 for others.
    pub const PARENT: usize = 56;
    /// i64: access time, ns since the epoch.
    pub const ATIME: usize = 64;
    /// i64: modification time, ns since the epoch.
    pub const MTIME: usize = 72;
    /// i64: change time, ns since the epoch.
    pub const CTIME: usize = 80;
    /// i64: creation time, ns since the epoch.
    pub const CRTIME: usize = 88;
    /// u32: device number of device nodes.
    pub const RDEV: usize = 96;
    /// u32: crc32c of the inode as `media::checksum::inode_checksum` defines it.
    pub const CRC: usize = 100;
    /// u32: symlinks: crc32c of the target (the first `size` bytes of its block).
    pub const TARGET_CRC: usize = 104;
    /// End of the scalar header.
    pub const HEADER: usize = 128;
    /// The header is journaled in pieces of this many bytes, each fitting one inline journal
    /// entry (`layout::header_diff`).
    pub const CHUNK: usize = 32;
    /// The [`INLINE_SLOTS`](super::INLINE_SLOTS) extent records follow the header.
    pub const SLOTS: usize = HEADER;
}

/// Extent record field offsets (16 bytes, in an inode slot or an extent-index block slot).
pub mod extent {
    /// u32: first logical block.
    pub const LOGICAL: usize = 0;
    /// u32: length in blocks; 0 = free slot.
    pub const LEN: usize = 4;
    /// u64: first pool block of the run.
    pub const PHYS: usize = 8;
}

/// Extent-index block field offsets.
pub mod index_block {
    /// u32: [`INDEX_MAGIC`](super::INDEX_MAGIC).
    pub const MAGIC: usize = 0;
    /// u32: crc32c of the block (`checksum::index_block_checksum`: the block number, then the
    /// block with this field and every slot that is not live taken as zero).
    pub const CRC: usize = 4;
    /// u64: next index block of the chain, 0 = end.
    pub const NEXT: usize = 8;
    /// The [`INDEX_SLOTS`](super::INDEX_SLOTS) extent records start here.
    pub const SLOTS: usize = 16;
}

/// Directory block field offsets. The block is [`DIR_SLOTS`] slots of [`dir_block::SLOT`] bytes;
/// slot 0 is this header, entries start in slots 1..
pub mod dir_block {
    /// u32: [`DIR_MAGIC`](super::DIR_MAGIC).
    pub const MAGIC: usize = 0;
    /// u32: crc32c of the header (`checksum::dir_header_checksum`: magic, `starts`, the
    /// directory's inode number and the block's index in it); written with `starts`.
    pub const CRC: usize = 4;
    /// u64: bit s set ⇔ a live entry begins at slot s (bit 0, the header, never).
    pub const STARTS: usize = 8;
    /// Size of one slot: slot s begins at byte `s * SLOT` (so the entries at `SLOT`).
    pub const SLOT: usize = 64;
}

/// Directory entry header offsets, from the start of the entry's first slot.
pub mod dentry {
    /// u64: inode the name points to.
    pub const INO: usize = 0;
    /// u8: name length, 1..=255.
    pub const NAME_LEN: usize = 8;
    /// u8: file type code (`FileKind::code`).
    pub const KIND: usize = 9;
    /// u32: crc32c of header bytes `0..CRC` followed by the name.
    pub const CRC: usize = 12;
    /// The name follows the 16-byte header.
    pub const NAME: usize = 16;
}

/// Xattr block field offsets.
pub mod xattr_block {
    /// u32: [`XATTR_MAGIC`](super::XATTR_MAGIC).
    pub const MAGIC: usize = 0;
    /// u16: number of entries.
    pub const COUNT: usize = 4;
    /// u32: bytes of entries.
    pub const USED: usize = 8;
    /// u32: crc32c of the `USED` bytes of entries.
    pub const CRC: usize = 12;
    /// Entries are packed from here to the end of the block.
    pub const ENTRIES: usize = 16;
}

/// Xattr entry header offsets, from the start of the entry.
pub mod xattr_entry {
    /// u8: name length, 1..=255.
    pub const NAME_LEN: usize = 0;
    /// u16: value length.
    pub const VALUE_LEN: usize = 2;
    /// The name follows the 4-byte header, and the value follows the name (no padding).
    pub const NAME: usize = 4;
}

/// The 16-bit little-endian field at `b[o..o + 2]`.
pub(crate) fn get_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
/// The 32-bit little-endian field at `b[o..o + 4]`.
pub(crate) fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("a 4-byte slice"))
}
/// The 64-bit little-endian field at `b[o..o + 8]`.
pub(crate) fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("an 8-byte slice"))
}
/// The signed 64-bit little-endian field at `b[o..o + 8]` (two's complement).
pub(crate) fn get_i64(b: &[u8], o: usize) -> i64 {
    i64::from_le_bytes(b[o..o + 8].try_into().expect("an 8-byte slice"))
}
/// Store `v` little-endian at `b[o..o + 2]`.
pub(crate) fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
/// Store `v` little-endian at `b[o..o + 4]`.
pub(crate) fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
/// Store `v` little-endian at `b[o..o + 8]`.
pub(crate) fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
/// Store `v` little-endian (two's complement) at `b[o..o + 8]`.
pub(crate) fn put_i64(b: &mut [u8], o: usize, v: i64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte index and bit mask of data block index `i` (pool block `data_start + i`) in the
/// allocator bitmap: byte `i / 8`, bit `i % 8`, least significant bit first.
pub(crate) fn bitmap_bit(i: u64) -> Result<(usize, u8)> {
    let byte = usize::try_from(i / 8)
        .map_err(|_| corrupt!("allocator bitmap index {i} does not fit in memory"))?;
    Ok((byte, 1u8 << (i % 8)))
}

/// The superblock: immutable geometry (checksummed) plus a separately checksummed state record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The region layout recorded at mkfs.
    pub geometry: Geometry,
    /// Pool identity, set at mkfs.
    pub uuid: [u8; 16],
    /// mkfs time, ns since the epoch.
    pub created_ns: i64,
}

impl Superblock {
    /// Encode the immutable part (bytes `0..sb::IMMUTABLE`).
    pub fn encode(&self) -> [u8; sb::IMMUTABLE] {
        let g = &self.geometry;
        let mut b = [0u8; sb::IMMUTABLE];
        b[sb::MAGIC..sb::MAGIC + MAGIC.len()].copy_from_slice(&MAGIC);
        put_u32(&mut b, sb::VERSION, FORMAT_VERSION);
        put_u32(&mut b, sb::BLOCK_SIZE, BLOCK_SIZE_FIELD);
        put_u64(&mut b, sb::POOL_SIZE, g.pool_size);
        put_u32(&mut b, sb::PARTITIONS, g.partitions);
        let incompat = if g.zone_slots > 0 { INCOMPAT_SLOT_ZONES } else { 0 }
            | if g.wear_blocks > 0 { INCOMPAT_WEAR_TABLE } else { 0 }
            | if g.checked_sizes { INCOMPAT_CHECKED_SIZES } else { 0 }
            | if g.zone_growth { INCOMPAT_ZONE_GROWTH } else { 0 };
        put_u32(&mut b, sb::INCOMPAT, incompat);
        put_u32(&mut b, sb::ZONE_SLOTS, g.zone_slots);
        put_u32(&mut b, sb::INODES_PER_PARTITION, g.inodes_per_partition);
        put_u32(&mut b, sb::JOURNAL_ENTRIES, g.journal_entries);
        put_u32(&mut b, sb::STAGING_BLOCKS, g.staging_blocks);
        put_u64(&mut b, sb::JOURNAL_START, g.journal_start);
        put_u64(&mut b, sb::INODE_TABLE_START, g.inode_table_start);
        put_u64(&mut b, sb::BITMAP_START, g.bitmap_start);
        put_u64(&mut b, sb::BITMAP_BLOCKS, g.bitmap_blocks);
        put_u64(&mut b, sb::DATA_START, g.data_start);
        put_u64(&mut b, sb::DATA_BLOCKS, g.data_blocks);
        b[sb::UUID..sb::UUID + 16].copy_from_slice(&self.uuid);
        put_i64(&mut b, sb::CREATED_NS, self.created_ns);
        let crc = crate::media::crc::crc32c(&b[..sb::CHECKSUMMED]);
        put_u32(&mut b, sb::CHECKSUM, crc);
        b
    }

    /// Decode and validate the immutable part. Header fields are checked before any layout math;
    /// each failure names the field. `actual_size` is the size of the backing file or device.
    pub fn decode(b: &[u8], actual_size: u64) -> Result<Superblock> {
        if b.len() < sb::IMMUTABLE {
            return Err(Error::Foreign("shorter than a superblock".into()));
        }
        let magic = &b[sb::MAGIC..sb::MAGIC + MAGIC.len()];
        if magic != MAGIC {
            return Err(Error::Foreign(format!(
                "bad magic {magic:02x?} at offset 0 (expected {MAGIC:02x?} \"WINEFSPM\")"
            )));
        }
        let version = get_u32(b, sb::VERSION);
        if version != FORMAT_VERSION {
            return Err(Error::Version {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let stored = get_u32(b, sb::CHECKSUM);
        let crc = crate::media::crc::crc32c(&b[..sb::CHECKSUMMED]);
        if stored != crc {
            return Err(corrupt!(
                "superblock checksum mismatch: stored {stored:#010x}, computed {crc:#010x}"
            ));
        }
        let bs = get_u32(b, sb::BLOCK_SIZE);
        if bs != BLOCK_SIZE_FIELD {
            return Err(corrupt!(
                "superblock block size {bs}, only {BLOCK_SIZE} is supported"
            ));
        }
        let incompat = get_u32(b, sb::INCOMPAT);
        let known =
            INCOMPAT_SLOT_ZONES | INCOMPAT_WEAR_TABLE | INCOMPAT_CHECKED_SIZES | INCOMPAT_ZONE_GROWTH;
        if incompat & !known != 0 {
            return Err(corrupt!(
                "superblock has unknown incompatible features {:#x}",
                incompat & !known
            ));
        }
        let zone_slots = get_u32(b, sb::ZONE_SLOTS);
        if (zone_slots > 0) != (incompat & INCOMPAT_SLOT_ZONES != 0) {
            return Err(corrupt!(
                "superblock says {zone_slots} slots per zone but its slot-zone feature bit is {}",
                if incompat & INCOMPAT_SLOT_ZONES != 0 { "set" } else { "clear" }
            ));
        }
        let pool_size = get_u64(b, sb::POOL_SIZE);
        if pool_size > actual_size {
            return Err(corrupt!(
                "superblock says the pool is {pool_size} bytes but the backing is only {actual_size} bytes (truncated?)"
            ));
        }
        let partitions = get_u32(b, sb::PARTITIONS);
        let ipp = get_u32(b, sb::INODES_PER_PARTITION);
        let wear = incompat & INCOMPAT_WEAR_TABLE != 0;
        let growth = incompat & INCOMPAT_ZONE_GROWTH != 0;
        let mut expect =
            Geometry::compute_layout(pool_size, partitions, ipp, zone_slots, wear, growth)
                .map_err(|e| corrupt!("superblock geometry is impossible: {e}"))?;
        expect.checked_sizes = incompat & INCOMPAT_CHECKED_SIZES != 0;
        let stored_geom = Geometry {
            pool_size,
            partitions,
            inodes_per_partition: ipp,
            journal_entries: get_u32(b, sb::JOURNAL_ENTRIES),
            staging_blocks: get_u32(b, sb::STAGING_BLOCKS),
            journal_start: get_u64(b, sb::JOURNAL_START),
            inode_table_start: get_u64(b, sb::INODE_TABLE_START),
            bitmap_start: get_u64(b, sb::BITMAP_START),
            bitmap_blocks: get_u64(b, sb::BITMAP_BLOCKS),
            data_start: get_u64(b, sb::DATA_START),
            data_blocks: get_u64(b, sb::DATA_BLOCKS),
            zone_slots,
            zone_start: expect.zone_start,
            wear_start: expect.wear_start,
            wear_blocks: expect.wear_blocks,
            checked_sizes: expect.checked_sizes,
            zone_growth: expect.zone_growth,
        };
        if stored_geom != expect {
            return Err(corrupt!(
                "superblock region offsets {stored_geom:?} disagree with the geometry {expect:?}"
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[sb::UUID..sb::UUID + 16]);
        Ok(Superblock {
            geometry: expect,
            uuid,
            created_ns: get_i64(b, sb::CREATED_NS),
        })
    }
}

/// The mutable state record in the superblock's fourth cache line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SbState {
    /// The last unmount was clean: the journals were cleared and the allocator bitmap saved.
    pub clean: bool,
    /// Mounts since mkfs.
    pub mount_count: u64,
    /// crc32c of the allocator bitmap saved by the last clean unmount.
    pub bitmap_crc: u32,
    /// 0, or "needs fsck": a check failed at run time (`state::damage::Damage` names the code).
    pub needs_fsck: u32,
    /// The record failed its checksum when read (torn or damaged); the other fields are then
    /// zero and mean nothing. Never encoded.
    pub damaged: bool,
}

impl SbState {
    /// Encode the record (bytes `sb::STATE..sb::STATE + sb::STATE_SIZE` of the superblock).
    pub fn encode(&self) -> [u8; sb::STATE_SIZE] {
        let mut b = [0u8; sb::STATE_SIZE];
        put_u32(&mut b, sb::STATE_CLEAN - sb::STATE, u32::from(self.clean));
        put_u32(&mut b, sb::STATE_NEEDS_FSCK - sb::STATE, self.needs_fsck);
        put_u64(&mut b, sb::STATE_MOUNT_COUNT - sb::STATE, self.mount_count);
        put_u32(&mut b, sb::STATE_BITMAP_CRC - sb::STATE, self.bitmap_crc);
        let crc = crate::media::crc::crc32c(&b[..sb::STATE_CHECKSUMMED]);
        put_u32(&mut b, sb::STATE_CHECKSUM - sb::STATE, crc);
        b
    }

    /// A torn or damaged state record decodes as `damaged` (and not clean): mount then takes
    /// the epoch from the journals and rebuilds the allocator state.
    pub fn decode(b: &[u8]) -> SbState {
        let crc = crate::media::crc::crc32c(&b[..sb::STATE_CHECKSUMMED]);
        if crc != get_u32(b, sb::STATE_CHECKSUM - sb::STATE) {
            return SbState {
                damaged: true,
                ..SbState::default()
            };
        }
        SbState {
            clean: get_u32(b, sb::STATE_CLEAN - sb::STATE) == 1,
            needs_fsck: get_u32(b, sb::STATE_NEEDS_FSCK - sb::STATE),
            mount_count: get_u64(b, sb::STATE_MOUNT_COUNT - sb::STATE),
            bitmap_crc: get_u32(b, sb::STATE_BITMAP_CRC - sb::STATE),
            damaged: false,
        }
    }
}

/// One extent record: `len` blocks of file data at logical block `logical`, stored at pool block
/// `phys`. `len == 0` marks a free slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExtentRecord {
    /// First logical block.
    pub logical: u32,
    /// Length in blocks; 0 = free slot.
    pub len: u32,
    /// First pool block of the run.
    pub phys: u64,
}

impl ExtentRecord {
    /// Encode the 16-byte record.
    pub fn encode(&self) -> [u8; EXTENT_BYTES] {
        let mut b = [0u8; EXTENT_BYTES];
        put_u32(&mut b, extent::LOGICAL, self.logical);
        put_u32(&mut b, extent::LEN, self.len);
        put_u64(&mut b, extent::PHYS, self.phys);
        b
    }
    /// Decode the record at the start of `b` (validation is `FileMap::load`'s).
    pub fn decode(b: &[u8]) -> ExtentRecord {
        ExtentRecord {
            logical: get_u32(b, extent::LOGICAL),
            len: get_u32(b, extent::LEN),
            phys: get_u64(b, extent::PHYS),
        }
    }
}

/// File type as stored in the mode's S_IFMT bits and in directory entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Regular file (code 1).
    File,
    /// Directory (code 2).
    Dir,
    /// Symbolic link (code 3).
    Symlink,
    /// Named pipe (code 4).
    Fifo,
    /// Unix socket (code 5).
    Socket,
    /// Character device (code 6).
    CharDev,
    /// Block device (code 7).
    BlockDev,
}

impl FileKind {
    /// The S_IFMT bits.
    pub(crate) fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::BlockDev => libc::S_IFBLK,
        }
    }
    /// From a full mode; None for an unknown type.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }
    /// Code stored in a directory entry.
    pub fn code(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }
    /// From a directory entry's code; None for an unknown one.
    pub(crate) fn from_code(c: u8) -> Option<FileKind> {
        Some(match c {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// The scalar part of an inode (bytes 0..128); extent slots are handled by `inode::FileMap`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct InodeHeader {
    /// Flags; bit 0 ([`INODE_IN_USE`]) marks a live inode, bit 1 ([`INODE_TAIL_UNSETTLED`])
    /// one whose bytes past its end may not be zero, bit 2 ([`INODE_SIZE_CHECKED`]) one whose
    /// size field is a checked size word, bits 4-7 the user's [`INODE_USER_FLAGS`].
    pub flags: u32,
    /// File type (`S_IFMT` bits) and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count; 0 while in use means unlinked but still open.
    pub nlink: u32,
    /// NFS-style generation, set at creation.
    pub generation: u32,
    /// Size in bytes.
    pub size: u64,
    /// Extents at logical blocks at or beyond this are dead (truncated away) and their slots free.
    pub map_end: u64,
    /// Data block holding the xattr block, 0 = none.
    pub xattr_block: u64,
    /// First extent-index block, 0 = none.
    pub index_block: u64,
    /// Directories: the parent directory's inode; 0 for others.
    pub parent: u64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Change time, ns since the epoch.
    pub ctime: i64,
    /// Creation time, ns since the epoch.
    pub crtime: i64,
    /// Device number of character and block device nodes.
    pub rdev: u32,
}

impl InodeHeader {
    /// Encode the header (bytes `0..ino::HEADER` of the inode).
    pub fn encode(&self) -> [u8; ino::HEADER] {
        let mut b = [0u8; ino::HEADER];
        put_u32(&mut b, ino::FLAGS, self.flags);
        put_u32(&mut b, ino::MODE, self.mode);
        put_u32(&mut b, ino::UID, self.uid);
        put_u32(&mut b, ino::GID, self.gid);
        put_u32(&mut b, ino::NLINK, self.nlink);
        put_u32(&mut b, ino::GENERATION, self.generation);
        put_u64(&mut b, ino::SIZE, self.size_field());
        put_u64(&mut b, ino::MAP_END, self.map_end);
        put_u64(&mut b, ino::XATTR_BLOCK, self.xattr_block);
        put_u64(&mut b, ino::INDEX_BLOCK, self.index_block);
        put_u64(&mut b, ino::PARENT, self.parent);
        put_i64(&mut b, ino::ATIME, self.atime);
        put_i64(&mut b, ino::MTIME, self.mtime);
        put_i64(&mut b, ino::CTIME, self.ctime);
        put_i64(&mut b, ino::CRTIME, self.crtime);
        put_u32(&mut b, ino::RDEV, self.rdev);
        b
    }
    /// Decode the header at the start of `b` (validation is mount's).
    pub fn decode(b: &[u8]) -> InodeHeader {
        InodeHeader {
            flags: get_u32(b, ino::FLAGS),
            mode: get_u32(b, ino::MODE),
            uid: get_u32(b, ino::UID),
            gid: get_u32(b, ino::GID),
            nlink: get_u32(b, ino::NLINK),
            generation: get_u32(b, ino::GENERATION),
            size: match get_u32(b, ino::FLAGS) & INODE_SIZE_CHECKED {
                0 => get_u64(b, ino::SIZE),
                _ => get_u64(b, ino::SIZE) & CHECKED_SIZE_MASK,
            },
            map_end: get_u64(b, ino::MAP_END),
            xattr_block: get_u64(b, ino::XATTR_BLOCK),
            index_block: get_u64(b, ino::INDEX_BLOCK),
            parent: get_u64(b, ino::PARENT),
            atime: get_i64(b, ino::ATIME),
            mtime: get_i64(b, ino::MTIME),
            ctime: get_i64(b, ino::CTIME),
            crtime: get_i64(b, ino::CRTIME),
            rdev: get_u32(b, ino::RDEV),
        }
    }
    /// What the size field holds: the size, or its checked size word.
    pub fn size_field(&self) -> u64 {
        match self.flags & INODE_SIZE_CHECKED {
            0 => self.size,
            _ => checked_size_word(self.generation, self.size),
        }
    }
    /// Whether the slot holds a live inode.
    pub(crate) fn in_use(&self) -> bool {
        self.flags & INODE_IN_USE != 0
    }
    /// The file type, None for an unknown one.
    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.mode)
    }
}

/// The pool writes needed to turn header `old` into `new`, in `ino::CHUNK` (32-byte) pieces so
/// each fits a single inline journal entry.
pub(crate) fn header_diff(
    inode_off: u64,
    old: &InodeHeader,
    new: &InodeHeader,
) -> impl Iterator<Item = (u64, [u8; ino::CHUNK])> {
    let (a, b) = (old.encode(), new.encode());
    (0..ino::HEADER / ino::CHUNK).filter_map(move |i| {
        let r = i * ino::CHUNK..(i + 1) * ino::CHUNK;
        let chunk: [u8; ino::CHUNK] = b[r.clone()].try_into().ok()?;
        (a[r] != chunk).then_some((inode_off + (i * ino::CHUNK) as u64, chunk))
    })
}

/// Encode a directory entry (header plus name; padded to whole slots when written). `name` must
/// be 1..=`NAME_MAX` (255) bytes, as every caller has already checked.
pub fn encode_dentry(ino: u64, kind: FileKind, name: &[u8]) -> Vec<u8> {
    assert!(
        (1..=NAME_MAX).contains(&name.len()),
        "directory entry name of {} bytes",
        name.len()
    );
    let name_len = u8::try_from(name.len()).expect("at most NAME_MAX = 255, asserted above");
    let mut b = vec![0u8; dentry::NAME + name.len()];
    put_u64(&mut b, dentry::INO, ino);
    b[dentry::NAME_LEN] = name_len;
    b[dentry::KIND] = kind.code();
    b[dentry::NAME..].copy_from_slice(name);
    let crc = dentry_crc(&b);
    put_u32(&mut b, dentry::CRC, crc);
    b
}

/// The entry checksum: crc32c of header bytes `0..dentry::CRC`, then the name.
fn dentry_crc(b: &[u8]) -> u32 {
    let h = crate::media::crc::crc32c(&b[..dentry::CRC]);
    crate::media::crc::crc32c_append(h, &b[dentry::NAME..])
}

/// Slots a dentry with a name of `len` bytes occupies (saturating at `u32::MAX`, far more than
/// a directory block has, for a length no name can have).
pub(crate) fn dentry_slots(len: usize) -> u32 {
    u32::try_from((dentry::NAME + len).div_ceil(dir_block::SLOT)).unwrap_or(u32::MAX)
}

/// Decode the dentry starting at `b[0]` (`b` runs to the end of its block). Errors name the defect.
pub fn decode_dentry(b: &[u8]) -> Result<(u64, FileKind, Vec<u8>)> {
    let ino = get_u64(b, dentry::INO);
    let len = usize::from(b[dentry::NAME_LEN]);
    if len == 0 || dentry::NAME + len > b.len() {
        return Err(corrupt!(
            "directory entry name length {len} does not fit its block"
        ));
    }
    let code = b[dentry::KIND];
    let kind = FileKind::from_code(code)
        .ok_or_else(|| corrupt!("directory entry has unknown type code {code}"))?;
    let rec = &b[..dentry::NAME + len];
    if dentry_crc(rec) != get_u32(b, dentry::CRC) {
        return Err(corrupt!("directory entry checksum mismatch (ino {ino})"));
    }
    let name = rec[dentry::NAME..].to_vec();
    if name.contains(&b'/') || name.contains(&0) {
        return Err(corrupt!(
            "directory entry name {:?} contains '/' or NUL",
            String::from_utf8_lossy(&name)
        ));
    }
    Ok((ino, kind, name))
}

/// The superblock's block-size field: [`BLOCK_SIZE`] as the u32 stored at `sb::BLOCK_SIZE`.
const BLOCK_SIZE_FIELD: u32 = 4096;

// Compile-time pins of the layout arithmetic the code relies on.
const _: () = assert!(BLOCK_SIZE_FIELD as u64 == BLOCK_SIZE);
const _: () = assert!(ino::SLOTS + INLINE_SLOTS * EXTENT_BYTES == INODE_BYTES);
const _: () = assert!(index_block::SLOTS + INDEX_SLOTS * EXTENT_BYTES == BLOCK_BYTES);
const _: () = assert!(dir_block::SLOT * DIR_SLOTS as usize == BLOCK_BYTES);
const _: () = assert!(dir_block::STARTS + 8 <= dir_block::SLOT);
// The header checksum and `starts` are one contiguous write (`dir::header_bytes`).
const _: () = assert!(dir_block::CRC + 4 == dir_block::STARTS);
const _: () = assert!(index_block::CRC + 4 <= index_block::NEXT);
const _: () = assert!(xattr_block::CRC + 4 == xattr_block::ENTRIES);
const _: () = assert!(ino::RDEV + 4 <= ino::HEADER);
const _: () = assert!(ino::HEADER.is_multiple_of(ino::CHUNK));
// The four times form exactly one journaling chunk (`ops::file` writes it in place).
const _: () =
    assert!(ino::ATIME.is_multiple_of(ino::CHUNK) && ino::CRTIME + 8 == ino::ATIME + ino::CHUNK);
const _: () = assert!(sb::CHECKSUM + 4 <= sb::IMMUTABLE && sb::IMMUTABLE <= sb::STATE);
const _: () = assert!(sb::STATE_CHECKSUM + 4 <= sb::STATE + sb::STATE_SIZE);
const _: () = assert!(BLOCK_SIZE.is_multiple_of(INODE_SIZE));
const _: () = assert!(dentry::NAME + NAME_MAX <= (DIR_SLOTS as usize - 1) * dir_block::SLOT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let g = Geometry::compute(64 << 20, 2, 1024).unwrap();
        let s = Superblock {
            geometry: g,
            uuid: [7; 16],
            created_ns: 42,
        };
        let b = s.encode();
        assert_eq!(Superblock::decode(&b, 64 << 20).unwrap(), s);
        let mut bad = b;
        bad[sb::PARTITIONS] ^= 1;
        assert!(
            matches!(Superblock::decode(&bad, 64 << 20), Err(Error::Corrupted(m)) if m.contains("checksum"))
        );
        let mut foreign = b;
        foreign[0] = b'X';
        assert!(
            matches!(Superblock::decode(&foreign, 64 << 20), Err(Error::Foreign(m)) if m.contains("magic"))
        );
        let mut v1 = b;
        put_u32(&mut v1, sb::VERSION, 1);
        assert!(matches!(
            Superblock::decode(&v1, 64 << 20),
            Err(Error::Version {
                found: 1,
                supported: 3
            })
        ));
        assert!(
            matches!(Superblock::decode(&b, 32 << 20), Err(Error::Corrupted(m)) if m.contains("truncated"))
        );
        // A pool made before checked size words round-trips as one without them.
        let mut old = s.clone();
        old.geometry.checked_sizes = false;
        let ob = old.encode();
        assert_eq!(get_u32(&ob, sb::INCOMPAT) & INCOMPAT_CHECKED_SIZES, 0);
        assert_eq!(Superblock::decode(&ob, 64 << 20).unwrap(), old);
        assert_ne!(get_u32(&b, sb::INCOMPAT) & INCOMPAT_CHECKED_SIZES, 0);
    }

    #[test]
    fn geometry_is_aligned_and_disjoint() {
        let g = Geometry::compute(256 << 20, 4, 2048).unwrap();
        assert_eq!(g.data_start % BLOCKS_PER_HUGE, 0);
        assert!(g.bitmap_start + g.bitmap_blocks <= g.data_start);
        assert!(
            g.journal_offset(3) / BLOCK_SIZE + Geometry::journal_blocks_each(1024, 1024)
                <= g.inode_table_start
        );
        let r = g.partition_ranges();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].0, g.data_start);
        assert_eq!(r[3].1, g.data_start + g.data_blocks);
        for w in r.windows(2) {
            assert_eq!(w[0].1, w[1].0);
            assert_eq!(w[0].0 % BLOCKS_PER_HUGE, 0);
        }
        assert!(matches!(
            Geometry::compute(4 << 20, 1, 16),
            Err(Error::PoolTooSmall { .. })
        ));
    }

    #[test]
    fn state_record_detects_tearing() {
        let s = SbState {
            clean: true,
            mount_count: 9,
            bitmap_crc: 0xdead_beef,
            needs_fsck: 2,
            damaged: false,
        };
        let mut b = s.encode();
        assert_eq!(SbState::decode(&b), s);
        b[8] ^= 0xff;
        let d = SbState::decode(&b);
        assert!(d.damaged && !d.clean);
    }

    #[test]
    fn dentry_round_trip_and_corruption() {
        let e = encode_dentry(77, FileKind::Symlink, b"name");
        let mut blk = e.clone();
        blk.resize(128, 0);
        assert_eq!(
            decode_dentry(&blk).unwrap(),
            (77, FileKind::Symlink, b"name".to_vec())
        );
        blk[17] ^= 1;
        assert!(decode_dentry(&blk).is_err());
        assert_eq!(dentry_slots(48), 1);
        assert_eq!(dentry_slots(49), 2);
        assert_eq!(dentry_slots(255), 5);
    }

    #[test]
    fn header_diff_touches_only_changed_chunks() {
        let a = InodeHeader {
            size: 1,
            ..Default::default()
        };
        let mut b = a.clone();
        b.mtime = 5;
        let w: Vec<_> = header_diff(1000, &a, &b).collect();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, 1064);
        assert_eq!(&w[0].1[..], &b.encode()[64..96]);
    }
}
