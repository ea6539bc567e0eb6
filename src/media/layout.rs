//! On-media format: every structure's size, field offsets, encoding and validation.
//!
//! This file and `docs/DESIGN.md` ("On-media format") describe the same bytes; a test in
//! `tests/format_doc.rs` checks the documented offsets against the constants here. All integers
//! are little-endian; all references on media are block numbers or byte offsets, never pointers.

use crate::error::{Error, Result, corrupt};

/// Block size: the unit of allocation.
pub const BLOCK_SIZE: u64 = 4096;
/// Blocks per 2 MiB hugepage.
pub const BLOCKS_PER_HUGE: u64 = 512;
/// Bytes per 2 MiB hugepage.
pub const HUGE_SIZE: u64 = BLOCK_SIZE * BLOCKS_PER_HUGE;
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Superblock magic (offset 0).
pub const MAGIC: [u8; 8] = *b"WINEFSPM";
/// Longest file name in bytes (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest symlink target in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Largest file: logical block numbers are 32-bit on media.
pub const MAX_FILE_SIZE: u64 = u32::MAX as u64 * BLOCK_SIZE;

/// Journal entries per per-CPU journal ring.
pub const JOURNAL_ENTRIES: u32 = 1024;
/// Size of one journal entry (one cache line).
pub const JOURNAL_ENTRY_SIZE: u64 = 64;
/// Blocks of undo staging per journal: large undo images (data journaling) live here.
pub const STAGING_BLOCKS: u32 = 1024;

/// Inode size on media.
pub const INODE_SIZE: u64 = 256;
/// Extent slots held in the inode itself.
pub const INLINE_SLOTS: usize = 8;
/// Offset of the first inline extent slot in an inode.
pub const INODE_SLOTS_OFF: u64 = 128;
/// Size of one extent record.
pub const EXTENT_SIZE: u64 = 16;
/// Extent slots per extent-index block.
pub const INDEX_SLOTS: usize = 255;
/// Offset of the first slot in an extent-index block.
pub const INDEX_SLOTS_OFF: u64 = 16;
/// Extent-index block magic.
pub const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"WXIB");
/// Directory block magic.
pub const DIR_MAGIC: u32 = u32::from_le_bytes(*b"WDIR");
/// Xattr block magic.
pub const XATTR_MAGIC: u32 = u32::from_le_bytes(*b"WXAT");
/// Directory slot size; slot 0 of a directory block is its header.
pub const DIR_SLOT: u64 = 64;
/// Slots per directory block.
pub const DIR_SLOTS: u32 = 64;
/// Size of a directory entry header (ino, name length, kind, crc).
pub const DENTRY_HEADER: usize = 16;

/// Inode flag: the slot holds a live inode.
pub const INODE_IN_USE: u32 = 1;
/// Root directory inode number.
pub const ROOT_INO: u64 = 1;

/// Superblock field offsets (block 0).
pub mod sb {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const BLOCK_SIZE: usize = 12;
    pub const POOL_SIZE: usize = 16;
    pub const PARTITIONS: usize = 24;
    pub const INCOMPAT: usize = 28;
    pub const INODES_PER_PARTITION: usize = 32;
    pub const JOURNAL_ENTRIES: usize = 36;
    pub const STAGING_BLOCKS: usize = 40;
    pub const JOURNAL_START: usize = 48;
    pub const INODE_TABLE_START: usize = 56;
    pub const BITMAP_START: usize = 64;
    pub const BITMAP_BLOCKS: usize = 72;
    pub const DATA_START: usize = 80;
    pub const DATA_BLOCKS: usize = 88;
    pub const UUID: usize = 96;
    pub const CREATED_NS: usize = 112;
    pub const CHECKSUM: usize = 120;
    /// Bytes covered by the checksum.
    pub const CHECKSUMMED: usize = 120;
    /// The mutable state record (own checksum) starts here, in its own cache line.
    pub const STATE: usize = 192;
    pub const STATE_CLEAN: usize = 192;
    pub const STATE_MOUNT_COUNT: usize = 200;
    pub const STATE_CHECKSUM: usize = 216;
    pub const STATE_CHECKSUMMED: usize = 24;
}

