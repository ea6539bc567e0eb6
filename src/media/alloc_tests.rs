//! Unit tests of the allocator (`media::alloc`), kept beside it in their own file.

use super::*;
use crate::rng::Rng;
use proptest::prelude::*;
use std::sync::Arc;

/// A goal of `alloc_from` that counts none of the file's blocks (the least room applies).
fn at(block: u64) -> Goal {
    Goal { at: block, room: 0 }
}

fn br(start: u64, len: u64) -> BlockRun {
    BlockRun { start, len }
}

fn fresh(ranges: &[(u64, u64)]) -> Allocator {
    Allocator::from_free_runs(ranges, ranges.iter().map(|&(s, e)| br(s, e - s))).unwrap()
}

#[test]
fn many_runs_go_back_at_once_in_order_and_a_double_free_changes_nothing_there() {
    let a = fresh(&[(0, 1024), (1024, 2048)]);
    a.alloc(2048, 0).unwrap();
    assert_eq!(a.free_blocks(), 0);
    // Units 512 and 0 of partition 0 in pieces, then unit 1536 of partition 1: whole units
    // come back to the aligned list in the order their last piece went back.
    let back = [br(512, 100), br(612, 412), br(0, 512), br(1536, 512)];
    a.free_all(&back).unwrap();
    assert_eq!(a.free_blocks(), 1536);
    a.check_consistency().unwrap();
    assert_eq!(a.alloc(512, 0).unwrap(), vec![br(512, 512)]);
    assert_eq!(a.alloc(512, 0).unwrap(), vec![br(0, 512)]);
    // A batch that frees a block twice, or a free block, is refused where it is found:
    // partition 1 is left as it was.
    let before = a.free_blocks();
    let twice = a.free_all(&[br(1024, 8), br(1030, 4)]).unwrap_err();
    assert!(twice.contains("double free"), "{twice}");
    let free_already = a.free_all(&[br(1024, 8), br(1536, 8)]).unwrap_err();
    assert!(
        free_already.contains("overlaps free space"),
        "{free_already}"
    );
    assert_eq!(a.free_blocks(), before);
    assert!(
        a.free_all(&[br(4096, 1)]).is_err(),
        "outside every partition"
    );
    a.check_consistency().unwrap();
}

