//! Logless alternate writing (after LAWN, docs/DESIGN.md §5): in strict mode, an overwrite
//! inside one block of a file is written once, either into an alternate slot or at home,
//! whichever does not hold the newest copy of each 64-byte line, and committed by one atomic
//! store of the slot's line bitmap (`media::zone`). No undo image, no copy on write: the file
//! keeps its blocks, so aligned extents stay aligned.
//!
//! DRAM side (`state::zones`): each zone's free slots and use order, and each inode's slots
//! (`InodeState::slots`, by logical block). A slot's contents and its inode's entry change
//! only under the inode's write lock; a zone's lists under the zone's lock, taken after inode
//! locks and never held while waiting for one (an eviction only *tries* its victim's lock).
//!
//! Everything that reads a file's blocks other than `read` and this module, moves them or
//! frees them (truncate, fallocate and its modes, leases and mappings, rewrites, compaction,
//! freeing the inode) first writes the file's slots home, durably ([`fold`], [`write_back`]), so
//! the rest of winefs sees files whose blocks hold their bytes.

use crate::error::Result;
use crate::media::geometry::Geometry;
use crate::media::alloc::BlockRun;
use crate::media::layout::{BLOCK_SIZE, BLOCKS_PER_HUGE};
use crate::media::pool::{Category, Pool};
use crate::media::zone::{self, LINE, LiveSlot, SlotSpace, Unit};
use crate::state::inode_state::{InodeState, SlotRef};
use crate::state::locks::lock;
use crate::state::zones::{
    COPY_DONE, COPY_FAILED, COPY_IDLE, COPY_QUEUED, COPY_RUNNING, CopyBatch, Zone, unit_holder,
};
use crate::state::mount_state::MountState;
use crate::sys::current_cpu;
use crate::types::{Consistency, OverwritePath};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

/// Whether a write of [pos, end) to `g` may take the alternate path: strict mode, a pool with
/// zones, inside one block and inside the file, into a block the file has, on a file nothing
/// maps in place (mappings and leases see the blocks themselves).
fn eligible(state: &MountState, g: &InodeState, pos: u64, end: u64) -> Option<u64> {
    if state.consistency != Consistency::Strict
        || state.overwrite_path != OverwritePath::Alternate
        || state.geo.zone_slots == 0
        || end <= pos
        || pos / BLOCK_SIZE != (end - 1) / BLOCK_SIZE
        || end > g.hdr.size
        || g.is_mapped()
        || g.appenders > 0
    {
        return None;
    }
    g.map.lookup(pos / BLOCK_SIZE).map(|(phys, _)| phys)
}

/// Write `buf` at `pos` by alternate writing if the write qualifies (see [`eligible`]) and a
/// slot can be had; Ok(false) leaves the write to the caller's other paths.
pub(crate) fn try_write(
    state: &MountState,
    g: &mut InodeState,
    pos: u64,
    buf: &[u8],
) -> Result<bool> {
    let end = pos + buf.len() as u64;
    let Some(home) = eligible(state, g, pos, end) else {
        return Ok(false);
    };
    let lb = pos / BLOCK_SIZE;
    let mut found = g.slots.get(&lb).copied();
    if found.is_some_and(|s| s.copying) {
        // Its block is being copied home: wait for that, and free the slot.
        finish_copy(state, g)?;
        found = g.slots.get(&lb).copied();
    }
    let (sref, new) = match found {
        Some(s) => (s, false),
        None => match take_slot(state, g, lb, home)? {
            Some(s) => (s, true),
            None => return Ok(false),
        },
    };
    let r = store(state, g, pos, buf, home, sref, new);
    if r.is_err() && new {
        state.zones.release(sref.part, sref.slot);
    }
    r.map(|()| true)
}

