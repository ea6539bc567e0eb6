//! The range-rewriting fallocate modes of the library (`Fs::zero_range`, `collapse_range`,
//! `insert_range`): each mode's bytes, size, errors and layout (aligned extents stay aligned,
//! collapse and insert copy no data), live mappings, a random sequence against a byte model,
//! and the same sequence differentially against ext4 on a loop device when one can be had.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use winefs::{Error, Fs};

const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;

/// Deterministic bytes (xorshift64*), different for every seed.
fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn content(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut b = vec![0u8; size as usize];
    assert_eq!(fs.read(ino, 0, &mut b).unwrap(), b.len());
    b
}

/// Where two byte strings first differ, for messages.
fn diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i}"),
        None => format!("lengths {} and {}", a.len(), b.len()),
    }
}

fn assert_content(fs: &Fs, ino: u64, want: &[u8], what: &str) {
    let got = content(fs, ino);
    assert!(got == want, "{what}: {}", diff(&got, want));
}

fn assert_clean(fs: &Fs, what: &str) {
    let r = fs.check();
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

/// Pool block of logical block `lb` of the file.
fn phys(fs: &Fs, ino: u64, lb: u64) -> Option<u64> {
    fs.extents(ino)
        .unwrap()
        .into_iter()
        .find(|&(l, _, n)| l <= lb && lb < l + n)
        .map(|(l, p, _)| p + (lb - l))
}

/// Every 2 MiB unit of the first `units` is one aligned extent.
fn units_aligned(fs: &Fs, ino: u64, units: u64) -> bool {
    (0..units).all(|u| {
        fs.extents(ino).unwrap().iter().any(|&(l, p, n)| {
            l <= u * 512 && u * 512 + 512 <= l + n && (p + (u * 512 - l)).is_multiple_of(512)
        })
    })
}

fn errno(r: winefs::Result<()>) -> i32 {
    r.map(|()| 0).unwrap_or_else(|e| e.errno())
}

/// A file of `len` bytes written in one call (large files land on aligned extents).
fn file_with(fs: &Fs, name: &str, data: &[u8]) -> u64 {
    let a = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap();
    fs.write(a.ino, 0, data).unwrap();
    a.ino
}

#[test]
fn zero_range_zeroes_allocates_and_keeps_aligned_units_in_place() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    // A small file: unaligned range inside, then past EOF with and without KEEP_SIZE.
    let mut want = bytes(1, 40_000);
    let f = file_with(&fs, "small", &want);
    fs.zero_range(f, 1000, 5000, false).unwrap();
    want[1000..6000].fill(0);
    assert_content(&fs, f, &want, "zero inside");
    fs.zero_range(f, 39_000, 5000, true).unwrap();
    want[39_000..].fill(0);
    assert_content(&fs, f, &want, "zero past EOF, keep size");
    let blocks = fs.getattr(f).unwrap().blocks;
    assert!(
        blocks >= 44_000u64.div_ceil(4096) * 8,
        "KEEP_SIZE allocated nothing: {blocks}"
    );
    fs.zero_range(f, 39_000, 9000, false).unwrap();
    want.resize(48_000, 0);
    assert_content(&fs, f, &want, "zero past EOF, growing");
    // A hole gets blocks.
    fs.truncate(f, 100_000).unwrap();
    want.resize(100_000, 0);
    fs.zero_range(f, 60_000, 20_000, true).unwrap();
    assert!(phys(&fs, f, 60_000 / 4096).is_some() && phys(&fs, f, 79_999 / 4096).is_some());
    assert_content(&fs, f, &want, "zero a hole");

    // An aligned file: a small range is zeroed in place (the unit keeps its extent) ...
    let mut want = bytes(2, 3 * HUGE);
    let a = file_with(&fs, "aligned", &want);
    assert!(units_aligned(&fs, a, 3));
    let before = fs.extents(a).unwrap();
    fs.zero_range(a, 4096 + 7, 100_000, true).unwrap();
    want[4103..104_103].fill(0);
    assert_content(&fs, a, &want, "small range in an aligned unit");
    assert_eq!(
        fs.extents(a).unwrap(),
        before,
        "zeroed in place, nothing moved"
    );
    // ... a large part of a unit, and a whole unit, keep every unit one aligned extent.
    fs.zero_range(a, HUGE + 1000, MIB + 12_345, true).unwrap();
    want[(HUGE + 1000) as usize..(HUGE + 1000 + MIB + 12_345) as usize].fill(0);
    fs.zero_range(a, 2 * HUGE, HUGE, true).unwrap();
    want[2 * HUGE as usize..].fill(0);
    assert_content(&fs, a, &want, "large ranges in aligned units");
    assert!(units_aligned(&fs, a, 3), "{:?}", fs.extents(a).unwrap());
    // Errors, as the VFS and ext4 give them; a range the pool cannot hold changes nothing.
    let free = fs.statfs().free_blocks;
    assert_eq!(errno(fs.zero_range(a, 0, 1 << 30, false)), libc::ENOSPC);
    assert_eq!(fs.statfs().free_blocks, free);
    assert_content(&fs, a, &want, "after a refused zero range");
    assert_eq!(errno(fs.zero_range(a, 0, 0, false)), libc::EINVAL);
    assert_eq!(
        errno(fs.zero_range(a, u64::MAX - 10, 100, false)),
        libc::EFBIG
    );
    let d = fs.mkdir(fs.root(), b"dir", 0o755, 0, 0).unwrap();
    assert_eq!(errno(fs.zero_range(d.ino, 0, 10, false)), libc::EISDIR);
    assert_clean(&fs, "after zero range");
    drop(fs);
    let fs = common::mount(&pool);
    assert_content(&fs, a, &want, "after remount");
    assert_clean(&fs, "after remount");
}

