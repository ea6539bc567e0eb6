//! Hole compaction: give 2 MiB units broken up by small files back to the aligned pool.
//!
//! Small files live in holes; when no hole fits, one aligned extent is broken for them
//! (docs/DESIGN.md §4). A broken unit becomes an aligned extent again only when every small
//! file in it has been deleted, so the number of broken units ratchets up to the largest
//! footprint small files ever had: as a pool ages and the mix of live small and large files
//! swings, free space left in broken units (holes) grows, and free aligned extents shrink by
//! as much. Compaction reverses that: it picks broken units that hold little data (file data
//! only, no metadata), takes their free blocks out of the allocator, moves the data into holes
//! elsewhere (one transaction per extent piece, `file::relocate_runs`) and frees the unit
//! whole, which makes it an aligned extent again. It runs in the background thread of the
//! reactive rewrite when holes exceed [`TRIGGER_SHARE`] of free space, and at once through
//! `Fs::compact` (`winefs compact POOL`).

use crate::error::{Error, Result};
use crate::fs::{Inner, rlock, wlock};
use crate::layout::FileKind;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Blocks per 2 MiB unit.
const UNIT: u64 = 512;
/// Background compaction starts when holes hold more than this share of free space...
pub const TRIGGER_SHARE: f64 = 0.08;
/// ... and stops once they hold at most this share (some holes are worth keeping: small
/// files need them).
pub const GOAL_SHARE: f64 = 0.04;
/// Units holding more than this are left alone. Emptying any unit turns 512 blocks of holes
/// into one aligned extent (its own free blocks, and the holes elsewhere its data moves into),
/// whatever it held; the cost is the copy, so the emptiest units go first and the fullest are
/// not worth it.
const MAX_USED: u64 = UNIT * 7 / 8;
/// Free space below this is left alone (too small a pool to have a hole problem).
const MIN_FREE: u64 = 16 * UNIT;

/// What a compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Broken units emptied and returned as aligned extents.
    pub units_freed: u64,
    /// Blocks of file data moved.
    pub blocks_moved: u64,
    /// Broken units that qualified (file data only, at most half full).
    pub candidates: u64,
}

/// Whether holes hold more than `share` of the free space.
pub(crate) fn holes_exceed(inner: &Inner, share: f64) -> bool {
    holes_exceed_with(inner, share, MIN_FREE)
}

fn holes_exceed_with(inner: &Inner, share: f64, min_free: u64) -> bool {
    let free = inner.alloc.free_blocks();
    free >= min_free && inner.alloc.hole_blocks() as f64 > share * free as f64
}

/// Something to move out of a unit: blocks of an inode's map (file data, directory blocks,
/// symlink targets) as (inode, logical block, physical block, blocks), or an inode's xattr
/// block as (inode, u64::MAX, physical block, 1).
type Piece = (u64, u64, u64, u64);

const XATTR: u64 = u64::MAX;

/// The pieces inside each candidate unit. Kept up to date as compaction moves pieces (a piece
/// moved into another candidate's holes must be moved again when that unit is emptied).
type Pieces = HashMap<u64, Vec<Piece>>;

/// Broken units worth emptying, fewest used blocks first, with the pieces inside them.
fn candidates(inner: &Inner) -> (Vec<u64>, Pieces) {
    // Free blocks per broken unit.
    let mut free: HashMap<u64, u64> = HashMap::new();
    for r in inner.alloc.free_runs() {
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
    let parts: Vec<(u64, u64)> = inner
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
    let nodes: Vec<_> = {
        let map = inner.nodes.read().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(&ino, n)| (ino, n.clone())).collect()
    };
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
    let keep: std::collections::HashSet<u64> = order.iter().map(|o| o.1).collect();
    pieces.retain(|u, _| keep.contains(u));
    for u in &keep {
        pieces.entry(*u).or_default();
    }
    (order.into_iter().map(|o| o.1).collect(), pieces)
}

/// Record blocks now at `runs` (logical `l` on, of `ino`) in the candidates they landed in.
fn track(pieces: &mut Pieces, ino: u64, mut l: u64, runs: &[crate::alloc::BlockRun]) {
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

/// Whether `node` is still the live inode `ino` (not freed after it was looked up).
pub(crate) fn still_live(inner: &Inner, ino: u64, node: &crate::fs::NodeRef) -> bool {
    inner
        .nodes
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&ino)
        .is_some_and(|n| std::sync::Arc::ptr_eq(n, node))
}

