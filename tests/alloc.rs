//! Allocation that degrades gracefully (docs/DESIGN.md §4): alignment is a preference, not a
//! condition, so a write fails with ENOSPC only when no block is free; statfs reports space a
//! write can use; small files and small sparse mappings allocate small; speculative
//! preallocation past EOF is given back at the last close of a small file and under space
//! pressure; a growing large file still ends up on aligned 2 MiB extents; on a young pool each
//! CPU allocates in its own partition.

use winefs::{Error, Fs};

mod common;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;
const BLOCK: u64 = 4 * KIB;

fn assert_clean(fs: &Fs) {
    let r = fs.check();
    assert!(r.is_clean(), "fsck: {r:?}");
}

/// Blocks the file owns (data, index and xattr blocks), from its attributes.
fn blocks_of(fs: &Fs, ino: u64) -> u64 {
    fs.getattr(ino).unwrap().blocks * 512 / BLOCK
}

/// Data blocks the file maps.
fn data_blocks(fs: &Fs, ino: u64) -> u64 {
    fs.extents(ino).unwrap().iter().map(|e| e.2).sum()
}

/// Whether file block `lb` lies in an aligned extent covering its whole 2 MiB unit.
fn unit_aligned(fs: &Fs, ino: u64, lb: u64) -> bool {
    fs.extents(ino).unwrap().iter().any(|&(l, p, n)| {
        l % 512 == 0 && p % 512 == 0 && n >= 512 && l <= lb && lb < l + n / 512 * 512
    })
}

/// Take every free aligned 2 MiB extent with one fallocated file, so only holes are left.
fn use_up_aligned(fs: &Fs, name: &str) {
    let f = fs.create_file(name).unwrap();
    let units = fs.statfs().free_aligned_extents;
    if units > 0 {
        f.fallocate(0, units * HUGE)
            .unwrap_or_else(|e| panic!("fallocate {units} units: {e} ({:?})", fs.statfs()));
    }
    assert_eq!(fs.statfs().free_aligned_extents, 0);
}

/// The measured failure: once no whole aligned extent is left, a file of 2 MiB or more could
/// not grow by 4 KiB although holes held almost 2 MiB. Alignment is a preference: the file
/// takes holes, and ENOSPC comes only when no block is free.
#[test]
fn large_file_grows_into_holes_until_no_block_is_free() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let mut big = fs.create_file("/big").unwrap();
    big.append(&vec![7u8; HUGE as usize]).unwrap();
    use_up_aligned(&fs, "/filler");
    // Leave fewer than 512 free blocks (about 2 MB), all in holes.
    let free = fs.statfs().free_blocks;
    assert!(free >= 488, "{free} free blocks");
    let pad = fs.create_file("/pad").unwrap();
    pad.write_at(0, &vec![1u8; ((free - 488) * BLOCK) as usize])
        .unwrap();
    assert_eq!(fs.statfs().free_blocks, 488);
    // A small file still takes 400 KiB...
    let small = fs.create_file("/small").unwrap();
    small.write_at(0, &vec![2u8; (400 * KIB) as usize]).unwrap();
    // ... and the 2 MiB file grows by 4 KiB at a time while any block is free.
    let mut appended = 0u64;
    loop {
        let before = fs.statfs().free_blocks;
        match big.append(&[3u8; BLOCK as usize]) {
            Ok(_) => appended += 1,
            Err(Error::NoSpace(_)) => {
                assert_eq!(before, 0, "ENOSPC with {before} blocks free");
                break;
            }
            Err(e) => panic!("append: {e}"),
        }
        assert!(appended < 1000, "appends never ran out of space");
    }
    assert!(appended >= 380, "only {appended} appends fitted");
    assert_eq!(fs.statfs().free_blocks, 0);
    let mut tail = vec![0u8; BLOCK as usize];
    big.read_at(HUGE + (appended - 1) * BLOCK, &mut tail)
        .unwrap();
    assert!(tail.iter().all(|&b| b == 3));
    assert_clean(&fs);
}