/// The stores of [`try_write`] into slot `sref` (`new`: just taken, its `HOME` not yet stored).
fn store(
    state: &MountState,
    g: &mut InodeState,
    pos: u64,
    buf: &[u8],
    home: u64,
    sref: SlotRef,
    new: bool,
) -> Result<()> {
    let lb = pos / BLOCK_SIZE;
    let pool = &state.pool;
    let in_blk = pos % BLOCK_SIZE;
    let (l0, l1) = (in_blk / LINE, (in_blk + buf.len() as u64 - 1) / LINE);
    let touched = if l1 - l0 == 63 { !0 } else { ((1u64 << (l1 - l0 + 1)) - 1) << l0 };
    let home_off = home * BLOCK_SIZE;
    let slot_off = state.zones.space.slot_offset(sref.part, sref.slot)?;
    // Runs of touched lines with the same destination: at home where the slot is newest, in
    // the slot where home is.
    let mut l = l0;
    while l <= l1 {
        let to_home = sref.lines >> l & 1 == 1;
        let mut r = l;
        while r < l1 && (sref.lines >> (r + 1) & 1 == 1) == to_home {
            r += 1;
        }
        let (dst, src, cat) = match to_home {
            true => (home_off, slot_off, Category::Data),
            false => (slot_off, home_off, Category::Slot),
        };
        let (a, b) = (l * LINE, (r + 1) * LINE); // the run, in the block
        let (ws, we) = (in_blk.max(a), (in_blk + buf.len() as u64).min(b));
        let data = &buf[(ws - in_blk) as usize..(we - in_blk) as usize];
        if ws == a && we == b {
            pool.write_flush(dst + a, data, cat)?;
        } else {
            // Partial head or tail line: the rest of it comes from the newest copy.
            let mut run = vec![0u8; (b - a) as usize];
            pool.read(src + a, &mut run)?;
            run[(ws - a) as usize..(we - a) as usize].copy_from_slice(data);
            pool.write_flush(dst + a, &run, cat)?;
        }
        l = r + 1;
    }
    if new {
        zone::store_home(pool, &state.zones.space, sref.part, sref.slot, home)?;
    }
    if !state.zones.broken_skip_fence.load(Ordering::Relaxed) {
        pool.fence();
    }
    let lines = sref.lines ^ touched;
    zone::store_lines(pool, &state.zones.space, sref.part, sref.slot, lines)?;
    // The modification and change times, durable with the commit's fence.
    state.store_write_times(g)?;
    pool.fence();
    if lines == 0 {
        g.slots.remove(&lb);
        state.zones.release(sref.part, sref.slot);
    } else {
        g.slots.insert(lb, SlotRef { lines, copying: false, ..sref });
        lock(&state.zones.zones[sref.part as usize]).touch(sref.slot);
    }
    // DRAM follows the pool's bytes either way; a pool whose sync failed reports it here.
    pool.check_durable()
}

/// A free slot for block `lb` of `g` (home `home`): of this CPU's zone, or another's when that
/// one is short ([`zone_for_take`]). A zone short of free slots (under a quarter) grows into a
/// free 2 MiB unit while the space left allows it ([`grow`]); one that cannot grow, once under
/// [`write_back_mark`], hands its own file's oldest to the background worker, which copies them
/// home on its own CPU while the file's lock is free ([`hand_to_worker`]), and writes back
/// other files' oldest whose lock is free now. Only under [`own_fold_mark`] (the worker fell
/// behind, or the mount has none) does it write a batch of `g`'s back itself. What it could not
/// free goes to the worker. None if no slot could be freed without waiting.
fn take_slot(state: &MountState, g: &mut InodeState, lb: u64, home: u64) -> Result<Option<SlotRef>> {
    let part = zone_for_take(state, current_cpu() % state.zones.zones.len());
    for _ in 0..2 {
        let victims = {
            let mut z = lock(&state.zones.zones[part as usize]);
            if let Some(slot) = z.free.pop() {
                z.owner[slot as usize] = Some((g.ino, lb));
                z.touch(slot);
                let cap = z.capacity();
                let grown = match z.free.len() < cap / 4 {
                    true => grow(state, part, &mut z),
                    false => Ok(false),
                };
                let mark = write_back_mark(cap);
                let short = matches!(grown, Ok(false)) && z.free.len() < mark;
                let phase = state.zones.copy_phase.load(Ordering::Acquire);
                // Between the mark and a quarter of it the worker copies this file's oldest
                // slots home (one hand-off at a time); below, the writer folds a batch itself.
                let hand_off = short
                    && state.background.writes_back()
                    && z.free.len() >= own_fold_mark(state, mark);
                let mut victims = match short && (!hand_off || phase == COPY_IDLE) {
                    true => z.oldest(BATCH),
                    false => Vec::new(),
                };
                // Not the slot just taken (its bytes are not stored yet).
                victims.retain(|&v| v != (g.ino, lb));
                drop(z);
                let freed = (|| {
                    grown?;
                    if short && matches!(phase, COPY_DONE | COPY_FAILED) {
                        finish_ended_copy(state, g)?;
                    }
                    if hand_off && !victims.is_empty() {
                        let (own, others): (Vec<_>, Vec<_>) =
                            victims.iter().partition(|v| v.0 == g.ino);
                        if !hand_to_worker(state, g, &own) {
                            write_back_victims(state, Some(&mut *g), &own, false)?;
                        }
                        // Other files' oldest: folded here if their lock is free.
                        victims = others;
                        return write_back_victims(state, None, &victims, false);
                    }
                    match victims.is_empty() {
                        true => Ok(0),
                        false => write_back_victims(state, Some(&mut *g), &victims, false),
                    }
                })();
                let freed = match freed {
                    Ok(n) => n,
                    Err(e) => {
                        state.zones.release(part, slot);
                        return Err(e);
                    }
                };
                if freed < victims.len() && !state.zones.write_back_asked.swap(true, Ordering::AcqRel) {
                    state.background.queue_write_back();
                }
                return Ok(Some(SlotRef { part, slot, home, lines: 0, copying: false }));
            }
            if grow(state, part, &mut z)? {
                continue;
            }
            state.zones.write_back_asked.store(false, Ordering::Release);
            z.oldest(BATCH)
        };
        write_back_victims(state, Some(g), &victims, false)?;
    }
    Ok(None)
}