/// Empty one unit: hold its free blocks back, move its pieces out, give the unit back.
/// Returns the blocks moved, or None when a piece could not be moved (the unit stays broken;
/// nothing is lost).
fn empty_unit(inner: &Inner, unit: u64, all: &mut Pieces) -> Result<Option<u64>> {
    // Like any foreground operation: fsck (which takes it for writing) sees no move half done.
    let _ns = inner.ns.read().unwrap_or_else(|e| e.into_inner());
    let pieces = all.remove(&unit).unwrap_or_default();
    let mut held = inner.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT);
    let mut moved = 0;
    let mut ok = true;
    for &(ino, l, p, n) in &pieces {
        let node = match inner.node(ino) {
            Ok(n) => n,
            Err(Error::Stale(_)) | Err(Error::NotFound) => continue, // deleted meanwhile
            Err(e) => {
                inner.free_runs(&held);
                return Err(e);
            }
        };
        let mut g = wlock(&node);
        // An inode freed between the lookup and the lock keeps its old map in DRAM, but its
        // blocks are free already: it must not be touched.
        if !still_live(inner, ino, &node) {
            continue;
        }
        // Holes must take the piece: with none left, the allocator would break an aligned
        // extent for it, undoing what compaction is for.
        if inner.alloc.hole_blocks() < n {
            ok = false;
            break;
        }
        if l == XATTR {
            match crate::xattr::relocate_block(inner, &mut g, p) {
                Ok(Some(b)) => {
                    moved += 1;
                    held.extend(inner.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT));
                    if let Some(v) = all.get_mut(&(b / UNIT)) {
                        v.push((ino, XATTR, b, 1));
                    }
                }
                Ok(None) => ok = false,
                Err(e) => {
                    inner.free_runs(&held);
                    return Err(e);
                }
            }
            continue;
        }
        // The piece must still be where the scan saw it (a write may have moved it).
        let here = g.map.segments(l, l + n);
        if here != [(l, p, n)] || crate::mmap::has_atomic(&g) {
            ok = false;
            continue;
        }
        let runs = match inner.alloc.alloc(n, crate::fs::current_cpu()) {
            Ok(r) => r,
            Err(_) => {
                ok = false;
                break;
            }
        };
        if let Err(e) = crate::file::relocate_runs(inner, &mut g, l, &runs) {
            // Not committed: the new blocks are still ours to free.
            inner.free_runs(&runs);
            inner.free_runs(&held);
            return Err(e);
        }
        moved += n;
        track(all, ino, l, &runs);
        // The piece's old blocks are free now: hold them too, or the next piece could land
        // there.
        held.extend(inner.alloc.take_free_in(unit * UNIT, (unit + 1) * UNIT));
    }
    inner.free_runs(&held);
    // Emptied only if the unit is whole again (a foreground write may have landed in it).
    Ok((ok && inner.alloc.is_free_aligned(unit * UNIT)).then_some(moved))
}

/// Compact until holes hold at most `goal` of free space, `max_units` units were emptied, or
/// no candidate is left. With `throttle`, sleep after each unit as long as it took (the
/// background thread keeps foreground work at least half the time). `inner` is upgraded per
/// unit so an unmount never waits for a whole pass.
pub(crate) fn compact(
    inner: &std::sync::Weak<Inner>,
    goal: f64,
    max_units: u64,
    throttle: bool,
) -> Result<CompactStats> {
    compact_with(inner, goal, max_units, throttle, MIN_FREE)
}

/// [`compact`] with the small-pool floor given (`Fs::compact` works on any pool).
pub(crate) fn compact_with(
    inner: &std::sync::Weak<Inner>,
    goal: f64,
    max_units: u64,
    throttle: bool,
    min_free: u64,
) -> Result<CompactStats> {
    let mut stats = CompactStats::default();
    let (order, mut pieces) = match inner.upgrade() {
        Some(i) => {
            i.check_alive()?;
            candidates(&i)
        }
        None => return Ok(stats),
    };
    stats.candidates = order.len() as u64;
    for unit in order {
        let Some(inner) = inner.upgrade() else {
            break;
        };
        inner.check_alive()?;
        if stats.units_freed >= max_units || !holes_exceed_with(&inner, goal, min_free) {
            break;
        }
        // Room elsewhere: the holes outside this unit must take its data. A unit that took
        // moved data meanwhile may no longer be worth it.
        let used: u64 = pieces.get(&unit).map_or(0, |v| v.iter().map(|p| p.3).sum());
        if used > MAX_USED {
            pieces.remove(&unit);
            continue;
        }
        if inner.alloc.hole_blocks() < UNIT {
            break;
        }
        let start = Instant::now();
        if let Some(m) = empty_unit(&inner, unit, &mut pieces)? {
            stats.units_freed += 1;
            stats.blocks_moved += m;
        }
        drop(inner);
        if throttle {
            std::thread::sleep(start.elapsed().min(Duration::from_millis(50)));
        }
    }
    Ok(stats)
}
