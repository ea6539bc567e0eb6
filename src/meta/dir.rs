//! Directories: entries persisted in directory blocks on media, indexed in DRAM by a hash map
//! per directory (O(1) lookup and insert), rebuilt at mount.
//!
//! A directory's blocks are its file data (logical block i = directory block i), so they are
//! allocated like any 4 KiB request: from holes, never breaking an aligned extent while a hole
//! exists. Block format: slot 0 is a header whose 64-bit `starts` bitmap marks the slots where a
//! live entry begins; an entry is a 16-byte header (ino, name length, type, crc) plus the name,
//! over 1..=5 consecutive 64-byte slots. An entry's bytes are written into free slots before the
//! transaction that sets its `starts` bit, so the bit is the only journaled write of an insert,
//! and clearing it is the only journaled write of a remove.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::checksum;
use crate::media::layout::{
    BLOCK_SIZE, DIR_MAGIC, DIR_SLOTS, FileKind, decode_dentry, dentry_slots, dir_block, get_u32,
    get_u64,
};
use crate::media::pool::{Category, Pool};
use hashbrown::HashTable;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, OnceLock};

/// Where a name lives and what it points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntryLoc {
    /// Inode the name points to.
    pub ino: u64,
    /// Its file type, as recorded in the entry.
    pub kind: FileKind,
    /// Directory block index (logical block of the directory).
    pub block: u32,
    /// First slot of the entry in that block (1..64).
    pub slot: u32,
    /// Slots the entry occupies (1..=5).
    pub nslots: u32,
}

impl DirEntryLoc {
    /// readdir position of this entry (1 and 2 are "." and "..").
    pub fn position(&self) -> u64 {
        3 + u64::from(self.block) * u64::from(DIR_SLOTS) + u64::from(self.slot)
    }
}

/// One name of a directory's index, with its hash kept: growing the table moves entries
/// without hashing their names again.
#[derive(Clone, Debug)]
struct Named {
    hash: u64,
    name: Arc<[u8]>,
    loc: DirEntryLoc,
}

/// The hash of a name: SipHash with keys drawn once per process, so names a client picks cannot
/// be made to collide on purpose.
fn name_hash(name: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(name)
}

/// The DRAM index of one directory.
#[derive(Clone, Debug, Default)]
pub struct DirIndex {
    /// Every name (other than "." and "..") and where its entry lives.
    names: HashTable<Named>,
    /// Per block: slots in use (bit 0, the header, always set).
    used: Vec<u64>,
    /// Per block: the on-media `starts` bitmap.
    pub starts: Vec<u64>,
    /// Blocks that had entries removed and may have room.
    roomy: BTreeSet<u32>,
    /// Names by readdir position, so paged readdir resumes in O(log n). The name is shared
    /// with `names`: one allocation per entry, not two.
    by_pos: BTreeMap<u64, Arc<[u8]>>,
}

fn run_mask(slot: u32, n: u32) -> u64 {
    (if n == 64 { u64::MAX } else { (1u64 << n) - 1 }) << slot
}

impl DirIndex {
    /// Number of directory blocks. A directory's size is bounded by `MAX_FILE_SIZE`, so it has
    /// fewer than 2^32 blocks; the count saturates at `u32::MAX` rather than wrap.
    pub fn blocks(&self) -> u32 {
        u32::try_from(self.used.len()).unwrap_or(u32::MAX)
    }

    /// Entries other than "." and "..".
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// No entries other than "." and "..".
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Where `name` lives, if it is in this directory.
    pub fn get(&self, name: &[u8]) -> Option<&DirEntryLoc> {
        self.names.find(name_hash(name), |e| *e.name == *name).map(|e| &e.loc)
    }

