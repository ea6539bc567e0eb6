//! The DRAM side of the alternate-slot zones (`state::slots`): each zone's free slots, the
//! owner of each live slot and a CLOCK approximation of least recently used, under one lock
//! per zone (taken after inode locks, never held while waiting for one); and where the slots
//! live (`zone::SlotSpace`), with the units the zones have grown into.

use crate::media::geometry::{EXTENSION_SLOTS, Geometry, ZONE_EXTENSIONS};
use crate::media::layout::BLOCKS_PER_HUGE;
use crate::media::zone::{SlotSpace, unit_first_slot};
use crate::state::inode_state::SlotRef;
use crate::state::locks::lock;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

/// Allocator holder id of zone `part`'s units (`Allocator::set_speculative`): above every
/// inode number, so the pressure handler tells them from files' preallocation.
pub(crate) fn unit_holder(part: u32) -> u64 {
    UNIT_HOLDERS + u64::from(part)
}

/// First allocator holder id of zone units.
pub(crate) const UNIT_HOLDERS: u64 = u64::MAX - 512;

/// One zone.
pub(crate) struct Zone {
    pub free: Vec<u32>,
    /// Owner (inode, logical block) of each live slot, by slot number: the zone's own slots,
    /// then each unit's (units given back leave their range unowned and out of `free`).
    pub owner: Vec<Option<(u64, u64)>>,
    /// Used since the clock hand last passed (CLOCK: such a slot gets a second chance).
    referenced: Vec<bool>,
    hand: usize,
    /// The zone's own slots.
    own: u32,
    /// Table word k held (a unit in use), by k.
    units: Vec<bool>,
    /// Units being emptied: their slots are not put back in `free` when released.
    draining: Vec<bool>,
}

impl Zone {
    /// Slot `slot` was just used.
    pub fn touch(&mut self, slot: u32) {
        self.referenced[slot as usize] = true;
    }

    /// Slots the zone has: its own and its units'.
    pub fn capacity(&self) -> usize {
        self.own as usize + self.held_units() * EXTENSION_SLOTS as usize
    }

    /// Units the zone holds.
    pub fn held_units(&self) -> usize {
        self.units.iter().filter(|&&u| u).count()
    }

    /// Table words of the units the zone holds, highest first.
    pub fn unit_words(&self) -> Vec<u32> {
        (0..self.units.len()).rev().filter(|&k| self.units[k]).map(|k| k as u32).collect()
    }

    /// The first table word not in use, if any is left.
    pub fn free_word(&self) -> Option<u32> {
        let k = self.units.iter().position(|&u| !u).unwrap_or(self.units.len());
        u32::try_from(k).ok().filter(|&k| k < ZONE_EXTENSIONS)
    }

    fn range(&self, k: u32) -> Range<usize> {
        let first = unit_first_slot(self.own, k) as usize;
        first..first + EXTENSION_SLOTS as usize
    }

    /// Unit `k` was added: its slots are free.
    pub fn add_unit(&mut self, k: u32) {
        let r = self.range(k);
        if self.owner.len() < r.end {
            self.owner.resize(r.end, None);
            self.referenced.resize(r.end, false);
        }
        let ku = k as usize;
        if self.units.len() <= ku {
            self.units.resize(ku + 1, false);
            self.draining.resize(ku + 1, false);
        }
        self.units[ku] = true;
        self.draining[ku] = false;
        self.free.extend(r.rev().map(|s| s as u32));
    }

    /// Whether the zone holds unit `k`.
    pub fn holds(&self, k: u32) -> bool {
        self.units.get(k as usize) == Some(&true)
    }

    /// Whether unit `k` is being emptied.
    pub fn is_draining(&self, k: u32) -> bool {
        self.draining.get(k as usize) == Some(&true)
    }

    /// Start emptying unit `k`: its free slots leave `free` (no writer takes them, and slots
    /// released from now on stay out) and the owners of its live ones come back.
    pub fn drain_unit(&mut self, k: u32) -> Vec<(u64, u64)> {
        let r = self.range(k);
        self.draining[k as usize] = true;
        self.free.retain(|&s| !r.contains(&(s as usize)));
        self.unit_owners(k)
    }

    /// Owners of unit `k`'s live slots.
    pub fn unit_owners(&self, k: u32) -> Vec<(u64, u64)> {
        self.owner[self.range(k)].iter().flatten().copied().collect()
    }

    /// Whether unit `k` has no live slot.
    pub fn unit_empty(&self, k: u32) -> bool {
        self.owner[self.range(k)].iter().all(Option::is_none)
    }

    /// Unit `k` is given back (it has no live slot).
    pub fn remove_unit(&mut self, k: u32) {
        self.units[k as usize] = false;
        self.draining[k as usize] = false;
    }

