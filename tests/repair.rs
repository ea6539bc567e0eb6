//! `fsck --repair` for blocks two inodes claim, inodes whose checksum fails, and a stale
//! allocator snapshot: mount refuses (pool unchanged), fsck names what it finds, repair fixes
//! what needs no guessing with a report line per change, and the pool then mounts and checks
//! clean.

mod common;

use common::{fresh_pool, mount, patch, pattern, refused, repaired};
use std::path::Path;
use std::process::Command;
use winefs::media::layout::{ExtentRecord, Geometry, ino};
use winefs::Fs;

const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_winefs");

/// The 256 bytes of inode `n`.
fn inode_bytes(p: &Path, g: &Geometry, n: u64) -> Vec<u8> {
    let off = g.inode_offset(n).unwrap() as usize;
    std::fs::read(p).unwrap()[off..off + 256].to_vec()
}

/// Rewrite inode `n`'s checksum to match its bytes, as a buggy writer would leave it.
fn reseal(p: &Path, g: &Geometry, n: u64) {
    let crc = winefs::media::checksum::inode_checksum(&inode_bytes(p, g, n));
    patch(p, g.inode_offset(n).unwrap() + ino::CRC as u64, &crc.to_le_bytes());
}

/// Point inode `n`'s inline extent record for logical block `logical` at pool block `phys`
/// (checksum resealed: the damage is a wrong claim, not a torn inode).
fn repoint(p: &Path, g: &Geometry, n: u64, logical: u32, phys: u64) {
    let raw = inode_bytes(p, g, n);
    let slot = (0..8)
        .find(|s| {
            let o = ino::SLOTS + s * 16;
            let r = ExtentRecord::decode(&raw[o..o + 16]);
            r.len > 0 && r.logical == logical
        })
        .expect("an inline record at that logical block");
    let o = ino::SLOTS + slot * 16;
    let mut r = ExtentRecord::decode(&raw[o..o + 16]);
    r.phys = phys;
    patch(p, g.inode_offset(n).unwrap() + o as u64, &r.encode());
    reseal(p, g, n);
}

fn fsck_cli(p: &Path, repair: bool) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.arg("fsck").arg(p);
    if repair {
        c.arg("--repair");
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned()
        + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn clean(p: &Path) {
    let fs = mount(p);
    assert!(fs.check().is_clean(), "{:?}", fs.check().problems);
    drop(fs);
    let r = winefs::state::fsck::check_pool(p).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// `/a` (3 blocks) and `/b` (2 blocks), each one extent; returns their inodes and first blocks.
fn two_files(p: &Path) -> (Geometry, [(u64, u64); 2]) {
    let fs = mount(p);
    let mut out = [(0, 0); 2];
    for (i, (name, len, seed)) in [("/a", 3 * 4096, 1u8), ("/b", 2 * 4096, 2)].iter().enumerate() {
        let f = fs.create_file(name).unwrap();
        f.write_at(0, &pattern(*len, *seed)).unwrap();
        out[i] = (f.ino(), fs.extents(f.ino()).unwrap()[0].1);
    }
    let g = fs.geometry();
    fs.unmount().unwrap();
    (g, out)
}

#[test]
fn a_block_two_files_claim_is_refused_reported_and_cloned() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(a, a_blk), (b, _)]) = two_files(&p);
    // /b's first extent (2 blocks) now points at /a's first two blocks.
    repoint(&p, &g, b, 0, a_blk);
    let line = format!(
        "blocks {a_blk}..{} claimed by inode {a} (data, logical 0) and inode {b} (data, logical 0)",
        a_blk + 1
    );
    refused(&p, &line);
    let before = std::fs::read(&p).unwrap();
    let r = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(r.problems.contains(&line), "{:?}", r.problems);
    let (code, out) = fsck_cli(&p, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&line), "{out}");
    assert!(std::fs::read(&p).unwrap() == before, "fsck wrote to the pool");
    // Repair: /b gets its own copy of what it saw (the shared blocks' content).
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("repaired: inode {b}: cloned 2 shared blocks (logical 0..1) from {a_blk} to ")),
        "{out}"
    );
    clean(&p);
    let fs = mount(&p);
    assert_eq!(fs.open_file("/a").unwrap().read_all().unwrap(), pattern(3 * 4096, 1));
    assert_eq!(
        fs.open_file("/b").unwrap().read_all().unwrap(),
        pattern(3 * 4096, 1)[..2 * 4096].to_vec()
    );
    assert_ne!(fs.extents(b).unwrap()[0].1, a_blk, "its own blocks now");
    // The copies are independent.
    fs.open_file("/b").unwrap().write_at(0, b"only b").unwrap();
    assert_eq!(fs.open_file("/a").unwrap().read_all().unwrap(), pattern(3 * 4096, 1));
}