/// Inode field offsets.
pub mod ino {
    pub const FLAGS: usize = 0;
    pub const MODE: usize = 4;
    pub const UID: usize = 8;
    pub const GID: usize = 12;
    pub const NLINK: usize = 16;
    pub const GENERATION: usize = 20;
    pub const SIZE: usize = 24;
    pub const MAP_END: usize = 32;
    pub const XATTR_BLOCK: usize = 40;
    pub const INDEX_BLOCK: usize = 48;
    pub const PARENT: usize = 56;
    pub const ATIME: usize = 64;
    pub const MTIME: usize = 72;
    pub const CTIME: usize = 80;
    pub const CRTIME: usize = 88;
    pub const RDEV: usize = 96;
    /// End of the scalar header; extent slots follow at `INODE_SLOTS_OFF`.
    pub const HEADER: usize = 128;
}

pub(crate) fn get_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
pub(crate) fn get_i64(b: &[u8], o: usize) -> i64 {
    get_u64(b, o) as i64
}
pub(crate) fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_i64(b: &mut [u8], o: usize, v: i64) {
    put_u64(b, o, v as u64)
}

/// Where everything lives, derived from the pool size and the mkfs parameters. Stored in the
/// superblock and recomputed at mount: a mismatch means corruption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub pool_size: u64,
    pub partitions: u32,
    pub inodes_per_partition: u32,
    pub journal_entries: u32,
    pub staging_blocks: u32,
    pub journal_start: u64,
    pub inode_table_start: u64,
    pub bitmap_start: u64,
    pub bitmap_blocks: u64,
    pub data_start: u64,
    pub data_blocks: u64,
}

impl Geometry {
    /// Lay out a pool. Errors name what does not fit.
    pub fn compute(pool_size: u64, partitions: u32, inodes_per_partition: u32) -> Result<Geometry> {
        if partitions == 0 || partitions > 256 {
            return Err(Error::Invalid(format!(
                "partitions must be 1..=256, got {partitions}"
            )));
        }
        if inodes_per_partition < 16 || !inodes_per_partition.is_multiple_of(16) {
            return Err(Error::Invalid(format!(
                "inodes per partition must be a positive multiple of 16, got {inodes_per_partition}"
            )));
        }
        let blocks = pool_size / BLOCK_SIZE;
        let journal_blocks = Self::journal_blocks_each(JOURNAL_ENTRIES, STAGING_BLOCKS);
        let journal_start = 1;
        let inode_table_start = journal_start + partitions as u64 * journal_blocks;
        let inode_blocks = inodes_per_partition as u64 * INODE_SIZE / BLOCK_SIZE;
        let bitmap_start = inode_table_start + partitions as u64 * inode_blocks;
        let bitmap_blocks = blocks.div_ceil(8 * BLOCK_SIZE).max(1);
        let data_start = (bitmap_start + bitmap_blocks).next_multiple_of(BLOCKS_PER_HUGE);
        let min_blocks = data_start + partitions as u64 * BLOCKS_PER_HUGE;
        if blocks < min_blocks {
            return Err(Error::PoolTooSmall {
                size: pool_size,
                min: min_blocks * BLOCK_SIZE,
            });
        }
        Ok(Geometry {
            pool_size: blocks * BLOCK_SIZE,
            partitions,
            inodes_per_partition,
            journal_entries: JOURNAL_ENTRIES,
            staging_blocks: STAGING_BLOCKS,
            journal_start,
            inode_table_start,
            bitmap_start,
            bitmap_blocks,
            data_start,
            data_blocks: blocks - data_start,
        })
    }

    /// Blocks taken by one journal (entry ring plus undo staging).
    pub fn journal_blocks_each(entries: u32, staging: u32) -> u64 {
        (entries as u64 * JOURNAL_ENTRY_SIZE).div_ceil(BLOCK_SIZE) + staging as u64
    }

