//! Where everything lives in a pool: the regions (journals with their undo staging, inode
//! tables, the allocator bitmap, the alternate-slot zones, the data area) derived from the pool
//! size and the mkfs parameters, and the offsets of each partition's parts.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};

/// Block size: the unit of allocation.
pub const BLOCK_SIZE: u64 = 4096;
/// Blocks per 2 MiB hugepage.
pub const BLOCKS_PER_HUGE: u64 = 512;
/// Inode size on media.
pub const INODE_SIZE: u64 = 256;
/// Journal entries per per-CPU journal ring.
pub const JOURNAL_ENTRIES: u32 = 1024;
/// Size of one journal entry (one cache line).
pub const JOURNAL_ENTRY_SIZE: u64 = 64;
/// Blocks of undo staging per journal: large undo images (data journaling) live here.
pub const STAGING_BLOCKS: u32 = 1024;

/// Where everything lives, derived from the pool size and the mkfs parameters. Stored in the
/// superblock and recomputed at mount: a mismatch means corruption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Usable pool size in bytes (a whole number of blocks).
    pub pool_size: u64,
    /// Number of partitions P (per-CPU journals, inode tables and allocator ranges).
    pub partitions: u32,
    /// Inodes in each partition's inode table.
    pub inodes_per_partition: u32,
    /// Entries per journal ring.
    pub journal_entries: u32,
    /// Undo staging blocks per journal.
    pub staging_blocks: u32,
    /// First journal block.
    pub journal_start: u64,
    /// First inode table block.
    pub inode_table_start: u64,
    /// First allocator bitmap block.
    pub bitmap_start: u64,
    /// Allocator bitmap length in blocks.
    pub bitmap_blocks: u64,
    /// First block of the data area (a multiple of 512).
    pub data_start: u64,
    /// Blocks in the data area.
    pub data_blocks: u64,
    /// Alternate slots per partition (0: the pool has no slot zones; pools made before them).
    pub zone_slots: u32,
    /// First block of the slot zones (right after the allocator bitmap).
    pub zone_start: u64,
    /// First block of the wear counters (right after the zones).
    pub wear_start: u64,
    /// Blocks of wear counters: 0 (a pool without them), or 4 bytes per pool block.
    pub wear_blocks: u64,
    /// Inodes made on the pool carry checked size words (`layout::INODE_SIZE_CHECKED`); false
    /// on pools made before them, whose inodes keep plain sizes.
    pub checked_sizes: bool,
    /// The zones may grow into free 2 MiB units of the data area: each zone ends with an
    /// extension table block (`layout::INCOMPAT_ZONE_GROWTH`; false on pools made before it).
    pub zone_growth: bool,
}

/// Most alternate slots per partition mkfs gives a pool.
pub const MAX_ZONE_SLOTS: u32 = 2048;
/// Bytes of one slot descriptor.
pub const ZONE_DESC_SIZE: u64 = 16;
/// Entries of a zone's extension table (one block of 8-byte words): the most 2 MiB units one
/// zone grows into.
pub const ZONE_EXTENSIONS: u32 = 256;
/// Descriptor blocks at the start of a zone extension (a 2 MiB unit): one descriptor per slot.
pub const EXTENSION_DESC_BLOCKS: u64 = 2;
/// Slots of a zone extension: the unit's blocks after its descriptors.
pub const EXTENSION_SLOTS: u32 = 510;
const _: () = assert!(EXTENSION_DESC_BLOCKS + EXTENSION_SLOTS as u64 == BLOCKS_PER_HUGE);
const _: () = assert!(EXTENSION_SLOTS as u64 * ZONE_DESC_SIZE <= EXTENSION_DESC_BLOCKS * BLOCK_SIZE);
const _: () = assert!(ZONE_EXTENSIONS as u64 * 8 <= BLOCK_SIZE);

impl Geometry {
    /// Lay out a new pool, with slot zones of the default size (about 1/64 of the pool, in
    /// multiples of 64 slots, at most [`MAX_ZONE_SLOTS`] per partition; none for tiny pools).
    pub fn compute(pool_size: u64, partitions: u32, inodes_per_partition: u32) -> Result<Geometry> {
        let per = (pool_size / BLOCK_SIZE / 64) / u64::from(partitions.max(1));
        let slots = u32::try_from((per / 64 * 64).min(u64::from(MAX_ZONE_SLOTS))).unwrap_or(0);
        Self::compute_zoned(pool_size, partitions, inodes_per_partition, slots)
    }

