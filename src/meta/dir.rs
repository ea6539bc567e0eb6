//! Directories: entries persisted in directory blocks on media, indexed in DRAM by a hash table
//! per directory (O(1) lookup and insert), rebuilt at mount.
//!
//! A directory's blocks are its file data (logical block i = directory block i), so they are
//! allocated like any 4 KiB request: from holes, never breaking an aligned extent while a hole
//! exists. Block format: slot 0 is a header whose 64-bit `starts` bitmap marks the slots where a
//! live entry begins; an entry is a 16-byte header (ino, name length, type, crc) plus the name,
//! over 1..=5 consecutive 64-byte slots. An entry's bytes are written into free slots before the
//! transaction that sets its `starts` bit, so the bit is the only journaled write of an insert,
//! and clearing it is the only journaled write of a remove.
//!
//! The DRAM index keeps no names: the pool is byte-addressable and every live entry's name is
//! in its directory block, so an index entry is a name's hash and where its entry lives (24
//! bytes), and a lookup compares the name it is given with the one on media ([`DirMedia`]).
//! readdir walks the `starts` words in block order and reads the entries from media.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::checksum;
use crate::media::layout::{
    BLOCK_SIZE, DENTRY_HEADER, DIR_MAGIC, DIR_SLOTS, FileKind, decode_dentry, dentry, dentry_slots,
    dir_block, get_u32, get_u64,
};
use crate::media::pool::{Category, Pool};
use crate::meta::inode::FileMap;
use hashbrown::HashTable;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

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

/// One name of a directory's index: its hash (kept, so growing the table moves entries without
/// reading names again) and where its entry lives. The name itself stays on media.
#[derive(Clone, Copy, Debug)]
struct Named {
    hash: u64,
    ino: u64,
    block: u32,
    slot: u8,
    nslots: u8,
    kind: FileKind,
}

// A directory entry costs the index this much plus the hash table's control byte and spare
// capacity (issue 18: at most 64 bytes of DRAM per entry).
const _: () = assert!(std::mem::size_of::<Named>() == 24);

impl Named {
    fn loc(&self) -> DirEntryLoc {
        DirEntryLoc {
            ino: self.ino,
            kind: self.kind,
            block: self.block,
            slot: u32::from(self.slot),
            nslots: u32::from(self.nslots),
        }
    }

    fn at(&self, loc: &DirEntryLoc) -> bool {
        self.block == loc.block && u32::from(self.slot) == loc.slot
    }
}

/// The hash of a name: SipHash with keys drawn once per process, so names a client picks cannot
/// be made to collide on purpose.
fn name_hash(name: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(name)
}

/// Heap bytes of a hashbrown table (std's `HashMap` is one) holding `capacity` entries of
/// `entry` bytes: buckets (a power of two at 7/8 load) of the entry and one control byte each.
pub(crate) fn hash_table_bytes(capacity: usize, entry: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity.next_power_of_two().max(4)
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    (buckets * (entry + 1) + 16) as u64
}

/// A directory's entries where they live: the pool and the directory's block map. Lookups read
/// candidate names through it; readdir and the checks read whole entries.
#[derive(Clone, Copy)]
pub struct DirMedia<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// The directory's extent map (directory block i = logical block i).
    pub map: &'a FileMap,
    /// The directory's inode (for error lines).
    pub ino: u64,
}

impl DirMedia<'_> {
    /// Pool offset of slot `slot` of directory block `block`.
    fn slot_offset(&self, block: u32, slot: u32) -> Result<u64> {
        let (phys, _) = self.map.lookup(u64::from(block)).ok_or_else(|| {
            corrupt!("directory {}: block {block} is not mapped", self.ino)
        })?;
        Ok(slot_offset(phys, slot))
    }

    /// Whether the entry at `loc` is named `name` (its bytes were checked when they were
    /// loaded or written; only the name is compared).
    fn is_named(&self, block: u32, slot: u32, name: &[u8]) -> Result<bool> {
        let off = self.slot_offset(block, slot)?;
        let head: [u8; DENTRY_HEADER] = self.pool.read_array(off)?;
        if usize::from(head[dentry::NAME_LEN]) != name.len() {
            return Ok(false);
        }
        let mut buf = [0u8; u8::MAX as usize];
        let stored = &mut buf[..name.len()];
        self.pool.read(off + DENTRY_HEADER as u64, stored)?;
        Ok(stored == name)
    }

    /// The entry at slot `slot` of block `block`, decoded and checked: (inode, type, name).
    pub fn entry(&self, block: u32, slot: u32) -> Result<(u64, FileKind, Vec<u8>)> {
        let off = self.slot_offset(block, slot)?;
        let room = (DIR_SLOTS - slot) as usize * dir_block::SLOT;
        let mut buf = vec![0u8; room.min(DENTRY_HEADER + usize::from(u8::MAX))];
        self.pool.read(off, &mut buf)?;
        decode_dentry(&buf).map_err(|e| {
            corrupt!("directory {}, block {block}, slot {slot}: {e}", self.ino)
        })
    }

    /// The name of the entry at `loc`, for a line that reports it ("?" if it cannot be read).
    pub fn name_for_report(&self, loc: &DirEntryLoc) -> String {
        self.entry(loc.block, loc.slot).map_or_else(
            |_| "?".to_string(),
            |(_, _, n)| String::from_utf8_lossy(&n).into_owned(),
        )
    }
}

