//! Damaged media never becomes silent data loss: stale journal entries are never replayed,
//! damaged journal entries and undo images refuse the mount instead of a partial rollback, a
//! refused pool is byte-for-byte unchanged, the allocator snapshot is never trusted on its own,
//! and mount refuses a namespace fsck rejects.

mod common;

use common::{flip, fresh_pool, mount, patch, pattern, refused, repaired};
use std::path::Path;
use winefs::media::layout::{FileKind, Geometry};
use winefs::{Error, Fs};

const MIB: u64 = 1 << 20;

/// Change bytes of inode `ino` and reseal its checksum, as a buggy writer would leave it (the
/// namespace checks, not the checksum, must catch what follows).
fn patch_inode(p: &Path, g: &Geometry, ino: u64, field: u64, bytes: &[u8]) {
    let off = g.inode_offset(ino).unwrap();
    patch(p, off + field, bytes);
    let img = std::fs::read(p).unwrap();
    let crc = winefs::media::checksum::inode_checksum(&img[off as usize..off as usize + 256]);
    patch(p, off + 100, &crc.to_le_bytes());
}

fn ring_bytes(p: &Path, g: &Geometry) -> Vec<u8> {
    let img = std::fs::read(p).unwrap();
    let off = g.journal_offset(0) as usize;
    img[off..off + g.journal_entries as usize * 64].to_vec()
}