/// statfs counts exactly what writes can take: a new file appended to until ENOSPC takes every
/// block statfs reported free, including the speculative preallocation another file held past
/// its end (taken back under pressure, crash-safely: fsck is clean after a crash and remount).
#[test]
fn statfs_reports_what_a_write_can_use_including_preallocation() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    // A large file appended past 2 MiB takes its next unit whole: 511 blocks past its end.
    let mut big = fs.create_file("/big").unwrap();
    big.append(&vec![5u8; HUGE as usize]).unwrap();
    big.append(&[6u8; BLOCK as usize]).unwrap();
    assert!(
        unit_aligned(&fs, big.ino(), 512),
        "{:?}",
        fs.extents(big.ino())
    );
    let st = fs.statfs();
    assert_eq!(st.preallocated_blocks, 511);
    use_up_aligned(&fs, "/filler");
    let free = fs.statfs().free_blocks;
    assert!(free > 511, "{free}");
    // Everything statfs calls free goes into one new file, 4 KiB at a time.
    let mut n = fs.create_file("/n").unwrap();
    let mut appended = 0u64;
    let err = loop {
        match n.append(&[9u8; BLOCK as usize]) {
            Ok(_) => appended += 1,
            Err(e) => break e,
        }
        assert!(appended <= free, "more appends than free blocks");
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    let st = fs.statfs();
    assert_eq!((st.free_blocks, st.preallocated_blocks), (0, 0));
    assert_eq!(blocks_of(&fs, n.ino()), free, "{appended} appended");
    // The preallocation went back; the file's data did not.
    assert_eq!(
        blocks_of(&fs, big.ino()),
        513 + 1,
        "data blocks and the xattr block"
    );
    let mut b = [0u8; 1];
    big.read_at(HUGE, &mut b).unwrap();
    assert_eq!(b[0], 6);
    assert_clean(&fs);
    drop((big, n));
    fs.simulate_crash();
    let fs = common::mount(&pool);
    assert_clean(&fs);
    assert_eq!(fs.statfs().free_blocks, 0);
    assert_eq!(fs.stat_path("/big").unwrap().size, HUGE + BLOCK);
}

/// A write larger than the free space writes what fits (a short write), and strict-mode
/// overwrites of hole-backed blocks still succeed on a full pool (journaled in place instead
/// of copied on write).
#[test]
fn full_pool_gives_short_writes_and_still_overwrites() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    use_up_aligned(&fs, "/filler");
    let free = fs.statfs().free_blocks;
    let f = fs.create_file("/f").unwrap();
    let want = ((free + 100) * BLOCK) as usize;
    let n = f.write_at(0, &vec![4u8; want]).unwrap();
    assert!(
        n < want && n as u64 >= (free - 2) * BLOCK,
        "wrote {n} of {want}"
    );
    assert_eq!(fs.statfs().free_blocks, 0);
    assert!(matches!(
        f.write_at(n as u64, &[1u8; 10]),
        Err(Error::NoSpace(_))
    ));
    // Overwrite inside the file: no space needed.
    f.write_at(8192, &[8u8; 3 * BLOCK as usize]).unwrap();
    let mut b = vec![0u8; 3 * BLOCK as usize + 2];
    f.read_at(8191, &mut b).unwrap();
    assert_eq!((b[0], b[1], b[b.len() - 1]), (4, 8, 4));
    assert!(b[1..b.len() - 1].iter().all(|&x| x == 8));
    assert_clean(&fs);
}

