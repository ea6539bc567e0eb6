//! Hole compaction: give 2 MiB units broken up by small files back to the aligned pool.
//!
//! Small files live in holes; when no hole fits, one aligned extent is broken for them
//! (docs/DESIGN.md §4). A broken unit becomes an aligned extent again only when every small
//! file in it has been deleted, so the number of broken units ratchets up to the largest
//! footprint small files ever had: as a pool ages and the mix of live small and large files
//! swings, free space left in broken units (holes) grows, and free aligned extents shrink by
//! as much. Compaction reverses that: it picks broken units that hold little data (file data
//! only, no metadata), takes their free blocks out of the allocator, moves the data into holes
//! elsewhere (one transaction per extent piece, `ops::relocate::relocate_runs`) and frees the unit
//! whole, which makes it an aligned extent again. It runs in the background thread of the
//! reactive rewrite when holes exceed `state::background::TRIGGER_SHARE` of free space, and at once through
//! `Fs::compact` (`winefs compact POOL`).

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::layout::{BLOCKS_PER_HUGE, FileKind};
use crate::ops::relocate::relocate_runs;
use crate::ops::xattr;
use crate::state::slots;
use crate::state::background::MIN_FREE;
use crate::state::inode_state::{rlock, wlock};
use crate::state::map_hooks::pinned;
use crate::state::mount_state::MountState;
use crate::sys::current_cpu;
use crate::types::CompactStats;
use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Blocks per 2 MiB unit.
const UNIT: u64 = BLOCKS_PER_HUGE;
/// Compaction stops once holes hold at most this share of free space (some holes are worth
/// keeping: small files need them). It starts at `state::background::TRIGGER_SHARE`.
pub const GOAL_SHARE: f64 = 0.04;
/// Units holding more than this are left alone. Emptying any unit turns 512 blocks of holes
/// into one aligned extent (its own free blocks, and the holes elsewhere its data moves into),
/// whatever it held; the cost is the copy, so the emptiest units go first and the fullest are
/// not worth it.
const MAX_USED: u64 = UNIT * 7 / 8;

/// Something to move out of a unit: blocks of an inode's map (file data, directory blocks,
/// symlink targets) as (inode, logical block, physical block, blocks), or an inode's xattr
/// block as (inode, u64::MAX, physical block, 1).
type Piece = (u64, u64, u64, u64);

const XATTR: u64 = u64::MAX;

/// The pieces inside each candidate unit. Kept up to date as compaction moves pieces (a piece
/// moved into another candidate's holes must be moved again when that unit is emptied).
type Pieces = HashMap<u64, Vec<Piece>>;

/// Broken units worth emptying, fewest used blocks first, with the pieces inside them.
fn candidates(state: &MountState) -> (Vec<u64>, Pieces) {
    // Free blocks per broken unit.
    let mut free: HashMap<u64, u64> = HashMap::new();
    for r in state.alloc.free_runs() {
        let mut b = r.start;
        while b < r.end() {
            let u = b / UNIT;
            let e = r.end().min((u + 1) * UNIT);
            *free.entry(u).or_default() += e - b;
            b = e;
        }
    }
    // Only units wholly inside one partition can become aligned extents (the first and last
    // units of the data area may share blocks with metadata regions).
    let parts: Vec<(u64, u64)> = state
        .alloc
        .stats()
        .iter()
        .map(|p| (p.start, p.end))
        .collect();
    let whole = |u: u64| {
        parts
            .iter()
            .any(|&(s, e)| s <= u * UNIT && (u + 1) * UNIT <= e)
    };
    free.retain(|&u, f| *f < UNIT && UNIT - *f <= MAX_USED && whole(u));
    if free.is_empty() {
        return (Vec::new(), HashMap::new());
    }
    // Every file's blocks: compaction must know all the owners of a unit it empties.
    let Ok(all) = state.all_inodes() else {
        return (Vec::new(), HashMap::new());
    };
    let nodes: Vec<_> = all
        .into_iter()
        .map(|n| {
            let ino = rlock(&n).ino;
            (ino, n)
        })
        .collect();
    let mut pieces: HashMap<u64, Vec<Piece>> = HashMap::new();
    let mut file_blocks: HashMap<u64, u64> = HashMap::new();
    for (ino, node) in nodes {
        let g = rlock(&node);
        if !matches!(g.kind(), FileKind::File | FileKind::Dir | FileKind::Symlink) {
            continue;
        }
        let x = g.hdr.xattr_block;
        if x != 0 && free.contains_key(&(x / UNIT)) {
            pieces.entry(x / UNIT).or_default().push((ino, XATTR, x, 1));
            *file_blocks.entry(x / UNIT).or_default() += 1;
        }
        // Extent-index blocks are not moved: a unit holding one is skipped below.
        for (l, p, n) in g.map.segments(0, u64::MAX) {
            let mut off = 0;
            while off < n {
                let u = (p + off) / UNIT;
                let take = (n - off).min((u + 1) * UNIT - (p + off));
                if free.contains_key(&u) {
                    pieces
                        .entry(u)
                        .or_default()
                        .push((ino, l + off, p + off, take));
                    *file_blocks.entry(u).or_default() += take;
                }
                off += take;
            }
        }
    }
    let mut order: Vec<(u64, u64)> = free
        .into_iter()
        .filter(|(u, f)| file_blocks.get(u).copied().unwrap_or(0) == UNIT - f)
        .map(|(u, f)| (UNIT - f, u))
        .collect();
    order.sort_unstable();
    let keep: HashSet<u64> = order.iter().map(|o| o.1).collect();
    pieces.retain(|u, _| keep.contains(u));
    for u in &keep {
        pieces.entry(*u).or_default();
    }
    (order.into_iter().map(|o| o.1).collect(), pieces)
}