#[test]
fn collapse_and_insert_move_extents_not_data() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let data = bytes(3, 3 * HUGE);
    let f = file_with(&fs, "f", &data);
    assert!(units_aligned(&fs, f, 3));
    let unit2 = phys(&fs, f, 1024).unwrap();
    let free = fs.statfs().free_blocks;
    // Collapse the middle unit: the last unit's blocks now hold the second unit.
    fs.collapse_range(f, HUGE, HUGE).unwrap();
    let mut want = data[..HUGE as usize].to_vec();
    want.extend_from_slice(&data[2 * HUGE as usize..]);
    assert_content(&fs, f, &want, "collapse a unit");
    assert_eq!(phys(&fs, f, 512), Some(unit2), "collapse copied data");
    assert!(units_aligned(&fs, f, 2));
    assert_eq!(
        fs.statfs().free_blocks,
        free + 512,
        "the collapsed unit was not freed"
    );
    // Insert a unit back at the front: a hole, everything else on the same blocks.
    fs.insert_range(f, 0, HUGE).unwrap();
    let mut want2 = vec![0u8; HUGE as usize];
    want2.extend_from_slice(&want);
    assert_content(&fs, f, &want2, "insert a unit");
    assert_eq!(phys(&fs, f, 1024), Some(unit2), "insert copied data");
    assert_eq!(phys(&fs, f, 0), None, "the inserted range is a hole");
    // Block-sized amounts split extents and shift logical blocks only.
    fs.insert_range(f, HUGE + 8192, 4096).unwrap();
    let mut want3 = want2.clone();
    want3.splice(
        (HUGE + 8192) as usize..(HUGE + 8192) as usize,
        std::iter::repeat_n(0, 4096),
    );
    assert_content(&fs, f, &want3, "insert a block");
    fs.collapse_range(f, 4096 * 3, 4096 * 5).unwrap();
    want3.drain(4096 * 3..4096 * 8);
    assert_content(&fs, f, &want3, "collapse blocks");
    let size = fs.getattr(f).unwrap().size;
    // Errors: unaligned offset or length, a collapse reaching EOF, an insert at or past EOF,
    // a size past the largest file.
    for (off, len) in [(1000, 4096), (4096, 1000), (0, 0)] {
        assert_eq!(
            errno(fs.collapse_range(f, off, len)),
            libc::EINVAL,
            "{off}+{len}"
        );
        assert_eq!(
            errno(fs.insert_range(f, off, len)),
            libc::EINVAL,
            "{off}+{len}"
        );
    }
    assert_eq!(
        errno(fs.collapse_range(f, size - 4096 * 4, 4096 * 4)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.collapse_range(f, size - 4096, 4096 * 4)),
        libc::EINVAL
    );
    assert_eq!(errno(fs.insert_range(f, size, 4096)), libc::EINVAL);
    assert_eq!(errno(fs.insert_range(f, size + 4096, 4096)), libc::EINVAL);
    assert_eq!(
        errno(fs.insert_range(f, 0, u32::MAX as u64 * 4096)),
        libc::EFBIG
    );
    assert_content(&fs, f, &want3, "after refused calls");
    assert_clean(&fs, "after collapse and insert");
    drop(fs);
    let fs = common::mount(&pool);
    assert_content(&fs, f, &want3, "after remount");
    assert_clean(&fs, "after remount");
}

