//! The golden pools: images of format version 3 made once by this file's ignored `make_golden`
//! test (which writes the newest) and stored sparsely in `tests/data/`:
//! `golden-v3.pool.hex` (before slot zones and checked size words) and
//! `golden-v3-checked-sizes.pool.hex` (with both). Every later build must mount them
//! and find exactly what was written — or, after a format change that cannot read it, refuse it
//! with the version message (then this test changes to expect that, and a new golden image of
//! the new format is added beside it). The golden image of format version 2
//! (`tests/data/golden-v2.pool.hex`, whose extent-index blocks and directory headers carry no
//! checksum) is kept: this build refuses it with the version message and leaves it unchanged.

mod common;

use std::fmt::Write as _;
use std::path::Path;
use winefs::media::layout;
use winefs::{Error, Fs, MkfsOptions, MountOptions, XattrSet};

const GOLDEN: &str = "tests/data/golden-v3.pool.hex";
/// The newest golden image: format 3 with slot zones and checked size words.
const GOLDEN_NEWEST: &str = "tests/data/golden-v3-checked-sizes.pool.hex";
const GOLDEN_V2: &str = "tests/data/golden-v2.pool.hex";

/// The content of `/frag.bin`: twelve 4 KiB pieces, each followed by a 4 KiB hole, so the file
/// has more extents than the eight inline slots and an extent-index block holds the rest.
fn fragmented() -> Vec<u8> {
    let mut v = Vec::new();
    for k in 0..12u8 {
        v.extend(std::iter::repeat_n(b'a' + k, 4096));
        if k < 11 {
            v.extend(std::iter::repeat_n(0u8, 4096));
        }
    }
    v
}

/// What the golden pool holds: (path, content).
fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("/hello.txt", b"hello, winefs\n".to_vec()),
        (
            "/docs/notes.md",
            (0..5000u32).map(|i| b"notes "[(i % 6) as usize]).collect(),
        ),
        (
            "/docs/deep/blocks.bin",
            (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect(),
        ),
        ("/empty", Vec::new()),
        ("/frag.bin", fragmented()),
    ]
}

fn decode(hex: &str, out: &Path) {
    let mut lines = hex.lines();
    let size: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("size "))
        .and_then(|s| s.parse().ok())
        .expect("golden header");
    let mut img = vec![0u8; size];
    for l in lines {
        let (off, data) = l.split_once(' ').expect("offset and bytes");
        let off: usize = off.parse().expect("offset");
        for (i, pair) in data.as_bytes().chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).unwrap();
            img[off + i] = u8::from_str_radix(s, 16).expect("hex byte");
        }
    }
    std::fs::write(out, img).unwrap();
}

/// Regenerate the golden image (only when the format changes: `cargo test --release --test
/// golden -- --ignored make_golden`).
#[test]
#[ignore]
fn make_golden() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    Fs::mkfs(
        &p,
        &MkfsOptions {
            size: Some(24 << 20),
            partitions: Some(1),
            inodes: Some(64),
            ..Default::default()
        },
    )
    .unwrap();
    let fs = common::mount(&p);
    fs.mkdir_path("/docs").unwrap();
    fs.mkdir_path("/docs/deep").unwrap();
    for (path, c) in files() {
        let f = fs.create_file(path).unwrap();
        // Written piece by piece, holes left out, so each piece is an extent of its own.
        for (k, piece) in c.chunks(4096).enumerate() {
            if piece.iter().any(|&b| b != 0) {
                f.write_at(k as u64 * 4096, piece).unwrap();
            }
        }
    }
    let h = fs.resolve("/hello.txt", true).unwrap();
    fs.link(h, fs.resolve("/docs", true).unwrap(), b"hello-link")
        .unwrap();
    fs.symlink(fs.root(), b"to-notes", b"docs/notes.md", 0, 0)
        .unwrap();
    fs.setxattr(h, b"user.colour", b"green", XattrSet::Create)
        .unwrap();
    fs.unmount().unwrap();
    let img = std::fs::read(&p).unwrap();
    let mut out = format!("size {}\n", img.len());
    for (i, line) in img.chunks(64).enumerate() {
        if line.iter().any(|&b| b != 0) {
            write!(out, "{}", i * 64).unwrap();
            out.push(' ');
            for b in line {
                write!(out, "{b:02x}").unwrap();
            }
            out.push('\n');
        }
    }
    std::fs::write(GOLDEN_NEWEST, out).unwrap();
}

#[test]
fn the_golden_pool_of_format_3_mounts_and_holds_what_was_written() {
    // Made before slot zones and checked size words: its inodes keep plain sizes, and so do
    // the ones made on it now.
    holds_what_was_written(GOLDEN, false);
}

