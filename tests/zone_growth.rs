//! Slot zones that grow into free space (docs/DESIGN.md §5, "Growth"): a strict hot set larger
//! than the zones' own slots is still written once per update; the units lent to the zones
//! come back whenever files need the space, at unmount and at mount; a crash with live slots
//! in units loses nothing; a damaged table word is refused, and repair clears it.

mod common;

use std::collections::HashMap;
use std::path::Path;
use winefs::media::geometry::Geometry;
use winefs::{Consistency, Fs, StatFs};

/// A 4 KiB block of `fill`, distinct per block and fill.
fn block(lb: u64, fill: u8) -> Vec<u8> {
    common::pattern(4096, fill.wrapping_add(lb as u8))
}

/// Strict random 4 KiB overwrites of the first `blocks` blocks of `ino`, recorded in `model`.
fn overwrite(fs: &Fs, ino: u64, blocks: u64, n: u64, seed: &mut u64, model: &mut HashMap<u64, u8>) {
    for _ in 0..n {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let lb = *seed % blocks;
        let fill = model.get(&lb).map_or(1, |f| f.wrapping_add(1));
        fs.write(ino, lb * 4096, &block(lb, fill)).unwrap();
        model.insert(lb, fill);
    }
}

/// Every block of `model` reads back as written.
fn verify(fs: &Fs, ino: u64, model: &HashMap<u64, u8>) {
    let mut back = vec![0u8; 4096];
    for (&lb, &fill) in model {
        fs.read(ino, lb * 4096, &mut back).unwrap();
        assert!(back == block(lb, fill), "block {lb} does not read back as written (fill {fill})");
    }
}

