//! Direct-path leases in the core (docs/DESIGN.md §7b), through the library API the mount's
//! channel uses: a lease fills holes (aligned units for large ranges), pins the file's blocks
//! (no rewrite, no scatter, strict writes in place, no collapse), quarantines what the file
//! gives up until the last lease goes, and keeps an unlinked file alive.

mod common;

use common::{fresh_pool, mount};
use winefs::{Error, Fs, MountOptions};

const MIB: u64 = 1 << 20;

fn free(fs: &Fs) -> u64 {
    fs.statfs().free_blocks
}

#[test]
fn a_large_lease_of_a_sparse_file_fills_it_with_aligned_units_and_a_no_fill_lease_fills_nothing() {
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/sparse").unwrap();
    f.set_len(8 * MIB).unwrap();
    let l = fs.lease(f.ino(), 0, 8 * MIB, false).unwrap();
    assert!(l.extents.is_empty(), "a no-fill lease of a sparse file filled {:?}", l.extents);
    let l = fs.lease(f.ino(), 0, 8 * MIB, true).unwrap();
    assert_eq!(l.size, 8 * MIB);
    let blocks: u64 = l.extents.iter().map(|e| e.2).sum();
    assert_eq!(blocks, 2048, "extents {:?}", l.extents);
    for &(fb, pb, n) in &l.extents {
        assert!(fb.is_multiple_of(512) && pb.is_multiple_of(512) && n.is_multiple_of(512), "unaligned extent {fb} {pb} {n}");
    }
    assert_eq!(fs.leases_held(), 2);
    fs.unlease(f.ino()).unwrap();
    fs.unlease(f.ino()).unwrap();
    assert_eq!(fs.leases_held(), 0);
    assert!(fs.unlease(f.ino()).is_err(), "a lease given back twice");
    drop(f);
    fs.unmount().unwrap();
}