#[test]
fn live_mappings_follow_collapse_insert_and_zero_range() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let data = bytes(4, 3 * HUGE);
    let f = fs.create_file("/m").unwrap();
    f.write_at(0, &data).unwrap();
    let m = f.mmap(0, 3 * HUGE as usize).unwrap();
    let load = |at: u64, len: usize| {
        let mut b = vec![0u8; len];
        m.load(at as usize, &mut b).unwrap();
        b
    };
    assert_eq!(load(HUGE, 4096), &data[HUGE as usize..HUGE as usize + 4096]);
    fs.collapse_range(f.ino(), 0, HUGE).unwrap();
    assert_eq!(load(0, 4096), &data[HUGE as usize..HUGE as usize + 4096]);
    assert_eq!(
        load(HUGE + 5, 100),
        &data[2 * HUGE as usize + 5..2 * HUGE as usize + 105]
    );
    fs.insert_range(f.ino(), 4096, HUGE).unwrap();
    assert_eq!(load(0, 4096), &data[HUGE as usize..HUGE as usize + 4096]);
    assert_eq!(load(4096, 4096), vec![0u8; 4096]);
    assert_eq!(
        load(HUGE + 4096, 4096),
        &data[HUGE as usize + 4096..HUGE as usize + 8192]
    );
    fs.zero_range(f.ino(), HUGE + 4096 + 10, 50, true).unwrap();
    assert_eq!(load(HUGE + 4096, 64)[10..60], [0u8; 50]);
    // Stores through the mapping land where reads find them.
    m.store(2 * HUGE as usize, b"through the mapping").unwrap();
    let mut b = [0u8; 19];
    f.read_at(2 * HUGE, &mut b).unwrap();
    assert_eq!(&b, b"through the mapping");
    // An atomic mapping's private stores would be lost: refused while it lives.
    let am = f.mmap_atomic(0, 4096).unwrap();
    assert!(matches!(
        fs.collapse_range(f.ino(), 0, 4096),
        Err(Error::Busy(_))
    ));
    drop(am);
    drop(m);
    assert_clean(&fs, "after mapped changes");
}

// ---------------------------------------------------------------------------------------------
// A random sequence against a byte model, and against ext4.

#[derive(Clone, Copy, Debug)]
enum Op {
    Write(u64, u64),
    Zero(u64, u64, bool),
    Collapse(u64, u64),
    Insert(u64, u64),
    Punch(u64, u64),
    Truncate(u64),
}