/// The DRAM index of one directory.
#[derive(Clone, Debug, Default)]
pub struct DirIndex {
    /// Every name (other than "." and "..") by hash, and where its entry lives.
    names: HashTable<Named>,
    /// Per block: slots in use (bit 0, the header, always set).
    used: Vec<u64>,
    /// Per block: the on-media `starts` bitmap (also readdir's order: block, then slot).
    pub starts: Vec<u64>,
    /// Blocks that had entries removed and may have room.
    roomy: BTreeSet<u32>,
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

    /// Where `name` lives, if it is in this directory (candidates with its hash are compared
    /// with their names on media).
    pub fn get(&self, media: &DirMedia<'_>, name: &[u8]) -> Result<Option<DirEntryLoc>> {
        self.find_hashed(media, name, name_hash(name))
    }

    /// [`DirIndex::get`] given the name's hash.
    fn find_hashed(
        &self,
        media: &DirMedia<'_>,
        name: &[u8],
        hash: u64,
    ) -> Result<Option<DirEntryLoc>> {
        let slots = dentry_slots(name.len());
        let mut failed = None;
        let found = self.names.find(hash, |e| {
            e.hash == hash
                && u32::from(e.nslots) == slots
                && failed.is_none()
                && media
                    .is_named(e.block, u32::from(e.slot), name)
                    .unwrap_or_else(|err| {
                        failed = Some(err);
                        false
                    })
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(found.map(Named::loc)),
        }
    }

    /// Heap bytes held by the index (hash table at its capacity, per-block words, roomy set).
    pub fn heap_bytes(&self) -> u64 {
        let table = hash_table_bytes(self.names.capacity(), std::mem::size_of::<Named>());
        let words = (self.used.capacity() + self.starts.capacity()) * 8;
        table + (words + self.roomy.len() * 8) as u64
    }

    /// Where every name's entry lives, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = DirEntryLoc> + '_ {
        self.names.iter().map(Named::loc)
    }

    fn fit_in(&self, b: u32, n: u32) -> Option<u32> {
        let used = self.used[b as usize];
        (1..=DIR_SLOTS - n).find(|&s| used & run_mask(s, n) == 0)
    }

    /// A free run of slots for a name of `len` bytes: (block, slot), or None if a new block is
    /// needed (it will be block `blocks()`, slot 1). Tries the last block, then blocks with
    /// removed entries, so inserts stay O(1) amortised.
    pub fn find_space(&mut self, len: usize) -> Option<(u32, u32)> {
        let (found, full) = self.peek_space(len);
        for b in full {
            self.roomy.remove(&b);
        }
        found
    }

    /// [`DirIndex::find_space`] without changing the index (a create plans while lookups read
    /// it): also the blocks with removed entries it found too full, for
    /// [`DirIndex::forget_roomy`] once the index may change.
    pub fn peek_space(&self, len: usize) -> (Option<(u32, u32)>, Vec<u32>) {
        let n = dentry_slots(len);
        if let Some(last) = self.blocks().checked_sub(1)
            && let Some(s) = self.fit_in(last, n)
        {
            return (Some((last, s)), Vec::new());
        }
        let mut full = Vec::new();
        for &b in &self.roomy {
            if let Some(s) = self.fit_in(b, n) {
                return (Some((b, s)), full);
            }
            full.push(b);
        }
        (None, full)
    }

    /// Stop offering block `b` for new names until an entry there is removed again.
    pub fn forget_roomy(&mut self, b: u32) {
        self.roomy.remove(&b);
    }

