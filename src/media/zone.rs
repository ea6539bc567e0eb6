//! Alternate-slot zones (docs/DESIGN.md §2, §5): one per partition, a descriptor table then
//! one-block slots. A live slot holds the newest copy of some 64-byte lines of one file block
//! (its *home*); the block's other lines are newest at home. A descriptor is two words:
//!
//! - `HOME` (bytes 0..8): the home's pool block number in bits 0..40 and, in bits 40..64, a
//!   check of the block number with the zone and slot numbers (a crc32c's top 24 bits), so a
//!   damaged or stray word is refused, never followed;
//! - `LINES` (bytes 8..16): bit *i* set = line *i* of the block is newest in the slot.
//!
//! Each word is stored with one atomic 8-byte store. `HOME` is stored before `LINES` names any
//! line, and `LINES` is the commit point of every update: a crash leaves the old set of lines
//! or the new one. `HOME` gets no write-back of its own: the two words share a cache line,
//! whose stores reach media in program order (x86's persistency model), so the write-back that
//! makes `LINES` durable carries the `HOME` stored before it, and `LINES` is never durable
//! without it. That saves a flush per new slot, and on CPUs whose `clwb` evicts the line, a
//! miss when `LINES` is stored.
//!
//! Zones of a pool made with growth (`Geometry::zone_growth`) may grow into free 2 MiB units
//! of the data area while enough of it stays free (the mount state's lending rules), and give
//! them back under pressure and at every unmount and mount. Each zone's extension table (its last block) names its units: word
//! *k* is 0 or the unit's first block in bits 0..40 with a check of the block, zone and *k* in
//! bits 40..64. A unit holds [`EXTENSION_SLOTS`] descriptors in its first two blocks, then as
//! many slots; its slots are numbered on after the zone's own `zone_slots`, unit *k*'s from
//! `zone_slots + k * EXTENSION_SLOTS`. A unit's descriptors are zeroed and fenced before its
//! word is stored, and the word is cleared and fenced before the unit goes back to the
//! allocator, so a word names a unit only while its descriptors mean something.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::geometry::{
    BLOCKS_PER_HUGE, EXTENSION_DESC_BLOCKS, EXTENSION_SLOTS, Geometry, ZONE_DESC_SIZE,
    ZONE_EXTENSIONS,
};
use crate::media::layout::{BLOCK_SIZE, get_u64};
use crate::media::pool::{Category, Pool};
use std::sync::atomic::{AtomicU64, Ordering};

/// Offsets inside a descriptor.
pub mod desc {
    /// u64: home block (bits 0..40) and check (bits 40..64).
    pub const HOME: usize = 0;
    /// u64: bitmap of the lines newest in the slot.
    pub const LINES: usize = 8;
}

/// Offsets inside a zone extension word (word k of a zone's extension table is at byte 8×k).
pub mod ext {
    /// u64: the unit's first block (bits 0..40) and check (bits 40..64).
    pub const UNIT: usize = 0;
}

/// Lines (of 64 bytes) in a block: one bit each in `LINES`.
pub const LINES_PER_BLOCK: u64 = 64;
/// Bytes of one line.
pub const LINE: u64 = 64;
const HOME_BITS: u32 = 40;
const HOME_MASK: u64 = (1 << HOME_BITS) - 1;

const _: () = assert!(LINES_PER_BLOCK * LINE == crate::media::layout::BLOCK_SIZE);
const _: () = assert!(desc::LINES as u64 + 8 == crate::media::geometry::ZONE_DESC_SIZE);
// A descriptor never straddles a cache line (so `HOME` and `LINES` share one).
const _: () = assert!(crate::media::pool::CACHE_LINE.is_multiple_of(crate::media::geometry::ZONE_DESC_SIZE));

fn check(home: u64, part: u32, slot: u32) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&home.to_le_bytes());
    b[8..12].copy_from_slice(&part.to_le_bytes());
    b[12..].copy_from_slice(&slot.to_le_bytes());
    u64::from(crate::media::crc::crc32c(&b) >> 8)
}

/// The `HOME` word naming pool block `home` for slot `slot` of zone `part`.
pub fn home_word(home: u64, part: u32, slot: u32) -> u64 {
    (home & HOME_MASK) | (check(home & HOME_MASK, part, slot) << HOME_BITS)
}

/// Word `k` of zone `part`'s extension table naming the unit at block `start`. The check's
/// slot field carries `k` with the top bit set, so a table word never passes as a `HOME` word.
pub fn extension_word(start: u64, part: u32, k: u32) -> u64 {
    (start & HOME_MASK) | (check(start & HOME_MASK, part, k | 1 << 31) << HOME_BITS)
}