    /// Every name and where its entry lives, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &DirEntryLoc)> + '_ {
        self.names.iter().map(|e| (&e.name[..], &e.loc))
    }

    /// Where every name's entry lives, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &DirEntryLoc> + '_ {
        self.names.iter().map(|e| &e.loc)
    }

    fn fit_in(&self, b: u32, n: u32) -> Option<u32> {
        let used = self.used[b as usize];
        (1..=DIR_SLOTS - n).find(|&s| used & run_mask(s, n) == 0)
    }

    /// A free run of slots for a name of `len` bytes: (block, slot), or None if a new block is
    /// needed (it will be block `blocks()`, slot 1). Tries the last block, then blocks with
    /// removed entries, so inserts stay O(1) amortised.
    pub fn find_space(&mut self, len: usize) -> Option<(u32, u32)> {
        let n = dentry_slots(len);
        if let Some(last) = self.blocks().checked_sub(1)
            && let Some(s) = self.fit_in(last, n)
        {
            return Some((last, s));
        }
        while let Some(&b) = self.roomy.first() {
            if let Some(s) = self.fit_in(b, n) {
                return Some((b, s));
            }
            self.roomy.remove(&b);
        }
        None
    }

    /// Record a new empty block in DRAM (its media header must already be written).
    pub fn push_block(&mut self) {
        self.used.push(1);
        self.starts.push(0);
    }

    /// New `starts` word of `block` once an entry at `slot` is added.
    pub fn starts_with(&self, block: u32, slot: u32) -> u64 {
        self.starts[block as usize] | (1u64 << slot)
    }

    /// New `starts` word of `block` once the entry at `slot` is removed.
    pub fn starts_without(&self, block: u32, slot: u32) -> u64 {
        self.starts[block as usize] & !(1u64 << slot)
    }

    /// Apply an insert to DRAM (after its transaction committed).
    pub fn insert(&mut self, name: &[u8], loc: DirEntryLoc) {
        self.used[loc.block as usize] |= run_mask(loc.slot, loc.nslots);
        self.starts[loc.block as usize] |= 1u64 << loc.slot;
        let hash = name_hash(name);
        let name: Arc<[u8]> = Arc::from(name);
        self.by_pos.insert(loc.position(), Arc::clone(&name));
        match self.names.find_mut(hash, |e| e.name == name) {
            Some(e) => e.loc = loc,
            None => {
                self.names.insert_unique(hash, Named { hash, name, loc }, |e| e.hash);
            }
        }
    }

    /// Apply a remove to DRAM (after its transaction committed).
    pub fn remove(&mut self, name: &[u8]) -> Option<DirEntryLoc> {
        let found = self.names.find_entry(name_hash(name), |e| *e.name == *name).ok()?;
        let loc = found.remove().0.loc;
        self.used[loc.block as usize] &= !run_mask(loc.slot, loc.nslots);
        self.starts[loc.block as usize] &= !(1u64 << loc.slot);
        self.by_pos.remove(&loc.position());
        self.roomy.insert(loc.block);
        Some(loc)
    }

    /// Change where an existing name points (rename over an existing entry, exchange).
    pub fn repoint(&mut self, name: &[u8], ino: u64, kind: FileKind) {
        if let Some(e) = self.names.find_mut(name_hash(name), |e| *e.name == *name) {
            e.loc.ino = ino;
            e.loc.kind = kind;
        }
    }

    /// Names in readdir order with positions > `after`.
    pub fn entries_after(
        &self,
        after: u64,
    ) -> impl Iterator<Item = (u64, &[u8], DirEntryLoc)> + '_ {
        self.by_pos
            .range(after + 1..)
            .filter_map(|(&p, n)| self.get(n).map(|l| (p, &n[..], *l)))
    }

    /// Parse one directory block read from media; `b` is the directory block index. Returns
    /// whether its header matched its checksum; when it did not, the block is loaded with the
    /// header rebuilt ([`rebuilt_starts`]) and the caller decides (mount refuses, fsck
    /// reports, repair writes the rebuilt header).
    pub fn load_block(&mut self, dir_ino: u64, b: u32, blk: &[u8]) -> Result<bool> {
        if get_u32(blk, dir_block::MAGIC) != DIR_MAGIC {
            return Err(corrupt!(
                "directory {dir_ino}: block {b} has no directory magic"
            ));
        }
        let header_ok = checksum::dir_header_checksum_ok(dir_ino, b, blk);
        let starts = if header_ok {
            get_u64(blk, dir_block::STARTS)
        } else {
            rebuilt_starts(blk)
        };
        if starts & 1 != 0 {
            return Err(corrupt!(
                "directory {dir_ino}: block {b} marks its header slot as an entry"
            ));
        }
        self.push_block();
        let mut s = 1;
        while s < DIR_SLOTS {
            if starts & (1u64 << s) == 0 {
                s += 1;
                continue;
            }
            let (ino, kind, name) = decode_dentry(&blk[s as usize * dir_block::SLOT..])
                .map_err(|e| corrupt!("directory {dir_ino}, block {b}, slot {s}: {e}"))?;
            let n = dentry_slots(name.len());
            if self.used[b as usize] & run_mask(s, n) != 0 {
                return Err(corrupt!(
                    "directory {dir_ino}, block {b}: entries overlap at slot {s}"
                ));
            }
            if self.get(&name).is_some() {
                return Err(corrupt!(
                    "directory {dir_ino}: duplicate name {:?}",
                    String::from_utf8_lossy(&name)
                ));
            }
            self.insert(
                &name,
                DirEntryLoc {
                    ino,
                    kind,
                    block: b,
                    slot: s,
                    nslots: n,
                },
            );
            s += n;
        }
        if self.used[b as usize] != u64::MAX {
            self.roomy.insert(b);
        }
        Ok(header_ok)
    }
}