/// Small files and small sparse mappings allocate what they touch: a 43 KB store through a
/// mapping of a small sparse file takes 11 blocks (it took the whole file's part of its unit),
/// and random writes into a large sparse file take single blocks, not whole units.
#[test]
fn small_sparse_mappings_and_random_writes_allocate_small() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let f = fs.create_file("/small").unwrap();
    f.set_len(MIB + 512 * KIB).unwrap();
    let m = f.mmap(0, (MIB + 512 * KIB) as usize).unwrap();
    let data: Vec<u8> = (0..43_000u32).map(|i| (i % 251) as u8).collect();
    m.store(100 * KIB as usize, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    m.load(100 * KIB as usize, &mut back).unwrap();
    assert_eq!(back, data);
    drop(m);
    // 100 KiB .. 100 KiB + 43 000 bytes spans blocks 25..=35.
    assert_eq!(blocks_of(&fs, f.ino()), 11);
    assert_eq!(data_blocks(&fs, f.ino()), 11);
    let mut r = vec![0u8; data.len()];
    f.read_at(100 * KIB, &mut r).unwrap();
    assert_eq!(r, data);
    // A large sparse file: random 4 KiB writes, none at a unit's first byte.
    let s = fs.create_file("/sparse").unwrap();
    s.set_len(64 * MIB).unwrap();
    for i in 0..16u64 {
        s.write_at(i * 3 * MIB + 5 * BLOCK + 7, &[1u8; BLOCK as usize])
            .unwrap();
    }
    assert_eq!(
        data_blocks(&fs, s.ino()),
        32,
        "two blocks per unaligned 4 KiB write"
    );
    assert_eq!(fs.statfs().preallocated_blocks, 0);
    assert_clean(&fs);
}

/// Preallocation past the end of a small file is given back when its last handle closes; a
/// large file keeps its aligned tail across close (it will likely be appended to again).
#[test]
fn preallocation_is_given_back_at_last_close_of_a_small_file() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let hint = winefs::meta::xattr::HUGEPAGE_HINT;
    let d = fs.mkdir_path("/hinted").unwrap();
    fs.setxattr(d.ino, hint, b"1", Default::default()).unwrap();
    // A hinted file takes a whole unit for its first write, at its first byte.
    let f = fs.create_file("/hinted/f").unwrap();
    let second = fs.open_file("/hinted/f").unwrap();
    let free0 = fs.statfs().free_blocks;
    f.write_at(0, &[3u8; 10_000]).unwrap();
    assert!(unit_aligned(&fs, f.ino(), 0));
    assert_eq!(fs.statfs().preallocated_blocks, 509);
    assert_eq!(fs.statfs().free_blocks, free0 - 3, "data blocks");
    let ino = f.ino();
    drop(f);
    assert_eq!(
        blocks_of(&fs, ino),
        512 + 1,
        "still open through another handle"
    );
    drop(second);
    assert_eq!(blocks_of(&fs, ino), 3 + 1);
    assert_eq!(fs.statfs().preallocated_blocks, 0);
    assert_eq!(fs.statfs().free_blocks, free0 - 3);
    assert_eq!(
        fs.open_file("/hinted/f").unwrap().read_all().unwrap(),
        vec![3u8; 10_000]
    );
    // A large file keeps its tail at close.
    let mut big = fs.create_file("/big").unwrap();
    big.append(&vec![1u8; (HUGE + BLOCK) as usize]).unwrap();
    let big_ino = big.ino();
    drop(big);
    assert_eq!(blocks_of(&fs, big_ino), 1024 + 1);
    assert!(unit_aligned(&fs, big_ino, 512));
    assert_eq!(fs.statfs().preallocated_blocks, 511);
    assert_clean(&fs);
    fs.unmount().unwrap();
    let fs = common::mount(&pool);
    assert_clean(&fs);
}