/// A 1-partition pool holding `/big` (2 MiB, one aligned unit) and `/small`, cleanly unmounted.
fn pool_with_files() -> (tempfile::TempDir, std::path::PathBuf, Geometry) {
    let (d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    fs.create_file("/big")
        .unwrap()
        .write_at(0, &pattern(2 * MIB as usize, 1))
        .unwrap();
    fs.create_file("/small")
        .unwrap()
        .write_at(0, &pattern(4096, 2))
        .unwrap();
    let g = fs.geometry();
    fs.unmount().unwrap();
    (d, p, g)
}

/// A strict 8 KiB overwrite of `/big` at 64 KiB interrupted after its in-place writes and
/// before its COMMIT, leaving the pool not clean.
fn interrupted_overwrite(p: &Path) {
    let fs = mount(p);
    let f = fs.open_file("/big").unwrap();
    fs.inject_crash_before_commit(1);
    assert!(f.write_at(64 << 10, &[0xee; 8192]).is_err());
    drop(f);
    drop(fs); // poisoned: not marked clean, like a crash
}

fn big_is_intact(fs: &Fs) {
    let f = fs.open_file("/big").unwrap();
    assert!(
        f.read_all().unwrap() == pattern(2 * MIB as usize, 1),
        "/big lost its content"
    );
}

#[test]
fn a_clean_unmount_clears_the_journals_so_old_entries_are_never_replayed() {
    let (_d, p, g) = pool_with_files();
    assert!(
        ring_bytes(&p, &g).iter().all(|&b| b == 0),
        "a clean unmount left journal entries"
    );
    // Entries left by a mount that crashed, then recovered by the next mount.
    let fs = mount(&p);
    fs.create_file("/c").unwrap().write_at(0, b"c").unwrap();
    fs.simulate_crash();
    let stale = ring_bytes(&p, &g);
    assert!(stale.iter().any(|&b| b != 0));
    drop(mount(&p));
    // Put the old mount's entries back (as if clearing had been lost) and damage every COMMIT:
    // each of its finished transactions would look unfinished, but the entries belong to an
    // old epoch and must be ignored.
    let mut old = stale.clone();
    for e in old.chunks_exact_mut(64) {
        if e[12] == winefs::media::journal::KIND_COMMIT {
            e[20] ^= 0x40;
        }
    }
    patch(&p, g.journal_offset(0), &old);
    let fs = mount(&p);
    assert!(fs.recovery_report().rolled_back.is_empty());
    big_is_intact(&fs);
    assert_eq!(fs.stat_path("/c").unwrap().size, 1);
    assert!(fs.check().is_clean());
}

#[test]
fn an_interrupted_overwrite_rolls_back_whole() {
    let (_d, p, _g) = pool_with_files();
    interrupted_overwrite(&p);
    let fs = mount(&p);
    assert_eq!(fs.recovery_report().rolled_back.len(), 1);
    big_is_intact(&fs);
}

#[test]
fn a_damaged_staged_undo_image_refuses_the_mount_and_leaves_the_pool_unchanged() {
    let (_d, p, g) = pool_with_files();
    interrupted_overwrite(&p);
    // The 8 KiB undo image sits at the start of the staging area.
    flip(&p, g.staging_offset(0) + 100, 0x01);
    let msg = refused(&p, "fails its checksum");
    assert!(msg.contains("journal 0 entry"), "{msg}");
    // fsck (read-only) refuses it too, and writes nothing either.
    let before = std::fs::read(&p).unwrap();
    assert!(winefs::state::fsck::check_pool(&p).is_err());
    assert!(std::fs::read(&p).unwrap() == before);
    // Repaired by hand, the same pool recovers completely.
    flip(&p, g.staging_offset(0) + 100, 0x01);
    let fs = mount(&p);
    assert_eq!(fs.recovery_report().rolled_back.len(), 1);
    big_is_intact(&fs);
}

#[test]
fn an_unreadable_undo_entry_refuses_instead_of_a_partial_rollback() {
    let (_d, p, g) = pool_with_files();
    interrupted_overwrite(&p);
    let ring = ring_bytes(&p, &g);
    let undo = ring
        .chunks_exact(64)
        .position(|e| e[12] == winefs::media::journal::KIND_UNDO_STAGED)
        .expect("the overwrite logged a staged undo entry") as u64;
    flip(&p, g.journal_offset(0) + undo * 64 + 40, 0x10);
    refused(&p, &format!("journal 0 entry {undo}: unreadable"));
}

#[test]
fn a_damaged_state_record_takes_the_epoch_from_the_journals() {
    let (_d, p, _g) = pool_with_files();
    interrupted_overwrite(&p);
    // The state record (superblock byte 200: the mount count) fails its checksum now.
    flip(&p, 200, 0x01);
    let fs = mount(&p);
    let r = fs.recovery_report();
    assert_eq!(r.rolled_back.len(), 1, "{r:?}");
    assert!(
        r.notes.iter().any(|n| n.contains("state record")),
        "{:?}",
        r.notes
    );
    big_is_intact(&fs);
    assert!(fs.check().is_clean());
}

#[test]
fn a_damaged_allocator_snapshot_is_rebuilt_never_trusted() {
    let (_d, p, g) = pool_with_files();
    // Mark /big's first block free in the saved bitmap: trusted, it would be given to another
    // file.
    let fs = mount(&p);
    let big = fs.resolve("/big", true).unwrap();
    let phys = fs.extents(big).unwrap()[0].1;
    fs.unmount().unwrap();
    let bit = phys - g.data_start;
    flip(&p, g.bitmap_start * 4096 + bit / 8, 1 << (bit % 8));
    let fs = mount(&p);
    assert!(
        fs.recovery_report()
            .notes
            .iter()
            .any(|n| n.contains("allocator bitmap")),
        "{:?}",
        fs.recovery_report().notes
    );
    // Fill the pool: no block of /big may be handed out again.
    let mut k = 0;
    while let Ok(f) = fs.create_file(&format!("/fill{k}")) {
        if f.write_at(0, &pattern(MIB as usize, 9)).is_err() {
            break;
        }
        k += 1;
    }
    big_is_intact(&fs);
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
}

/// Byte offset in the pool image of the directory entry naming `name` (unique in the image).
fn dentry_offset(img: &[u8], name: &[u8]) -> usize {
    let at = img
        .windows(name.len())
        .position(|w| w == name)
        .expect("the name is in the pool");
    at - 16
}

fn reseal_dentry(img: &mut [u8], e: usize, name_len: usize) {
    let mut crc_in = img[e..e + 12].to_vec();
    crc_in.extend_from_slice(&img[e + 16..e + 16 + name_len]);
    let crc = crc32c::crc32c(&crc_in);
    img[e + 12..e + 16].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn mount_refuses_an_entry_whose_type_disagrees_with_its_inode() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    fs.mknod(fs.root(), b"pipe-xq7", FileKind::Fifo, 0o644, 0, 0, 0)
        .unwrap();
    fs.unmount().unwrap();
    // The entry says "regular file" (kind 1) for an inode that is a FIFO; the entry's own
    // checksum is made to match, as a buggy writer would leave it.
    let mut img = std::fs::read(&p).unwrap();
    let e = dentry_offset(&img, b"pipe-xq7");
    img[e + 9] = 1;
    reseal_dentry(&mut img, e, 8);
    std::fs::write(&p, &img).unwrap();
    let msg = refused(&p, "\"pipe-xq7\" says");
    assert!(msg.contains("winefs fsck"), "{msg}");
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems.iter().any(|x| x.contains("pipe-xq7")),
        "{:?}",
        rep.problems
    );
}

