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
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::geometry::Geometry;
use crate::media::layout::get_u64;
use crate::media::pool::{Category, Pool};

/// Offsets inside a descriptor.
pub mod desc {
    /// u64: home block (bits 0..40) and check (bits 40..64).
    pub const HOME: usize = 0;
    /// u64: bitmap of the lines newest in the slot.
    pub const LINES: usize = 8;
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
    u64::from(crc32c::crc32c(&b) >> 8)
}

/// The `HOME` word naming pool block `home` for slot `slot` of zone `part`.
pub fn home_word(home: u64, part: u32, slot: u32) -> u64 {
    (home & HOME_MASK) | (check(home & HOME_MASK, part, slot) << HOME_BITS)
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
pub(crate) fn store_home(pool: &Pool, g: &Geometry, part: u32, slot: u32, home: u64) -> Result<()> {
    let off = g.zone_desc_offset(part, slot) + desc::HOME as u64;
    pool.store_u64(off, home_word(home, part, slot), Category::Slot)
}

/// Store `LINES` of a slot and write it back (no fence): the commit point of an update.
pub(crate) fn store_lines(pool: &Pool, g: &Geometry, part: u32, slot: u32, lines: u64) -> Result<()> {
    let off = g.zone_desc_offset(part, slot) + desc::LINES as u64;
    pool.store_u64_flush(off, lines, Category::Slot)
}

/// Clear `LINES` of each of `slots` (zone, slot) and write the descriptors back, each cache line
/// once (no fence): neighbouring slots, written back together, share descriptor lines.
pub(crate) fn clear_lines(pool: &Pool, g: &Geometry, slots: &[(u32, u32)]) -> Result<()> {
    let mut lines = Vec::with_capacity(slots.len());
    for &(part, slot) in slots {
        let off = g.zone_desc_offset(part, slot) + desc::LINES as u64;
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

/// Every live slot of the pool's zones, each checked: its `HOME` word must carry the right
/// check and name a block of the data area. Slots that fail come back apart, with the line
/// that says why.
pub fn scan(pool: &Pool, g: &Geometry) -> Result<Scan> {
    let (mut live, mut bad) = (Vec::new(), Vec::new());
    if g.zone_slots == 0 {
        return Ok((live, bad));
    }
    let n = usize::try_from(g.zone_slots).map_err(|_| corrupt!("zone size does not fit memory"))?;
    let mut table = vec![0u8; n * 16];
    for part in 0..g.partitions {
        pool.read(g.zone_desc_offset(part, 0), &mut table)?;
        for (slot, d) in (0..g.zone_slots).zip(table.chunks_exact(16)) {
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
pub(crate) fn copy_home(pool: &Pool, g: &Geometry, s: &LiveSlot) -> Result<()> {
    let slot_off = g.zone_slot_offset(s.part, s.slot);
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