#[test]
fn an_allocation_passes_over_a_partition_whose_lock_is_held_and_a_free_waits_for_it() {
    // Partition 1 has a hole and an aligned extent free; partition 0 is all free.
    let free = [br(0, 1024), br(1030, 70), br(1536, 512)];
    let a = Arc::new(Allocator::from_free_runs(&[(0, 1024), (1024, 2048)], free).unwrap());
    let held = a.parts[0].space.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let a2 = Arc::clone(&a);
    let t = std::thread::spawn(move || {
        // CPU 0's partition is held: a small run and an aligned extent come from partition 1
        // at once instead of waiting.
        let small = a2.alloc(8, 0).unwrap();
        let big = a2.alloc(512, 0).unwrap();
        tx.send((small, big)).unwrap();
        // A free of blocks of partition 0 has nowhere else to go: it waits for the lock.
        a2.free(br(0, 8)).unwrap_err();
    });
    let (small, big) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the allocations did not wait for the held partition");
    assert!(
        small.iter().chain(&big).all(|r| r.start >= 1024),
        "{small:?} {big:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!t.is_finished(), "the free waits for partition 0");
    drop(held);
    t.join().unwrap();
    // Partition 0 untouched: its two aligned extents are still there for CPU 0.
    assert_eq!(a.alloc(1024, 0).unwrap(), vec![br(0, 512), br(512, 512)]);
    a.check_consistency().unwrap();
}

fn aligned_total(a: &Allocator) -> u64 {
    a.stats().iter().map(|s| s.free_aligned_extents).sum()
}

fn merged(ranges: &[(u64, u64)]) -> Vec<BlockRun> {
    coalesce(ranges.iter().map(|&(s, e)| br(s, e - s)).collect())
}

/// Allocated runs and free space must be pairwise disjoint and inside the partitions.
fn assert_disjoint(a: &Allocator, held: &[BlockRun]) {
    let mut all: Vec<BlockRun> = held.iter().copied().chain(a.free_runs()).collect();
    all.sort();
    for w in all.windows(2) {
        assert!(w[0].end() <= w[1].start, "overlap {:?} {:?}", w[0], w[1]);
    }
    for r in &all {
        let i = a.partition_of(r.start).expect("inside");
        assert!(a.partition_of(r.end() - 1).is_some_and(|j| j >= i));
    }
}

#[test]
fn fresh_single_partition_policy() {
    let a = fresh(&[(0, 4096)]);
    let v = a.alloc(3 * H, 0).unwrap();
    assert_eq!(v.len(), 3);
    assert!(v.iter().all(|r| r.len == H && r.start % H == 0));
    assert_eq!(aligned_total(&a), 5);
    // No hole exists: must break exactly one aligned extent.
    assert_eq!(a.stats()[0].hole_count, 0);
    let one = a.alloc(1, 0).unwrap();
    assert_eq!(one, vec![br(3 * H, 1)]);
    let st = &a.stats()[0];
    assert_eq!(
        (st.free_aligned_extents, st.hole_count, st.free_hole_blocks),
        (4, 1, H - 1)
    );
    // A hole now exists: served from it, contiguous, nothing else broken.
    let two = a.alloc(1, 0).unwrap();
    assert_eq!(two, vec![br(3 * H + 1, 1)]);
    assert_eq!(aligned_total(&a), 4);
    a.check_consistency().unwrap();
}

#[test]
fn n_huge_gets_n_aligned_extents() {
    let ranges = [(0, 4 * H), (4 * H, 8 * H), (8 * H, 12 * H)];
    // Aligned extents spread across partitions plus many small holes everywhere else.
    let mut free = vec![br(H, H), br(5 * H, H), br(6 * H, H), br(11 * H, H)];
    for u in [0u64, 2, 3, 4, 7, 8, 9, 10] {
        for k in 0..20 {
            free.push(br(u * H + 1 + k * 20, 7));
        }
    }
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    assert_eq!(aligned_total(&a), 4);
    let holes_before: u64 = a.stats().iter().map(|s| s.free_hole_blocks).sum();
    let v = a.alloc(4 * H, 0).unwrap();
    assert_eq!(v.len(), 4);
    assert!(v.iter().all(|r| r.len == H && r.start % H == 0));
    let mut starts: Vec<u64> = v.iter().map(|r| r.start).collect();
    starts.sort();
    assert_eq!(starts, vec![H, 5 * H, 6 * H, 11 * H]);
    assert_eq!(
        a.stats().iter().map(|s| s.free_hole_blocks).sum::<u64>(),
        holes_before
    );
    a.check_consistency().unwrap();
}

#[test]
fn frees_merge_back_to_aligned() {
    let ranges = [(0, 6 * H), (6 * H, 16 * H)];
    let a = fresh(&ranges);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut held = Vec::new();
    while a.free_blocks() > 0 {
        let n = 1 + rng.below(a.free_blocks().min(1500));
        held.extend(a.alloc(n, rng.pick(4)).unwrap());
    }
    assert_eq!(a.free_runs(), vec![]);
    // Split some runs into pieces, then free everything in random order.
    let mut pieces = Vec::new();
    for r in held {
        if r.len > 2 {
            let cut = 1 + rng.below(r.len - 1);
            pieces.push(br(r.start, cut));
            pieces.push(br(r.start + cut, r.len - cut));
        } else {
            pieces.push(r);
        }
    }
    while !pieces.is_empty() {
        let i = rng.pick(pieces.len());
        a.free(pieces.swap_remove(i)).unwrap();
        a.check_consistency().unwrap();
    }
    assert_eq!(a.free_runs(), vec![br(0, 16 * H)]);
    let st = a.stats();
    assert_eq!(
        (st[0].free_aligned_extents, st[1].free_aligned_extents),
        (6, 10)
    );
    assert!(st.iter().all(|s| s.hole_count == 0));
}

#[test]
fn stealing_picks_most_free_partition() {
    let ranges = [(0, 2 * H), (2 * H, 6 * H), (6 * H, 12 * H)];
    // P0 empty; P1: 1 aligned + 10-block hole; P2: 3 aligned + 100-block hole.
    let free = [
        br(2 * H, H),
        br(3 * H + 5, 10),
        br(6 * H, 3 * H),
        br(10 * H + 7, 100),
    ];
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    let v = a.alloc(H, 0).unwrap();
    assert_eq!(a.partition_of(v[0].start), Some(2));
    assert_eq!(v[0].start % H, 0);
    let s = a.alloc(5, 0).unwrap();
    assert_eq!(s, vec![br(10 * H + 7, 5)]);
    assert_eq!(
        a.alloc_aligned_extent(0).map(|u| a.partition_of(u)),
        Some(Some(2))
    );
    a.check_consistency().unwrap();
}

/// Every partition's holes' lengths (the free runs outside aligned extents).
fn hole_lengths(a: &Allocator) -> Vec<u64> {
    (0..a.partitions())
        .flat_map(|i| a.with(i, |p| p.holes.holes().into_iter().map(|h| h.1).collect::<Vec<_>>()))
        .collect()
}

#[test]
fn small_requests_prefer_holes() {
    let ranges = [(0, 8 * H), (8 * H, 16 * H)];
    let mut free = vec![br(0, 4 * H), br(12 * H, 2 * H)];
    for u in [4u64, 5, 6, 7, 8, 9, 10, 11, 14, 15] {
        free.push(br(u * H + 3, 300));
        free.push(br(u * H + 320, 150));
    }
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    let mut aligned = aligned_total(&a);
    assert_eq!(aligned, 6);
    let (mut few, mut any, mut broke, mut local_breaks) = (0, 0, 0, 0);
    let mut rng = Rng(3);
    while aligned > 0 {
        let r = 1 + rng.below(H - 1);
        // Holes serve r while those of at least r / MAX_SMALL_PIECES blocks add up to r, or
        // in any pieces while they hold more than HOLES_FIRST_SHARE of the free space.
        let holes = hole_lengths(&a);
        let min_piece = r.div_ceil(MAX_SMALL_PIECES);
        let usable: u64 = holes.iter().filter(|&&l| l >= min_piece).sum();
        let in_holes: u64 = holes.iter().sum();
        let holes_first = in_holes as f64 > HOLES_FIRST_SHARE * a.free_blocks() as f64;
        // Where the local partition's holes cannot give r while holes are scarce, a local
        // extent is broken before other partitions' holes are taken.
        let cpu = rng.pick(2);
        let local = a.stats()[cpu].clone();
        let breaks_locally = local.free_hole_blocks < r
            && local.free_aligned_extents > 0
            && in_holes < SCARCE_HOLES_PER_PARTITION * 2;
        let v = a.alloc(r, cpu).unwrap();
        assert_eq!(v.iter().map(|x| x.len).sum::<u64>(), r);
        if breaks_locally {
            assert_eq!(v.len(), 1, "alloc({r}) from a broken extent is one run");
            assert_eq!(a.partition_of(v[0].start), Some(cpu), "alloc({r}) broke a local extent");
            assert_eq!(aligned_total(&a), aligned - 1, "alloc({r}) broke one extent");
            aligned -= 1;
            broke += 1;
            local_breaks += 1;
        } else if usable >= r {
            assert!(v.len() as u64 <= MAX_SMALL_PIECES, "alloc({r}) took {} pieces", v.len());
            assert_eq!(aligned_total(&a), aligned, "alloc({r}) broke an extent");
            few += 1;
        } else if holes_first && in_holes >= r {
            assert_eq!(aligned_total(&a), aligned, "alloc({r}) broke an extent");
            any += 1;
        } else {
            assert_eq!(v.len(), 1, "alloc({r}) from a broken extent is one run");
            assert_eq!(aligned_total(&a), aligned - 1, "alloc({r}) broke one extent");
            aligned -= 1;
            broke += 1;
        }
        a.check_consistency().unwrap();
    }
    assert!(
        few > 10 && any > 0 && broke == 6 && local_breaks > 0,
        "{few} in few pieces, {any} in any, {broke} broke ({local_breaks} locally while scarce)"
    );
}

#[test]
fn a_young_pool_serves_each_cpu_from_its_own_partition() {
    // Four partitions of eight free aligned extents each, as a fresh pool.
    let ranges = [(0, 8 * H), (8 * H, 16 * H), (16 * H, 24 * H), (24 * H, 32 * H)];
    let a = Allocator::from_free_runs(&ranges, [br(0, 32 * H)]).unwrap();
    // Each CPU's first small file breaks an extent of its own partition...
    let firsts: Vec<BlockRun> = (0..4).map(|cpu| a.alloc(16, cpu).unwrap()[0]).collect();
    for (cpu, r) in firsts.iter().enumerate() {
        assert_eq!(a.partition_of(r.start), Some(cpu));
    }
    // ...and when CPU 0's file goes, its extent is whole again and its partition has no holes:
    // the next file there breaks another local extent, not the rests that CPUs 1-3 are using.
    a.free(firsts[0]).unwrap();
    assert_eq!(a.stats()[0].free_hole_blocks, 0);
    let next = a.alloc(16, 0).unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(a.partition_of(next[0].start), Some(0));
    assert_eq!(a.stats()[1..].iter().map(|s| s.free_hole_blocks).sum::<u64>(), 3 * (H - 16));
    a.check_consistency().unwrap();

    // Holes plentiful (more than two extents' worth per partition, most in partition 3): a
    // CPU with no holes of its own takes them there and keeps its extents.
    let ranges = [(0, 8 * H), (8 * H, 16 * H), (16 * H, 24 * H), (24 * H, 32 * H)];
    let mut free = vec![br(0, 8 * H)];
    free.extend((16..18).chain(24..32).map(|u| br(u * H + 1, H - 1)));
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    assert!(a.hole_blocks() >= SCARCE_HOLES_PER_PARTITION * 4);
    let v = a.alloc(16, 0).unwrap();
    assert_eq!(a.partition_of(v[0].start), Some(3));
    assert_eq!(a.stats()[0].free_aligned_extents, 8);
    a.check_consistency().unwrap();
}

#[test]
fn a_small_request_breaks_an_extent_rather_than_take_tiny_holes() {
    // Partition 0: five free aligned extents and 64 one-block holes (2.4% of the free space);
    // partition 1 full.
    let ranges = [(0, 8 * H), (8 * H, 12 * H)];
    let mut free = vec![br(3 * H, 5 * H)];
    free.extend((0..64).map(|i| br(H + 2 * i, 1)));
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    // 32 blocks from holes would take 32 pieces: the head extent is broken instead, one run.
    assert_eq!(a.alloc(32, 1).unwrap(), vec![br(3 * H, 32)]);
    assert_eq!((aligned_total(&a), hole_lengths(&a).len()), (4, 65));
    // The rest of that extent (480 blocks) serves the next ones whole.
    assert_eq!(a.alloc(100, 0).unwrap(), vec![br(3 * H + 32, 100)]);
    a.check_consistency().unwrap();
}

#[test]
fn tiny_holes_are_gathered_while_they_hold_much_of_the_free_space_or_nothing_else_is_free() {
    // 64 one-block holes and one free aligned extent: holes hold 11% of the free space.
    let ranges = [(0, 4 * H), (4 * H, 8 * H)];
    let mut free = vec![br(3 * H, H)];
    free.extend((0..64).map(|i| br(H + 2 * i, 1)));
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    let v = a.alloc(32, 0).unwrap();
    assert_eq!(v.len(), 32);
    assert!(v.iter().all(|r| r.len == 1 && r.start < 2 * H));
    assert_eq!(aligned_total(&a), 1);
    // 32 holes (5.9%) now: the extent is broken for the next 20 blocks.
    assert_eq!(a.alloc(20, 0).unwrap(), vec![br(3 * H, 20)]);
    // With no aligned extent left, tiny holes are gathered whatever their share: the rest of
    // the broken extent goes first (lowest fit), then 30 blocks from 30 holes.
    a.alloc(492, 0).unwrap();
    let v = a.alloc(30, 0).unwrap();
    assert_eq!(v.len(), 30);
    assert!(v.iter().all(|r| r.len == 1 && r.start < 2 * H));
    a.check_consistency().unwrap();
}

#[test]
fn a_small_request_gathers_a_few_large_enough_holes_before_breaking_an_extent() {
    let ranges = [(0, 4 * H), (4 * H, 8 * H)];
    // Two free aligned extents; holes of 40, 30, 20 and 10 blocks plus many single blocks.
    let mut free = vec![br(2 * H, H), br(6 * H, H)];
    free.extend([br(H, 40), br(H + 100, 30), br(5 * H, 20), br(5 * H + 100, 10)]);
    free.extend((0..50).map(|i| br(H + 200 + 2 * i, 1)));
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    // 80 blocks: no hole fits, pieces of at least 20 do (40 + 30 + 10 of the 20): three runs,
    // largest first, across partitions, and both extents stay whole.
    let v = a.alloc(80, 0).unwrap();
    assert_eq!(v, vec![br(H, 40), br(H + 100, 30), br(5 * H, 10)]);
    assert_eq!(aligned_total(&a), 2);
    // 60 blocks: pieces of at least 15 hold only 10 (the rest of the 20), and holes are 5.5% of
    // the free space: an extent is broken.
    assert_eq!(a.alloc(60, 1).unwrap().len(), 1);
    assert_eq!(aligned_total(&a), 1);
    a.check_consistency().unwrap();
}

#[test]
fn compaction_allocates_from_holes_of_any_size_and_never_breaks_an_extent() {
    let ranges = [(0, 4 * H)];
    let mut free = vec![br(3 * H, H)];
    free.extend((0..64).map(|i| br(H + 2 * i, 1)));
    let a = Allocator::from_free_runs(&ranges, free).unwrap();
    let v = a.alloc_in_holes(40, 0).unwrap();
    assert_eq!((v.len(), aligned_total(&a)), (40, 1));
    let e = a.alloc_in_holes(25, 0).unwrap_err();
    assert_eq!((e.requested, aligned_total(&a), hole_lengths(&a).len()), (25, 1, 24));
    assert_eq!(a.alloc_in_holes(0, 0).unwrap(), Vec::new());
    a.check_consistency().unwrap();
}

#[test]
fn no_space_is_all_or_nothing() {
    let ranges = [(0, 4 * H), (4 * H, 8 * H)];
    let a =
        Allocator::from_free_runs(&ranges, [br(H, H), br(5 * H, H), br(7 * H + 1, 100)]).unwrap();
    let before = a.free_runs();
    let fb = a.free_blocks();
    // Two aligned pieces succeed, then the third cannot be served: must roll back.
    let e = a.alloc(3 * H, 0).unwrap_err();
    assert_eq!((e.requested, e.free), (3 * H, fb));
    assert_eq!(a.free_runs(), before);
    let e = a.alloc(fb + 1, 1).unwrap_err();
    assert_eq!(e.requested, fb + 1);
    assert_eq!(a.free_blocks(), fb);
    assert_eq!(a.free_runs(), before);
    assert!(e.to_string().contains("no space"));
    a.check_consistency().unwrap();
}

#[test]
fn take_free_in_holds_a_unit_back_until_freed() {
    // Unit 1 (blocks 512..1024) has a used block at 600; the rest of 0..2048 is free.
    let a = Allocator::from_free_runs(&[(0, 2048)], [br(0, 600), br(601, 1447)]).unwrap();
    let before = a.free_blocks();
    let taken = a.take_free_in(512, 1024);
    assert_eq!(taken.iter().map(|r| r.len).sum::<u64>(), 511);
    assert!(taken.iter().all(|r| r.start >= 512 && r.end() <= 1024));
    assert_eq!(a.free_blocks(), before - 511);
    // Nothing is allocated inside the unit while it is held.
    let got = a.alloc(100, 0).unwrap();
    assert!(
        got.iter().all(|r| r.end() <= 512 || r.start >= 1024),
        "{got:?}"
    );
    for r in got {
        a.free(r).unwrap();
    }
    // Freeing the used block and the taken runs makes the unit an aligned extent again.
    a.free(br(600, 1)).unwrap();
    for r in taken {
        a.free(r).unwrap();
    }
    assert_eq!(aligned_total(&a), 4);
    a.check_consistency().unwrap();
}

#[test]
fn speculative_holdings_count_as_available() {
    let a = fresh(&[(0, 4 * H)]);
    let free = a.free_blocks();
    assert_eq!(a.available_blocks(), free);
    a.set_speculative(7, 100);
    a.set_speculative(9, 300);
    a.set_speculative(7, 40);
    assert_eq!(a.speculative_blocks(), 340);
    assert_eq!(a.available_blocks(), free + 340);
    assert_eq!(a.speculative_holders(), vec![(9, 300), (7, 40)]);
    assert_eq!(a.speculative_of(7), 40);
    // No handler yet: nothing is relieved.
    assert_eq!(a.relieve(10), 0);
    let asked = std::sync::Arc::new(AtomicU64::new(0));
    let seen = asked.clone();
    a.set_pressure_handler(Box::new(move |n| {
        seen.store(n, Relaxed);
        5
    }));
    assert_eq!(a.relieve(10), 5);
    assert_eq!(asked.load(Relaxed), 10);
    a.set_speculative(9, 0);
    a.set_speculative(7, 0);
    assert_eq!((a.speculative_blocks(), a.speculative_of(9)), (0, 0));
    assert!(a.speculative_holders().is_empty());
    // Nothing held: the handler is not asked.
    assert_eq!(a.relieve(10), 0);
}

#[test]
fn a_holding_recounted_by_its_holder_shows_in_every_total() {
    let a = fresh(&[(0, 4 * H)]);
    let free = a.free_blocks();
    let h = a.hold_speculative(7, 100);
    a.set_speculative(9, 30);
    assert_eq!((a.speculative_blocks(), a.speculative_of(7)), (130, 100));
    h.set(12);
    assert_eq!(a.speculative_blocks(), 42);
    assert_eq!(a.available_blocks(), free + 42);
    assert_eq!(a.speculative_holders(), vec![(9, 30), (7, 12)]);
    // Registering again hands out the same count.
    let again = a.hold_speculative(7, 5);
    assert_eq!(a.speculative_of(7), 5);
    again.set(6);
    h.set(8);
    assert_eq!(a.speculative_of(7), 8);
    a.set_speculative(7, 0);
    assert_eq!((a.speculative_blocks(), a.speculative_of(7)), (30, 0));
    assert_eq!(a.speculative_holders(), vec![(9, 30)]);
}

#[test]
fn double_free_rejected_without_change() {
    let ranges = [(0, 4 * H), (4 * H, 8 * H)];
    let a = fresh(&ranges);
    let v = a.alloc(3 * H + 10, 0).unwrap();
    let before = a.free_runs();
    // Overlaps an aligned extent.
    assert!(
        a.free(br(3 * H - 5, 20))
            .unwrap_err()
            .contains("double free")
    );
    // Overlaps the hole left by the remainder.
    assert!(a.free(br(3 * H + 5, 10)).is_err());
    assert_eq!(a.free_runs(), before);
    // Fill partition 0, then free a run crossing into partition 1 whose second half is free:
    // the (allocated) first half must not be freed either.
    assert_eq!(a.alloc(H - 10, 0).unwrap(), vec![br(3 * H + 10, H - 10)]);
    let before = a.free_runs();
    assert!(a.free(br(4 * H - 10, 20)).is_err());
    assert_eq!(a.free_runs(), before);
    a.free(v[0]).unwrap();
    assert!(a.free(v[0]).is_err());
    assert!(a.free(br(8 * H, 1)).is_err());
    a.check_consistency().unwrap();
}

#[test]
fn from_free_runs_validation() {
    let ranges = [(0, 2 * H), (2 * H, 4 * H + 7)];
    assert!(Allocator::from_free_runs(&ranges, [br(4 * H, 8)]).is_err());
    assert!(Allocator::from_free_runs(&ranges, [br(0, 10), br(9, 3)]).is_err());
    assert!(Allocator::from_free_runs(&[(0, H), (H - 1, 2 * H)], []).is_err());
    assert!(Allocator::from_free_runs(&[(0, H), (2 * H, 3 * H)], [br(H - 1, 2)]).is_err());
    let a = Allocator::from_free_runs(&ranges, [br(H + 100, 2 * H)]).unwrap();
    let st: Vec<_> = a
        .stats()
        .iter()
        .map(|s| (s.free_hole_blocks, s.free_aligned_extents))
        .collect();
    assert_eq!(st, vec![(H - 100, 0), (100, 1)]);
    assert_eq!(a.free_runs(), vec![br(H + 100, 2 * H)]);
    assert_eq!(a.total_blocks(), 4 * H + 7);
    assert_eq!(a.partition_of(4 * H + 7), None);
    assert_eq!(a.partition_of(2 * H), Some(1));
    a.check_consistency().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, usize),
    Free(u64, u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..3000, 0usize..8).prop_map(|(n, c)| Op::Alloc(n, c)),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(i, a, b)| Op::Free(i, a, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn random_alloc_free(units in prop::collection::vec(1u64..5, 2..=4), tail in 1u64..512,
                         ops in prop::collection::vec(op(), 200..400)) {
        let mut ranges = Vec::new();
        let mut s = 0;
        for (i, u) in units.iter().enumerate() {
            let len = u * H + if i + 1 == units.len() { tail } else { 0 };
            ranges.push((s, s + len));
            s += len;
        }
        let a = fresh(&ranges);
        let mut held: Vec<BlockRun> = Vec::new();
        for o in ops {
            match o {
                Op::Free(i, x, y) if !held.is_empty() => {
                    let r = held.swap_remove(usize::try_from(i % held.len() as u64).unwrap());
                    let (lo, hi) = if y % 3 == 0 { (0, r.len) } else {
                        let lo = x % r.len;
                        (lo, lo + 1 + y % (r.len - lo))
                    };
                    a.free(br(r.start + lo, hi - lo)).unwrap();
                    held.extend([br(r.start, lo), br(r.start + hi, r.len - hi)].into_iter().filter(|p| p.len > 0));
                }
                Op::Free(..) => {}
                Op::Alloc(n, cpu) => {
                    let before = a.free_runs();
                    match a.alloc(n, cpu) {
                        Ok(v) => {
                            prop_assert_eq!(v.iter().map(|r| r.len).sum::<u64>(), n);
                            held.extend(v);
                        }
                        Err(e) => {
                            prop_assert_eq!(e.requested, n);
                            prop_assert_eq!(a.free_runs(), before);
                        }
                    }
                }
            }
            if let Err(e) = a.check_consistency() { prop_assert!(false, "{}", e); }
            prop_assert_eq!(a.free_blocks() + held.iter().map(|r| r.len).sum::<u64>(), a.total_blocks());
            assert_disjoint(&a, &held);
        }
        for r in held { a.free(r).unwrap(); }
        prop_assert_eq!(a.free_runs(), merged(&ranges));
        for (st, &(s, e)) in a.stats().iter().zip(&ranges) {
            prop_assert_eq!(st.free_aligned_extents, (e - s) / H);
            prop_assert_eq!(st.free_hole_blocks, (e - s) % H);
        }
        a.check_consistency().unwrap();
    }
}

#[test]
fn concurrent_smoke() {
    let ranges = [
        (0, 8 * H),
        (8 * H, 16 * H),
        (16 * H, 24 * H),
        (24 * H, 32 * H + 100),
    ];
    let a = Arc::new(fresh(&ranges));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                let mut rng = Rng(0x1234_5678 + t as u64 * 7919);
                let mut held: Vec<BlockRun> = Vec::new();
                for _ in 0..3000 {
                    if held.is_empty() || rng.below(2) == 0 {
                        if let Ok(v) = a.alloc(1 + rng.below(2000), t) {
                            held.extend(v);
                        }
                    } else {
                        let i = rng.pick(held.len());
                        a.free(held.swap_remove(i)).unwrap();
                    }
                }
                held
            })
        })
        .collect();
    let held: Vec<BlockRun> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    a.check_consistency().unwrap();
    assert_eq!(
        a.free_blocks() + held.iter().map(|r| r.len).sum::<u64>(),
        a.total_blocks()
    );
    assert_disjoint(&a, &held);
    for r in held {
        a.free(r).unwrap();
    }
    assert_eq!(a.free_runs(), merged(&ranges));
}