    /// Unit `k` could not be emptied: it stays, its free slots are free again.
    pub fn keep_unit(&mut self, k: u32) {
        let r = self.range(k);
        self.draining[k as usize] = false;
        let free: Vec<u32> = r.filter(|&s| self.owner[s].is_none()).map(|s| s as u32).collect();
        self.free.extend(free);
    }

    fn draining(&self, slot: u32) -> bool {
        slot >= self.own && self.draining.get(((slot - self.own) / EXTENSION_SLOTS) as usize) == Some(&true)
    }

    /// Owners of up to `n` live slots not used lately, oldest first as the clock hand finds
    /// them (an approximation of least recently used that costs O(1) per use).
    pub fn oldest(&mut self, n: usize) -> Vec<(u64, u64)> {
        let len = self.owner.len();
        let mut out = Vec::new();
        let mut steps = 0;
        while out.len() < n && steps < 2 * len {
            let i = self.hand;
            self.hand = (i + 1) % len;
            steps += 1;
            if let Some(o) = self.owner[i] {
                if std::mem::take(&mut self.referenced[i]) {
                    continue;
                }
                out.push(o);
            }
        }
        out
    }
}

/// No background copy is running.
pub(crate) const COPY_IDLE: u8 = 0;
/// A batch is being copied home.
pub(crate) const COPY_RUNNING: u8 = 1;
/// The batch's lines are home and fenced; its descriptors still name them.
pub(crate) const COPY_DONE: u8 = 2;
/// A copy failed: the batch's slots still hold the newest lines and stay live.
pub(crate) const COPY_FAILED: u8 = 3;
/// A writer handed the worker a batch to copy; nobody has started it.
pub(crate) const COPY_QUEUED: u8 = 4;

/// Slots of one inode copied home while the inode's lock is free (their `SlotRef::copying`
/// set), by logical block: by the background worker, or by whoever must wait for it first.
pub(crate) struct CopyBatch {
    pub ino: u64,
    pub picked: Vec<(u64, SlotRef)>,
}

/// The zones of a mount, in DRAM.
pub(crate) struct Zones {
    pub zones: Vec<Mutex<Zone>>,
    /// Where each slot lives.
    pub space: SlotSpace,
    /// Blocks of the units the zones hold, in all.
    unit_blocks: AtomicU64,
    /// A background write-back was asked for and has not started (the run clears it first).
    pub write_back_asked: AtomicBool,
    /// The background worker's batch of slots being copied home without their inode's lock
    /// (`state::slots`, at most one at a time), taken by whoever finishes it.
    pub copy: Mutex<Option<CopyBatch>>,
    /// Where that copy stands: [`COPY_IDLE`], [`COPY_QUEUED`], [`COPY_RUNNING`], [`COPY_DONE`]
    /// or [`COPY_FAILED`].
    pub copy_phase: AtomicU8,
    /// Test-only: skip the fence between a write's stores and its descriptor store (the crash
    /// explorer's self-test of a deliberately broken build).
    pub broken_skip_fence: AtomicBool,
}

impl Zones {
    /// Every slot of `g`'s zones free, no unit held (mount folds the live ones home first and
    /// gives the units back).
    pub fn new(g: &Geometry) -> Zones {
        let n = usize::try_from(g.zone_slots).unwrap_or(0);
        Zones {
            zones: (0..g.partitions)
                .map(|_| {
                    Mutex::new(Zone {
                        free: (0..g.zone_slots).rev().collect(),
                        owner: vec![None; n],
                        referenced: vec![false; n],
                        hand: 0,
                        own: g.zone_slots,
                        units: Vec::new(),
                        draining: Vec::new(),
                    })
                })
                .collect(),
            space: SlotSpace::new(g),
            unit_blocks: AtomicU64::new(0),
            write_back_asked: AtomicBool::new(false),
            copy: Mutex::new(None),
            copy_phase: AtomicU8::new(COPY_IDLE),
            broken_skip_fence: AtomicBool::new(false),
        }
    }

    /// Slot `slot` of zone `part` is free again.
    pub fn release(&self, part: u32, slot: u32) {
        let mut z = lock(&self.zones[part as usize]);
        if z.owner[slot as usize].take().is_some() && !z.draining(slot) {
            z.free.push(slot);
        }
    }

    /// Live slots in all zones.
    pub fn live(&self) -> usize {
        self.zones
            .iter()
            .map(|z| lock(z).owner.iter().filter(|o| o.is_some()).count())
            .sum()
    }

    /// Blocks of the units the zones hold.
    pub fn unit_blocks(&self) -> u64 {
        self.unit_blocks.load(Ordering::Relaxed)
    }