/// The `starts` word of a directory block whose header fails its checksum, rebuilt: the bits
/// of the stored word that begin a valid entry (its own checksum passes, it fits the block and
/// overlaps no entry kept before it). Slots no bit marks are not scanned for entries: a removed
/// entry's bytes stay behind with a valid checksum (a remove clears only its bit), so a scan
/// could not tell a lost name from a removed one. An inode whose name is lost this way is
/// named nowhere, which fsck reports and repair links into `/lost+found`.
pub fn rebuilt_starts(blk: &[u8]) -> u64 {
    let stored = get_u64(blk, dir_block::STARTS);
    let mut used = 1u64;
    let mut starts = 0u64;
    for s in 1..DIR_SLOTS {
        if stored & (1u64 << s) == 0 {
            continue;
        }
        let Some(rest) = blk.get(s as usize * dir_block::SLOT..) else {
            break;
        };
        if let Ok((_, _, name)) = decode_dentry(rest) {
            let n = dentry_slots(name.len());
            if s + n <= DIR_SLOTS && used & run_mask(s, n) == 0 {
                used |= run_mask(s, n);
                starts |= 1u64 << s;
            }
        }
    }
    starts
}

/// The journaled bytes of a directory block header at [`header_offset`]: its checksum and its
/// `starts` word, one contiguous write, for block `index` of directory `dir_ino`.
pub(crate) fn header_bytes(dir_ino: u64, index: u32, starts: u64) -> Vec<u8> {
    let mut v = checksum::dir_header_checksum(dir_ino, index, starts)
        .to_le_bytes()
        .to_vec();
    v.extend_from_slice(&starts.to_le_bytes());
    v
}

/// Write an empty directory block header for block `index` of directory `dir_ino` (the block
/// is not yet reachable, so unjournaled).
pub(crate) fn init_dir_block(pool: &Pool, phys: u64, dir_ino: u64, index: u32) -> Result<()> {
    let off = phys * BLOCK_SIZE;
    pool.zero_flush(off, BLOCK_SIZE, Category::Metadata)?;
    let mut head = DIR_MAGIC.to_le_bytes().to_vec();
    head.extend(header_bytes(dir_ino, index, 0));
    pool.write_flush(off + dir_block::MAGIC as u64, &head, Category::Metadata)?;
    Ok(())
}

/// Pool offset of the journaled part of the header (checksum, then `starts`) of the directory
/// block at physical block `phys`.
pub(crate) fn header_offset(phys: u64) -> u64 {
    phys * BLOCK_SIZE + dir_block::CRC as u64
}