/// Where every slot of a mount's zones lives: the fixed zones from the geometry, and the
/// units each zone has grown into (read without a lock on every slot access).
pub struct SlotSpace {
    geo: Geometry,
    /// Per zone, per table word: the unit's first block, 0 when none.
    units: Vec<Box<[AtomicU64]>>,
}

impl SlotSpace {
    /// The zones of `g`, grown into no unit yet.
    pub fn new(g: &Geometry) -> SlotSpace {
        let words = if g.zone_growth { ZONE_EXTENSIONS as usize } else { 0 };
        SlotSpace {
            geo: g.clone(),
            units: (0..g.partitions)
                .map(|_| (0..words).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        }
    }

    /// First block of unit `k` of zone `part`, if it has one.
    pub fn unit(&self, part: u32, k: u32) -> Option<u64> {
        let w = self.units.get(part as usize)?.get(k as usize)?.load(Ordering::Acquire);
        (w != 0).then_some(w)
    }

    /// Byte offset of word `k` of zone `part`'s extension table.
    fn word_offset(&self, part: u32, k: u32) -> u64 {
        word_offset(&self.geo, part, k)
    }

    /// The units the zones hold now.
    pub fn units(&self) -> Vec<Unit> {
        let mut out = Vec::new();
        for (part, words) in (0u32..).zip(&self.units) {
            for (k, w) in (0u32..).zip(words.iter()) {
                let start = w.load(Ordering::Acquire);
                if start != 0 {
                    out.push(Unit { part, k, start });
                }
            }
        }
        out
    }

    /// Whether unit `u`'s table word on media names it (fsck).
    pub fn word_on_media(&self, pool: &Pool, u: &Unit) -> Result<bool> {
        let mut b = [0u8; 8];
        pool.read(self.word_offset(u.part, u.k), &mut b)?;
        Ok(u64::from_le_bytes(b) == extension_word(u.start, u.part, u.k))
    }

    /// Mount: unit `u`, read from the tables, is where its slots are.
    pub(crate) fn set_unit_at_mount(&self, u: &Unit) {
        self.set_unit(u.part, u.k, u.start);
    }

    fn set_unit(&self, part: u32, k: u32, start: u64) {
        if let Some(w) = self.units.get(part as usize).and_then(|u| u.get(k as usize)) {
            w.store(start, Ordering::Release);
        }
    }

    /// Slot `slot` of zone `part`: in the fixed zone (block offset of its descriptor table and
    /// the slot's index there) or in a unit.
    fn locate(&self, part: u32, slot: u32) -> Result<(u64, u64)> {
        let s = self.geo.zone_slots;
        if slot < s {
            return Ok((self.geo.zone_desc_offset(part, slot), self.geo.zone_slot_offset(part, slot)));
        }
        let (k, i) = ((slot - s) / EXTENSION_SLOTS, (slot - s) % EXTENSION_SLOTS);
        let start = self
            .unit(part, k)
            .ok_or_else(|| corrupt!("slot zone {part} slot {slot} lies in no unit the zone has"))?;
        Ok((
            start * BLOCK_SIZE + u64::from(i) * ZONE_DESC_SIZE,
            (start + EXTENSION_DESC_BLOCKS + u64::from(i)) * BLOCK_SIZE,
        ))
    }

    /// Byte offset of the descriptor of slot `slot` of zone `part`.
    pub fn desc_offset(&self, part: u32, slot: u32) -> Result<u64> {
        self.locate(part, slot).map(|(d, _)| d)
    }

    /// Byte offset of slot `slot` (one block) of zone `part`.
    pub fn slot_offset(&self, part: u32, slot: u32) -> Result<u64> {
        self.locate(part, slot).map(|(_, b)| b)
    }
}

/// Byte offset of word `k` of zone `part`'s extension table in a pool laid out by `g`.
fn word_offset(g: &Geometry, part: u32, k: u32) -> u64 {
    g.zone_table_offset(part) + u64::from(k) * 8 + ext::UNIT as u64
}

/// First slot number of unit `k` of a zone with `zone_slots` slots of its own.
pub fn unit_first_slot(zone_slots: u32, k: u32) -> u32 {
    zone_slots + k * EXTENSION_SLOTS
}

/// Zone `part` grows into the free unit at block `start` as its unit `k`: the unit's
/// descriptors are zeroed and fenced, then table word `k` is stored and fenced.
pub(crate) fn add_unit(pool: &Pool, space: &SlotSpace, part: u32, k: u32, start: u64) -> Result<()> {
    let g = &space.geo;
    if !g.zone_growth || k >= ZONE_EXTENSIONS || !start.is_multiple_of(BLOCKS_PER_HUGE) || !g.is_data_block(start) {
        return Err(corrupt!("slot zone {part} cannot grow into block {start} as unit {k}"));
    }
    let descs = u64::from(EXTENSION_SLOTS) * ZONE_DESC_SIZE;
    pool.zero(start * BLOCK_SIZE, descs, Category::Slot)?;
    pool.flush(start * BLOCK_SIZE, descs, Category::Slot);
    pool.fence();
    let word = space.word_offset(part, k);
    pool.store_u64_flush(word, extension_word(start, part, k), Category::Slot)?;
    pool.fence();
    space.set_unit(part, k, start);
    Ok(())
}

/// Zone `part` gives unit `k` back (none of its slots is live): table word `k` is cleared and
/// fenced before the caller hands the unit to the allocator.
pub(crate) fn remove_unit(pool: &Pool, space: &SlotSpace, part: u32, k: u32) -> Result<()> {
    let word = space.word_offset(part, k);
    pool.store_u64_flush(word, 0, Category::Slot)?;
    pool.fence();
    space.set_unit(part, k, 0);
    Ok(())
}

/// A unit named by a zone's extension table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Zone (partition) number.
    pub part: u32,
    /// Word of the zone's table.
    pub k: u32,
    /// The unit's first block (as stored: a bad word's may be anything).
    pub start: u64,
}