    /// Lay out a pool with `zone_slots` alternate slots per partition (0 or a multiple of 64 up
    /// to [`MAX_ZONE_SLOTS`]). Errors name what does not fit.
    pub fn compute_zoned(
        pool_size: u64,
        partitions: u32,
        inodes_per_partition: u32,
        zone_slots: u32,
    ) -> Result<Geometry> {
        Self::compute_full(pool_size, partitions, inodes_per_partition, zone_slots, false)
    }

    /// [`Geometry::compute_zoned`], with a wear counter per pool block if `wear`. Zones of a
    /// new pool may grow (an extension table block each).
    pub fn compute_full(
        pool_size: u64,
        partitions: u32,
        inodes_per_partition: u32,
        zone_slots: u32,
        wear: bool,
    ) -> Result<Geometry> {
        Self::compute_layout(pool_size, partitions, inodes_per_partition, zone_slots, wear, zone_slots > 0)
    }

    /// [`Geometry::compute_full`] with the zones' growth given: a pool made before growth
    /// (`zone_growth` false) has no extension table blocks.
    pub fn compute_layout(
        pool_size: u64,
        partitions: u32,
        inodes_per_partition: u32,
        zone_slots: u32,
        wear: bool,
        zone_growth: bool,
    ) -> Result<Geometry> {
        if zone_growth && zone_slots == 0 {
            return Err(Error::Invalid("zones that grow need slots to start with".into()));
        }
        if !zone_slots.is_multiple_of(64) || zone_slots > MAX_ZONE_SLOTS {
            return Err(Error::Invalid(format!(
                "slots per zone must be a multiple of 64 up to {MAX_ZONE_SLOTS}, got {zone_slots}"
            )));
        }
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
        let zone_start = bitmap_start + bitmap_blocks;
        let wear_start =
            zone_start + u64::from(partitions) * Self::zone_blocks_each(zone_slots, zone_growth);
        let wear_blocks = if wear { (blocks * 4).div_ceil(BLOCK_SIZE) } else { 0 };
        let data_start = (wear_start + wear_blocks).next_multiple_of(BLOCKS_PER_HUGE);
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
            zone_slots,
            zone_start,
            wear_start,
            wear_blocks,
            checked_sizes: true,
            zone_growth,
        })
    }

    /// Blocks of one partition's slot zone: its descriptor table, its slots, then (zones that
    /// grow) its extension table.
    pub(crate) fn zone_blocks_each(slots: u32, growth: bool) -> u64 {
        Self::zone_desc_blocks(slots) + u64::from(slots) + u64::from(growth)
    }

    fn zone_desc_blocks(slots: u32) -> u64 {
        (u64::from(slots) * ZONE_DESC_SIZE).div_ceil(BLOCK_SIZE)
    }

    /// Byte offset of the descriptor of slot `slot` of partition `p`'s zone.
    pub fn zone_desc_offset(&self, p: u32, slot: u32) -> u64 {
        (self.zone_start + u64::from(p) * self.zone_blocks()) * BLOCK_SIZE
            + u64::from(slot) * ZONE_DESC_SIZE
    }

    /// Byte offset of slot `slot` (one block) of partition `p`'s zone.
    pub fn zone_slot_offset(&self, p: u32, slot: u32) -> u64 {
        (self.zone_start
            + u64::from(p) * self.zone_blocks()
            + Self::zone_desc_blocks(self.zone_slots)
            + u64::from(slot))
            * BLOCK_SIZE
    }

    /// Byte offset of partition `p`'s zone extension table (pools whose zones grow): the
    /// zone's last block.
    pub fn zone_table_offset(&self, p: u32) -> u64 {
        (self.zone_start + (u64::from(p) + 1) * self.zone_blocks() - 1) * BLOCK_SIZE
    }

    fn zone_blocks(&self) -> u64 {
        Self::zone_blocks_each(self.zone_slots, self.zone_growth)
    }

    /// Blocks taken by one journal (entry ring plus undo staging).
    pub(crate) fn journal_blocks_each(entries: u32, staging: u32) -> u64 {
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

    /// Partition owning inode `ino`, which must be a valid inode number (1..=`total_inodes`,
    /// as every inode number in DRAM is): the quotient is then below `partitions` (≤ 256).
    pub(crate) fn inode_partition(&self, ino: u64) -> u32 {
        let p = (ino - 1) / u64::from(self.inodes_per_partition);
        u32::try_from(p).expect("a valid inode number lies in one of at most 256 partitions")
    }

    /// Data-area block range of each partition. All but the last are whole 2 MiB units; the last
    /// takes the remainder.
    pub(crate) fn partition_ranges(&self) -> Vec<(u64, u64)> {
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

