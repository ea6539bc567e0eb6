//! The DRAM side of the alternate-slot zones (`state::slots`): each zone's free slots, the
//! owner of each live slot and a CLOCK approximation of least recently used, under one lock
//! per zone (taken after inode locks, never held while waiting for one).

use crate::state::locks::lock;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// One zone.
pub(crate) struct Zone {
    pub free: Vec<u32>,
    /// Owner (inode, logical block) of each live slot.
    pub owner: Vec<Option<(u64, u64)>>,
    /// Used since the clock hand last passed (CLOCK: such a slot gets a second chance).
    referenced: Vec<bool>,
    hand: usize,
}

impl Zone {
    /// Slot `slot` was just used.
    pub fn touch(&mut self, slot: u32) {
        self.referenced[slot as usize] = true;
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

/// The zones of a mount, in DRAM.
pub(crate) struct Zones {
    pub zones: Vec<Mutex<Zone>>,
    /// A background write-back was asked for and has not finished.
    pub write_back_asked: AtomicBool,
    /// Test-only: skip the fence between a write's stores and its descriptor store (the crash
    /// explorer's self-test of a deliberately broken build).
    pub broken_skip_fence: AtomicBool,
}

impl Zones {
    /// Every slot free (mount folds the live ones home first).
    pub fn new(partitions: u32, slots: u32) -> Zones {
        let n = usize::try_from(slots).unwrap_or(0);
        Zones {
            zones: (0..partitions)
                .map(|_| {
                    Mutex::new(Zone {
                        free: (0..slots).rev().collect(),
                        owner: vec![None; n],
                        referenced: vec![false; n],
                        hand: 0,
                    })
                })
                .collect(),
            write_back_asked: AtomicBool::new(false),
            broken_skip_fence: AtomicBool::new(false),
        }
    }

    /// Slot `slot` of zone `part` is free again.
    pub fn release(&self, part: u32, slot: u32) {
        let mut z = lock(&self.zones[part as usize]);
        if z.owner[slot as usize].take().is_some() {
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
}