/// Pool offset of slot `slot` in the directory block at `phys`.
pub(crate) fn slot_offset(phys: u64, slot: u32) -> u64 {
    phys * BLOCK_SIZE + u64::from(slot) * dir_block::SLOT as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::layout::encode_dentry;

    #[test]
    fn space_search_reuses_removed_slots() {
        let mut d = DirIndex::default();
        assert_eq!(d.find_space(10), None);
        d.push_block();
        for i in 0..63u32 {
            let (b, s) = d.find_space(10).unwrap();
            assert_eq!((b, s), (0, i + 1));
            d.insert(
                format!("n{i}").as_bytes(),
                DirEntryLoc {
                    ino: 5,
                    kind: FileKind::File,
                    block: b,
                    slot: s,
                    nslots: 1,
                },
            );
        }
        assert_eq!(d.find_space(10), None);
        d.remove(b"n7");
        assert_eq!(d.find_space(10), Some((0, 8)));
        assert_eq!(
            d.find_space(100),
            None,
            "a 3-slot name does not fit a 1-slot gap"
        );
    }

    #[test]
    fn names_stay_found_as_the_table_grows() {
        // Thousands of names: the table grows many times, moving entries by their kept hash.
        let mut d = DirIndex::default();
        let n = 5000u32;
        for i in 0..n {
            if i % 60 == 0 {
                d.push_block();
            }
            let (ino, block, slot) = (u64::from(i) + 2, i / 60, i % 60 + 1);
            let loc = DirEntryLoc { ino, kind: FileKind::File, block, slot, nslots: 1 };
            d.insert(format!("name-{i}").as_bytes(), loc);
        }
        assert_eq!(d.len(), n as usize);
        for i in (0..n).step_by(7) {
            assert_eq!(d.get(format!("name-{i}").as_bytes()).map(|l| l.ino), Some(u64::from(i) + 2));
        }
        assert!(d.get(b"name-5000").is_none());
        d.repoint(b"name-42", 100_000, FileKind::Dir);
        assert_eq!(d.get(b"name-42").map(|l| (l.ino, l.kind)), Some((100_000, FileKind::Dir)));
        assert_eq!(d.remove(b"name-43").map(|l| l.ino), Some(45));
        assert!(d.get(b"name-43").is_none() && d.remove(b"name-43").is_none());
        assert_eq!(d.iter().count(), n as usize - 1);
        assert_eq!(d.values().filter(|l| l.ino == 100_000).count(), 1);
        // readdir order follows positions, and skips the removed name.
        let listed: Vec<Vec<u8>> = d.entries_after(0).map(|(_, name, _)| name.to_vec()).collect();
        assert_eq!(listed.len(), n as usize - 1);
        assert_eq!(listed[42], b"name-42".to_vec());
        assert_eq!(listed[43], b"name-44".to_vec());
    }

    #[test]
    fn block_parsing_rejects_overlap_and_duplicates() {
        let mut blk = vec![0u8; 4096];
        blk[..4].copy_from_slice(&DIR_MAGIC.to_le_bytes());
        let e = encode_dentry(9, FileKind::File, b"a");
        blk[64..64 + e.len()].copy_from_slice(&e);
        blk[128..128 + e.len()].copy_from_slice(&e);
        blk[4..16].copy_from_slice(&header_bytes(1, 0, 0b110));
        let mut d = DirIndex::default();
        assert!(d.load_block(1, 0, &blk).is_err(), "duplicate name");
        blk[4..16].copy_from_slice(&header_bytes(1, 0, 0b10));
        let mut d = DirIndex::default();
        assert!(d.load_block(1, 0, &blk).unwrap());
        assert_eq!(d.get(b"a").unwrap().ino, 9);
    }

    #[test]
    fn a_damaged_header_is_detected_and_rebuilt_from_its_valid_entries() {
        // A directory index with `b` blocks loaded before: the next block loaded is block `b`.
        let at = |b: u32| {
            let mut d = DirIndex::default();
            (0..b).for_each(|_| d.push_block());
            d
        };
        let mut blk = vec![0u8; 4096];
        blk[..4].copy_from_slice(&DIR_MAGIC.to_le_bytes());
        let a = encode_dentry(9, FileKind::File, b"a");
        let b = encode_dentry(10, FileKind::Dir, b"b");
        blk[64..64 + a.len()].copy_from_slice(&a);
        blk[192..192 + b.len()].copy_from_slice(&b);
        blk[4..16].copy_from_slice(&header_bytes(7, 2, 0b1010));
        assert!(at(2).load_block(7, 2, &blk).unwrap());
        // The same header read as another block, or of another directory, fails.
        assert!(!at(3).load_block(7, 3, &blk).unwrap());
        assert!(!at(2).load_block(8, 2, &blk).unwrap());
        // A bit set at a slot holding no entry (a flipped bit): dropped by the rebuild.
        blk[8] |= 0b100;
        let mut d = at(2);
        assert!(!d.load_block(7, 2, &blk).unwrap());
        assert_eq!(d.starts[2], 0b1010);
        assert_eq!(rebuilt_starts(&blk), 0b1010);
        assert_eq!(d.len(), 2);
        // A flipped checksum byte: the same entries.
        blk[8] &= !0b100;
        blk[5] ^= 0x40;
        let mut d = at(2);
        assert!(!d.load_block(7, 2, &blk).unwrap());
        assert_eq!(d.starts[2], 0b1010);
    }
}
