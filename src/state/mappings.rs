//! The address-space side of memory mappings: each mapping's range and which of its 2 MiB
//! units are installed, and the userfaultfds of a mount's page-fault service. The data path
//! keeps them in step with the file through `map_hooks`; `ops::mmap` creates and serves them.
//!
//! Every page of a mapping is in one of three states (docs/DESIGN.md §7a): **installed** (a
//! shared `MAP_FIXED` mapping of the pool at the block's offset), **missing** (inside the file,
//! registered with the main userfaultfd: the first touch is served by allocating its unit) or
//! **beyond EOF** (registered with the SIGBUS userfaultfd).

use crate::error::Result;
use crate::media::layout::{BLOCK_SIZE, BLOCKS_PER_HUGE};
use crate::state::locks::lock;
use crate::sys::vm::{self, PAGE, Uffd, Wakeup};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Blocks per 2 MiB unit.
pub(crate) const UNIT_BLOCKS: u64 = BLOCKS_PER_HUGE;

/// The address-space side of one mapping.
pub(crate) struct MapState {
    pub ino: u64,
    /// Address of file offset `off`.
    pub base: usize,
    /// File offset of `base` (page-aligned).
    pub off: u64,
    /// Length in bytes (whole pages).
    pub len: usize,
    /// Atomic mapping: pages are copy-on-write views of the pool, written back by `msync`
    /// in one journal transaction.
    pub atomic: bool,
    pub va: Mutex<VaState>,
    /// Fault workers currently serving this mapping; teardown waits for zero, so no worker
    /// still holds the mount (or touches the range) once the mapping is gone.
    pub in_flight: AtomicUsize,
}