/// The paper's property stays: a file that grows to 2 MiB and more ends up on aligned 2 MiB
/// extents — appended 4 KiB at a time next to another growing file, written sequentially into
/// a sparse file, and stored through a 2 MiB mapping while still small (its unit is taken whole
/// and the file grows into it).
#[test]
fn growing_large_files_still_get_aligned_units() {
    let (_d, pool) = common::fresh_pool(128 * MIB, Some(1));
    let fs = common::mount(&pool);
    let mut a = fs.create_file("/a").unwrap();
    let mut other = fs.create_file("/other").unwrap();
    for i in 0..(10 * MIB / BLOCK) {
        a.append(&[(i % 200) as u8; BLOCK as usize]).unwrap();
        other.append(&[1u8; 100]).unwrap();
    }
    fs.settle_rewrites(std::time::Duration::from_secs(60))
        .unwrap();
    for u in 0..5 {
        assert!(
            unit_aligned(&fs, a.ino(), u * 512),
            "unit {u}: {:?}",
            fs.extents(a.ino())
        );
    }
    // Sequential 4 KiB writes into a sparse 8 MiB file.
    let s = fs.create_file("/sparse-seq").unwrap();
    s.set_len(8 * MIB).unwrap();
    for i in 0..(8 * MIB / BLOCK) {
        s.write_at(i * BLOCK, &[2u8; BLOCK as usize]).unwrap();
        other.append(&[1u8; 100]).unwrap();
    }
    for u in 0..4 {
        assert!(
            unit_aligned(&fs, s.ino(), u * 512),
            "unit {u}: {:?}",
            fs.extents(s.ino())
        );
    }
    // A small file mapped with a 4 MiB mapping takes its unit whole at the first store.
    let g = fs.create_file("/grows").unwrap();
    g.set_len(100 * KIB).unwrap();
    let m = g.mmap(0, 2 * HUGE as usize).unwrap();
    m.store(0, b"head").unwrap();
    assert!(unit_aligned(&fs, g.ino(), 0), "{:?}", fs.extents(g.ino()));
    g.set_len(2 * HUGE).unwrap();
    m.store((HUGE + 5) as usize, b"second unit").unwrap();
    m.store((HUGE - 4) as usize, b"tail").unwrap();
    assert!(unit_aligned(&fs, g.ino(), 0) && unit_aligned(&fs, g.ino(), 512));
    assert_eq!(fs.statfs().preallocated_blocks, 0);
    drop(m);
    let mut b = [0u8; 4];
    g.read_at(HUGE - 4, &mut b).unwrap();
    assert_eq!(&b, b"tail");
    assert_clean(&fs);
}

/// A strict overwrite of a whole aligned 2 MiB unit goes into a fresh aligned extent (one copy)
/// while one is free; with none free it is written where it is (undo-journaled) rather than
/// moved onto scattered blocks, so the file never loses the aligned extent for it.
#[test]
fn whole_unit_strict_overwrites_keep_the_unit_aligned_with_or_without_free_extents() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let f = fs.create_file("/f").unwrap();
    f.write_at(0, &vec![1u8; (2 * HUGE) as usize]).unwrap();
    assert!(unit_aligned(&fs, f.ino(), 0) && unit_aligned(&fs, f.ino(), 512));
    let phys = |fs: &Fs| fs.extents(f.ino()).unwrap()[0].1;
    let before = phys(&fs);
    f.write_at(0, &vec![2u8; HUGE as usize]).unwrap();
    assert!(unit_aligned(&fs, f.ino(), 0));
    assert_ne!(phys(&fs), before, "swapped for a fresh aligned extent");
    // Take all free space with another file, then free every other block of three units of
    // it: 768 free blocks, enough for a unit, but no aligned extent.
    let filler = fs.create_file("/filler").unwrap();
    let free = fs.statfs().free_blocks;
    filler.fallocate(0, (free - 16) * BLOCK).unwrap();
    for b in (0..3 * 512).step_by(2) {
        fs.punch_hole(filler.ino(), b * BLOCK, BLOCK).unwrap();
    }
    assert!(fs.statfs().free_blocks >= 512);
    assert!(fs.free_runs().iter().all(|r| r.len < 512), "{:?}", fs.free_runs());
    let before = phys(&fs);
    f.write_at(0, &vec![3u8; HUGE as usize]).unwrap();
    assert!(unit_aligned(&fs, f.ino(), 0), "{:?}", fs.extents(f.ino()));
    assert_eq!(phys(&fs), before, "written in place");
    let mut back = vec![0u8; HUGE as usize];
    fs.read(f.ino(), 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 3));
    drop((f, filler));
    fs.unmount().unwrap();
}