/// [`verify`], then fsck of the live mount finds nothing.
fn verify_checked(fs: &Fs, ino: u64, model: &HashMap<u64, u8>) {
    verify(fs, ino, model);
    let report = fs.check();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Words of the zones' extension tables that are not 0, as (zone, word, value).
fn table_words(p: &Path, g: &Geometry) -> Vec<(u32, u64, u64)> {
    let img = std::fs::read(p).unwrap();
    let mut out = Vec::new();
    for part in 0..g.partitions {
        let t = g.zone_table_offset(part) as usize;
        for k in 0..512 {
            let w = u64::from_le_bytes(img[t + k * 8..t + k * 8 + 8].try_into().unwrap());
            if w != 0 {
                out.push((part, k as u64, w));
            }
        }
    }
    out
}

/// A 256 MiB strict pool with a 64 MiB file whose blocks have been overwritten at random long
/// enough for the zones to grow.
fn grown() -> (tempfile::TempDir, std::path::PathBuf, Fs, u64, HashMap<u64, u8>, StatFs) {
    let (d, p) = common::fresh_pool(256 << 20, None);
    let fs = common::mount_with(&p, Consistency::Strict);
    let ino = fs.create_file("/big").unwrap().ino();
    fs.fallocate(ino, 0, 64 << 20, false).unwrap();
    let before = fs.statfs();
    let mut model = HashMap::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    overwrite(&fs, ino, 16384, 30_000, &mut seed, &mut model);
    (d, p, fs, ino, model, before)
}

#[test]
fn a_hot_set_larger_than_the_fixed_zones_is_written_once() {
    // 16384 blocks written at random: about half of them hold their newest copy in a slot at
    // any time, far more than the fixed zones' slots of a 256 MiB pool (1024 in all), so the
    // zones grow; each update is then one copy, the newest alternating between slot and home.
    let (_d, p, fs, ino, mut model, before) = grown();
    let g = fs.geometry();
    let st = fs.statfs();
    assert!(
        st.free_aligned_extents + 10 <= before.free_aligned_extents,
        "the zones grew into no more than a few units: {} free extents before, {} after",
        before.free_aligned_extents,
        st.free_aligned_extents
    );
    // Lent, not used: statfs still counts the units' blocks as free, and says they are lent.
    assert_eq!(st.free_blocks, before.free_blocks);
    assert_eq!(st.preallocated_blocks, before.preallocated_blocks);
    assert_eq!(before.zone_blocks, 0);
    assert_eq!(st.zone_blocks, 512 * (before.free_aligned_extents - st.free_aligned_extents));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let stats = fs.persist_stats();
    overwrite(&fs, ino, 16384, 10_000, &mut seed, &mut model);
    let spent = fs.persist_stats().since(&stats);
    let per_write = spent.total_bytes() as f64 / 10_000.0;
    assert!(
        per_write <= 1.1 * 4096.0,
        "{per_write:.0} bytes stored per 4 KiB write: {spent:?}"
    );
    verify_checked(&fs, ino, &model);
    // A clean unmount writes every slot home and gives every unit back.
    fs.unmount().unwrap();
    assert_eq!(table_words(&p, &g), vec![]);
    let fs = common::mount(&p);
    assert_eq!(fs.statfs().free_aligned_extents, before.free_aligned_extents);
    assert_eq!(fs.statfs().zone_blocks, 0);
    verify(&fs, ino, &model);
}

/// A 256 MiB strict pool that a ballast file fills to `full` percent, then a 32 MiB file
/// overwritten at random long enough for the zones to grow as far as they may.
fn nearly_full(full: u64) -> (tempfile::TempDir, Fs, u64, HashMap<u64, u8>) {
    let (d, p) = common::fresh_pool(256 << 20, Some(2));
    let fs = common::mount_with(&p, Consistency::Strict);
    let st = fs.statfs();
    let ballast = fs.create_file("/ballast").unwrap().ino();
    let fill = st.blocks * full / 100 - (st.blocks - st.free_blocks) - 8192;
    fs.fallocate(ballast, 0, fill * 4096, false).unwrap();
    let ino = fs.create_file("/hot").unwrap().ino();
    fs.fallocate(ino, 0, 32 << 20, false).unwrap();
    let mut model = HashMap::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    overwrite(&fs, ino, 8192, 40_000, &mut seed, &mut model);
    (d, fs, ino, model)
}

#[test]
fn zones_grow_on_a_nearly_full_pool_but_never_past_the_files_aligned_space() {
    // 85% full (an aged pool running a workload): the hot set's newest copies (about 4096
    // slots) outgrow the zones' own 512 per partition, and the zones borrow units as long as
    // the files keep as many free aligned extents as they hold.
    let (_d, fs, ino, mut model) = nearly_full(85);
    let st = fs.statfs();
    assert!(st.zone_blocks >= 4 * 512, "the zones grew into {} blocks only", st.zone_blocks);
    assert!(
        st.free_aligned_extents * 512 >= st.zone_blocks,
        "the zones hold {} blocks, the files have {} free aligned extents left",
        st.zone_blocks,
        st.free_aligned_extents
    );
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let stats = fs.persist_stats();
    overwrite(&fs, ino, 8192, 10_000, &mut seed, &mut model);
    let per_write = fs.persist_stats().since(&stats).total_bytes() as f64 / 10_000.0;
    assert!(per_write <= 1.2 * 4096.0, "{per_write:.0} bytes stored per 4 KiB write");
    verify_checked(&fs, ino, &model);
}

#[test]
fn units_go_back_when_files_take_the_aligned_extents() {
    let (_d, fs, ino, model) = nearly_full(85);
    let lent = fs.statfs().zone_blocks;
    assert!(lent >= 4 * 512, "the zones grew into {lent} blocks only");
    // Another file takes free aligned extents in one call, leaving the files fewer than a
    // quarter as many as the zones hold.
    let other = fs.create_file("/other").unwrap().ino();
    let take = fs.statfs().free_aligned_extents - lent / 512 / 4 + 1;
    fs.fallocate(other, 0, take * (2 << 20), false).unwrap();
    // The background worker gives back units until the files have at least half as many free
    // aligned extents as the zones hold units again, not all. (It levels the two sides from
    // what it sees; the fallocate allocates a unit at a time, so a worker woken part way
    // through may level them before the last units are taken, leaving the two sides anywhere
    // between level and the half at which units are asked back: `Room::pressed`.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let st = loop {
        let st = fs.statfs();
        if 2 * st.free_aligned_extents * 512 >= st.zone_blocks {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "units not given back: {st:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(st.zone_blocks > 0, "every unit went back, not just enough: {st:?}");
    verify_checked(&fs, ino, &model);
}

#[test]
fn space_lent_to_the_zones_comes_back_when_a_file_needs_it() {
    let (_d, _p, fs, ino, model, _) = grown();
    let st = fs.statfs();
    assert!(fs.statfs().free_aligned_extents < st.free_blocks / 512, "the zones hold units");
    // Another file takes every block statfs calls free but a few for its map, in one call:
    // the units go back.
    let other = fs.create_file("/other").unwrap().ino();
    fs.fallocate(other, 0, (st.free_blocks - 16) * 4096, false).unwrap();
    assert!(fs.statfs().free_blocks <= 16);
    assert_eq!(fs.statfs().zone_blocks, 0, "every unit went back");
    verify_checked(&fs, ino, &model);
}

#[test]
fn a_file_appending_to_itself_gets_the_space_its_own_slots_hold() {
    // The file whose slots fill the units appends until the pool is full: its own slots (whose
    // lock the append holds) must not keep the units from it.
    let (_d, _p, fs, ino, model, _) = grown();
    let free = fs.statfs().free_blocks;
    let piece = vec![0x77u8; 1 << 20];
    let mut appended = 0u64;
    while fs.append(ino, &piece).is_ok() {
        appended += piece.len() as u64;
    }
    // All but what the file's map and the last partial piece take.
    assert!(
        appended + (4 << 20) >= free * 4096,
        "appended {appended} bytes of {} free",
        free * 4096
    );
    verify_checked(&fs, ino, &model);
}

#[test]
fn a_crash_with_live_slots_in_units_loses_nothing() {
    let (_d, p, fs, ino, model, before) = grown();
    let g = fs.geometry();
    fs.simulate_crash();
    assert!(!table_words(&p, &g).is_empty(), "the crash left the zones' units named");
    let fs = common::mount(&p);
    // Mount wrote the units' slots home and gave the units back.
    assert_eq!(table_words(&p, &g), vec![]);
    assert_eq!(fs.statfs().free_aligned_extents, before.free_aligned_extents);
    verify_checked(&fs, ino, &model);
}

#[test]
fn a_damaged_table_word_is_refused_and_repair_clears_it() {
    let (_d, p, fs, _, _, _) = grown();
    let g = fs.geometry();
    fs.simulate_crash();
    let (part, k, _) = table_words(&p, &g)[0];
    common::flip(&p, g.zone_table_offset(part) + k * 8 + 6, 0x10);
    let e = common::refused(&p, &format!("slot zone {part} extension word {k} fails its check"));
    assert!(e.contains("fsck --repair"), "{e}");
    common::repaired(&p, &format!("slot zone {part} extension word {k}"));
    assert_eq!(table_words(&p, &g), vec![]);
    common::mount(&p).unmount().unwrap();
}

#[test]
fn a_table_word_naming_a_files_blocks_is_refused() {
    let (_d, p, fs, ino, _, _) = grown();
    let g = fs.geometry();
    // A unit of the big file's own blocks, named by a well-formed word.
    let unit = fs.extents(ino).unwrap().iter().map(|&(_, phys, _)| phys).find(|p| p % 512 == 0).unwrap();
    fs.simulate_crash();
    let free_word = (0..256u32).find(|k| !table_words(&p, &g).iter().any(|w| w.0 == 0 && w.1 == u64::from(*k))).unwrap();
    let word = winefs::media::zone::extension_word(unit, 0, free_word);
    common::patch(&p, g.zone_table_offset(0) + u64::from(free_word) * 8, &word.to_le_bytes());
    common::refused(&p, &format!("slot zone 0 extension word {free_word} names unit {unit}, which holds blocks of inode {ino}"));
}

#[test]
fn a_zone_that_cannot_grow_fills_to_a_sixteenth_before_writing_back() {
    // One partition, a ballast leaving no room to lend units: the zone keeps its own slots.
    let (_d, p) = common::fresh_pool(256 << 20, Some(1));
    let fs = common::mount_with(&p, Consistency::Strict);
    let slots = u64::from(fs.geometry().zone_slots);
    assert!(slots >= 1024, "a zone of {slots} slots: too small for its sixteenth to be below 64");
    let ballast = fs.create_file("/ballast").unwrap().ino();
    let free = fs.statfs().free_blocks;
    fs.fallocate(ballast, 0, (free - slots - 1024) * 4096, false).unwrap();
    let ino = fs.create_file("/hot").unwrap().ino();
    fs.fallocate(ino, 0, slots * 4096, false).unwrap();
    // Seven eighths of the slots, each block overwritten once: every newest copy stays in a
    // slot, and nothing is written home (a zone that wrote back from a quarter free did).
    let stats = fs.persist_stats();
    let mut model = HashMap::new();
    for lb in 0..slots * 7 / 8 {
        fs.write(ino, lb * 4096, &block(lb, 1)).unwrap();
        model.insert(lb, 1u8);
    }
    let spent = fs.persist_stats().since(&stats);
    assert_eq!(spent.bytes_written[winefs::media::pool::Category::WriteBack as usize], 0);
    assert_eq!(fs.statfs().zone_blocks, 0, "the zone grew");
    verify_checked(&fs, ino, &model);
}

#[test]
fn a_writer_moved_to_another_cpu_uses_the_slots_its_first_zone_freed() {
    // Zones are per CPU. A writer that made the first zone grow on CPU 0 and then runs on CPU 1
    // finds a zone the space lent to the first keeps from growing: it must take the slots the
    // first zone has free rather than write a batch back every few updates (1.4-1.9x the bytes
    // per update before stop 56, in runs where the scheduler moved the thread).
    let pinned = std::thread::spawn(|| {
        if winefs::sys::run_only_on_cpu(0).is_err() || winefs::sys::run_only_on_cpu(1).is_err() {
            return None;
        }
        winefs::sys::run_only_on_cpu(0).unwrap();
        let (d, fs, ino, mut model) = nearly_full(85);
        winefs::sys::run_only_on_cpu(1).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let stats = fs.persist_stats();
        overwrite(&fs, ino, 8192, 10_000, &mut seed, &mut model);
        let per_write = fs.persist_stats().since(&stats).total_bytes() as f64 / 10_000.0;
        verify_checked(&fs, ino, &model);
        drop(fs);
        drop(d);
        Some(per_write)
    });
    match pinned.join().unwrap() {
        Some(per_write) => assert!(per_write <= 1.2 * 4096.0, "{per_write:.0} bytes stored per 4 KiB write"),
        None => eprintln!("skipped: needs CPUs 0 and 1"),
    }
}

#[test]
fn the_worker_copies_a_writers_oldest_slots_home_while_it_writes_and_reads_see_whole_writes() {
    // A pool too full for the zones to grow much: sequential passes of strict 4 KiB overwrites
    // over a 32 MiB file outrun the zones' slots, so the oldest are written home all along.
    // The writer hands them to the background worker, which copies them without the file's
    // lock (`slots::hand_to_worker`); meanwhile a reader must only ever see whole writes, and
    // after the passes every block must hold its last write, before and after a remount.
    let (_d, p) = common::fresh_pool(256 << 20, Some(2));
    let fs = common::mount_with(&p, Consistency::Strict);
    let st = fs.statfs();
    let ballast = fs.create_file("/ballast").unwrap().ino();
    let fill = st.blocks * 90 / 100 - (st.blocks - st.free_blocks) - 8192;
    fs.fallocate(ballast, 0, fill * 4096, false).unwrap();
    let ino = fs.create_file("/hot").unwrap().ino();
    const BLOCKS: u64 = 8192;
    const PASSES: u8 = 4;
    for lb in 0..BLOCKS {
        fs.write(ino, lb * 4096, &block(lb, 1)).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut back = vec![0u8; 4096];
            let mut seed = 0x1234_5678_9abc_def1u64;
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let lb = seed % BLOCKS;
                fs.read(ino, lb * 4096, &mut back).unwrap();
                let fill = back[0].wrapping_sub(lb as u8);
                assert!(
                    (1..=PASSES + 1).contains(&fill) && back == block(lb, fill),
                    "block {lb} read as no whole write (first byte {})",
                    back[0]
                );
                reads += 1;
            }
            reads
        })
    };
    let total = fs.persist_stats();
    let mine = winefs::media::persist_stats::thread_stats();
    for pass in 2..=PASSES + 1 {
        for lb in 0..BLOCKS {
            fs.write(ino, lb * 4096, &block(lb, pass)).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);
    let total = fs.persist_stats().since(&total);
    let mine = winefs::media::persist_stats::thread_stats().since(&mine);
    let written_back = |s: &winefs::media::persist_stats::PersistStats| {
        s.bytes_written[winefs::media::persist_stats::Category::WriteBack as usize]
    };
    // Most slots went home before the passes ended, and the worker made some of those copies.
    assert!(
        written_back(&total) >= BLOCKS * 4096,
        "{} bytes written back in {PASSES} passes over {BLOCKS} blocks",
        written_back(&total)
    );
    assert!(
        written_back(&mine) + 64 * 4096 <= written_back(&total),
        "the writer wrote back {} of {} bytes itself",
        written_back(&mine),
        written_back(&total)
    );
    let model: HashMap<u64, u8> = (0..BLOCKS).map(|lb| (lb, PASSES + 1)).collect();
    verify_checked(&fs, ino, &model);
    fs.unmount().unwrap();
    let fs = common::mount(&p);
    verify_checked(&fs, ino, &model);
}