#[test]
fn mount_refuses_a_wrong_link_count() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/linked").unwrap();
    let ino = f.ino();
    drop(f);
    fs.link(ino, fs.root(), b"second").unwrap();
    let g = fs.geometry();
    fs.unmount().unwrap();
    // nlink is inode byte 16; set it to 1 while two entries name the inode.
    patch_inode(&p, &g, ino, 16, &1u32.to_le_bytes());
    refused(&p, &format!("inode {ino}: link count 1 but 2 directory entries"));
}

#[test]
fn fsck_finds_a_damaged_xattr_block() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/x").unwrap();
    fs.setxattr(f.ino(), b"user.tag", b"value-q9z", winefs::XattrSet::Any)
        .unwrap();
    drop(f);
    fs.unmount().unwrap();
    let img = std::fs::read(&p).unwrap();
    let at = img
        .windows(9)
        .position(|w| w == b"value-q9z")
        .expect("the value is in the pool") as u64;
    flip(&p, at, 0x20);
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems.iter().any(|x| x.contains("xattr block")),
        "{:?}",
        rep.problems
    );
    // Mounted, the damage is an error on that file's xattrs, never the wrong value.
    let fs = mount(&p);
    let ino = fs.resolve("/x", true).unwrap();
    assert!(fs.getxattr(ino, b"user.tag").is_err());
}

#[test]
fn repair_fixes_link_counts_types_dangling_and_nameless_inodes() {
    // A link count too low, and a named inode whose count says 0 (never freed as an orphan).
    for bad in [1u32, 0] {
        let (_d, p) = fresh_pool(32 * MIB, Some(1));
        let fs = mount(&p);
        let f = fs.create_file("/linked").unwrap();
        f.write_at(0, b"keep me").unwrap();
        let ino = f.ino();
        drop(f);
        fs.link(ino, fs.root(), b"second").unwrap();
        let g = fs.geometry();
        fs.unmount().unwrap();
        patch_inode(&p, &g, ino, 16, &bad.to_le_bytes());
        refused(&p, &format!("inode {ino}: link count {bad}"));
        repaired(&p, &format!("link count was {bad}; set to 2"));
        let fs = mount(&p);
        assert_eq!(fs.open_file("/second").unwrap().read_all().unwrap(), b"keep me");
    }
    // A mistyped entry.
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    fs.mknod(fs.root(), b"pipe-xq7", FileKind::Fifo, 0o644, 0, 0, 0)
        .unwrap();
    fs.unmount().unwrap();
    let mut img = std::fs::read(&p).unwrap();
    let e = dentry_offset(&img, b"pipe-xq7");
    img[e + 9] = 1;
    reseal_dentry(&mut img, e, 8);
    std::fs::write(&p, &img).unwrap();
    repaired(&p, "is Fifo, and the entry now says so");
    let fs = mount(&p);
    assert_eq!(fs.stat_path("/pipe-xq7").unwrap().kind, FileKind::Fifo);
    drop(fs);
    // An entry naming a freed inode, and an inode no entry names.
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let gone = fs.create_file("/gone-k1").unwrap().ino();
    let lost = fs.create_file("/lost-k2").unwrap();
    lost.write_at(0, b"found again").unwrap();
    let lost_ino = lost.ino();
    drop(lost);
    let g = fs.geometry();
    let root_block = fs.extents(fs.root()).unwrap()[0].1;
    fs.unmount().unwrap();
    patch(&p, g.inode_offset(gone).unwrap(), &0u32.to_le_bytes()); // in-use flag cleared
    let img = std::fs::read(&p).unwrap();
    let e = dentry_offset(&img, b"lost-k2") as u64;
    let slot = (e - root_block * 4096) / 64;
    let starts_at = root_block * 4096 + 8;
    let mut starts =
        u64::from_le_bytes(img[starts_at as usize..starts_at as usize + 8].try_into().unwrap());
    starts &= !(1u64 << slot); // the entry is gone
    patch(&p, starts_at, &starts.to_le_bytes());
    refused(&p, "");
    let rep = repaired(&p, "which named free inode");
    assert!(
        rep.changes
            .iter()
            .any(|c| c.contains(&format!("linked as /lost+found/#{lost_ino}"))),
        "{:?}",
        rep.changes
    );
    let fs = mount(&p);
    assert_eq!(
        fs.open_file(&format!("/lost+found/#{lost_ino}"))
            .unwrap()
            .read_all()
            .unwrap(),
        b"found again"
    );
    assert!(fs.stat_path("/gone-k1").is_err());
}