/// A strict append to a file whose last block is partly filled stores into that block in place
/// (its bytes past the end hold nothing of the file) and takes the blocks right after it when
/// they are free, even with a lower hole that fits: the file stays one extent.
#[test]
fn appends_keep_a_small_file_in_one_extent() {
    let (_d, p) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&p);
    let low = fs.create_file("/low").unwrap();
    low.write_at(0, &[1u8; 3 * BLOCK as usize]).unwrap();
    let f = fs.create_file("/log").unwrap();
    f.write_at(0, &[2u8; 5000]).unwrap();
    let before = fs.extents(f.ino()).unwrap();
    assert_eq!(before.len(), 1, "{before:?}");
    drop(low);
    fs.unlink_path("/low").unwrap(); // a hole below the file that fits the next append
    for (i, len) in [9000usize, 700, 20_000].into_iter().enumerate() {
        let size = fs.getattr(f.ino()).unwrap().size;
        f.write_at(size, &vec![3 + i as u8; len]).unwrap();
        let after = fs.extents(f.ino()).unwrap();
        assert_eq!(after.len(), 1, "append {i}: {after:?}");
        assert_eq!(after[0].1, before[0].1, "append {i}: the first block moved");
    }
    let all = f.read_all().unwrap();
    assert_eq!(all.len(), 5000 + 9000 + 700 + 20_000);
    assert!(all[..5000].iter().all(|&b| b == 2) && all[5000..14_000].iter().all(|&b| b == 3));
    assert!(all[14_000..14_700].iter().all(|&b| b == 4) && all[14_700..].iter().all(|&b| b == 5));
    drop(f);
    assert_clean(&fs);
}

/// An append that cannot continue the file's last extent (the block after it is another
/// file's) takes its block where the file can grow by its own size again (16 blocks at least),
/// not the lowest hole: past a row of two-block holes a 64 KiB file of 4 KiB appends ends in
/// two pieces, where lowest-first put it in about one piece per hole (nine).
#[test]
fn appends_past_a_taken_block_go_where_the_file_has_room_to_grow() {
    let (_d, p) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&p);
    // Forty two-block files side by side, every other one removed: twenty two-block holes
    // below the rest of the extent they broke.
    for i in 0..40 {
        let f = fs.create_file(&format!("/s{i}")).unwrap();
        f.write_at(0, &[1u8; 2 * BLOCK as usize]).unwrap();
    }
    for i in (0..40).step_by(2) {
        fs.unlink_path(&format!("/s{i}")).unwrap();
    }
    let small_holes = fs.free_runs().iter().filter(|r| r.len == 2).count();
    assert_eq!(small_holes, 20, "{:?}", fs.free_runs());
    let f = fs.create_file("/log").unwrap();
    for i in 0..16u8 {
        f.write_at(u64::from(i) * BLOCK, &[i + 1; BLOCK as usize]).unwrap();
    }
    let ext = fs.extents(f.ino()).unwrap();
    let pieces = 1 + ext.windows(2).filter(|w| w[0].1 + w[0].2 != w[1].1).count();
    assert!(pieces <= 2, "{pieces} pieces: {ext:?}");
    let all = f.read_all().unwrap();
    for i in 0..16usize {
        assert!(all[i * BLOCK as usize..][..BLOCK as usize].iter().all(|&b| b == i as u8 + 1));
    }
    drop(f);
    assert_clean(&fs);
}

/// Run the calling thread on `cpu` only; false if the process may not use it.
fn pin_to(cpu: usize) -> bool {
    winefs::sys::run_only_on_cpu(cpu).is_ok()
}

/// The partition (index into `Fs::alloc_stats`) holding pool block `b`.
fn partition_of(fs: &Fs, b: u64) -> usize {
    fs.alloc_stats().iter().position(|p| p.start <= b && b < p.end).expect("inside a partition")
}