/// A sequence of operations, including ones that must be refused (unaligned, past EOF).
fn sequence(seed: u64, n: usize) -> Vec<Op> {
    let r = bytes(seed, n as u64 * 8 * 4);
    let word = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
    (0..n)
        .map(|i| {
            let (a, b, c) = (word(4 * i), word(4 * i + 1), word(4 * i + 2));
            // Offsets and lengths in blocks, sometimes in whole units, sometimes unaligned.
            let blocks = |x: u64| match x % 4 {
                0 => (x >> 8) % 3 * 512,
                1 => (x >> 8) % 1200,
                _ => (x >> 8) % 40,
            } * 4096;
            let odd = |x: u64| if x.is_multiple_of(5) { (x >> 20) % 4096 } else { 0 };
            let (off, len) = (blocks(a) + odd(c), blocks(b) + 4096 + odd(c >> 7));
            match word(4 * i + 3) % 7 {
                0 | 1 => Op::Write(off, len.min(3 * MIB)),
                2 => Op::Zero(off, len, c.is_multiple_of(2)),
                3 => Op::Collapse(off, len),
                4 => Op::Insert(off, len),
                5 => Op::Punch(off, len),
                _ => Op::Truncate(off + len / 2),
            }
        })
        .collect()
}

/// The model: what each operation does to the bytes (ext4's rules), or the errno it gets.
fn model(file: &mut Vec<u8>, op: Op, seed: u64) -> i32 {
    let size = file.len() as u64;
    match op {
        Op::Write(off, len) => {
            if file.len() < (off + len) as usize {
                file.resize((off + len) as usize, 0);
            }
            file[off as usize..(off + len) as usize].copy_from_slice(&bytes(seed, len));
        }
        Op::Zero(off, len, keep) => {
            let end = if keep {
                (off + len).min(size)
            } else {
                off + len
            };
            if file.len() < end as usize {
                file.resize(end as usize, 0);
            }
            if off < end {
                file[off as usize..end as usize].fill(0);
            }
        }
        Op::Collapse(off, len) => {
            if !(off | len).is_multiple_of(4096) || off + len >= size {
                return libc::EINVAL;
            }
            file.drain(off as usize..(off + len) as usize);
        }
        Op::Insert(off, len) => {
            if !(off | len).is_multiple_of(4096) || off >= size {
                return libc::EINVAL;
            }
            file.splice(
                off as usize..off as usize,
                std::iter::repeat_n(0, len as usize),
            );
        }
        Op::Punch(off, len) => {
            let end = (off + len).min(size);
            if off < end {
                file[off as usize..end as usize].fill(0);
            }
        }
        Op::Truncate(size) => file.resize(size as usize, 0),
    }
    0
}

fn on_winefs(fs: &Fs, ino: u64, op: Op, seed: u64) -> i32 {
    errno(match op {
        Op::Write(off, len) => fs.write(ino, off, &bytes(seed, len)).map(drop),
        Op::Zero(off, len, keep) => fs.zero_range(ino, off, len, keep),
        Op::Collapse(off, len) => fs.collapse_range(ino, off, len),
        Op::Insert(off, len) => fs.insert_range(ino, off, len),
        Op::Punch(off, len) => fs.punch_hole(ino, off, len),
        Op::Truncate(size) => fs.truncate(ino, size),
    })
}

fn on_host(f: &std::fs::File, op: Op, seed: u64) -> i32 {
    use libc::{
        FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE,
    };
    let fa = |mode, off, len| winefs::sys::fallocate_mode(f, mode, off, len);
    let r = match op {
        Op::Write(off, len) => f.write_all_at(&bytes(seed, len), off),
        Op::Zero(off, len, keep) => fa(
            FALLOC_FL_ZERO_RANGE | if keep { FALLOC_FL_KEEP_SIZE } else { 0 },
            off,
            len,
        ),
        Op::Collapse(off, len) => fa(FALLOC_FL_COLLAPSE_RANGE, off, len),
        Op::Insert(off, len) => fa(FALLOC_FL_INSERT_RANGE, off, len),
        Op::Punch(off, len) => fa(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len),
        Op::Truncate(size) => f.set_len(size),
    };
    r.map(|()| 0)
        .unwrap_or_else(|e| e.raw_os_error().unwrap_or(-1))
}