#[test]
fn a_damaged_inode_fails_its_checksum_is_refused_and_repair_judges_it() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/victim").unwrap();
    f.write_at(0, &pattern(10_000, 4)).unwrap();
    let ino = f.ino();
    drop(f);
    fs.create_file("/bystander").unwrap().write_at(0, b"fine").unwrap();
    let g = fs.geometry();
    fs.unmount().unwrap();
    let off = g.inode_offset(ino).unwrap();
    let raw = std::fs::read(&p).unwrap()[off as usize..off as usize + 256].to_vec();
    assert!(winefs::media::checksum::inode_checksum_ok(&raw), "sealed on media");
    // The size field grows by one byte: without the checksum, reads would return a zero.
    flip(&p, off + 24, 0x01);
    refused(&p, &format!("inode {ino} fails its checksum"));
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(rep.problems.iter().any(|x| x.contains(&format!("inode {ino} fails its checksum"))));
    // Every field still passes every check, so repair keeps the inode (e2fsck's rule) and says
    // that its content cannot be verified: the size is now one byte more.
    repaired(&p, &format!("inode {ino}: checksum rewritten"));
    let fs = mount(&p);
    let got = fs.open_file("/victim").unwrap().read_all().unwrap();
    assert_eq!(got.len(), 10_001);
    assert_eq!(&got[..10_000], &pattern(10_000, 4)[..]);
    assert_eq!(fs.open_file("/bystander").unwrap().read_all().unwrap(), b"fine");
    drop(fs);
    // A file type that does not exist is a field no check passes: the inode is freed.
    let img = std::fs::read(&p).unwrap();
    let mode = u32::from_le_bytes(img[off as usize + 4..off as usize + 8].try_into().unwrap());
    patch(&p, off + 4, &((mode & 0o7777) | 0o030000).to_le_bytes());
    refused(&p, &format!("inode {ino} fails its checksum"));
    repaired(&p, &format!("inode {ino} failed its checksum; freed"));
    let fs = mount(&p);
    assert!(fs.stat_path("/victim").is_err(), "the damaged file's entry is gone");
    assert_eq!(fs.open_file("/bystander").unwrap().read_all().unwrap(), b"fine");
}

#[test]
fn a_damaged_symlink_target_is_an_error_not_a_wrong_target() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    fs.symlink(fs.root(), b"ln", b"target-zq8/file", 0, 0).unwrap();
    fs.unmount().unwrap();
    let img = std::fs::read(&p).unwrap();
    let at = img
        .windows(15)
        .position(|w| w == b"target-zq8/file")
        .unwrap() as u64;
    flip(&p, at + 3, 0x02);
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems.iter().any(|x| x.contains("target fails its checksum")),
        "{:?}",
        rep.problems
    );
    let fs = mount(&p);
    let l = fs.resolve("/ln", false).unwrap();
    assert!(matches!(fs.readlink(l), Err(Error::Corrupted(_))));
}

/// A 1-partition pool with `/frag` (12 one-block extents, so an extent-index block holds four)
/// and `/d/a`, `/d/b`; returns the pool, the index block, frag's inode and `/d`'s inode.
fn pool_with_index_block() -> (tempfile::TempDir, std::path::PathBuf, u64, u64, u64, Geometry) {
    let (d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/frag").unwrap();
    for k in 0..12u64 {
        f.write_at(k * 8192, &pattern(4096, k as u8)).unwrap();
    }
    let ino = f.ino();
    drop(f);
    fs.mkdir_path("/d").unwrap();
    fs.create_file("/d/a").unwrap().write_at(0, b"a").unwrap();
    fs.create_file("/d/b").unwrap().write_at(0, b"b").unwrap();
    let dino = fs.resolve("/d", true).unwrap();
    let g = fs.geometry();
    fs.unmount().unwrap();
    let img = std::fs::read(&p).unwrap();
    let off = g.inode_offset(ino).unwrap() as usize + 48;
    let ib = u64::from_le_bytes(img[off..off + 8].try_into().unwrap());
    assert!(g.is_data_block(ib), "twelve extents need an index block");
    (d, p, ib, ino, dino, g)
}

#[test]
fn a_damaged_extent_index_block_is_refused_reported_and_resealed_by_repair() {
    let (_d, p, ib, ino, _, _) = pool_with_index_block();
    // The top bit of a live record's logical block: the record would read as dead (beyond the
    // map end) and its data as a hole, structurally valid — only the checksum tells.
    let img = std::fs::read(&p).unwrap();
    let slot = (0..255u64)
        .map(|s| ib * 4096 + 16 + s * 16)
        .find(|&o| img[o as usize + 4..o as usize + 8] != [0; 4])
        .unwrap();
    let logical = u64::from(u32::from_le_bytes(
        img[slot as usize..slot as usize + 4].try_into().unwrap(),
    ));
    flip(&p, slot + 3, 0x80);
    let msg = refused(&p, &format!("inode {ino}: extent-index block {ib} fails its checksum"));
    assert!(msg.contains("the pool was not changed"), "{msg}");
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems.iter().any(|x| x.contains(&format!("extent-index block {ib} fails its checksum"))),
        "{:?}",
        rep.problems
    );
    // Leaving the block would leave a pool no mount accepts: repair reseals it as e2fsck
    // would, and says that the record which now reads as dead is dropped.
    let fixed = Fs::repair_pool(&p).unwrap();
    assert!(fixed.left.is_empty(), "{fixed:?}");
    assert!(
        fixed.changes.iter().any(|c| c.contains(&format!("inode {ino}: extent-index blocks [{ib}] failed their checksum; resealed"))
            && c.contains("1 records there read as beyond the map end and are dropped")),
        "{fixed:?}"
    );
    assert!(winefs::state::fsck::check_pool(&p).unwrap().is_clean());
    // The dropped record's block reads as a hole; the pool is writable again.
    let fs = mount(&p);
    let mut b = vec![1u8; 4096];
    fs.read(ino, logical * 4096, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "the dropped record's block is a hole");
    fs.write(ino, logical * 4096, b"again").unwrap();
    fs.unmount().unwrap();
    assert!(winefs::state::fsck::check_pool(&p).unwrap().is_clean());
}