/// The zone to take a slot from: this CPU's (`own`), unless it is short of free slots (under
/// [`write_back_mark`]: it could not grow, for want of room or of a free aligned extent in its
/// partition) and another zone has a batch more than its mark free. A thread
/// that moved to another CPU would otherwise leave the slots it freed in its old zone unused
/// while its new one, which the space lent to the old one keeps from growing, writes back a
/// batch every few updates (a second copy each: `tests/zone_growth.rs` met 1.4-1.9x the bytes
/// per update so). Zone locks are taken one at a time.
fn zone_for_take(state: &MountState, own: usize) -> u32 {
    // Taking one more would put it under the mark, where its writer writes a batch back.
    let short = |z: &Zone| z.free.len() <= write_back_mark(z.capacity());
    let zones = &state.zones.zones;
    let own32 = u32::try_from(own).unwrap_or(0);
    // Short of free slots means the zone could not grow meanwhile: growth is tried from a
    // quarter free on, at every take.
    if zones.len() == 1 || !short(&lock(&zones[own])) {
        return own32;
    }
    (1..zones.len())
        .map(|k| (own + k) % zones.len())
        .find(|&p| {
            let z = lock(&zones[p]);
            z.free.len() > write_back_mark(z.capacity()) + BATCH
        })
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(own32)
}

/// Whether the zones may grow by a unit now: the pool's zones grow, it is writable, and the
/// space left allows it ([`Room::may_lend`]: a sixteenth of the data area stays free and the files
/// keep at least as much free aligned space as the zones hold; a unit is free space lent).
fn may_grow(state: &MountState) -> bool {
    state.geo.zone_growth && !state.is_read_only() && state.room().may_lend()
}

/// Under zone `part`'s lock: grow the zone into a free aligned 2 MiB unit (its descriptors
/// zeroed, then its table word stored: `zone::add_unit`), if [`may_grow`]. The unit's blocks
/// count as given back on demand (`Allocator::set_speculative`), so statfs counts them free
/// and an allocation short of space takes them back ([`shrink`]). Ok(false): no growth.
fn grow(state: &MountState, part: u32, z: &mut Zone) -> Result<bool> {
    if !may_grow(state) {
        return Ok(false);
    }
    let Some(k) = z.free_word() else {
        return Ok(false);
    };
    let Some(start) = state.alloc.alloc_aligned_extent(part as usize) else {
        return Ok(false);
    };
    if let Err(e) = zone::add_unit(&state.pool, &state.zones.space, part, k, start) {
        give_unit(state, start);
        return Err(e);
    }
    z.add_unit(k);
    log::debug!("slot zone {part} grew into the unit at block {start} (table word {k})");
    units_changed(state, part, z, BLOCKS_PER_HUGE as i64);
    Ok(true)
}

/// Zone `part` (`z`, locked) just gained or gave back a unit (`delta` blocks): the count of
/// lent blocks and the zone's speculative holding follow.
fn units_changed(state: &MountState, part: u32, z: &Zone, delta: i64) {
    state.zones.add_unit_blocks(delta);
    let held = z.held_units() as u64 * BLOCKS_PER_HUGE;
    state.alloc.set_speculative(unit_holder(part), held);
}