/// What [`read_units`] found: the units that pass their checks, and the words that fail, each
/// with the line that says why.
pub type Units = (Vec<Unit>, Vec<(Unit, String)>);

/// The units the pool's extension tables name, each checked: its word must carry the right
/// check and name a whole 2 MiB unit of the data area that no other word names. Words that
/// fail come back apart, with the line that says why.
pub fn read_units(pool: &Pool, g: &Geometry) -> Result<Units> {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    if !g.zone_growth {
        return Ok((good, bad));
    }
    let mut table = vec![0u8; ZONE_EXTENSIONS as usize * 8];
    let mut seen = std::collections::HashSet::new();
    for part in 0..g.partitions {
        pool.read(g.zone_table_offset(part), &mut table)?;
        for (k, w) in (0..ZONE_EXTENSIONS).zip(table.chunks_exact(8)) {
            let word = get_u64(w, 0);
            if word == 0 {
                continue;
            }
            let start = word & HOME_MASK;
            let u = Unit { part, k, start };
            let why = if word != extension_word(start, part, k) {
                format!("fails its check (word {word:#018x})")
            } else if !start.is_multiple_of(BLOCKS_PER_HUGE)
                || !g.is_data_block(start)
                || !g.is_data_block(start + BLOCKS_PER_HUGE - 1)
            {
                format!("names block {start}, not a 2 MiB unit of the data area")
            } else if !seen.insert(start) {
                format!("names unit {start}, which another word names too")
            } else {
                good.push(u);
                continue;
            };
            bad.push((u, format!("slot zone {part} extension word {k} {why}")));
        }
    }
    Ok((good, bad))
}

/// Clear every word of the extension tables that is not 0, durably (mount: the units' slots
/// went home, and the units are free space again).
pub(crate) fn clear_units(pool: &Pool, g: &Geometry, units: &[Unit]) -> Result<()> {
    if units.is_empty() {
        return Ok(());
    }
    for u in units {
        let word = word_offset(g, u.part, u.k);
        pool.store_u64_flush(word, 0, Category::Slot)?;
    }
    pool.fence();
    Ok(())
}

/// A slot that names lines of a home block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveSlot {
    /// Zone (partition) number.
    pub part: u32,
    /// Slot number in the zone.
    pub slot: u32,
    /// Pool block number of the home block.
    pub home: u64,
    /// Lines newest in the slot (never 0).
    pub lines: u64,
}

/// Store `HOME` of a slot, not written back: the [`store_lines`] that follows, in the same
/// cache line, carries it to media (see the module documentation).
pub(crate) fn store_home(pool: &Pool, sp: &SlotSpace, part: u32, slot: u32, home: u64) -> Result<()> {
    let off = sp.desc_offset(part, slot)? + desc::HOME as u64;
    pool.store_u64(off, home_word(home, part, slot), Category::Slot)
}

/// Store `LINES` of a slot and write it back (no fence): the commit point of an update.
pub(crate) fn store_lines(pool: &Pool, sp: &SlotSpace, part: u32, slot: u32, lines: u64) -> Result<()> {
    let off = sp.desc_offset(part, slot)? + desc::LINES as u64;
    pool.store_u64_flush(off, lines, Category::Slot)
}