/// A worker's claim on a mapping while it serves one of its faults.
pub(crate) struct InFlight(pub Arc<MapState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// Which units of a mapping are installed, and whether it is going away.
pub(crate) struct VaState {
    /// 2 MiB units whose pages inside the file size (and the mapping) are all installed.
    pub installed: BTreeSet<u64>,
    /// Blocks installed one by one, in units not wholly installed (faults of small and
    /// sparse mappings allocate and install only the page touched).
    pub pages: BTreeSet<u64>,
    /// The mapping is being torn down: install nothing more.
    pub dead: bool,
}

impl MapState {
    /// A mapping of `len` bytes of file `ino` from `off`, placed at `base`, nothing installed.
    pub fn new(ino: u64, base: usize, off: u64, len: usize, atomic: bool) -> MapState {
        MapState {
            ino,
            base,
            off,
            len,
            atomic,
            va: Mutex::new(VaState {
                installed: BTreeSet::new(),
                pages: BTreeSet::new(),
                dead: false,
            }),
            in_flight: AtomicUsize::new(0),
        }
    }
    pub fn first_block(&self) -> u64 {
        self.off / BLOCK_SIZE
    }
    pub fn end_block(&self) -> u64 {
        self.first_block() + (self.len / PAGE) as u64
    }
    pub fn va_of_block(&self, b: u64) -> usize {
        self.base + ((b - self.first_block()) as usize) * PAGE
    }
    /// Blocks of `unit` inside both the mapping and the first `eof_blocks` blocks of the file.
    pub fn unit_valid(&self, unit: u64, eof_blocks: u64) -> (u64, u64) {
        let a = (unit * UNIT_BLOCKS).max(self.first_block());
        let b = ((unit + 1) * UNIT_BLOCKS)
            .min(self.end_block())
            .min(eof_blocks);
        (a, b.max(a))
    }
    /// The address range of `unit` inside the mapping.
    pub fn unit_va(&self, unit: u64) -> (usize, usize) {
        let a = (unit * UNIT_BLOCKS).max(self.first_block());
        let b = ((unit + 1) * UNIT_BLOCKS).min(self.end_block());
        (self.va_of_block(a), (b - a) as usize * PAGE)
    }
    /// Clip blocks [a, b) to the mapping.
    pub fn clip(&self, a: u64, b: u64) -> Option<(u64, u64)> {
        let a = a.max(self.first_block());
        let b = b.min(self.end_block());
        (a < b).then_some((a, b))
    }
}

/// What the fault workers share with the service.
pub(crate) struct Shared {
    pub main: Uffd,
    pub sigbus: Uffd,
    /// Mapping start address → (length, state), to find the mapping of a faulting address.
    pub regions: Mutex<BTreeMap<usize, (usize, Weak<MapState>)>>,
}

impl Shared {
    /// The mapping holding `addr`, claimed for the caller until the claim is dropped.
    pub fn lookup(&self, addr: usize) -> Option<InFlight> {
        let r = lock(&self.regions);
        let (&start, (len, st)) = r.range(..=addr).next_back()?;
        let st = (addr < start + len).then(|| st.upgrade()).flatten()?;
        // Counted under the regions lock: teardown removes the region under it first.
        st.in_flight.fetch_add(1, Ordering::Acquire);
        Some(InFlight(st))
    }

    /// Turn blocks [a, b) of a mapping missing (`sigbus` false) or beyond-EOF (`sigbus` true),
    /// atomically replacing whatever pages were there.
    pub fn replace(&self, st: &MapState, a: u64, b: u64, sigbus: bool) -> Result<()> {
        let Some((a, b)) = st.clip(a, b) else {
            return Ok(());
        };
        let len = (b - a) as usize * PAGE;
        let uffd = if sigbus { &self.sigbus } else { &self.main };
        let scratch = vm::registered_scratch(uffd, len)?;
        vm::move_over(scratch, len, st.va_of_block(a))?;
        // A unit cut off at EOF keeps its valid pages installed (the caller drops units left
        // with none); pages made missing leave their units not fully installed.
        let mut va = lock(&st.va);
        let gone: Vec<u64> = va.pages.range(a..b).copied().collect();
        for p in gone {
            va.pages.remove(&p);
        }
        if !sigbus {
            for unit in a / UNIT_BLOCKS..b.div_ceil(UNIT_BLOCKS) {
                va.installed.remove(&unit);
            }
        }
        Ok(())
    }
}

/// The page-fault service of one mount: a reader thread that drains the userfaultfds and
/// workers that serve faults (started by `ops::mmap`). Dropping it (with the mount) stops the
/// threads.
pub(crate) struct FaultService {
    pub shared: Arc<Shared>,
    pub stop: Arc<Wakeup>,
}

impl Drop for FaultService {
    fn drop(&mut self) {
        self.stop.signal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::vm::HUGE;

    fn state(off: u64, len: usize) -> MapState {
        MapState::new(
            2,
            0x4000_0000 + (off % HUGE as u64) as usize,
            off,
            len,
            false,
        )
    }

    #[test]
    fn unit_geometry_clips_to_mapping_and_eof() {
        // Mapping file bytes [12 KiB, 12 KiB + 5 MiB): blocks 3..1283.
        let st = state(3 * 4096, 5 << 20);
        assert_eq!((st.first_block(), st.end_block()), (3, 1283));
        // Unit 0 starts before the mapping; unit 2 ends after it; EOF cuts unit 1.
        assert_eq!(st.unit_valid(0, 10_000), (3, 512));
        assert_eq!(st.unit_valid(1, 700), (512, 700));
        assert_eq!(st.unit_valid(2, 10_000), (1024, 1283));
        assert_eq!(st.unit_valid(2, 900), (1024, 1024), "past EOF: empty");
        // Addresses: file unit boundaries fall on 2 MiB-aligned addresses.
        assert_eq!(st.va_of_block(512) % HUGE, 0);
        assert_eq!(st.unit_va(0), (st.base, 509 * PAGE));
        assert_eq!(st.unit_va(1), (st.va_of_block(512), HUGE));
        assert_eq!(st.clip(0, 5), Some((3, 5)));
        assert_eq!(st.clip(2000, 3000), None);
    }
}