#[test]
fn the_golden_pool_with_checked_size_words_mounts_and_holds_what_was_written() {
    holds_what_was_written(GOLDEN_NEWEST, true);
}

/// Mount the golden image `path`, check that it holds what `make_golden` wrote, append to a
/// file and make one, and check it all again after a remount. `checked`: the pool's inodes
/// carry checked size words.
fn holds_what_was_written(path: &str, checked: bool) {
    let hex = std::fs::read_to_string(path).expect("the golden image is in the tree");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    decode(&hex, &p);
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    let fs = Fs::mount(&p, MountOptions::default()).unwrap();
    for (path, c) in files() {
        assert_eq!(
            fs.open_file(path).unwrap().read_all().unwrap(),
            c,
            "{path}"
        );
    }
    let h = fs.resolve("/hello.txt", true).unwrap();
    assert_eq!(fs.resolve("/docs/hello-link", true).unwrap(), h);
    assert_eq!(fs.getattr(h).unwrap().nlink, 2);
    assert_eq!(fs.getxattr(h, b"user.colour").unwrap(), b"green");
    let frag = fs.resolve("/frag.bin", true).unwrap();
    assert!(fs.extents(frag).unwrap().len() > 8, "/frag.bin needs an extent-index block");
    let l = fs.resolve("/to-notes", false).unwrap();
    assert_eq!(fs.readlink(l).unwrap(), b"docs/notes.md");
    let mut names = fs.list_dir("/docs").unwrap();
    names.sort();
    assert_eq!(names, vec![b"deep".to_vec(), b"hello-link".to_vec(), b"notes.md".to_vec()]);
    // It stays usable: write, append, unmount, mount, check.
    let after = fs.create_file("/after").unwrap();
    after.write_at(0, b"later").unwrap();
    after.write_at(5, b", more").unwrap();
    let notes = fs.open_file("/docs/notes.md").unwrap();
    notes.write_at(5000, b"appended").unwrap();
    let inos = [after.ino(), notes.ino()];
    drop((after, notes));
    let g = fs.geometry();
    assert_eq!(g.checked_sizes, checked);
    fs.unmount().unwrap();
    let img = std::fs::read(&p).unwrap();
    for ino in inos {
        let off = g.inode_offset(ino).unwrap() as usize;
        let flags = u32::from_le_bytes(img[off..off + 4].try_into().unwrap());
        assert_eq!(flags & layout::INODE_SIZE_CHECKED != 0, checked, "inode {ino}");
    }
    let fs = Fs::mount(&p, MountOptions::default()).unwrap();
    assert!(fs.check().is_clean());
    assert_eq!(fs.open_file("/after").unwrap().read_all().unwrap(), b"later, more");
    let mut notes = files()[1].1.clone();
    notes.extend_from_slice(b"appended");
    assert_eq!(fs.open_file("/docs/notes.md").unwrap().read_all().unwrap(), notes);
}

/// The golden pool of format 2 (no checksums on extent-index blocks and directory headers) is
/// refused by mount and fsck with the version message, and left unchanged.
#[test]
fn the_golden_pool_of_format_2_is_refused_with_the_version_message() {
    let hex = std::fs::read_to_string(GOLDEN_V2).expect("the version-2 golden image is in the tree");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    decode(&hex, &p);
    let img = std::fs::read(&p).unwrap();
    match Fs::mount(&p, MountOptions::default()) {
        Err(e @ Error::Version { found: 2, supported: 3 }) => {
            assert!(e.to_string().contains("format version 2"), "{e}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a version-2 pool mounted"),
    }
    assert!(matches!(
        winefs::state::fsck::check_pool(&p),
        Err(Error::Version { found: 2, .. })
    ));
    assert!(std::fs::read(&p).unwrap() == img, "a refused pool was written");
}

/// A pool of an older format (version 1) is refused with the version message, unwritten.
#[test]
fn a_pool_of_format_1_is_refused_with_the_version_message() {
    let hex = std::fs::read_to_string(GOLDEN).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    decode(&hex, &p);
    // Rewrite the version (and the immutable part's checksum) as a version-1 pool has it.
    let mut img = std::fs::read(&p).unwrap();
    img[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&img[..120]);
    img[120..124].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&p, &img).unwrap();
    match Fs::mount(&p, MountOptions::default()) {
        Err(e @ Error::Version { found: 1, .. }) => {
            assert!(e.to_string().contains("format version 1"), "{e}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a version-1 pool mounted"),
    }
    assert!(std::fs::read(&p).unwrap() == img);
}