    /// The units held changed by `delta` blocks.
    pub fn add_unit_blocks(&self, delta: i64) {
        if delta >= 0 {
            self.unit_blocks.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
        } else {
            self.unit_blocks.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

/// The space figures that decide when free space is lent to the zones as units and when it is
/// asked back (all in blocks). A unit is a free aligned 2 MiB extent, the kind a file needs to
/// be mapped with hugepages, so the zones borrow at most as many as the files have left.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Room {
    /// The pool's data area.
    pub data_blocks: u64,
    /// Free blocks (the lent units not counted).
    pub free: u64,
    /// Free blocks in free aligned extents.
    pub free_aligned: u64,
    /// Blocks the zones hold as units.
    pub lent: u64,
}

/// Zones grow while a sixteenth of the data area stays free with the unit taken...
const LEND_FREE_DIVISOR: u64 = 16;
/// ...and give units back once less than a thirty-second would be free (the gap between the two
/// lines keeps a pool near one of them from lending and asking back in turn).
const ASK_FREE_DIVISOR: u64 = 32;

impl Room {
    /// Whether the zones may take one more unit: with it taken, a sixteenth of the data area is
    /// still free and the free aligned extents left are at least the zones' units.
    pub fn may_lend(&self) -> bool {
        let h = BLOCKS_PER_HUGE;
        self.free >= self.data_blocks / LEND_FREE_DIVISOR + h
            && self.free_aligned >= 2 * h + self.lent
    }

    /// Whether the zones should give units back before `blocks` more are allocated: they hold
    /// some, and less than a thirty-second of the data area would be free, or the files have less
    /// than half as much free aligned space left as the zones hold.
    pub fn pressed(&self, blocks: u64) -> bool {
        self.lent > 0
            && (self.free < self.data_blocks / ASK_FREE_DIVISOR + blocks
                || self.free_aligned < self.lent / 2)
    }

    /// Blocks to give back when [`Room::pressed`]: enough to bring free space back to the
    /// lending line and the zones' units down to the files' free aligned space (each unit
    /// given back adds a unit to the one side and takes one from the other), whole units.
    pub fn blocks_to_ask_back(&self, blocks: u64) -> u64 {
        let h = BLOCKS_PER_HUGE;
        let space = (self.data_blocks / LEND_FREE_DIVISOR + blocks).saturating_sub(self.free);
        let aligned = self.lent.saturating_sub(self.free_aligned).div_ceil(2);
        space.max(aligned).next_multiple_of(h).min(self.lent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = BLOCKS_PER_HUGE;

    fn room(free: u64, free_aligned: u64, lent: u64) -> Room {
        Room { data_blocks: 1600 * H, free, free_aligned, lent }
    }

    #[test]
    fn zones_borrow_at_most_what_the_files_keep_of_aligned_space() {
        // An aged pool 85% full: 240 units free, 100 of them aligned.
        assert!(room(240 * H, 100 * H, 0).may_lend());
        // The 50th unit leaves the files 50 aligned extents, level with the zones...
        assert!(room(240 * H, 51 * H, 49 * H).may_lend());
        // ...one fewer aligned extent free, and it would leave them 49 against 50.
        assert!(!room(240 * H, 50 * H, 49 * H).may_lend());
        // A sixteenth of the data area (100 units) free: taking a unit would go below it.
        assert!(!room(100 * H, 100 * H, 0).may_lend());
    }

    #[test]
    fn units_are_asked_back_below_lower_lines_than_they_are_lent_at() {
        // Just past the lending lines: not pressed, so lending stops without a give-back.
        assert!(!room(99 * H, 50 * H, 50 * H).pressed(0));
        assert!(!room(99 * H, 25 * H, 50 * H).pressed(0));
        // Files took aligned extents: fewer than half the zones' units are left to them.
        let r = room(99 * H, 24 * H, 50 * H);
        assert!(r.pressed(0));
        assert_eq!(r.blocks_to_ask_back(0), 13 * H, "(50 - 24) / 2 units bring the sides level");
        // Space short of a thirty-second (50 units) with an allocation of 10 units coming.
        let r = room(55 * H, 100 * H, 20 * H);
        assert!(r.pressed(10 * H));
        assert!(!r.pressed(4 * H));
        assert_eq!(r.blocks_to_ask_back(10 * H), 20 * H, "never more than the zones hold");
        let r = room(55 * H, 100 * H, 200 * H);
        assert_eq!(r.blocks_to_ask_back(10 * H), 55 * H, "back to the lending line (100 + 10 - 55)");
        // Nothing lent: never pressed.
        assert!(!room(0, 0, 0).pressed(H));
    }
}