    /// Byte offset of partition `p`'s journal entry ring.
    pub fn journal_offset(&self, p: u32) -> u64 {
        (self.journal_start
            + p as u64 * Self::journal_blocks_each(self.journal_entries, self.staging_blocks))
            * BLOCK_SIZE
    }

    /// Byte offset of partition `p`'s undo staging area.
    pub fn staging_offset(&self, p: u32) -> u64 {
        self.journal_offset(p)
            + (self.journal_entries as u64 * JOURNAL_ENTRY_SIZE).next_multiple_of(BLOCK_SIZE)
    }

    /// Total inodes.
    pub fn total_inodes(&self) -> u64 {
        self.partitions as u64 * self.inodes_per_partition as u64
    }

    /// Byte offset of inode `ino` (1-based), or an error if out of range.
    pub fn inode_offset(&self, ino: u64) -> Result<u64> {
        if ino == 0 || ino > self.total_inodes() {
            return Err(corrupt!(
                "inode number {ino} out of range 1..={}",
                self.total_inodes()
            ));
        }
        Ok(self.inode_table_start * BLOCK_SIZE + (ino - 1) * INODE_SIZE)
    }

    /// Partition owning inode `ino`.
    pub fn inode_partition(&self, ino: u64) -> u32 {
        ((ino - 1) / self.inodes_per_partition as u64) as u32
    }

    /// Data-area block range of each partition. All but the last are whole 2 MiB units; the last
    /// takes the remainder.
    pub fn partition_ranges(&self) -> Vec<(u64, u64)> {
        let units = self.data_blocks / BLOCKS_PER_HUGE;
        let per = units / self.partitions as u64 * BLOCKS_PER_HUGE;
        let end = self.data_start + self.data_blocks;
        (0..self.partitions as u64)
            .map(|i| {
                let s = self.data_start + i * per;
                let e = if i + 1 == self.partitions as u64 {
                    end
                } else {
                    s + per
                };
                (s, e)
            })
            .collect()
    }

    /// True if block `b` is in the data area.
    pub fn is_data_block(&self, b: u64) -> bool {
        b >= self.data_start && b < self.data_start + self.data_blocks
    }
}

/// The superblock: immutable geometry (checksummed) plus a separately checksummed state record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub geometry: Geometry,
    pub uuid: [u8; 16],
    pub created_ns: i64,
}

impl Superblock {
    /// Encode the immutable part (bytes 0..128).
    pub fn encode(&self) -> [u8; 128] {
        let g = &self.geometry;
        let mut b = [0u8; 128];
        b[sb::MAGIC..sb::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, sb::VERSION, FORMAT_VERSION);
        put_u32(&mut b, sb::BLOCK_SIZE, BLOCK_SIZE as u32);
        put_u64(&mut b, sb::POOL_SIZE, g.pool_size);
        put_u32(&mut b, sb::PARTITIONS, g.partitions);
        put_u32(&mut b, sb::INCOMPAT, 0);
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
        let crc = crc32c::crc32c(&b[..sb::CHECKSUMMED]);
        put_u32(&mut b, sb::CHECKSUM, crc);
        b
    }