/// Record blocks now at `runs` (logical `l` on, of `ino`) in the candidates they landed in.
fn track(pieces: &mut Pieces, ino: u64, mut l: u64, runs: &[BlockRun]) {
    for r in runs {
        let mut off = 0;
        while off < r.len {
            let p = r.start + off;
            let u = p / UNIT;
            let take = (r.len - off).min((u + 1) * UNIT - p);
            if let Some(v) = pieces.get_mut(&u) {
                v.push((ino, l, p, take));
            }
            off += take;
            l += take;
        }
    }
}

/// Empty one unit: hold its free blocks back, move its pieces out, give the unit back.
/// Returns the blocks moved, or None when a piece could not be moved (the unit stays broken;
/// nothing is lost).
fn empty_unit(state: &MountState, unit: u64, all: &mut Pieces) -> Result<Option<u64>> {
    // Like any foreground operation: fsck (which takes it for writing) sees no move half done.
    let _ns = state.namespace.read();
    let pieces = all.remove(&unit).unwrap_or_default();
    let mut held = state.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT);
    let mut moved = 0;
    let mut ok = true;
    for &(ino, l, p, n) in &pieces {
        let node = match state.inode(ino) {
            Ok(n) => n,
            Err(Error::Stale(_)) | Err(Error::NotFound) => continue, // deleted meanwhile
            Err(e) => {
                state.free_runs(&held);
                return Err(e);
            }
        };
        let mut g = wlock(&node);
        // An inode freed between the lookup and the lock keeps its old map in DRAM, but its
        // blocks are free already: it must not be touched.
        if !state.still_live(ino, &node) {
            continue;
        }
        // The blocks are copied: their newest bytes must be in them.
        slots::fold_all(state, &mut g)?;
        // Holes must take the piece (`alloc_in_holes` never breaks an aligned extent, which
        // would undo what compaction is for): with too few left, stop here.
        if state.alloc.hole_blocks() < n {
            ok = false;
            break;
        }
        if l == XATTR {
            match xattr::relocate_block(state, &mut g, p) {
                Ok(Some(b)) => {
                    moved += 1;
                    held.extend(state.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT));
                    if let Some(v) = all.get_mut(&(b / UNIT)) {
                        v.push((ino, XATTR, b, 1));
                    }
                }
                Ok(None) => ok = false,
                Err(e) => {
                    state.free_runs(&held);
                    return Err(e);
                }
            }
            continue;
        }
        // The piece must still be where the scan saw it (a write may have moved it).
        let here = g.map.segments(l, l + n);
        if here != [(l, p, n)] || pinned(&g) {
            ok = false;
            continue;
        }
        let runs = match state.alloc.alloc_in_holes(n, current_cpu()) {
            Ok(r) => r,
            Err(_) => {
                ok = false;
                break;
            }
        };
        if let Err(e) = relocate_runs(state, &mut g, l, &runs) {
            // Not committed: the new blocks are still ours to free.
            state.free_runs(&runs);
            state.free_runs(&held);
            return Err(e);
        }
        moved += n;
        track(all, ino, l, &runs);
        // The piece's old blocks are free now: hold them too, or the next piece could land
        // there.
        held.extend(state.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT));
    }
    state.free_runs(&held);
    // Emptied only if the unit is whole again (a foreground write may have landed in it).
    Ok((ok && state.alloc.is_free_aligned(unit * UNIT)).then_some(moved))
}

/// Compact until holes hold at most `goal` of free space, `max_units` units were emptied, or
/// no candidate is left. With `throttle`, sleep after each unit as long as it took (the
/// background thread keeps foreground work at least half the time). `state` is upgraded per
/// unit so an unmount never waits for a whole pass.
pub(crate) fn compact(
    state: &Weak<MountState>,
    goal: f64,
    max_units: u64,
    throttle: bool,
) -> Result<CompactStats> {
    compact_with(state, goal, max_units, throttle, MIN_FREE)
}

/// [`compact`] with the small-pool floor given (`Fs::compact` works on any pool).
fn compact_with(
    state: &Weak<MountState>,
    goal: f64,
    max_units: u64,
    throttle: bool,
    min_free: u64,
) -> Result<CompactStats> {
    let mut stats = CompactStats::default();
    let (order, mut pieces) = match state.upgrade() {
        Some(i) => {
            i.check_alive()?;
            candidates(&i)
        }
        None => return Ok(stats),
    };
    stats.candidates = order.len() as u64;
    for unit in order {
        let Some(state) = state.upgrade() else {
            break;
        };
        state.check_alive()?;
        if stats.units_freed >= max_units || !state.alloc.holes_exceed(goal, min_free) {
            break;
        }
        // Room elsewhere: the holes outside this unit must take its data. A unit that took
        // moved data meanwhile may no longer be worth it.
        let used: u64 = pieces.get(&unit).map_or(0, |v| v.iter().map(|p| p.3).sum());
        if used > MAX_USED {
            pieces.remove(&unit);
            continue;
        }
        if state.alloc.hole_blocks() < UNIT {
            break;
        }
        let start = Instant::now();
        if let Some(m) = empty_unit(&state, unit, &mut pieces)? {
            stats.units_freed += 1;
            stats.blocks_moved += m;
        }
        drop(state);
        if throttle {
            std::thread::sleep(start.elapsed().min(Duration::from_millis(50)));
        }
    }
    Ok(stats)
}

/// Compact now, on any pool, until holes hold at most [`GOAL_SHARE`] of free space
/// (`Fs::compact`, `winefs compact`).
pub(crate) fn compact_now(state: &Weak<MountState>) -> Result<CompactStats> {
    compact_with(state, GOAL_SHARE, u64::MAX, false, 0)
}