#[test]
fn an_allocation_from_a_goal_takes_the_blocks_there_first_and_the_rest_as_usual() {
    // Partition 0: holes [100, 110) and [200, 300); the rest of it and partition 1 in use.
    let a =
        Allocator::from_free_runs(&[(0, 1024), (1024, 2048)], [br(100, 10), br(200, 100)]).unwrap();
    // A goal where a hole starts: the blocks continue from there.
    assert_eq!(a.alloc_from(4, at(200), 0).unwrap(), vec![br(200, 4)]);
    assert_eq!(a.alloc_from(2, at(204), 0).unwrap(), vec![br(204, 2)]);
    // A goal inside a hole is not a free block right after a file's: lowest fit as usual.
    assert_eq!(a.alloc_from(12, at(105), 0).unwrap(), vec![br(206, 12)]);
    // More than the hole at the goal holds: all of it, then the rest lowest-fit.
    assert_eq!(a.alloc_from(20, at(218), 0).unwrap(), vec![br(218, 20)]);
    assert_eq!(
        a.alloc_from(70, at(238), 0).unwrap(),
        vec![br(238, 62), br(100, 8)]
    );
    // Not enough anywhere: refused with nothing taken, the goal's blocks given back too.
    assert!(a.alloc_from(5, at(300), 0).is_err());
    assert!(a.alloc_from(3, at(108), 0).is_err());
    assert_eq!(a.free_blocks(), 2);
    assert_eq!(a.alloc_from(2, at(108), 0).unwrap(), vec![br(108, 2)]);
    a.check_consistency().unwrap();
}