#[test]
fn a_file_claiming_another_files_index_block_gets_a_copy_and_the_index_stays() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    // Twelve separate extents: more than the eight inline slots, so an index block exists.
    let frag = fs.create_file("/frag").unwrap();
    for k in 0..12u64 {
        frag.write_at(k * 8192, &pattern(4096, k as u8)).unwrap();
        fs.create_file(&format!("/gap{k}")).unwrap().write_at(0, b"x").unwrap();
    }
    let frag_ino = frag.ino();
    let frag_content = frag.read_all().unwrap();
    drop(frag);
    let small = fs.create_file("/small").unwrap();
    small.write_at(0, &pattern(4096, 77)).unwrap();
    let small_ino = small.ino();
    drop(small);
    let g = fs.geometry();
    fs.unmount().unwrap();
    let raw = inode_bytes(&p, &g, frag_ino);
    let index = u64::from_le_bytes(raw[ino::INDEX_BLOCK..ino::INDEX_BLOCK + 8].try_into().unwrap());
    assert_ne!(index, 0);
    repoint(&p, &g, small_ino, 0, index);
    refused(&p, &format!("block {index} claimed by"));
    repaired(&p, &format!("inode {small_ino}: cloned 1 shared blocks (logical 0..0) from {index}"));
    clean(&p);
    let fs = mount(&p);
    assert_eq!(fs.open_file("/frag").unwrap().read_all().unwrap(), frag_content);
}

#[test]
fn two_index_chains_sharing_a_block_are_left_unrepaired() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let mut inos = Vec::new();
    for name in ["/f1", "/f2"] {
        let f = fs.create_file(name).unwrap();
        for k in 0..10u64 {
            f.write_at(k * 8192, &pattern(4096, k as u8)).unwrap();
            fs.create_file(&format!("{name}-gap{k}")).unwrap().write_at(0, b"x").unwrap();
        }
        inos.push(f.ino());
    }
    let g = fs.geometry();
    fs.unmount().unwrap();
    // f2's index block chain starts at f1's (a resealed header: deliberate-looking damage).
    let i1 = u64::from_le_bytes(
        inode_bytes(&p, &g, inos[0])[ino::INDEX_BLOCK..ino::INDEX_BLOCK + 8].try_into().unwrap(),
    );
    patch(&p, g.inode_offset(inos[1]).unwrap() + ino::INDEX_BLOCK as u64, &i1.to_le_bytes());
    reseal(&p, &g, inos[1]);
    // f1's records in that block (logical 16 and 18) do not overlap f2's inline ones (0..14).
    refused(&p, &format!("claimed by inode {} (extent-index block) and inode {} (extent-index block)", inos[0], inos[1]));
    let r = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(r.problems.iter().any(|x| x.contains("(extent-index block)")), "{:?}", r.problems);
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("not repaired: two extent maps cannot share an index block"), "{out}");
    assert!(!out.contains("cloned"), "nothing of the two is copied: {out}");
    // Neither map is touched: the pool is still refused for the same reason.
    refused(&p, "(extent-index block)");
    let fs = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(fs.problems.iter().any(|x| x.contains("(extent-index block)")));
}

