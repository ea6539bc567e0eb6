//! The DRAM side of the alternate-slot zones (`state::slots`): each zone's free slots, the
//! owner of each live slot and the least-recently-used order, under one lock per zone (taken
//! after inode locks, never held while waiting for one).

use crate::state::locks::lock;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// One zone.
pub(crate) struct Zone {
    pub free: Vec<u32>,
    /// Owner (inode, logical block) and last use of each live slot.
    pub owner: Vec<Option<(u64, u64)>>,
    pub used: Vec<u64>,
    /// Last use → slot, oldest first.
    pub lru: BTreeMap<u64, u32>,
    pub clock: u64,
}

/// The zones of a mount, in DRAM.
pub(crate) struct Zones {
    pub zones: Vec<Mutex<Zone>>,
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
                        used: vec![0; n],
                        lru: BTreeMap::new(),
                        clock: 0,
                    })
                })
                .collect(),
            broken_skip_fence: AtomicBool::new(false),
        }
    }

    pub fn touch(z: &mut Zone, slot: u32) {
        let i = slot as usize;
        z.lru.remove(&z.used[i]);
        z.clock += 1;
        z.used[i] = z.clock;
        z.lru.insert(z.clock, slot);
    }

    pub fn release(&self, part: u32, slot: u32) {
        let mut z = lock(&self.zones[part as usize]);
        let i = slot as usize;
        if z.owner[i].take().is_some() {
            let u = z.used[i];
            z.lru.remove(&u);
            z.free.push(slot);
        }
    }

    /// Live slots per zone (for tests and reports).
    pub fn live(&self) -> usize {
        self.zones
            .iter()
            .map(|z| lock(z).owner.iter().filter(|o| o.is_some()).count())
            .sum()
    }
}