#[test]
fn a_growing_file_that_cannot_continue_takes_a_hole_with_room_for_its_size_again() {
    // Partition 0: holes of 3, 1, 2, 20, 40 and 80 blocks; the rest of it and partition 1 in use.
    let holes = [br(100, 3), br(110, 1), br(120, 2), br(140, 20), br(200, 40), br(300, 80)];
    let a = Allocator::from_free_runs(&[(0, 1024), (1024, 2048)], holes).unwrap();
    let grown = |at, room| Goal { at, room };
    // A file of 3 blocks whose next block is taken: the lowest hole of 1 + 16 or more (the
    // least room), not the lowest hole.
    assert_eq!(a.alloc_from(1, grown(60, 3), 0).unwrap(), vec![br(140, 1)]);
    // It continues there; at 20 blocks, to the lowest hole of 2 + 20 or more.
    assert_eq!(a.alloc_from(19, grown(141, 4), 0).unwrap(), vec![br(141, 19)]);
    assert_eq!(a.alloc_from(2, grown(160, 20), 0).unwrap(), vec![br(200, 2)]);
    // What the goal's hole cannot hold goes where the file, with those blocks, fits again.
    assert_eq!(a.alloc_from(45, grown(202, 22), 0).unwrap(), vec![br(202, 38), br(300, 7)]);
    // Room that no hole has: the lowest fit of what is asked.
    assert_eq!(a.alloc_from(1, grown(70, 100), 0).unwrap(), vec![br(100, 1)]);
    a.check_consistency().unwrap();
    // Wear-aware allocation spreads (next fit from the partition's start) and keeps no room.
    a.set_wear_aware(true);
    assert_eq!(a.alloc_from(1, grown(80, 3), 0).unwrap(), vec![br(101, 1)]);
    a.check_consistency().unwrap();
}

#[test]
fn a_long_batch_that_frees_a_block_twice_is_refused() {
    let a = fresh(&[(0, 1024)]);
    a.alloc(1024, 0).unwrap();
    // 20 single blocks (more than are compared pair by pair), block 14 twice, far apart.
    let mut batch: Vec<BlockRun> = (0..20).map(|i| br(i * 2, 1)).collect();
    batch.push(br(14, 1));
    let e = a.free_all(&batch).unwrap_err();
    assert!(e.contains("double free: [14,15) and [14,15)"), "{e}");
    assert_eq!(a.free_blocks(), 0);
    batch.pop();
    a.free_all(&batch).unwrap();
    assert_eq!(a.free_blocks(), 20);
    a.check_consistency().unwrap();
}