#[test]
fn no_space_for_the_copy_is_left_unrepaired() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let big = fs.create_file("/big").unwrap();
    big.write_at(0, &pattern(2 * MIB as usize, 5)).unwrap();
    let big_ino = big.ino();
    drop(big);
    let other = fs.create_file("/other").unwrap();
    other.write_at(0, &pattern(4096, 6)).unwrap();
    let other_ino = other.ino();
    drop(other);
    let mut k = 0;
    while let Ok(f) = fs.create_file(&format!("/fill{k}")) {
        if f.write_at(0, &pattern(MIB as usize, 9)).is_err() {
            break;
        }
        k += 1;
    }
    let g = fs.geometry();
    let big_blk = fs.extents(big_ino).unwrap()[0].1;
    fs.unmount().unwrap();
    // /other's one-block extent becomes 256 blocks of /big's (blocks past its size, as
    // preallocation would be): a copy needs 256 blocks, and the pool has almost none.
    repoint(&p, &g, other_ino, 0, big_blk);
    let raw = inode_bytes(&p, &g, other_ino);
    let slot = (0..8)
        .find(|s| ExtentRecord::decode(&raw[ino::SLOTS + s * 16..ino::SLOTS + s * 16 + 16]).len > 0)
        .unwrap();
    let at = g.inode_offset(other_ino).unwrap();
    patch(&p, at + (ino::SLOTS + slot * 16 + 4) as u64, &256u32.to_le_bytes());
    patch(&p, at + ino::MAP_END as u64, &256u64.to_le_bytes());
    reseal(&p, &g, other_ino);
    refused(&p, &format!("claimed by inode {big_ino} (data, logical 0) and inode {other_ino} (data, logical 0)"));
    let rep = Fs::repair_pool(&p).unwrap();
    assert!(
        rep.left
            .iter()
            .any(|l| l.starts_with(&format!("inode {other_ino}: 256 shared blocks (logical 0..255) not copied: no space"))),
        "{:?} / {:?}",
        rep.left,
        rep.changes
    );
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 3, "{out}");
    refused(&p, "claimed by");
}

#[test]
fn an_inode_whose_checksum_alone_is_wrong_is_resealed_and_readable() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(a, _), _]) = two_files(&p);
    patch(
        &p,
        g.inode_offset(a).unwrap() + ino::CRC as u64 + 1,
        &[inode_bytes(&p, &g, a)[ino::CRC + 1] ^ 0x10],
    );
    refused(&p, &format!("inode {a} fails its checksum"));
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "repaired: inode {a}: checksum rewritten; its fields pass every check, but its content cannot be verified"
        )),
        "{out}"
    );
    clean(&p);
    let fs = mount(&p);
    assert_eq!(fs.open_file("/a").unwrap().read_all().unwrap(), pattern(3 * 4096, 1));
    assert_eq!(fs.open_file("/b").unwrap().read_all().unwrap(), pattern(2 * 4096, 2));
}

#[test]
fn an_inode_with_a_nonsense_field_and_a_bad_checksum_is_freed() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(a, _), _]) = two_files(&p);
    // The file type bits of the mode become a type that does not exist (checksum not resealed).
    let mode = u32::from_le_bytes(inode_bytes(&p, &g, a)[ino::MODE..ino::MODE + 4].try_into().unwrap());
    patch(&p, g.inode_offset(a).unwrap() + ino::MODE as u64, &((mode & 0o7777) | 0o030000).to_le_bytes());
    refused(&p, &format!("inode {a} fails its checksum"));
    let rep = repaired(&p, &format!("inode {a} failed its checksum; freed (its content is lost)"));
    assert!(!rep.changes.iter().any(|c| c.contains("checksum rewritten")), "{:?}", rep.changes);
    clean(&p);
    let fs = mount(&p);
    assert!(fs.stat_path("/a").is_err());
    assert_eq!(fs.open_file("/b").unwrap().read_all().unwrap(), pattern(2 * 4096, 2));
}

#[test]
fn a_damaged_inode_that_claims_another_files_blocks_is_freed_not_cloned() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(a, a_blk), (b, _)]) = two_files(&p);
    repoint(&p, &g, b, 0, a_blk);
    // ...and its checksum fails as well: its claim is the suspect one.
    let crc_at = g.inode_offset(b).unwrap() + ino::CRC as u64;
    patch(&p, crc_at, &[inode_bytes(&p, &g, b)[ino::CRC] ^ 1]);
    repaired(&p, &format!("inode {b} failed its checksum; freed (its content is lost): it shares blocks"));
    clean(&p);
    let fs = mount(&p);
    assert!(fs.stat_path("/b").is_err());
    assert_eq!(fs.open_file("/a").unwrap().read_all().unwrap(), pattern(3 * 4096, 1));
    assert_eq!(fs.stat_path("/a").unwrap().ino, a);
}