    /// Make room for `entries` more names without growing the table on the way (a mount knows
    /// how many entries a directory's blocks mark before it loads them).
    pub fn reserve(&mut self, entries: usize) {
        self.names.reserve(entries, |e| e.hash);
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

    /// Apply an insert of `name`, which the directory does not hold, to DRAM (after its
    /// transaction committed).
    pub fn insert(&mut self, name: &[u8], loc: DirEntryLoc) {
        self.insert_hashed(name_hash(name), loc);
    }

    /// [`DirIndex::insert`] given the name's hash.
    fn insert_hashed(&mut self, hash: u64, loc: DirEntryLoc) {
        self.used[loc.block as usize] |= run_mask(loc.slot, loc.nslots);
        self.starts[loc.block as usize] |= 1u64 << loc.slot;
        let named = Named {
            hash,
            ino: loc.ino,
            block: loc.block,
            // Slots are below 64 and entries span at most five of them.
            slot: u8::try_from(loc.slot).unwrap_or(u8::MAX),
            nslots: u8::try_from(loc.nslots).unwrap_or(u8::MAX),
            kind: loc.kind,
        };
        self.names.insert_unique(named.hash, named, |e| e.hash);
    }

    /// Apply the remove of `name`, whose entry is at `loc`, to DRAM (after its transaction
    /// committed).
    pub fn remove(&mut self, name: &[u8], loc: &DirEntryLoc) -> Option<DirEntryLoc> {
        let found = self.names.find_entry(name_hash(name), |e| e.at(loc)).ok()?;
        let loc = found.remove().0.loc();
        self.used[loc.block as usize] &= !run_mask(loc.slot, loc.nslots);
        self.starts[loc.block as usize] &= !(1u64 << loc.slot);
        self.roomy.insert(loc.block);
        Some(loc)
    }

    /// Change where the existing name `name`, whose entry is at `loc`, points (rename over an
    /// existing entry, exchange).
    pub fn repoint(&mut self, name: &[u8], loc: &DirEntryLoc, ino: u64, kind: FileKind) {
        if let Some(e) = self.names.find_mut(name_hash(name), |e| e.at(loc)) {
            e.ino = ino;
            e.kind = kind;
        }
    }

    /// Entries in readdir order with positions > `after`, read from media: (position, name,
    /// location). The walk stops at the first entry that cannot be read.
    pub fn entries_after<'a>(
        &'a self,
        media: DirMedia<'a>,
        after: u64,
    ) -> impl Iterator<Item = Result<(u64, Vec<u8>, DirEntryLoc)>> + 'a {
        let per = u64::from(DIR_SLOTS);
        let from = after.saturating_sub(2);
        let first_block = usize::try_from(from / per).unwrap_or(usize::MAX);
        self.starts
            .iter()
            .enumerate()
            .skip(first_block)
            .flat_map(move |(b, &w)| {
                let b = u32::try_from(b).unwrap_or(u32::MAX);
                (1..DIR_SLOTS)
                    .filter(move |s| w & (1u64 << s) != 0)
                    .map(move |s| (b, s))
            })
            .filter(move |&(b, s)| 3 + u64::from(b) * per + u64::from(s) > after)
            .map(move |(block, slot)| {
                let (ino, kind, name) = media.entry(block, slot)?;
                let loc = DirEntryLoc { ino, kind, block, slot, nslots: dentry_slots(name.len()) };
                Ok((loc.position(), name, loc))
            })
    }

    /// Every entry, read from media, in readdir order: (name, location).
    pub fn entries(&self, media: DirMedia<'_>) -> Result<Vec<(Vec<u8>, DirEntryLoc)>> {
        self.entries_after(media, 0).map(|r| r.map(|(_, n, l)| (n, l))).collect()
    }

    /// Parse one directory block read from media; `b` is the directory block index and `media`
    /// where its earlier blocks are (to tell a duplicate name). Returns whether its header
    /// matched its checksum; when it did not, the block is loaded with the header rebuilt
    /// ([`rebuilt_starts`]) and the caller decides (mount refuses, fsck reports, repair writes
    /// the rebuilt header).
    pub fn load_block(&mut self, media: &DirMedia<'_>, b: u32, blk: &[u8]) -> Result<bool> {
        let dir_ino = media.ino;
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
            let hash = name_hash(&name);
            if self.find_hashed(media, &name, hash)?.is_some() {
                return Err(corrupt!(
                    "directory {dir_ino}: duplicate name {:?}",
                    String::from_utf8_lossy(&name)
                ));
            }
            self.insert_hashed(
                hash,
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
pub(crate) fn header_bytes(dir_ino: u64, index: u32, starts: u64) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&checksum::dir_header_checksum(dir_ino, index, starts).to_le_bytes());
    v[4..].copy_from_slice(&starts.to_le_bytes());
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
    use crate::media::alloc::BlockRun;
    use crate::media::layout::encode_dentry;
    use crate::meta::inode::MapUpdate;

    /// A pool of `blocks` blocks whose directory block i is pool block i + 1, each with an empty
    /// header, and that directory's map.
    fn dir_on_pool(blocks: u64) -> (tempfile::TempDir, Pool, FileMap) {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(&dir.path().join("pool"), (blocks + 1) * BLOCK_SIZE).unwrap();
        let mut map = FileMap::new();
        map.remap(0, blocks, &[BlockRun { start: 1, len: blocks }], &mut MapUpdate::default());
        for b in 0..blocks {
            init_dir_block(&pool, b + 1, 1, u32::try_from(b).unwrap()).unwrap();
        }
        (dir, pool, map)
    }

    /// Write `name`'s entry at `loc` and record it in `d`, as a committed insert does.
    fn add(pool: &Pool, d: &mut DirIndex, name: &[u8], loc: DirEntryLoc) {
        let e = encode_dentry(loc.ino, loc.kind, name);
        pool.write(slot_offset(u64::from(loc.block) + 1, loc.slot), &e, Category::Metadata).unwrap();
        d.insert(name, loc);
    }

    #[test]
    fn space_search_reuses_removed_slots() {
        let (_t, pool, map) = dir_on_pool(1);
        let media = DirMedia { pool: &pool, map: &map, ino: 1 };
        let mut d = DirIndex::default();
        assert_eq!(d.find_space(10), None);
        d.push_block();
        for i in 0..63u32 {
            let (b, s) = d.find_space(10).unwrap();
            assert_eq!((b, s), (0, i + 1));
            let loc = DirEntryLoc { ino: 5, kind: FileKind::File, block: b, slot: s, nslots: 1 };
            add(&pool, &mut d, format!("n{i}").as_bytes(), loc);
        }
        assert_eq!(d.find_space(10), None);
        let loc = d.get(&media, b"n7").unwrap().unwrap();
        assert_eq!(d.remove(b"n7", &loc), Some(loc));
        assert_eq!(d.find_space(10), Some((0, 8)));
        assert_eq!(
            d.find_space(100),
            None,
            "a 3-slot name does not fit a 1-slot gap"
        );
    }

    #[test]
    fn names_are_found_on_media_as_the_table_grows() {
        // Thousands of names: the table grows many times, moving entries by their kept hash.
        let n = 5000u32;
        let (_t, pool, map) = dir_on_pool(u64::from(n / 60 + 1));
        let media = DirMedia { pool: &pool, map: &map, ino: 1 };
        let mut d = DirIndex::default();
        for i in 0..n {
            if i % 60 == 0 {
                d.push_block();
            }
            let (ino, block, slot) = (u64::from(i) + 2, i / 60, i % 60 + 1);
            let loc = DirEntryLoc { ino, kind: FileKind::File, block, slot, nslots: 1 };
            add(&pool, &mut d, format!("name-{i}").as_bytes(), loc);
        }
        assert_eq!(d.len(), n as usize);
        let get = |d: &DirIndex, name: &str| d.get(&media, name.as_bytes()).unwrap();
        for i in (0..n).step_by(7) {
            assert_eq!(get(&d, &format!("name-{i}")).map(|l| l.ino), Some(u64::from(i) + 2));
        }
        assert!(get(&d, "name-5000").is_none());
        // A name of the same length as a stored one that differs in one byte.
        assert!(get(&d, "name-9999").is_none() && get(&d, "nbme-42").is_none());
        let at42 = get(&d, "name-42").unwrap();
        d.repoint(b"name-42", &at42, 100_000, FileKind::Dir);
        assert_eq!(get(&d, "name-42").map(|l| (l.ino, l.kind)), Some((100_000, FileKind::Dir)));
        let at43 = get(&d, "name-43").unwrap();
        assert_eq!(d.remove(b"name-43", &at43).map(|l| l.ino), Some(45));
        assert!(get(&d, "name-43").is_none() && d.remove(b"name-43", &at43).is_none());
        assert_eq!(d.values().count(), n as usize - 1);
        assert_eq!(d.values().filter(|l| l.ino == 100_000).count(), 1);
        // readdir order follows positions, reads names from media and skips the removed name.
        let listed = d.entries(media).unwrap();
        assert_eq!(listed.len(), n as usize - 1);
        assert_eq!(listed[42].0, b"name-42".to_vec());
        assert_eq!(listed[43].0, b"name-44".to_vec());
        // Resuming after any position gives the rest, in order.
        for k in [0usize, 1, 58, 59, 60, 61, 4000] {
            let pos = if k == 0 { 2 } else { listed[k - 1].1.position() };
            let rest: Vec<Vec<u8>> =
                d.entries_after(media, pos).map(|r| r.unwrap().1).collect();
            let want: Vec<Vec<u8>> = listed[k..].iter().map(|x| x.0.clone()).collect();
            assert_eq!(rest, want, "after position {pos}");
        }
    }

    #[test]
    fn a_damaged_entry_on_media_is_reported_by_readdir() {
        let (_t, pool, map) = dir_on_pool(1);
        let media = DirMedia { pool: &pool, map: &map, ino: 1 };
        let mut d = DirIndex::default();
        d.push_block();
        let loc = DirEntryLoc { ino: 9, kind: FileKind::File, block: 0, slot: 1, nslots: 1 };
        add(&pool, &mut d, b"a", loc);
        pool.write(slot_offset(1, 1) + DENTRY_HEADER as u64, b"b", Category::Metadata).unwrap();
        let err = d.entries(media).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        // A lookup compares names only: the changed name is not found.
        assert_eq!(d.get(&media, b"a").unwrap(), None);
    }

    #[test]
    fn block_parsing_rejects_overlap_and_duplicates() {
        let (_t, pool, map) = dir_on_pool(1);
        let media = DirMedia { pool: &pool, map: &map, ino: 1 };
        let mut blk = vec![0u8; 4096];
        blk[..4].copy_from_slice(&DIR_MAGIC.to_le_bytes());
        let e = encode_dentry(9, FileKind::File, b"a");
        blk[64..64 + e.len()].copy_from_slice(&e);
        blk[128..128 + e.len()].copy_from_slice(&e);
        blk[4..16].copy_from_slice(&header_bytes(1, 0, 0b110));
        pool.write(BLOCK_SIZE, &blk, Category::Metadata).unwrap();
        let mut d = DirIndex::default();
        assert!(d.load_block(&media, 0, &blk).is_err(), "duplicate name");
        blk[4..16].copy_from_slice(&header_bytes(1, 0, 0b10));
        pool.write(BLOCK_SIZE, &blk, Category::Metadata).unwrap();
        let mut d = DirIndex::default();
        assert!(d.load_block(&media, 0, &blk).unwrap());
        assert_eq!(d.get(&media, b"a").unwrap().unwrap().ino, 9);
    }

    #[test]
    fn a_damaged_header_is_detected_and_rebuilt_from_its_valid_entries() {
        let (_t, pool, map) = dir_on_pool(4);
        // A directory index with `b` blocks loaded before: the next block loaded is block `b`.
        let at = |b: u32| {
            let mut d = DirIndex::default();
            (0..b).for_each(|_| d.push_block());
            d
        };
        let media = |ino| DirMedia { pool: &pool, map: &map, ino };
        let mut blk = vec![0u8; 4096];
        blk[..4].copy_from_slice(&DIR_MAGIC.to_le_bytes());
        let a = encode_dentry(9, FileKind::File, b"a");
        let b = encode_dentry(10, FileKind::Dir, b"b");
        blk[64..64 + a.len()].copy_from_slice(&a);
        blk[192..192 + b.len()].copy_from_slice(&b);
        blk[4..16].copy_from_slice(&header_bytes(7, 2, 0b1010));
        for k in 1..=4 {
            pool.write(k * BLOCK_SIZE, &blk, Category::Metadata).unwrap();
        }
        assert!(at(2).load_block(&media(7), 2, &blk).unwrap());
        // The same header read as another block, or of another directory, fails.
        assert!(!at(3).load_block(&media(7), 3, &blk).unwrap());
        assert!(!at(2).load_block(&media(8), 2, &blk).unwrap());
        // A bit set at a slot holding no entry (a flipped bit): dropped by the rebuild.
        blk[8] |= 0b100;
        let mut d = at(2);
        assert!(!d.load_block(&media(7), 2, &blk).unwrap());
        assert_eq!(d.starts[2], 0b1010);
        assert_eq!(rebuilt_starts(&blk), 0b1010);
        assert_eq!(d.len(), 2);
        // A flipped checksum byte: the same entries.
        blk[8] &= !0b100;
        blk[5] ^= 0x40;
        let mut d = at(2);
        assert!(!d.load_block(&media(7), 2, &blk).unwrap());
        assert_eq!(d.starts[2], 0b1010);
    }
}