#[test]
fn a_cpu_whose_partition_has_no_holes_breaks_its_own_extent_on_a_young_pool() {
    // DESIGN §4, "Each CPU in its own partition": one partition per CPU, and a thread that
    // moves from CPU 1 to CPU 0 plays two CPUs' threads in turn.
    let (_d, p) = common::fresh_pool(256 * MIB, Some(2));
    let fs = common::mount(&p);
    if !pin_to(1) {
        eprintln!("skipped: this process may not run on CPU 1");
        return;
    }
    // CPU 1 writes a small file and keeps it: the rest of the extent it broke is a hole there.
    let kept = fs.create(fs.root(), b"kept", 0o644, 0, 0).unwrap().ino;
    fs.write(kept, 0, &vec![1u8; 64 * KIB as usize]).unwrap();
    assert!(fs.alloc_stats()[1].free_hole_blocks > 0);
    assert!(pin_to(0));
    // CPU 0 writes a file and deletes it: its extent is whole again, its partition without
    // holes.
    let gone = fs.create(fs.root(), b"gone", 0o644, 0, 0).unwrap().ino;
    fs.write(gone, 0, &vec![2u8; 64 * KIB as usize]).unwrap();
    fs.unlink(fs.root(), b"gone").unwrap();
    assert_eq!(fs.alloc_stats()[0].free_hole_blocks, 0);
    // Its next file breaks one of its own extents rather than take CPU 1's hole.
    let next = fs.create(fs.root(), b"next", 0o644, 0, 0).unwrap().ino;
    for i in 0..16u64 {
        fs.write(next, i * BLOCK, &vec![3u8; BLOCK as usize]).unwrap();
    }
    let ext = fs.extents(next).unwrap();
    assert!(ext.iter().all(|e| partition_of(&fs, e.1) == 0), "{ext:?}");
    let kept_ext = fs.extents(kept).unwrap();
    assert!(kept_ext.iter().all(|e| partition_of(&fs, e.1) == 1), "{kept_ext:?}");
    assert_clean(&fs);
}

/// Bytes stored into the pool so far, all categories.
fn pool_bytes_stored(fs: &Fs) -> u64 {
    fs.write_stats().pool_bytes.iter().map(|c| c.1).sum()
}

/// The pool's bytes at pool block `pb`, read from its file (the mount's shared mapping and the
/// file's page cache are the same pages).
fn raw_block(pool: &std::path::Path, pb: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; BLOCK as usize];
    std::fs::File::open(pool).unwrap().read_exact_at(&mut b, pb * BLOCK).unwrap();
    b
}

/// Pool block holding file block `lb` of `ino`.
fn pool_block_of(fs: &Fs, ino: u64, lb: u64) -> u64 {
    let e = fs.extents(ino).unwrap();
    let &(l, p, _) = e.iter().find(|&&(l, _, n)| l <= lb && lb < l + n).expect("block is mapped");
    p + (lb - l)
}