#[test]
fn a_stale_allocator_snapshot_is_reported_by_fsck_and_rewritten_by_repair() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(_, a_blk), _]) = two_files(&p);
    let bit = a_blk - g.data_start;
    let at = g.bitmap_start * 4096 + bit / 8;
    patch(&p, at, &[std::fs::read(&p).unwrap()[at as usize] ^ (1 << (bit % 8))]);
    let r = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(r.problems.iter().any(|x| x.contains("allocator bitmap")), "{:?}", r.problems);
    repaired(&p, "; rewritten from the inode tables");
    clean(&p);
}

#[test]
fn a_damaged_fifo_with_a_size_is_freed_and_a_damaged_symlink_resealed() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let fifo = fs
        .mknod(fs.root(), b"pipe", winefs::media::layout::FileKind::Fifo, 0o644, 0, 0, 0)
        .unwrap()
        .ino;
    let ln = fs.symlink(fs.root(), b"ln", b"some/target", 0, 0).unwrap().ino;
    let g = fs.geometry();
    fs.unmount().unwrap();
    // A FIFO has no size: a size is a field no check passes. The symlink's permission bits
    // change: nothing can tell, its target still matches its checksum.
    patch(&p, g.inode_offset(fifo).unwrap() + ino::SIZE as u64, &4096u64.to_le_bytes());
    let mode = u32::from_le_bytes(inode_bytes(&p, &g, ln)[ino::MODE..ino::MODE + 4].try_into().unwrap());
    patch(&p, g.inode_offset(ln).unwrap() + ino::MODE as u64, &(mode ^ 0o004).to_le_bytes());
    let rep = repaired(&p, &format!("inode {fifo} failed its checksum; freed (its content is lost): a Fifo with size 4096"));
    assert!(rep.changes.contains(&format!(
        "inode {ln}: checksum rewritten; its fields pass every check, but its content cannot be verified"
    )));
    clean(&p);
    let fs = mount(&p);
    assert!(fs.stat_path("/pipe").is_err());
    let l = fs.resolve("/ln", false).unwrap();
    assert_eq!(fs.readlink(l).unwrap(), b"some/target");
}

#[test]
fn a_flagged_pool_whose_damaged_inode_is_resealed_has_its_flag_cleared() {
    use winefs::media::layout::{SbState, sb};
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let (g, [(a, _), _]) = two_files(&p);
    // The pool says "needs fsck" (as a run-time check failure leaves it), and inode `a`'s
    // checksum alone is wrong.
    let img = std::fs::read(&p).unwrap();
    let mut st = SbState::decode(&img[sb::STATE..sb::STATE + 32]);
    st.needs_fsck = 2;
    patch(&p, sb::STATE as u64, &st.encode());
    patch(
        &p,
        g.inode_offset(a).unwrap() + ino::CRC as u64,
        &[inode_bytes(&p, &g, a)[ino::CRC] ^ 0x40],
    );
    let rep = repaired(&p, &format!("inode {a}: checksum rewritten"));
    assert!(
        rep.changes.iter().any(|c| c.starts_with("cleared the \"needs fsck\" flag")),
        "{:?}",
        rep.changes
    );
    let img = std::fs::read(&p).unwrap();
    assert_eq!(SbState::decode(&img[sb::STATE..sb::STATE + 32]).needs_fsck, 0);
    clean(&p);
}