/// Clear `LINES` of each of `slots` (zone, slot) and write the descriptors back, each cache line
/// once (no fence): neighbouring slots, written back together, share descriptor lines.
pub(crate) fn clear_lines(pool: &Pool, sp: &SlotSpace, slots: &[(u32, u32)]) -> Result<()> {
    let mut lines = Vec::with_capacity(slots.len());
    for &(part, slot) in slots {
        let off = sp.desc_offset(part, slot)? + desc::LINES as u64;
        pool.store_u64(off, 0, Category::Slot)?;
        lines.push(off & !(crate::media::pool::CACHE_LINE - 1));
    }
    lines.sort_unstable();
    lines.dedup();
    for line in lines {
        pool.flush(line, crate::media::pool::CACHE_LINE, Category::Slot);
    }
    Ok(())
}

/// What [`scan`] found: the live slots that pass their checks, and those that fail, each with
/// the line that says why.
pub type Scan = (Vec<LiveSlot>, Vec<(LiveSlot, String)>);

/// Every live slot of the pool's zones and of the `units` they grew into, each checked: its
/// `HOME` word must carry the right check and name a block of the data area. Slots that fail
/// come back apart, with the line that says why.
pub fn scan(pool: &Pool, g: &Geometry, units: &[Unit]) -> Result<Scan> {
    let (mut live, mut bad) = (Vec::new(), Vec::new());
    if g.zone_slots == 0 {
        return Ok((live, bad));
    }
    let n = usize::try_from(g.zone_slots).map_err(|_| corrupt!("zone size does not fit memory"))?;
    let mut tables: Vec<(u32, u32, u64, usize)> =
        (0..g.partitions).map(|p| (p, 0, g.zone_desc_offset(p, 0), n)).collect();
    tables.extend(units.iter().map(|u| {
        let first = unit_first_slot(g.zone_slots, u.k);
        (u.part, first, u.start * BLOCK_SIZE, EXTENSION_SLOTS as usize)
    }));
    for (part, first, at, count) in tables {
        let mut table = vec![0u8; count * 16];
        pool.read(at, &mut table)?;
        for (slot, d) in (first..).zip(table.chunks_exact(16)) {
            let lines = get_u64(d, desc::LINES);
            if lines == 0 {
                continue;
            }
            let word = get_u64(d, desc::HOME);
            let home = word & HOME_MASK;
            let s = LiveSlot { part, slot, home, lines };
            if word != home_word(home, part, slot) {
                bad.push((s, format!(
                    "slot zone {part} slot {slot}: descriptor home word {word:#018x} fails its check"
                )));
            } else if !g.is_data_block(home) {
                bad.push((s, format!(
                    "slot zone {part} slot {slot}: home block {home} is outside the data area"
                )));
            } else {
                live.push(s);
            }
        }
    }
    Ok((live, bad))
}

/// Copy the lines slot `s` holds to its home (written back, not fenced).
pub(crate) fn copy_home(pool: &Pool, sp: &SlotSpace, s: &LiveSlot) -> Result<()> {
    let slot_off = sp.slot_offset(s.part, s.slot)?;
    for (a, len) in line_runs(s.lines) {
        pool.copy_flush(slot_off + a, s.home * crate::media::layout::BLOCK_SIZE + a, len, Category::WriteBack)?;
    }
    Ok(())
}

/// The byte ranges (offset in the block, length) of the lines set in `lines`, runs merged.
pub fn line_runs(lines: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut rest = lines;
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let first = u64::from(rest.trailing_zeros());
        let run = u64::from((rest >> first).trailing_ones());
        rest &= if first + run >= 64 { 0 } else { !0u64 << (first + run) };
        Some((first * LINE, run * LINE))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_words_check_block_zone_and_slot() {
        let w = home_word(12345, 1, 7);
        assert_eq!(w & HOME_MASK, 12345);
        assert_ne!(w, home_word(12345, 1, 8));
        assert_ne!(w, home_word(12345, 0, 7));
        assert_ne!(w ^ 1, home_word(12345 ^ 1, 1, 7) ^ 1);
    }

    #[test]
    fn line_runs_merge_neighbours() {
        assert_eq!(line_runs(0).count(), 0);
        assert_eq!(line_runs(!0).collect::<Vec<_>>(), vec![(0, 4096)]);
        assert_eq!(
            line_runs(0b1011 | 1 << 63).collect::<Vec<_>>(),
            vec![(0, 128), (192, 64), (63 * 64, 64)]
        );
    }
}