    /// Decode and validate the immutable part. Header fields are checked before any layout math;
    /// each failure names the field. `actual_size` is the size of the backing file or device.
    pub fn decode(b: &[u8], actual_size: u64) -> Result<Superblock> {
        if b.len() < 128 {
            return Err(Error::Foreign("shorter than a superblock".into()));
        }
        if b[..8] != MAGIC {
            return Err(Error::Foreign(format!(
                "bad magic {:02x?} at offset 0 (expected {:02x?} \"WINEFSPM\")",
                &b[..8],
                MAGIC
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
        let crc = crc32c::crc32c(&b[..sb::CHECKSUMMED]);
        if stored != crc {
            return Err(corrupt!(
                "superblock checksum mismatch: stored {stored:#010x}, computed {crc:#010x}"
            ));
        }
        let bs = get_u32(b, sb::BLOCK_SIZE);
        if bs as u64 != BLOCK_SIZE {
            return Err(corrupt!(
                "superblock block size {bs}, only {BLOCK_SIZE} is supported"
            ));
        }
        let incompat = get_u32(b, sb::INCOMPAT);
        if incompat != 0 {
            return Err(corrupt!(
                "superblock has unknown incompatible features {incompat:#x}"
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
        let expect = Geometry::compute(pool_size, partitions, ipp)
            .map_err(|e| corrupt!("superblock geometry is impossible: {e}"))?;
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
    pub clean: bool,
    pub mount_count: u64,
}

impl SbState {
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        put_u32(&mut b, 0, self.clean as u32);
        put_u64(&mut b, sb::STATE_MOUNT_COUNT - sb::STATE, self.mount_count);
        let crc = crc32c::crc32c(&b[..sb::STATE_CHECKSUMMED]);
        put_u32(&mut b, sb::STATE_CHECKSUM - sb::STATE, crc);
        b
    }

    /// A torn or damaged state record decodes as "not clean", which only costs a full rebuild.
    pub fn decode(b: &[u8]) -> SbState {
        let crc = crc32c::crc32c(&b[..sb::STATE_CHECKSUMMED]);
        if crc != get_u32(b, sb::STATE_CHECKSUM - sb::STATE) {
            return SbState {
                clean: false,
                mount_count: 0,
            };
        }
        SbState {
            clean: get_u32(b, 0) == 1,
            mount_count: get_u64(b, sb::STATE_MOUNT_COUNT - sb::STATE),
        }
    }
}

/// One extent record: `len` blocks of file data at logical block `logical`, stored at pool block
/// `phys`. `len == 0` marks a free slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExtentRecord {
    pub logical: u32,
    pub len: u32,
    pub phys: u64,
}

impl ExtentRecord {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u32(&mut b, 0, self.logical);
        put_u32(&mut b, 4, self.len);
        put_u64(&mut b, 8, self.phys);
        b
    }
    pub fn decode(b: &[u8]) -> ExtentRecord {
        ExtentRecord {
            logical: get_u32(b, 0),
            len: get_u32(b, 4),
            phys: get_u64(b, 8),
        }
    }
}

/// File type as stored in the mode's S_IFMT bits and in directory entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
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
    pub fn from_code(c: u8) -> Option<FileKind> {
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
    pub flags: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub generation: u32,
    pub size: u64,
    /// Extents at logical blocks at or beyond this are dead (truncated away) and their slots free.
    pub map_end: u64,
    pub xattr_block: u64,
    pub index_block: u64,
    pub parent: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    pub rdev: u32,
}

impl InodeHeader {
    pub fn encode(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        put_u32(&mut b, ino::FLAGS, self.flags);
        put_u32(&mut b, ino::MODE, self.mode);
        put_u32(&mut b, ino::UID, self.uid);
        put_u32(&mut b, ino::GID, self.gid);
        put_u32(&mut b, ino::NLINK, self.nlink);
        put_u32(&mut b, ino::GENERATION, self.generation);
        put_u64(&mut b, ino::SIZE, self.size);
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
    pub fn decode(b: &[u8]) -> InodeHeader {
        InodeHeader {
            flags: get_u32(b, ino::FLAGS),
            mode: get_u32(b, ino::MODE),
            uid: get_u32(b, ino::UID),
            gid: get_u32(b, ino::GID),
            nlink: get_u32(b, ino::NLINK),
            generation: get_u32(b, ino::GENERATION),
            size: get_u64(b, ino::SIZE),
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
    pub fn in_use(&self) -> bool {
        self.flags & INODE_IN_USE != 0
    }
    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.mode)
    }
}

/// The pool writes needed to turn header `old` into `new`, at 32-byte granularity so each fits a
/// single inline journal entry.
pub fn header_diff(inode_off: u64, old: &InodeHeader, new: &InodeHeader) -> Vec<(u64, Vec<u8>)> {
    let (a, b) = (old.encode(), new.encode());
    (0..4)
        .filter(|c| a[c * 32..c * 32 + 32] != b[c * 32..c * 32 + 32])
        .map(|c| (inode_off + (c * 32) as u64, b[c * 32..c * 32 + 32].to_vec()))
        .collect()
}

/// Encode a directory entry (header plus name), `nslots` slots long once padded.
pub fn encode_dentry(ino: u64, kind: FileKind, name: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; DENTRY_HEADER + name.len()];
    put_u64(&mut b, 0, ino);
    b[8] = name.len() as u8;
    b[9] = kind.code();
    b[DENTRY_HEADER..].copy_from_slice(name);
    let crc = dentry_crc(&b);
    put_u32(&mut b, 12, crc);
    b
}

fn dentry_crc(b: &[u8]) -> u32 {
    let h = crc32c::crc32c(&b[..12]);
    crc32c::crc32c_append(h, &b[DENTRY_HEADER..])
}

/// Slots a dentry with a name of `len` bytes occupies.
pub fn dentry_slots(len: usize) -> u32 {
    (DENTRY_HEADER + len).div_ceil(DIR_SLOT as usize) as u32
}

/// Decode the dentry starting at `b[0]` (`b` runs to the end of its block). Errors name the defect.
pub fn decode_dentry(b: &[u8]) -> Result<(u64, FileKind, Vec<u8>)> {
    let ino = get_u64(b, 0);
    let len = b[8] as usize;
    if len == 0 || DENTRY_HEADER + len > b.len() {
        return Err(corrupt!(
            "directory entry name length {len} does not fit its block"
        ));
    }
    let kind = FileKind::from_code(b[9])
        .ok_or_else(|| corrupt!("directory entry has unknown type code {}", b[9]))?;
    let rec = &b[..DENTRY_HEADER + len];
    if dentry_crc(rec) != get_u32(b, 12) {
        return Err(corrupt!("directory entry checksum mismatch (ino {ino})"));
    }
    let name = rec[DENTRY_HEADER..].to_vec();
    if name.contains(&b'/') || name.contains(&0) {
        return Err(corrupt!(
            "directory entry name {:?} contains '/' or NUL",
            String::from_utf8_lossy(&name)
        ));
    }
    Ok((ino, kind, name))
}

// Compile-time pins of the layout arithmetic the code relies on.
const _: () = assert!(INODE_SLOTS_OFF as usize == ino::HEADER);
const _: () = assert!(INODE_SLOTS_OFF + INLINE_SLOTS as u64 * EXTENT_SIZE == INODE_SIZE);
const _: () = assert!(INDEX_SLOTS_OFF + INDEX_SLOTS as u64 * EXTENT_SIZE == BLOCK_SIZE);
const _: () = assert!(DIR_SLOT * DIR_SLOTS as u64 == BLOCK_SIZE);
const _: () = assert!(ino::RDEV + 4 <= ino::HEADER);
const _: () = assert!(sb::STATE_CHECKSUM + 4 <= 256);
const _: () = assert!(BLOCK_SIZE.is_multiple_of(INODE_SIZE));
const _: () = assert!(DENTRY_HEADER + NAME_MAX <= (DIR_SLOTS as usize - 1) * DIR_SLOT as usize);

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
        let mut v2 = b;
        put_u32(&mut v2, sb::VERSION, 2);
        assert!(matches!(
            Superblock::decode(&v2, 64 << 20),
            Err(Error::Version {
                found: 2,
                supported: 1
            })
        ));
        assert!(
            matches!(Superblock::decode(&b, 32 << 20), Err(Error::Corrupted(m)) if m.contains("truncated"))
        );
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
        };
        let mut b = s.encode();
        assert_eq!(SbState::decode(&b), s);
        b[8] ^= 0xff;
        assert!(!SbState::decode(&b).clean);
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
        let w = header_diff(1000, &a, &b);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, 1064);
    }
}