/// Give zone units back to the allocator, the highest of each zone first, until `need` blocks
/// came back (`u64::MAX`: all of them): each unit's live slots are written home, then its
/// table word cleared (`zone::remove_unit`), then its blocks freed. With `wait`, their files'
/// locks are waited for; without (the allocator's pressure handler, whose caller holds an
/// inode lock), a lock held elsewhere is tried again for a few milliseconds (the background
/// worker holds one only while it writes a batch back), and a unit still not emptied stays.
/// Returns the blocks given back.
pub(crate) fn shrink(state: &MountState, need: u64, wait: bool) -> Result<u64> {
    let mut freed = 0;
    for (part, zm) in (0u32..).zip(&state.zones.zones) {
        let words = lock(zm).unit_words();
        for k in words {
            if freed >= need {
                return Ok(freed);
            }
            if empty_unit(state, part, k, wait)? {
                freed += BLOCKS_PER_HUGE;
            }
        }
    }
    Ok(freed)
}

/// Tries of [`empty_unit`] without waiting for locks, a millisecond apart.
const UNIT_TRIES: u32 = 20;

/// Write unit `k` of zone `part`'s slots home and give it back; false if it could not be
/// emptied (see [`shrink`]). One caller empties a unit at a time: another that finds it being
/// emptied waits for that (as long as it would try itself) and counts it given back if it
/// went.
fn empty_unit(state: &MountState, part: u32, k: u32, wait: bool) -> Result<bool> {
    let zm = &state.zones.zones[part as usize];
    let pause = || std::thread::sleep(std::time::Duration::from_millis(1));
    let mut victims = {
        let mut z = lock(zm);
        if !z.holds(k) {
            return Ok(false);
        }
        if z.is_draining(k) {
            drop(z);
            for _ in 0..UNIT_TRIES {
                pause();
                if !lock(zm).holds(k) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        z.drain_unit(k)
    };
    for attempt in 1..=UNIT_TRIES {
        let r = write_back_victims(state, None, &victims, wait);
        let mut z = lock(zm);
        if let Err(e) = r {
            z.keep_unit(k);
            return Err(e);
        }
        if z.unit_empty(k)
            && let Some(start) = state.zones.space.unit(part, k)
        {
            if let Err(e) = zone::remove_unit(&state.pool, &state.zones.space, part, k) {
                z.keep_unit(k);
                return Err(e);
            }
            z.remove_unit(k);
            units_changed(state, part, &z, -(BLOCKS_PER_HUGE as i64));
            drop(z);
            give_unit(state, start);
            return Ok(true);
        }
        if wait || attempt == UNIT_TRIES {
            z.keep_unit(k);
            return Ok(false);
        }
        victims = z.unit_owners(k);
        drop(z);
        pause();
    }
    Ok(false)
}

/// Hand the unit at `start` back to the allocator (a whole free unit: no hole is left behind,
/// so hole compaction is not told).
fn give_unit(state: &MountState, start: u64) {
    if let Err(e) = state.alloc.free(BlockRun { start, len: BLOCKS_PER_HUGE }) {
        state.poison();
        log::error!("allocator refused a zone unit back: {e}");
    }
}

/// Slots written back together: one fence for their lines, one for their descriptors.
const BATCH: usize = 64;

/// Free slots below which a writer writes a batch back itself (see [`take_slot`]): the
/// zone's [`write_back_mark`] on a mount without background work; with it, a quarter of that,
/// so that the worker, asked at the mark, makes the second copies on another CPU while the
/// writer goes on. (Before the worker copied without the inode's lock, a writer handing it its
/// own file's batches ran 10-20% slower than one folding them: the two took turns at the lock.)
fn own_fold_mark(state: &MountState, mark: usize) -> usize {
    match state.background.writes_back() {
        true => mark / 4,
        false => mark,
    }
}

/// Free slots below which a writer whose zone cannot grow writes a batch back: a sixteenth of
/// the zone, at least a batch, at most the quarter at which the zone tries to grow. (Writing
/// back from the quarter on, where growth is tried, left a quarter of a zone that could not
/// grow unused.)
fn write_back_mark(capacity: usize) -> usize {
    (capacity / 16).max(BATCH).min(capacity / 4)
}

/// Write the slots of `victims` back home, grouped by inode: those of `own` (locked by the
/// caller) directly, others under their inode's lock, taken only if free now unless `wait`.
fn write_back_victims(
    state: &MountState,
    mut own: Option<&mut InodeState>,
    victims: &[(u64, u64)],
    wait: bool,
) -> Result<usize> {
    let mut by_ino: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(ino, lb) in victims {
        by_ino.entry(ino).or_default().push(lb);
    }
    let mut done = 0;
    for (ino, lbs) in by_ino {
        match own.as_deref_mut() {
            Some(g) if g.ino == ino => done += fold_blocks(state, g, &lbs)?,
            _ => {
                let Ok(n) = state.inode(ino) else { continue };
                if wait {
                    done += fold_blocks(state, &mut crate::state::inode_state::wlock(&n), &lbs)?;
                } else if let Some(mut vg) = crate::state::inode_state::try_wlock(&n) {
                    done += fold_blocks(state, &mut vg, &lbs)?;
                }
            }
        }
    }
    Ok(done)
}

/// The background write-back: give the zones' units back while the pool is short of free space
/// (`MountState::zones_pressed`); in every zone short of free slots, write the oldest back
/// until half the zone is free.
///
/// The request flag is cleared first: an allocation that finds space short while this runs
/// asks again (one more run) rather than finding the flag still set and leaving the pool
/// pressed once this run ends. Giving back repeats while allocations running beside it keep
/// the pool pressed, until a pass gives nothing back.
pub(crate) fn write_back_lru(state: &MountState) -> Result<()> {
    state.zones.write_back_asked.store(false, Ordering::Release);
    loop {
        let room = state.room();
        if !room.pressed(0) || shrink(state, room.blocks_to_ask_back(0), true)? == 0 {
            break;
        }
    }
    write_back_zones(state)
}

fn write_back_zones(state: &MountState) -> Result<()> {
    for z in &state.zones.zones {
        loop {
            let victims = {
                let mut z = lock(z);
                let want = (z.capacity() / 2).saturating_sub(z.free.len());
                if want == 0 {
                    break;
                }
                z.oldest(want.min(BATCH))
            };
            if copy_victims_in_background(state, &victims)? == 0 {
                break;
            }
        }
    }
    Ok(())
}

/// Write the slots of logical blocks `lbs` of `g` back home (those it has) and free them.
fn fold_blocks(state: &MountState, g: &mut InodeState, lbs: &[u64]) -> Result<usize> {
    let pick = |g: &InodeState| -> Vec<(u64, SlotRef)> {
        lbs.iter().filter_map(|lb| g.slots.get(lb).map(|s| (*lb, *s))).collect()
    };
    let mut picked = pick(g);
    let mut done = 0;
    if picked.iter().any(|(_, s)| s.copying) {
        done += finish_copy(state, g)?;
        picked = pick(g);
    }
    write_home(state, g, &picked)?;
    Ok(done + picked.len())
}

/// The background worker's write-back of `victims` (inode, logical block), grouped by inode,
/// each group by [`copy_in_background`]. Returns the slots freed.
fn copy_victims_in_background(state: &MountState, victims: &[(u64, u64)]) -> Result<usize> {
    let mut by_ino: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(ino, lb) in victims {
        by_ino.entry(ino).or_default().push(lb);
    }
    let mut done = 0;
    for (ino, lbs) in by_ino {
        done += copy_in_background(state, ino, &lbs)?;
    }
    Ok(done)
}

/// Write the slots of blocks `lbs` of inode `ino` home with the copies made while the inode's
/// lock is free, so its writers go on meanwhile: under the lock the slots are marked
/// `copying` and named in `Zones::copy`; without it their newest lines are copied home and
/// fenced; under the lock again [`finish_copy`] clears their descriptors (fenced) and frees
/// them. Whoever meets a marked slot under the lock before that (a write into its block, a
/// fold, the inode's freeing) waits for the copy and finishes it itself. The lines copied are
/// those the descriptors say are newest in the slots, so a crash at any point leaves each
/// block's newest copy where its descriptor says, as with [`write_home`]. Background worker
/// only (one batch at a time). Returns the slots freed.
fn copy_in_background(state: &MountState, ino: u64, lbs: &[u64]) -> Result<usize> {
    let Ok(n) = state.inode(ino) else {
        return Ok(0);
    };
    {
        let mut g = crate::state::inode_state::wlock(&n);
        let mut batch = lock(&state.zones.copy);
        if batch.is_some() {
            // Another copy is unfinished (not made by this worker): fold these under the lock.
            drop(batch);
            return fold_blocks(state, &mut g, lbs);
        }
        let mut picked = Vec::new();
        for lb in lbs {
            if let Some(s) = g.slots.get_mut(lb) {
                s.copying = true;
                picked.push((*lb, *s));
            }
        }
        if picked.is_empty() {
            return Ok(0);
        }
        *batch = Some(CopyBatch { ino, picked });
        state.zones.copy_phase.store(COPY_QUEUED, Ordering::Release);
    }
    // Made here unless someone who met a mark made it first; finished either way.
    let copied = run_copy(state);
    let done = finish_copy(state, &mut crate::state::inode_state::wlock(&n))?;
    copied.map(|_| done)
}

/// Under `g`'s write lock, with slots of `g` marked `copying` (or as the worker's last step):
/// wait for the background copy to end, then clear the descriptors of the slots it copied
/// home, fenced, and free them; after a failed copy they stay live, unmarked. Returns the slots
/// freed (0 if the batch was finished by someone else).
pub(crate) fn finish_copy(state: &MountState, g: &mut InodeState) -> Result<usize> {
    let phase = wait_copy(state);
    let batch = {
        let mut batch = lock(&state.zones.copy);
        match batch.as_ref() {
            Some(b) if b.ino == g.ino => {
                state.zones.copy_phase.store(COPY_IDLE, Ordering::Release);
                batch.take()
            }
            _ => None,
        }
    };
    let Some(batch) = batch else {
        // Marks of a batch someone else finished (the inode's freeing took it): stale.
        g.slots.values_mut().for_each(|s| s.copying = false);
        return Ok(0);
    };
    let mut copied = Vec::new();
    for (lb, s) in &batch.picked {
        if let Some(cur) = g.slots.get_mut(lb)
            && cur.copying
            && (cur.part, cur.slot, cur.home) == (s.part, s.slot, s.home)
        {
            cur.copying = false;
            if phase == COPY_DONE && cur.lines == s.lines {
                copied.push((*lb, *cur));
            }
        }
    }
    clear(state, g, &copied)?;
    Ok(copied.len())
}

/// Wait for the background copy to end (it takes no lock), making it here if the worker has
/// not started it yet; its phase then.
fn wait_copy(state: &MountState) -> u8 {
    let mut spins = 0u32;
    loop {
        match state.zones.copy_phase.load(Ordering::Acquire) {
            COPY_QUEUED => {
                if let Err(e) = run_copy(state) {
                    log::error!("copying alternate slots home: {e}");
                }
            }
            COPY_RUNNING => {
                spins += 1;
                match spins % 64 {
                    0 => std::thread::yield_now(),
                    _ => std::hint::spin_loop(),
                }
            }
            phase => return phase,
        }
    }
}

/// A writer short of slots (holding `g`'s lock) finishes the copy that ended: its own file's,
/// or another's whose lock is free now (so that a batch of a file nobody writes any more does
/// not keep every writer from handing over the next).
fn finish_ended_copy(state: &MountState, g: &mut InodeState) -> Result<()> {
    let Some(ino) = lock(&state.zones.copy).as_ref().map(|b| b.ino) else {
        return Ok(());
    };
    match ino == g.ino {
        true => finish_copy(state, g).map(drop),
        false => finish_if_free(state, ino),
    }
}

/// Finish the batch of inode `ino` ([`finish_copy`]) if its lock is free now; else it is left
/// to whoever holds the lock or meets a mark next.
fn finish_if_free(state: &MountState, ino: u64) -> Result<()> {
    let Ok(n) = state.inode(ino) else {
        return Ok(());
    };
    if let Some(mut g) = crate::state::inode_state::try_wlock(&n)
        && g.slots.values().any(|s| s.copying)
    {
        finish_copy(state, &mut g)?;
    }
    Ok(())
}

/// A writer short of slots (holding `g`'s lock) hands the worker its file's oldest slots
/// `own` (inode, logical block) to copy home ([`run_copy`]): they are marked `copying` and
/// queued. The writer (or whoever meets a mark) finishes the batch later ([`finish_copy`]).
/// False if another batch is unfinished (the caller folds them itself).
fn hand_to_worker(state: &MountState, g: &mut InodeState, own: &[(u64, u64)]) -> bool {
    let mut batch = lock(&state.zones.copy);
    if batch.is_some() {
        return false;
    }
    let mut picked = Vec::new();
    for &(_, lb) in own {
        if let Some(s) = g.slots.get_mut(&lb)
            && !s.copying
        {
            s.copying = true;
            picked.push((lb, *s));
        }
    }
    if picked.is_empty() {
        return true;
    }
    *batch = Some(CopyBatch { ino: g.ino, picked });
    state.zones.copy_phase.store(COPY_QUEUED, Ordering::Release);
    drop(batch);
    state.background.queue_copy();
    true
}

/// Make the queued copy if nobody has started it (the worker, or a thread that must wait for
/// it): the batch's newest lines are copied home and fenced by this thread, then the phase
/// says done (or failed). Returns the phase after; Err if this thread's copy failed (the phase
/// then says so, and the batch's slots stay live).
fn run_copy(state: &MountState) -> Result<u8> {
    let phase = &state.zones.copy_phase;
    if phase
        .compare_exchange(COPY_QUEUED, COPY_RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Ok(phase.load(Ordering::Acquire));
    }
    let picked = lock(&state.zones.copy).as_ref().map(|b| b.picked.clone()).unwrap_or_default();
    let copied = picked.iter().try_for_each(|(_, s)| {
        let live = LiveSlot { part: s.part, slot: s.slot, home: s.home, lines: s.lines };
        zone::copy_home(&state.pool, &state.zones.space, &live)
    });
    let done = if copied.is_ok() {
        // This thread's write-backs, durable before anyone clears a descriptor.
        state.pool.fence();
        COPY_DONE
    } else {
        COPY_FAILED
    };
    phase.store(done, Ordering::Release);
    copied.map(|()| done)
}

/// The worker's part of a hand-off ([`hand_to_worker`]): make the copy, then finish the batch if
/// its file's lock is free now (else the writer does at its next take, or whoever meets a mark).
pub(crate) fn copy_handed_off(state: &MountState) -> Result<()> {
    if run_copy(state)? != COPY_DONE {
        return Ok(());
    }
    // Bound first: a guard in a `match` scrutinee would be held through `finish_copy`.
    let Some(ino) = lock(&state.zones.copy).as_ref().map(|b| b.ino) else {
        return Ok(());
    };
    finish_if_free(state, ino)
}

/// Put the newest bytes of [off, off+buf.len()) that live in slots into `buf` (which holds what
/// the file's blocks say).
pub(crate) fn overlay(state: &MountState, g: &InodeState, off: u64, buf: &mut [u8]) -> Result<()> {
    if g.slots.is_empty() || buf.is_empty() {
        return Ok(());
    }
    let end = off + buf.len() as u64;
    for (&lb, s) in g.slots.range(off / BLOCK_SIZE..end.div_ceil(BLOCK_SIZE)) {
        let base = lb * BLOCK_SIZE;
        let slot_off = state.zones.space.slot_offset(s.part, s.slot)?;
        for (a, len) in zone::line_runs(s.lines) {
            let (ws, we) = ((base + a).max(off), (base + a + len).min(end));
            if ws < we {
                let dst = &mut buf[(ws - off) as usize..(we - off) as usize];
                state.pool.read(slot_off + (ws - base), dst)?;
            }
        }
    }
    Ok(())
}

/// Write the slots of logical blocks [lb0, lb1) of `g` back home and free them, durably: the
/// lines are copied and fenced, then the descriptors cleared and fenced.
pub(crate) fn fold(state: &MountState, g: &mut InodeState, lb0: u64, lb1: u64) -> Result<()> {
    let pick = |g: &InodeState| -> Vec<(u64, SlotRef)> {
        g.slots.range(lb0..lb1).map(|(l, s)| (*l, *s)).collect()
    };
    let mut picked = pick(g);
    if picked.iter().any(|(_, s)| s.copying) {
        finish_copy(state, g)?;
        picked = pick(g);
    }
    write_home(state, g, &picked)
}

fn write_home(state: &MountState, g: &mut InodeState, picked: &[(u64, SlotRef)]) -> Result<()> {
    if picked.is_empty() {
        return Ok(());
    }
    for (_, s) in picked {
        let live = LiveSlot { part: s.part, slot: s.slot, home: s.home, lines: s.lines };
        zone::copy_home(&state.pool, &state.zones.space, &live)?;
    }
    state.pool.fence();
    clear(state, g, picked)
}

/// Fold every slot of `g` home.
pub(crate) fn fold_all(state: &MountState, g: &mut InodeState) -> Result<()> {
    fold(state, g, 0, u64::MAX)
}

/// Write every slot of `g` back home and clear its descriptor, durably, leaving the DRAM
/// entries to [`forget`] (the inode is being freed: its lock is held shared).
pub(crate) fn write_back(state: &MountState, g: &InodeState) -> Result<()> {
    if g.slots.is_empty() {
        return Ok(());
    }
    if g.slots.values().any(|s| s.copying) {
        // The worker's copy of some of them: let it end and take its batch (the copies below
        // include its slots), so that nothing clears or frees them after `forget`.
        wait_copy(state);
        let mut batch = lock(&state.zones.copy);
        if batch.as_ref().is_some_and(|b| b.ino == g.ino) {
            *batch = None;
            state.zones.copy_phase.store(COPY_IDLE, Ordering::Release);
        }
    }
    for s in g.slots.values() {
        let live = LiveSlot { part: s.part, slot: s.slot, home: s.home, lines: s.lines };
        zone::copy_home(&state.pool, &state.zones.space, &live)?;
    }
    state.pool.fence();
    let cleared: Vec<(u32, u32)> = g.slots.values().map(|s| (s.part, s.slot)).collect();
    zone::clear_lines(&state.pool, &state.zones.space, &cleared)?;
    state.pool.fence();
    Ok(())
}

/// Give the slots of a freed inode back to their zones (their descriptors were cleared by
/// [`write_back`]).
pub(crate) fn forget(state: &MountState, g: &mut InodeState) {
    for s in std::mem::take(&mut g.slots).into_values() {
        state.zones.release(s.part, s.slot);
    }
}

fn clear(state: &MountState, g: &mut InodeState, picked: &[(u64, SlotRef)]) -> Result<()> {
    if picked.is_empty() {
        return Ok(());
    }
    let cleared: Vec<(u32, u32)> = picked.iter().map(|(_, s)| (s.part, s.slot)).collect();
    zone::clear_lines(&state.pool, &state.zones.space, &cleared)?;
    state.pool.fence();
    for (lb, s) in picked {
        g.slots.remove(lb);
        state.zones.release(s.part, s.slot);
    }
    Ok(())
}

/// Of the live slots a crash left, those whose home is not a block of a regular file's data
/// (damage: following one would overwrite metadata or free space), or is named by another live
/// slot too (a block has one slot at a time: which is newest cannot be known), each with the
/// line that says why. `file_data`: the data extents of every regular file.
pub(crate) fn homeless(
    live: &[LiveSlot],
    file_data: impl IntoIterator<Item = BlockRun>,
) -> Vec<(&LiveSlot, String)> {
    let mut homes: Vec<u64> = live.iter().map(|s| s.home).collect();
    homes.sort_unstable();
    let mut held = HashSet::new();
    if homes.is_empty() {
        return Vec::new();
    }
    for run in file_data {
        let from = homes.partition_point(|&h| h < run.start);
        for &h in homes[from..].iter().take_while(|&&h| h < run.start + run.len) {
            held.insert(h);
        }
    }
    let shared: HashSet<u64> = homes.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
    live.iter()
        .filter_map(|s| {
            let what = if !held.contains(&s.home) {
                "is no regular file's data"
            } else if shared.contains(&s.home) {
                "is named by another live slot too"
            } else {
                return None;
            };
            Some((s, format!("slot zone {} slot {}: home block {} {what}", s.part, s.slot, s.home)))
        })
        .collect()
}

/// Mount: fold every live slot home and clear every named descriptor (`bad` too: slots that
/// failed their checks, which fsck reported), durably; then clear every word of the extension
/// tables (`units` that passed their checks, whose slots `live` and `bad` include, and `stray`
/// ones that did not): the units are free space from here on.
pub(crate) fn fold_at_mount(
    pool: &Pool,
    g: &Geometry,
    units: &[Unit],
    stray: &[Unit],
    live: &[LiveSlot],
    bad: &[LiveSlot],
) -> Result<()> {
    let space = SlotSpace::new(g);
    for u in units {
        space.set_unit_at_mount(u);
    }
    if !live.is_empty() || !bad.is_empty() {
        for s in live {
            zone::copy_home(pool, &space, s)?;
        }
        pool.fence();
        for s in live.iter().chain(bad) {
            zone::store_lines(pool, &space, s.part, s.slot, 0)?;
        }
        pool.fence();
    }
    let all: Vec<Unit> = units.iter().chain(stray).copied().collect();
    zone::clear_units(pool, g, &all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_that_cannot_grow_writes_back_from_a_sixteenth_free() {
        // A large zone keeps a sixteenth free, not the quarter at which it tries to grow.
        assert_eq!(write_back_mark(65_536), 4096);
        // At least a batch...
        assert_eq!(write_back_mark(1024), BATCH);
        // ...but never more than the quarter (a zone of 64 slots writes back below 16 free).
        assert_eq!(write_back_mark(64), 16);
    }
}