#[test]
fn a_large_lease_moves_a_few_scattered_blocks_onto_an_aligned_unit_unless_another_lease_pins_them() {
    // LMDB writes its 8 KiB header, then ftruncates to the map size and maps it: on an aged
    // pool the header sits on scattered blocks, and unit 0 would be mapped 4 KiB at a time.
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/env").unwrap();
    f.write_at(0, &[5u8; 8192]).unwrap();
    fs.scatter(f.ino()).unwrap();
    f.set_len(8 * MIB).unwrap();
    // Pinned by another lease: left where it is, the rest of the unit filled around it.
    fs.lease(f.ino(), 0, 8192, false).unwrap();
    let l = fs.lease(f.ino(), 0, 8 * MIB, true).unwrap();
    assert!(l.extents.iter().any(|e| e.0 == 0 && e.2 < 512), "moved under a lease: {:?}", l.extents);
    fs.unlease(f.ino()).unwrap();
    fs.unlease(f.ino()).unwrap();
    let g = fs.create_file("/env2").unwrap();
    g.write_at(0, &[6u8; 8192]).unwrap();
    fs.scatter(g.ino()).unwrap();
    g.set_len(8 * MIB).unwrap();
    let l = fs.lease(g.ino(), 0, 8 * MIB, true).unwrap();
    assert_eq!(l.extents[0].0, 0);
    assert!(l.extents[0].1.is_multiple_of(512) && l.extents[0].2 >= 512, "unit 0 not aligned: {:?}", l.extents);
    let mut back = [0u8; 8192];
    fs.read(g.ino(), 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 6), "the header's bytes did not move with it");
    fs.unlease(g.ino()).unwrap();
    drop((f, g));
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn blocks_a_leased_file_gives_up_wait_in_quarantine_until_the_last_lease_goes() {
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/q").unwrap();
    f.write_at(0, &vec![7u8; 4 * MIB as usize]).unwrap();
    let before = free(&fs);
    let l = fs.lease(f.ino(), 0, 4 * MIB, true).unwrap();
    fs.lease(f.ino(), 0, MIB, true).unwrap();
    f.set_len(0).unwrap();
    assert_eq!(free(&fs), before, "truncated blocks of a leased file went back to the allocator");
    assert!(fs.quarantined_blocks() >= 1024);
    // No new file gets them.
    let g2 = fs.create_file("/other").unwrap();
    g2.write_at(0, &vec![1u8; 4 * MIB as usize]).unwrap();
    let theirs = fs.extents(g2.ino()).unwrap();
    for &(_, p, n) in &theirs {
        for &(_, lp, ln) in &l.extents {
            assert!(p + n <= lp || lp + ln <= p, "a quarantined block went to another file");
        }
    }
    fs.unlease(f.ino()).unwrap();
    assert!(fs.quarantined_blocks() >= 1024, "the first of two leases let the blocks go");
    fs.unlease(f.ino()).unwrap();
    assert_eq!(fs.quarantined_blocks(), 0);
    drop((f, g2));
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn a_leased_file_is_pinned_and_an_unlinked_one_lives_until_its_lease_goes() {
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/pinned").unwrap();
    f.write_at(0, &vec![3u8; 4 * MIB as usize]).unwrap();
    fs.scatter(f.ino()).unwrap(); // fragmented: a rewrite would move it
    let ino = f.ino();
    let l = fs.lease(ino, 0, 4 * MIB, true).unwrap();
    assert_eq!(fs.rewrite(ino).unwrap().units_rewritten, 0, "a leased file was rewritten");
    assert!(matches!(fs.scatter(ino), Err(Error::Busy(_))));
    assert!(matches!(fs.collapse_range(ino, 0, MIB), Err(Error::Busy(_))));
    // Strict overwrites land in place (a client maps the blocks), not copied on write.
    f.write_at(4096, &[9u8; 8192]).unwrap();
    assert_eq!(fs.extents(ino).unwrap(), l.extents, "an overwrite moved a leased file's blocks");
    drop(f);
    let before = free(&fs);
    fs.unlink_path("/pinned").unwrap();
    assert_eq!(free(&fs), before, "an unlinked, leased file was freed");
    assert_eq!(fs.getattr(ino).unwrap().size, 4 * MIB);
    fs.unlease(ino).unwrap();
    assert!(free(&fs) >= before + 1024, "the unlinked file was not freed with its last lease");
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn compaction_moves_no_block_of_a_leased_file() {
    let (_d, p) = fresh_pool(96 * MIB, Some(1));
    let opts = MountOptions { no_background_rewrite: true, ..Default::default() };
    let fs = Fs::mount(&p, opts).unwrap();
    // Small files over several units, most deleted: broken, sparse units compaction would empty.
    let mut kept = Vec::new();
    for i in 0..600u64 {
        let f = fs.create_file(&format!("/f{i}")).unwrap();
        f.write_at(0, &vec![i as u8; 4096 * (1 + (i * 7 % 24) as usize)]).unwrap();
        if i % 5 == 0 {
            kept.push(f.ino());
        }
    }
    for i in (0..600u64).filter(|i| i % 5 != 0) {
        fs.unlink_path(&format!("/f{i}")).unwrap();
    }
    let before: Vec<_> = kept.iter().map(|&i| fs.extents(i).unwrap()).collect();
    for &i in &kept {
        fs.lease(i, 0, 1 << 20, true).unwrap();
    }
    let st = fs.compact().unwrap();
    let after: Vec<_> = kept.iter().map(|&i| fs.extents(i).unwrap()).collect();
    assert_eq!(before, after, "compaction moved a leased file's blocks ({st:?})");
    for &i in &kept {
        fs.unlease(i).unwrap();
    }
    // Without the leases the same pool compacts: the test set-up did leave work to do.
    let st = fs.compact().unwrap();
    assert!(st.units_freed > 0, "nothing to compact even without leases: {st:?}");
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn a_lease_that_finds_no_space_to_fill_is_refused_whole_and_a_no_fill_lease_still_works() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let big = fs.create_file("/big").unwrap();
    let chunk = vec![1u8; MIB as usize];
    let mut off = 0;
    while big.write_at(off, &chunk).is_ok_and(|n| n == chunk.len()) {
        off += MIB;
    }
    let f = fs.create_file("/sparse").unwrap();
    f.set_len(16 * MIB).unwrap();
    assert!(matches!(fs.lease(f.ino(), 0, 16 * MIB, true), Err(Error::NoSpace(_))));
    assert_eq!(fs.leases_held(), 0, "a refused lease is held");
    let l = fs.lease(f.ino(), 0, 16 * MIB, false).unwrap();
    assert_eq!(l.size, 16 * MIB);
    fs.unlease(f.ino()).unwrap();
    drop((big, f));
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}