/// An append that takes a fresh aligned unit stores its own bytes and no zeros over the rest
/// of the unit (docs/DESIGN.md §4: `fill_unit_for_write`): what the blocks held before lies
/// past the end, and nothing that shows bytes past the end — growing the file by truncate,
/// fallocate or a write past a gap, a mapping (of the file, and of it as it grows), a lease of
/// the last block or an append lease — shows any of it; after a crash too.
#[test]
fn an_append_into_a_fresh_unit_is_not_zeroed_first_and_old_bytes_never_show() {
    let (_d, p) = common::fresh_pool(48 * MIB, Some(1));
    let old_bytes = 0xA5u8;
    let large_file = |fs: &Fs| {
        // Every aligned unit left holds a deleted file's bytes.
        let old = fs.create_file("/old").unwrap();
        let chunk = vec![old_bytes; HUGE as usize];
        let mut at = 0;
        while old.write_at(at, &chunk).is_ok() {
            at += HUGE;
        }
        drop(old);
        fs.unlink_path("/old").unwrap();
        let f = fs.create_file("/log").unwrap();
        f.write_at(0, &vec![1u8; HUGE as usize]).unwrap(); // large: its next unit comes whole
        f
    };
    let fresh_unit = |fs: &Fs| {
        let f = large_file(fs);
        let before = pool_bytes_stored(fs);
        f.write_at(HUGE, &[2u8; 5000]).unwrap();
        let stored = pool_bytes_stored(fs) - before;
        assert!(stored < 64 * KIB, "the append stored {stored} bytes (zeroed its unit first?)");
        assert!(unit_aligned(fs, f.ino(), 512), "{:?}", fs.extents(f.ino()));
        f
    };
    let size = HUGE + 5000;
    let last = size / BLOCK; // file block holding the end
    let past = |fs: &Fs, ino: u64, lb: u64| raw_block(&p, pool_block_of(fs, ino, lb));
    {
        let fs = common::mount(&p);
        let f = fresh_unit(&fs);
        // The test means something: old bytes lie past the end, in the last block and after it.
        assert!(past(&fs, f.ino(), last)[(size % BLOCK) as usize..].iter().all(|&b| b == old_bytes));
        assert!(past(&fs, f.ino(), last + 8).iter().all(|&b| b == old_bytes));
        // A lease of the last block: the client maps it whole.
        let l = fs.lease(f.ino(), HUGE, 8 * KIB, false).unwrap();
        assert!(l.extents.iter().any(|e| e.0 <= last && last < e.0 + e.2), "{:?}", l.extents);
        assert!(past(&fs, f.ino(), last)[(size % BLOCK) as usize..].iter().all(|&b| b == 0));
        fs.unlease(f.ino()).unwrap();
        // An append lease maps the blocks past the end.
        let l = fs.lease_append(f.ino(), size, 64 * KIB).unwrap();
        for &(_, pb, n) in &l.extents {
            for b in pb..pb + n {
                assert!(raw_block(&p, b).iter().all(|&x| x != old_bytes), "pool block {b}");
            }
        }
        fs.unlease_append(f.ino()).unwrap();
        // A mapping of the file, then the file growing under it by a write past a gap.
        let m = f.mmap(0, 4 * HUGE as usize).unwrap();
        let grown = size + 100 * KIB;
        f.write_at(grown, &[3u8; 10]).unwrap();
        let mut page = vec![0u8; BLOCK as usize];
        let end_page = (grown + 10) / BLOCK * BLOCK;
        m.load(end_page as usize, &mut page).unwrap();
        let inblk = ((grown + 10) % BLOCK) as usize;
        assert!(page[inblk - 10..inblk].iter().all(|&b| b == 3));
        assert!(page[inblk..].iter().all(|&b| b == 0), "old bytes past the end of a mapping");
        drop(m);
        let all = f.read_all().unwrap();
        assert!(all[size as usize..grown as usize].iter().all(|&b| b == 0), "the gap");
        // Truncate and fallocate growing it.
        f.set_len(grown + 300 * KIB).unwrap();
        fs.fallocate(f.ino(), grown + 300 * KIB, 200 * KIB, false).unwrap();
        let all = f.read_all().unwrap();
        assert_eq!(all.len() as u64, grown + 500 * KIB);
        assert!(all[(grown + 10) as usize..].iter().all(|&b| b == 0), "grown by truncate, fallocate");
        drop(f);
        fs.unlink_path("/log").unwrap();
        assert_clean(&fs);
    }
    // A crash after the unit joined the file and before the append committed: the mark is
    // durable with the unit, so growing the file after the next mount shows zeros too.
    {
        let fs = common::mount(&p);
        let f = large_file(&fs);
        fs.inject_crash_before_commit(2); // the unit's transaction commits, the append's not
        assert!(f.write_at(HUGE, &[2u8; 5000]).is_err(), "cut before its commit");
        drop(f);
        drop(fs); // the crash: no clean unmount
    }
    let fs = common::mount(&p);
    let f = fs.open_file("/log").unwrap();
    assert_eq!(f.metadata().unwrap().size, HUGE);
    assert!(unit_aligned(&fs, f.ino(), 512), "the unit went: {:?}", fs.extents(f.ino()));
    assert!(past(&fs, f.ino(), 520).iter().all(|&b| b == old_bytes), "nothing to show");
    f.set_len(HUGE + MIB).unwrap();
    let all = f.read_all().unwrap();
    assert!(all[..HUGE as usize].iter().all(|&b| b == 1));
    assert!(all[HUGE as usize..].iter().all(|&b| b == 0), "old bytes after the crash");
    drop(f);
    assert_clean(&fs);
}