/// A pool holding `/NAME` (one 4 KiB block of pattern `seed`) and `/frag`, twelve separate
/// extents (so it has an extent-index block), cleanly unmounted: (pool dir, pool, the small
/// file's block, /frag's inode, its index block).
fn small_and_frag(name: &str, seed: u8) -> (tempfile::TempDir, std::path::PathBuf, u64, u64, u64) {
    let (d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let small = fs.create_file(name).unwrap();
    small.write_at(0, &pattern(4096, seed)).unwrap();
    let small_blk = fs.extents(small.ino()).unwrap()[0].1;
    drop(small);
    let frag = fs.create_file("/frag").unwrap();
    for k in 0..12u64 {
        frag.write_at(k * 8192, &pattern(4096, k as u8)).unwrap();
    }
    let frag_ino = frag.ino();
    drop(frag);
    let g = fs.geometry();
    fs.unmount().unwrap();
    let raw = inode_bytes(&p, &g, frag_ino);
    let ib = u64::from_le_bytes(raw[ino::INDEX_BLOCK..ino::INDEX_BLOCK + 8].try_into().unwrap());
    (d, p, small_blk, frag_ino, ib)
}

#[test]
fn a_shared_block_claimed_through_a_damaged_index_block_is_freed_with_its_file() {
    let (_d, p, small_blk, frag_ino, ib) = small_and_frag("/small", 3);
    // A live record of the index block now points at /small's block; the block's checksum is
    // not resealed, so the claim is read through a block that fails it.
    let img = std::fs::read(&p).unwrap();
    let rec = (0..255u64)
        .map(|s| ib * 4096 + 16 + s * 16)
        .find(|&o| img[o as usize + 4..o as usize + 8] != [0; 4])
        .unwrap();
    patch(&p, rec + 8, &small_blk.to_le_bytes());
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "inode {frag_ino}: extent-index blocks [{ib}] fail their checksum and it shares blocks"
        )) && out.contains("freed (its content is lost), the shared blocks left to their other owner"),
        "{out}"
    );
    assert!(!out.contains("cloned"), "{out}");
    // /small keeps its own block and content; the pool checks clean.
    assert!(winefs::state::fsck::check_pool(&p).unwrap().is_clean());
    let fs = mount(&p);
    assert_eq!(fs.extents(fs.resolve("/small", true).unwrap()).unwrap()[0].1, small_blk);
    assert_eq!(fs.open_file("/small").unwrap().read_all().unwrap(), pattern(4096, 3));
    assert!(fs.resolve("/frag", true).is_err());
    fs.unmount().unwrap();
}

#[test]
fn an_inode_whose_extent_map_cannot_be_loaded_is_reported_and_freed() {
    let (_d, p, _, frag_ino, ib) = small_and_frag("/keep", 9);
    // The index block's `next` points at itself: the map cannot be loaded at all.
    patch(&p, ib * 4096 + 8, &ib.to_le_bytes());
    refused(&p, &format!("inode {frag_ino}: extent index chain points at block {ib}"));
    // fsck checks the rest and names it (exit 1: problems), rather than "cannot check" (2).
    let (code, out) = fsck_cli(&p, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("inode {frag_ino}: extent index chain points at block {ib}")), "{out}");
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("inode {frag_ino} freed (its content is lost)")), "{out}");
    assert!(out.contains("removed entry \"frag\""), "{out}");
    clean(&p);
    let fs = mount(&p);
    assert!(fs.resolve("/frag", true).is_err());
    assert_eq!(fs.open_file("/keep").unwrap().read_all().unwrap(), pattern(4096, 9));
    fs.unmount().unwrap();
}

/// As e2fsck, repair makes `/lost+found` in an immutable root (`chattr +i /`) and leaves the
/// flag as it was.
#[test]
fn lost_and_found_is_made_in_an_immutable_root() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"x", 0o644, 0, 0).unwrap().ino;
    let dblk = fs.extents(d).unwrap()[0].1;
    fs.set_inode_flags(fs.root(), 0x10).unwrap();
    assert_eq!(fs.mkdir(fs.root(), b"e", 0o755, 0, 0).unwrap_err().errno(), libc::EPERM);
    fs.unmount().unwrap();
    patch(&p, dblk * 4096, &[0u8; 4096]);
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("linked as /lost+found/#{f}")), "{out}");
    clean(&p);
    let fs = mount(&p);
    fs.resolve(&format!("/lost+found/#{f}"), true).unwrap();
    assert_eq!(fs.inode_flags(fs.root()).unwrap(), 0x10);
    fs.unmount().unwrap();
}

#[test]
fn a_directory_whose_block_is_zeroed_is_freed_and_its_children_go_to_lost_and_found() {
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"x", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &pattern(4096, 5)).unwrap();
    let dblk = fs.extents(d).unwrap()[0].1;
    fs.unmount().unwrap();
    patch(&p, dblk * 4096, &[0u8; 4096]);
    refused(&p, &format!("directory {d}: block 0 has no directory magic"));
    let (code, out) = fsck_cli(&p, true);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("inode {d} freed (its content is lost)")), "{out}");
    assert!(out.contains(&format!("linked as /lost+found/#{f}")), "{out}");
    clean(&p);
    let fs = mount(&p);
    assert!(fs.resolve("/d", true).is_err());
    let x = fs.resolve(&format!("/lost+found/#{f}"), true).unwrap();
    let mut b = vec![0u8; 4096];
    fs.read(x, 0, &mut b).unwrap();
    assert_eq!(b, pattern(4096, 5));
    fs.unmount().unwrap();
}