/// A loop-mounted 4 KiB-block ext4 in `dir`, unmounted on drop; None (with a message) where
/// this machine cannot make one (not root, no mkfs.ext4, no loop devices).
struct Ext4(std::path::PathBuf);

impl Ext4 {
    fn mount(dir: &Path) -> Option<Ext4> {
        let img = dir.join("ext4.img");
        let mnt = dir.join("ext4");
        std::fs::create_dir(&mnt).ok()?;
        std::fs::File::create(&img).ok()?.set_len(64 * MIB).ok()?;
        let run = |c: &mut Command| c.output().map(|o| o.status.success()).unwrap_or(false);
        let made = run(Command::new("mkfs.ext4")
            .args(["-q", "-b", "4096"])
            .arg(&img))
            && run(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&mnt));
        if !made {
            eprintln!("skipping the ext4 comparison: cannot make a loop-mounted ext4 here");
            return None;
        }
        Some(Ext4(mnt))
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn random_sequences_match_the_model_and_ext4() {
    let (d, pool) = common::fresh_pool(128 * MIB, Some(1));
    let fs = common::mount(&pool);
    let ext4 = Ext4::mount(d.path());
    let mut outcomes = std::collections::BTreeMap::new();
    for seed in 1..=4u64 {
        let name = format!("r{seed}");
        let ino = fs
            .create(fs.root(), name.as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        let host = ext4.as_ref().map(|e| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(e.0.join(&name))
                .unwrap()
        });
        let mut want = Vec::new();
        for (i, op) in sequence(seed, 60).into_iter().enumerate() {
            let s = seed * 1000 + i as u64;
            let what = format!("seed {seed} step {i} {op:?}");
            let e = model(&mut want, op, s);
            let kind = format!("{op:?}");
            let kind = kind.split('(').next().unwrap_or_default().to_string();
            *outcomes.entry((kind, e == 0)).or_insert(0u32) += 1;
            assert_eq!(on_winefs(&fs, ino, op, s), e, "{what}: errno");
            assert_content(&fs, ino, &want, &what);
            if let Some(h) = &host {
                assert_eq!(
                    on_host(h, op, s),
                    e,
                    "{what}: ext4 errno differs from the model"
                );
                let mut got = vec![0u8; h.metadata().unwrap().len() as usize];
                h.read_exact_at(&mut got, 0).unwrap();
                assert!(
                    got == want,
                    "{what}: ext4 differs from the model: {}",
                    diff(&got, &want)
                );
            }
        }
        assert_clean(&fs, &format!("seed {seed}"));
        // Room for the next sequence.
        fs.unlink(fs.root(), name.as_bytes()).unwrap();
        if let Some(e) = &ext4 {
            std::fs::remove_file(e.0.join(&name)).unwrap();
        }
    }
    // The sequences exercise every mode, both done and refused.
    for kind in ["Zero", "Collapse", "Insert"] {
        assert!(
            outcomes
                .get(&(kind.to_string(), true))
                .copied()
                .unwrap_or(0)
                >= 3,
            "too few {kind} done: {outcomes:?}"
        );
    }
    for kind in ["Collapse", "Insert"] {
        assert!(
            outcomes
                .get(&(kind.to_string(), false))
                .copied()
                .unwrap_or(0)
                >= 3,
            "too few {kind} refused: {outcomes:?}"
        );
    }
    eprintln!("outcomes (kind, done): {outcomes:?}");
    drop(fs);
    let fs = common::mount(&pool);
    assert_clean(&fs, "after remount");
}