#[test]
fn a_damaged_directory_header_is_refused_reported_and_rebuilt_by_repair() {
    // The header's checksum damaged: the rebuilt header keeps every entry.
    let (_d, p, _, _, dino, g) = pool_with_index_block();
    let fs = mount(&p);
    let phys = fs.extents(dino).unwrap()[0].1;
    fs.unmount().unwrap();
    flip(&p, phys * 4096 + 5, 0x10);
    let what = format!("directory {dino}: the header of block 0 fails its checksum");
    refused(&p, &what);
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(rep.problems.iter().any(|x| x.contains(&what)), "{:?}", rep.problems);
    repaired(&p, &format!("directory {dino}: the header of block 0 failed its checksum; rewritten from the 2 valid entries"));
    let fs = mount(&p);
    assert_eq!(fs.open_file("/d/a").unwrap().read_all().unwrap(), b"a");
    assert_eq!(fs.open_file("/d/b").unwrap().read_all().unwrap(), b"b");
    fs.unmount().unwrap();
    // A `starts` bit set on a slot holding no entry: dropped by the rebuild, nothing lost.
    flip(&p, phys * 4096 + 8 + 1, 0x40);
    refused(&p, &what);
    repaired(&p, "rewritten from the 2 valid entries");
    let fs = mount(&p);
    let mut names = fs.list_dir("/d").unwrap();
    names.sort();
    assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec()]);
    assert!(fs.check().is_clean());
    let _ = g;
}

/// The inode tables are scanned by several threads, each over its own range: damage in a later
/// range is found as well, and the refusal names the lowest damaged inode first, as a scan in
/// one thread would.
#[test]
fn damage_in_every_range_of_the_inode_scan_is_found_lowest_first() {
    let (_d, p) = common::fresh_pool_with(&winefs::MkfsOptions {
        size: Some(64 * MIB),
        partitions: Some(2),
        inodes: Some(40_000),
        ..Default::default()
    });
    let fs = mount(&p);
    let f = fs.create_file("/victim").unwrap();
    f.write_at(0, b"data").unwrap();
    let victim = f.ino();
    drop(f);
    let g = fs.geometry();
    fs.unmount().unwrap();
    // A free slot at the other end of the tables from the file (whose partition follows the
    // CPU it was made on), marked in use: it fails its checksum.
    let total = g.total_inodes();
    let far = if victim > total / 2 { 100 } else { total - 3 };
    flip(&p, g.inode_offset(far).unwrap(), 0x01);
    refused(&p, &format!("inode {far} fails its checksum"));
    flip(&p, g.inode_offset(victim).unwrap() + 24, 0x01);
    let (low, high) = (victim.min(far), victim.max(far));
    assert!(high - low > 19_000, "{low} {high}");
    let why = refused(&p, &format!("inode {low} fails its checksum (and 1 more inodes)"));
    assert!(!why.contains(&format!("inode {high}")), "{why}");
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    for ino in [low, high] {
        let what = format!("inode {ino} fails its checksum");
        assert!(rep.problems.iter().any(|x| x.contains(&what)), "{:?}", rep.problems);
    }
}
