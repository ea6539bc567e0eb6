//! docs/DESIGN.md is the single source of truth for the on-media format. This test parses its
//! field tables (`### Name (N bytes)` headings followed by `| offset | size | field | meaning |`
//! rows) and checks every row of every table against the code's named offsets (`layout::sb`,
//! `ino`, `extent`, `index_block`, `dir_block`, `dentry`, `xattr_block`, `xattr_entry`,
//! `journal::entry`, `zone::desc`), and decodes real encoded structures (and a real pool written by mkfs, a
//! journal commit and ordinary operations, read back through `Pool`) at the documented offsets.

use std::collections::BTreeMap;
use std::path::Path;
use winefs::media::journal::{self, Journals, Tx, entry};
use winefs::media::layout::{
    self, BLOCK_SIZE, DENTRY_HEADER, DIR_MAGIC, DIR_SLOTS, EXTENT_SIZE, ExtentRecord, FileKind,
    Geometry, INDEX_MAGIC, INDEX_SLOTS, INLINE_SLOTS, INODE_SIZE, InodeHeader, JOURNAL_ENTRY_SIZE,
    SbState, Superblock, XATTR_MAGIC, dentry, dir_block, extent, index_block, ino, sb, xattr_block,
    xattr_entry,
};
use winefs::media::pool::{Category, Pool};
use winefs::media::zone;
use winefs::meta::xattr::XATTR_SPACE;
use winefs::{Fs, MountOptions, XattrSet};

mod common;

#[derive(Debug, Clone)]
struct Row {
    offset: usize,
    size: usize,
}

/// structure name → (declared size, field → row), in document order of fields.
type Tables = BTreeMap<String, (usize, Vec<(String, Row)>)>;

fn parse_doc() -> Tables {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/DESIGN.md");
    let text = std::fs::read_to_string(path).expect("read docs/DESIGN.md");
    let mut tables = Tables::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            cur = None;
            // "<Name> (<N> bytes)"
            if let Some(open) = h.rfind(" (")
                && let Some(n) = h[open + 2..].strip_suffix(" bytes)")
                && let Ok(n) = n.trim().parse::<usize>()
            {
                let name = h[..open].trim().to_string();
                assert!(
                    tables.insert(name.clone(), (n, Vec::new())).is_none(),
                    "structure {name:?} documented twice"
                );
                cur = Some(name);
            }
            continue;
        }
        if line.starts_with("## ") {
            cur = None;
            continue;
        }
        let Some(name) = &cur else { continue };
        let t = line.trim();
        if !t.starts_with('|') {
            continue;
        }
        let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        // Header and separator rows have a non-numeric offset cell.
        let Ok(offset) = cells[0].parse::<usize>() else {
            assert!(
                cells[0] == "offset" || cells[0].starts_with("---"),
                "{name}: offset cell {:?} is not a plain decimal integer",
                cells[0]
            );
            continue;
        };
        let size: usize = cells[1]
            .parse()
            .unwrap_or_else(|_| panic!("{name}: size cell {:?} is not an integer", cells[1]));
        let field = cells[2].trim_matches('`').to_string();
        tables
            .get_mut(name)
            .expect("current table")
            .1
            .push((field, Row { offset, size }));
    }
    tables
}

fn table<'a>(t: &'a Tables, s: &str) -> &'a (usize, Vec<(String, Row)>) {
    t.get(s)
        .unwrap_or_else(|| panic!("docs/DESIGN.md has no `### {s} (N bytes)` table"))
}

fn field<'a>(t: &'a Tables, s: &str, f: &str) -> &'a Row {
    &table(t, s)
        .1
        .iter()
        .find(|(n, _)| n == f)
        .unwrap_or_else(|| panic!("docs/DESIGN.md: structure {s:?} has no field {f:?}"))
        .1
}

/// Documented size of structure `s` (for the entry headers: where the name starts).
fn size_of(t: &Tables, s: &str) -> usize {
    table(t, s).0
}

/// Every documented "reserved" byte of structure `s` in `b` is zero.
fn assert_reserved_zero(t: &Tables, s: &str, b: &[u8]) {
    for (f, r) in &table(t, s).1 {
        if f == "reserved" {
            assert!(
                b[r.offset..r.offset + r.size].iter().all(|&x| x == 0),
                "{s}: reserved bytes {}..{} are not zero",
                r.offset,
                r.offset + r.size
            );
        }
    }
}

/// (structure, field, code offset, field size in bytes).
fn mapping() -> Vec<(&'static str, &'static str, usize, usize)> {
    const SB: &str = "Superblock";
    const JE: &str = "Journal entry";
    const IN: &str = "Inode";
    const EX: &str = "Extent record";
    const IX: &str = "Extent-index block";
    const DB: &str = "Directory block";
    const DE: &str = "Directory entry";
    const XA: &str = "Xattr block";
    const XE: &str = "Xattr entry";
    vec![
        (SB, "magic", sb::MAGIC, layout::MAGIC.len()),
        (SB, "version", sb::VERSION, 4),
        (SB, "block_size", sb::BLOCK_SIZE, 4),
        (SB, "pool_size", sb::POOL_SIZE, 8),
        (SB, "partitions", sb::PARTITIONS, 4),
        (SB, "incompat", sb::INCOMPAT, 4),
        (SB, "inodes_per_partition", sb::INODES_PER_PARTITION, 4),
        (SB, "journal_entries", sb::JOURNAL_ENTRIES, 4),
        (SB, "staging_blocks", sb::STAGING_BLOCKS, 4),
        (SB, "zone_slots", sb::ZONE_SLOTS, 4),
        (SB, "journal_start", sb::JOURNAL_START, 8),
        (SB, "inode_table_start", sb::INODE_TABLE_START, 8),
        (SB, "bitmap_start", sb::BITMAP_START, 8),
        (SB, "bitmap_blocks", sb::BITMAP_BLOCKS, 8),
        (SB, "data_start", sb::DATA_START, 8),
        (SB, "data_blocks", sb::DATA_BLOCKS, 8),
        (SB, "uuid", sb::UUID, 16),
        (SB, "created_ns", sb::CREATED_NS, 8),
        (SB, "checksum", sb::CHECKSUM, 4),
        (SB, "state_clean", sb::STATE_CLEAN, 4),
        (SB, "state_needs_fsck", sb::STATE_NEEDS_FSCK, 4),
        (SB, "state_mount_count", sb::STATE_MOUNT_COUNT, 8),
        (SB, "state_bitmap_crc", sb::STATE_BITMAP_CRC, 4),
        (SB, "state_checksum", sb::STATE_CHECKSUM, 4),
        (JE, "txid", entry::TXID, 8),
        (JE, "gen", entry::GEN, 4),
        (JE, "kind", entry::KIND, 1),
        (JE, "inline_len", entry::INLINE_LEN, 1),
        (JE, "count", entry::COUNT, 2),
        (JE, "target", entry::TARGET, 8),
        (JE, "payload", entry::PAYLOAD, journal::INLINE_MAX),
        (JE, "epoch", entry::EPOCH, 4),
        (JE, "crc", entry::CRC, 4),
        (IN, "flags", ino::FLAGS, 4),
        (IN, "mode", ino::MODE, 4),
        (IN, "uid", ino::UID, 4),
        (IN, "gid", ino::GID, 4),
        (IN, "nlink", ino::NLINK, 4),
        (IN, "generation", ino::GENERATION, 4),
        (IN, "size", ino::SIZE, 8),
        (IN, "map_end", ino::MAP_END, 8),
        (IN, "xattr_block", ino::XATTR_BLOCK, 8),
        (IN, "index_block", ino::INDEX_BLOCK, 8),
        (IN, "parent", ino::PARENT, 8),
        (IN, "atime", ino::ATIME, 8),
        (IN, "mtime", ino::MTIME, 8),
        (IN, "ctime", ino::CTIME, 8),
        (IN, "crtime", ino::CRTIME, 8),
        (IN, "rdev", ino::RDEV, 4),
        (IN, "crc", ino::CRC, 4),
        (IN, "target_crc", ino::TARGET_CRC, 4),
        (
            IN,
            "extent_slots",
            ino::SLOTS,
            INLINE_SLOTS * EXTENT_SIZE as usize,
        ),
        (EX, "logical", extent::LOGICAL, 4),
        (EX, "len", extent::LEN, 4),
        (EX, "phys", extent::PHYS, 8),
        (IX, "magic", index_block::MAGIC, 4),
        (IX, "crc", index_block::CRC, 4),
        (IX, "next", index_block::NEXT, 8),
        (
            IX,
            "slots",
            index_block::SLOTS,
            INDEX_SLOTS * EXTENT_SIZE as usize,
        ),
        (DB, "magic", dir_block::MAGIC, 4),
        (DB, "crc", dir_block::CRC, 4),
        (DB, "starts", dir_block::STARTS, 8),
        (
            DB,
            "slots",
            dir_block::SLOT,
            (DIR_SLOTS as usize - 1) * dir_block::SLOT,
        ),
        (DE, "ino", dentry::INO, 8),
        (DE, "name_len", dentry::NAME_LEN, 1),
        (DE, "kind", dentry::KIND, 1),
        (DE, "crc", dentry::CRC, 4),
        (XA, "magic", xattr_block::MAGIC, 4),
        (XA, "count", xattr_block::COUNT, 2),
        (XA, "used", xattr_block::USED, 4),
        (XA, "crc", xattr_block::CRC, 4),
        (XA, "entries", xattr_block::ENTRIES, XATTR_SPACE),
        (XE, "name_len", xattr_entry::NAME_LEN, 1),
        (XE, "value_len", xattr_entry::VALUE_LEN, 2),
        ("Slot descriptor", "home", zone::desc::HOME, 8),
        ("Slot descriptor", "lines", zone::desc::LINES, 8),
        ("Zone extension word", "unit", zone::ext::UNIT, 8),
    ]
}

#[test]
fn documented_sizes_match_the_code() {
    let t = parse_doc();
    let want = [
        ("Superblock", BLOCK_SIZE as usize),
        ("Journal entry", JOURNAL_ENTRY_SIZE as usize),
        ("Inode", INODE_SIZE as usize),
        ("Extent record", EXTENT_SIZE as usize),
        ("Extent-index block", BLOCK_SIZE as usize),
        ("Directory block", BLOCK_SIZE as usize),
        // The entry headers' documented sizes are where the code puts the name.
        ("Directory entry", dentry::NAME),
        ("Xattr block", BLOCK_SIZE as usize),
        ("Xattr entry", xattr_entry::NAME),
        ("Slot descriptor", 16),
        ("Zone extension word", 8),
    ];
    for (name, size) in want {
        let (declared, rows) = t
            .get(name)
            .unwrap_or_else(|| panic!("docs/DESIGN.md has no `### {name} (N bytes)` table"));
        assert_eq!(*declared, size, "{name}: documented size vs code");
        assert!(!rows.is_empty(), "{name}: empty table");
    }
    assert_eq!(
        t.len(),
        want.len(),
        "unexpected structure tables: {:?}",
        t.keys().collect::<Vec<_>>()
    );
    // Superblock sub-ranges and the inode header boundary.
    // The immutable part is bytes 0..128, ending before the state record's cache line.
    assert_eq!(Superblock::encode(&sample_sb()).len(), 128);
    const { assert!(sb::CHECKSUM + 4 <= 128 && 128 <= sb::STATE) };
    assert_eq!(sb::CHECKSUMMED, sb::CHECKSUM);
    assert_eq!(sb::STATE_CHECKSUMMED, sb::STATE_CHECKSUM - sb::STATE);
    assert_eq!(SbState::default().encode().len(), 32);
    assert_eq!(ino::HEADER, ino::SLOTS);
    assert_eq!(InodeHeader::default().encode().len(), ino::HEADER);
    // Block-header sub-ranges: entries fill their block to the end.
    assert_eq!(DENTRY_HEADER, dentry::NAME);
    assert_eq!(DIR_SLOTS as usize * dir_block::SLOT, BLOCK_SIZE as usize);
    assert_eq!(xattr_block::ENTRIES + XATTR_SPACE, BLOCK_SIZE as usize);
    assert_eq!(ExtentRecord::default().encode().len(), EXTENT_SIZE as usize);
}

#[test]
fn documented_offsets_match_the_code() {
    let t = parse_doc();
    for (s, f, off, size) in mapping() {
        let r = field(&t, s, f);
        assert_eq!(r.offset, off, "{s}.{f}: documented offset vs code constant");
        assert_eq!(r.size, size, "{s}.{f}: documented size vs code");
    }
    // Every table: rows in ascending order, disjoint, inside the structure.
    for (name, (size, rows)) in &t {
        let mut end = 0;
        for (f, r) in rows {
            assert!(
                r.offset >= end,
                "{name}.{f} at {} overlaps the previous row",
                r.offset
            );
            end = r.offset + r.size;
            assert!(
                end <= *size,
                "{name}.{f} runs past the structure's {size} bytes"
            );
        }
    }
    // Every documented field that is not reserved padding is mapped to the code.
    let mapped: Vec<(&str, &str)> = mapping().iter().map(|m| (m.0, m.1)).collect();
    for (name, (_, rows)) in &t {
        for (f, _) in rows {
            assert!(
                f == "reserved" || mapped.contains(&(name.as_str(), f.as_str())),
                "{name}.{f} is documented but not checked against the code"
            );
        }
    }
}

fn sample_sb() -> Superblock {
    Superblock {
        geometry: Geometry::compute(64 << 20, 3, 1024).unwrap(),
        uuid: *b"0123456789abcdef",
        created_ns: 0x1122_3344_5566_7788,
    }
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

#[test]
fn encoded_structures_decode_at_documented_offsets() {
    let t = parse_doc();
    let at = |s: &str, f: &str| field(&t, s, f).offset;

    // Superblock: immutable part and state record.
    let s = sample_sb();
    let g = &s.geometry;
    let mut blk = vec![0u8; BLOCK_SIZE as usize];
    blk[..128].copy_from_slice(&s.encode());
    let st = SbState {
        clean: true,
        mount_count: 0xabcdef,
        bitmap_crc: 0x1357_9bdf,
        needs_fsck: 2,
        damaged: false,
    };
    let o = at("Superblock", "state_clean");
    blk[o..o + 32].copy_from_slice(&st.encode());
    let m = at("Superblock", "magic");
    assert_eq!(&blk[m..m + 8], b"WINEFSPM");
    assert_eq!(
        u32_at(&blk, at("Superblock", "version")),
        layout::FORMAT_VERSION
    );
    assert_eq!(u32_at(&blk, at("Superblock", "block_size")), 4096);
    assert_eq!(u64_at(&blk, at("Superblock", "pool_size")), g.pool_size);
    assert_eq!(u32_at(&blk, at("Superblock", "partitions")), 3);
    // 64 MiB over 3 partitions: 16384 / 64 / 3 = 85 slots each, rounded down to 64.
    assert_eq!(g.zone_slots, 64);
    assert_eq!(
        u32_at(&blk, at("Superblock", "incompat")),
        layout::INCOMPAT_SLOT_ZONES | layout::INCOMPAT_CHECKED_SIZES | layout::INCOMPAT_ZONE_GROWTH
    );
    assert_eq!(u32_at(&blk, at("Superblock", "zone_slots")), 64);
    assert_eq!(u32_at(&blk, at("Superblock", "inodes_per_partition")), 1024);
    assert_eq!(
        u32_at(&blk, at("Superblock", "journal_entries")),
        g.journal_entries
    );
    assert_eq!(
        u32_at(&blk, at("Superblock", "staging_blocks")),
        g.staging_blocks
    );
    assert_eq!(
        u64_at(&blk, at("Superblock", "journal_start")),
        g.journal_start
    );
    assert_eq!(
        u64_at(&blk, at("Superblock", "inode_table_start")),
        g.inode_table_start
    );
    assert_eq!(
        u64_at(&blk, at("Superblock", "bitmap_start")),
        g.bitmap_start
    );
    assert_eq!(
        u64_at(&blk, at("Superblock", "bitmap_blocks")),
        g.bitmap_blocks
    );
    assert_eq!(u64_at(&blk, at("Superblock", "data_start")), g.data_start);
    assert_eq!(u64_at(&blk, at("Superblock", "data_blocks")), g.data_blocks);
    let u = at("Superblock", "uuid");
    assert_eq!(&blk[u..u + 16], b"0123456789abcdef");
    assert_eq!(
        u64_at(&blk, at("Superblock", "created_ns")),
        0x1122_3344_5566_7788
    );
    let c = at("Superblock", "checksum");
    assert_eq!(
        u32_at(&blk, c),
        crc32c::crc32c(&blk[..c]),
        "crc over 0..checksum"
    );
    assert_eq!(u32_at(&blk, at("Superblock", "state_clean")), 1);
    assert_eq!(u32_at(&blk, at("Superblock", "state_needs_fsck")), 2);
    assert_eq!(
        u64_at(&blk, at("Superblock", "state_mount_count")),
        0xabcdef
    );
    assert_eq!(
        u32_at(&blk, at("Superblock", "state_bitmap_crc")),
        0x1357_9bdf
    );
    let sc = at("Superblock", "state_checksum");
    assert_eq!(u32_at(&blk, sc), crc32c::crc32c(&blk[o..sc]), "state crc");
    assert_eq!(Superblock::decode(&blk, g.pool_size).unwrap(), s);
    assert_eq!(SbState::decode(&blk[o..o + 32]), st);

    // Inode header.
    let h = InodeHeader {
        flags: 0x0101_0101,
        mode: 0o100644,
        uid: 1001,
        gid: 1002,
        nlink: 3,
        generation: 0xdead_beef,
        size: 0x0102_0304_0506,
        map_end: 0x0708_090a,
        xattr_block: 0x1111,
        index_block: 0x2222,
        parent: 0x3333,
        atime: -5,
        mtime: 0x4444_5555,
        ctime: 0x6666_7777,
        crtime: 0x0888_9999,
        rdev: 0x0aaa_bbbb,
    };
    let b = h.encode();
    let i = |f: &str| at("Inode", f);
    assert_eq!(u32_at(&b, i("flags")), h.flags);
    assert_eq!(u32_at(&b, i("mode")), h.mode);
    assert_eq!(u32_at(&b, i("uid")), h.uid);
    assert_eq!(u32_at(&b, i("gid")), h.gid);
    assert_eq!(u32_at(&b, i("nlink")), h.nlink);
    assert_eq!(u32_at(&b, i("generation")), h.generation);
    assert_eq!(u64_at(&b, i("size")), h.size);
    assert_eq!(u64_at(&b, i("map_end")), h.map_end);
    assert_eq!(u64_at(&b, i("xattr_block")), h.xattr_block);
    assert_eq!(u64_at(&b, i("index_block")), h.index_block);
    assert_eq!(u64_at(&b, i("parent")), h.parent);
    assert_eq!(u64_at(&b, i("atime")) as i64, h.atime);
    assert_eq!(u64_at(&b, i("mtime")) as i64, h.mtime);
    assert_eq!(u64_at(&b, i("ctime")) as i64, h.ctime);
    assert_eq!(u64_at(&b, i("crtime")) as i64, h.crtime);
    assert_eq!(u32_at(&b, i("rdev")), h.rdev);
    let r = field(&t, "Inode", "reserved");
    assert!(b[r.offset..r.offset + r.size].iter().all(|&x| x == 0));
    assert_eq!(InodeHeader::decode(&b), h);

    // Extent record.
    let e = ExtentRecord {
        logical: 0x1234_5678,
        len: 0x9abc,
        phys: 0x0102_0304_0506_0708,
    };
    let b = e.encode();
    assert_eq!(u32_at(&b, at("Extent record", "logical")), e.logical);
    assert_eq!(u32_at(&b, at("Extent record", "len")), e.len);
    assert_eq!(u64_at(&b, at("Extent record", "phys")), e.phys);

    // Directory entry.
    let d = layout::encode_dentry(0x0bad_cafe, FileKind::Symlink, b"name.txt");
    let f = |x: &str| at("Directory entry", x);
    assert_eq!(u64_at(&d, f("ino")), 0x0bad_cafe);
    assert_eq!(d[f("name_len")], 8);
    assert_eq!(d[f("kind")], 3, "documented kind code of a symlink");
    assert_eq!(&d[DENTRY_HEADER..], b"name.txt", "name follows the header");
    assert_eq!(
        &d[size_of(&t, "Directory entry")..],
        b"name.txt",
        "name at the documented header size"
    );
    assert_reserved_zero(&t, "Directory entry", &d);
    let mut crc_in = d[..f("crc")].to_vec();
    crc_in.extend_from_slice(b"name.txt");
    assert_eq!(u32_at(&d, f("crc")), crc32c::crc32c(&crc_in));
}

#[test]
fn real_journal_entries_decode_at_documented_offsets() {
    let t = parse_doc();
    let at = |f: &str| field(&t, "Journal entry", f).offset;
    let dir = tempfile::tempdir().unwrap();
    let g = Geometry::compute(32 << 20, 2, 64).unwrap();
    let pool = Pool::create(&dir.path().join("p"), 32 << 20).unwrap();
    let j = Journals::new(&g, 0x0e0c_0a08);
    let target = g.data_start * BLOCK_SIZE + 40;
    pool.write(target, &[0x5a; 12], Category::Data).unwrap();
    let mut tx = Tx::new();
    tx.write(target, vec![0xa5; 12], Category::Metadata);
    tx.write(target + 4096, vec![7; 100], Category::Data);
    j.commit(&pool, tx, 0).unwrap();
    let ring = g.journal_offset(0);
    let e: Vec<[u8; 64]> = (0..4)
        .map(|i| {
            pool.read_array::<64>(ring + i * JOURNAL_ENTRY_SIZE)
                .unwrap()
        })
        .collect();
    let kinds: Vec<u8> = e.iter().map(|x| x[at("kind")]).collect();
    assert_eq!(
        kinds,
        [
            journal::KIND_START,
            journal::KIND_UNDO_INLINE,
            journal::KIND_UNDO_STAGED,
            journal::KIND_COMMIT
        ]
    );
    let txid = u64_at(&e[0], at("txid"));
    for x in &e {
        assert_eq!(u64_at(x, at("txid")), txid);
        assert_eq!(u32_at(x, at("gen")), 1);
        assert_eq!(u16_at(x, at("count")), 4);
        assert_eq!(journal::entry_count(x), 4);
        assert_eq!(u32_at(x, at("epoch")), 0x0e0c_0a08);
        assert_eq!(u32_at(x, at("crc")), crc32c::crc32c(&x[..at("crc")]));
    }
    assert_eq!(u64_at(&e[1], at("target")), target);
    assert_eq!(e[1][at("inline_len")], 12);
    let p = at("payload");
    assert_eq!(&e[1][p..p + 12], &[0x5a; 12], "old bytes inline");
    assert_eq!(u64_at(&e[2], at("target")), target + 4096);
    // The staged payload's documented sub-fields.
    assert_eq!(p, entry::STAGED_OFF);
    assert_eq!(p + 4, entry::STAGED_LEN);
    assert_eq!(p + 8, entry::STAGED_CRC);
    assert_eq!(u32_at(&e[2], p), 0);
    assert_eq!(u32_at(&e[2], p + 4), 100);
    assert_eq!(u32_at(&e[2], p + 8), crc32c::crc32c(&[0u8; 100]), "old image's crc");
    let staged = pool
        .read_array::<100>(g.staging_offset(0))
        .unwrap();
    assert_eq!(staged, [0u8; 100], "the old image in the staging area");
}

/// Format a one-partition 64 MiB pool at `path` and mount it.
fn fresh_fs(path: &Path, opts: MountOptions) -> Fs {
    common::format(path, 64 << 20, Some(1));
    common::mount_opts(path, opts)
}

/// An unmounted pool read back through a private (read-only) mapping.
struct Media {
    pool: Pool,
    g: Geometry,
}

impl Media {
    fn open(path: &Path, g: &Geometry) -> Media {
        Media {
            pool: Pool::open(path, true).unwrap(),
            g: g.clone(),
        }
    }
    /// `len` bytes at pool offset `off`.
    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.pool.read(off, &mut b).unwrap();
        b
    }
    /// Pool block `b`.
    fn block(&self, b: u64) -> Vec<u8> {
        self.read(b * BLOCK_SIZE, BLOCK_SIZE as usize)
    }
    /// The 256 bytes of inode `n`.
    fn inode(&self, n: u64) -> Vec<u8> {
        self.read(self.g.inode_offset(n).unwrap(), INODE_SIZE as usize)
    }
}

#[test]
fn real_pool_blocks_decode_at_documented_offsets() {
    let t = parse_doc();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let fs = fresh_fs(&path, MountOptions::default());
    let g = fs.geometry();
    let f = fs.create(fs.root(), b"file", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, b"user.k", b"value", XattrSet::Any).unwrap();
    // Ten one-block extents, logically separated: more than the 8 inline slots.
    for k in 0..10u64 {
        fs.write(f, k * 2 * BLOCK_SIZE, &[k as u8 + 1; 10]).unwrap();
    }
    fs.unmount().unwrap();

    let m = Media::open(&path, &g);
    let (blk, inode) = (|b: u64| m.block(b), |n: u64| m.inode(n));
    let io = |x: &str| field(&t, "Inode", x).offset;
    let slot0 = io("extent_slots");

    // Root directory: its block 0 holds "file" in slot 1.
    let root = inode(fs_root());
    let rec = ExtentRecord::decode(&root[slot0..slot0 + 16]);
    assert_eq!((rec.logical, rec.len), (0, 1));
    let d = blk(rec.phys);
    let db = |x: &str| field(&t, "Directory block", x).offset;
    assert_eq!(u32_at(&d, db("magic")), DIR_MAGIC);
    assert_eq!(u64_at(&d, db("starts")), 0b10);
    // The header checksum: crc32c of magic, starts, directory inode, block index.
    let mut hc = DIR_MAGIC.to_le_bytes().to_vec();
    hc.extend_from_slice(&0b10u64.to_le_bytes());
    hc.extend_from_slice(&fs_root().to_le_bytes());
    hc.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(u32_at(&d, db("crc")), crc32c::crc32c(&hc), "directory header checksum");
    assert_reserved_zero(&t, "Directory block", &d);
    let e = &d[db("slots")..];
    let de = |x: &str| field(&t, "Directory entry", x).offset;
    assert_eq!(u64_at(e, de("ino")), f);
    assert_eq!(e[de("name_len")], 4);
    assert_eq!(e[de("kind")], 1);
    assert_eq!(&e[DENTRY_HEADER..DENTRY_HEADER + 4], b"file");
    let name = size_of(&t, "Directory entry");
    assert_eq!(&e[name..name + 4], b"file", "name at the documented offset");
    let mut crc_in = e[..de("crc")].to_vec();
    crc_in.extend_from_slice(b"file");
    assert_eq!(u32_at(e, de("crc")), crc32c::crc32c(&crc_in));
    // Sizes are checked size words: the size in bits 0..48, then the low 16 bits of crc32c of
    // the generation and the size.
    let checked = |inode: &[u8], size: u64| {
        let mut b = u32_at(inode, io("generation")).to_le_bytes().to_vec();
        b.extend_from_slice(&size.to_le_bytes());
        (u64::from(crc32c::crc32c(&b) & 0xffff) << 48) | size
    };
    assert_ne!(u32_at(&root, io("flags")) & layout::INODE_SIZE_CHECKED, 0);
    assert_eq!(u64_at(&root, io("size")), checked(&root, BLOCK_SIZE));

    // The file: size, xattr block, index chain.
    let fi = inode(f);
    assert_eq!(u32_at(&fi, io("flags")) & layout::INODE_IN_USE, 1);
    assert_eq!(u32_at(&fi, io("nlink")), 1);
    assert_ne!(u32_at(&fi, io("flags")) & layout::INODE_SIZE_CHECKED, 0);
    assert_eq!(u64_at(&fi, io("size")), checked(&fi, 18 * BLOCK_SIZE + 10));
    assert_eq!(u64_at(&fi, io("map_end")), 19);
    let xb = u64_at(&fi, io("xattr_block"));
    assert!(g.is_data_block(xb));
    let x = blk(xb);
    let xa = |n: &str| field(&t, "Xattr block", n).offset;
    assert_eq!(u32_at(&x, xa("magic")), XATTR_MAGIC);
    assert_eq!(u16_at(&x, xa("count")), 1);
    assert_reserved_zero(&t, "Xattr block", &x);
    let used = u32_at(&x, xa("used")) as usize;
    assert_eq!(used, 4 + 6 + 5);
    let ent = xa("entries");
    assert_eq!(u32_at(&x, xa("crc")), crc32c::crc32c(&x[ent..ent + used]));
    let xe = |n: &str| ent + field(&t, "Xattr entry", n).offset;
    assert_eq!(x[xe("name_len")], 6);
    assert_eq!(u16_at(&x, xe("value_len")), 5);
    assert_reserved_zero(&t, "Xattr entry", &x[ent..]);
    let xname = ent + size_of(&t, "Xattr entry");
    assert_eq!(&x[xname..xname + 11], b"user.kvalue");

    let ib = u64_at(&fi, io("index_block"));
    assert!(g.is_data_block(ib), "ten extents need an index block");
    let ix = blk(ib);
    let xo = |n: &str| field(&t, "Extent-index block", n).offset;
    assert_eq!(u32_at(&ix, xo("magic")), INDEX_MAGIC);
    assert_eq!(u64_at(&ix, xo("next")), 0);
    assert_reserved_zero(&t, "Extent-index block", &ix);
    // The block checksum: crc32c of the block number, then the block with its crc field as
    // zero (every record in it is live here, and free slots are zero anyway).
    let mut ic = ib.to_le_bytes().to_vec();
    let mut body = ix.clone();
    body[xo("crc")..xo("crc") + 4].fill(0);
    ic.extend_from_slice(&body);
    assert_eq!(u32_at(&ix, xo("crc")), crc32c::crc32c(&ic), "extent-index block checksum");
    let mut logicals: Vec<u32> = (0..INLINE_SLOTS)
        .map(|s| ExtentRecord::decode(&fi[slot0 + s * 16..slot0 + s * 16 + 16]))
        .chain((0..INDEX_SLOTS).map(|s| {
            let o = xo("slots") + s * 16;
            ExtentRecord::decode(&ix[o..o + 16])
        }))
        .filter(|r| r.len > 0)
        .map(|r| r.logical)
        .collect();
    logicals.sort();
    assert_eq!(logicals, (0..10).map(|k| k * 2).collect::<Vec<u32>>());

    // Superblock state and the bitmap written by the clean unmount.
    let so = field(&t, "Superblock", "state_clean").offset;
    assert_eq!(u32_at(&m.read(0, so + 4), so), 1, "clean after unmount");
    let bm = m.read(
        g.bitmap_start * BLOCK_SIZE,
        (g.bitmap_blocks * BLOCK_SIZE) as usize,
    );
    let used_bit = |b: u64| {
        let i = b - g.data_start;
        bm[(i / 8) as usize] & (1 << (i % 8)) != 0
    };
    assert!(used_bit(rec.phys) && used_bit(xb) && used_bit(ib));
    let free_blocks = (0..g.data_blocks)
        .filter(|&i| !used_bit(g.data_start + i))
        .count() as u64;
    assert_eq!(free_blocks, g.data_blocks - 1 - 1 - 1 - 10);
    let sc = field(&t, "Superblock", "state_bitmap_crc").offset;
    assert_eq!(u32_at(&m.read(0, sc + 4), sc), crc32c::crc32c(&bm), "bitmap checksum");
}

/// The fields a one-block, zero-link structure cannot tell apart from zero padding, checked with
/// non-zero values in real blocks: a directory entry in slot 2 spanning two slots, a second packed
/// xattr entry, a linked second extent-index block, and a physical run longer than one block.
#[test]
fn real_pool_nonzero_links_decode_at_documented_offsets() {
    let t = parse_doc();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let fs = fresh_fs(
        &path,
        MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        },
    );
    let g = fs.geometry();
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let long = [b'n'; 60]; // 16 + 60 bytes: two slots
    let b = fs.create(fs.root(), &long, 0o600, 7, 8).unwrap().ino;
    fs.setxattr(a, b"user.first", b"1", XattrSet::Any).unwrap();
    fs.setxattr(a, b"user.second", &[0xab; 300], XattrSet::Any)
        .unwrap();
    // One extent of 3 blocks, then enough separated one-block extents to fill the 8 inline
    // slots and one index block (255 slots) and start a second.
    fs.write(a, 0, &[1; 3 * BLOCK_SIZE as usize]).unwrap();
    let extents = INLINE_SLOTS + INDEX_SLOTS + 2;
    for k in 1..extents as u64 {
        fs.write(a, (2 + 2 * k) * BLOCK_SIZE, &[2; 1]).unwrap();
    }
    fs.unmount().unwrap();

    let m = Media::open(&path, &g);
    let (blk, inode) = (|b: u64| m.block(b), |n: u64| m.inode(n));
    let io = |x: &str| field(&t, "Inode", x).offset;
    let slot0 = io("extent_slots");

    // Root directory block: "a" at slot 1, the 60-byte name at slots 2..4.
    let root = inode(fs_root());
    let d = blk(u64_at(
        &root,
        slot0 + field(&t, "Extent record", "phys").offset,
    ));
    let db = |x: &str| field(&t, "Directory block", x).offset;
    assert_eq!(u64_at(&d, db("starts")), 0b110);
    let slot = db("slots"); // slot 1; slots are this many bytes each
    let e2 = &d[2 * slot..];
    let de = |x: &str| field(&t, "Directory entry", x).offset;
    assert_eq!(u64_at(e2, de("ino")), b);
    assert_eq!(usize::from(e2[de("name_len")]), long.len());
    assert_eq!(e2[de("kind")], 1);
    let name = size_of(&t, "Directory entry");
    assert_eq!(&e2[name..name + long.len()], &long[..]);
    assert_eq!(
        layout::decode_dentry(e2).unwrap(),
        (b, FileKind::File, long.to_vec()),
        "the code decodes what the documented offsets show"
    );
    let bi = inode(b);
    assert_eq!(u32_at(&bi, io("uid")), 7);
    assert_eq!(u32_at(&bi, io("gid")), 8);
    assert_eq!(u32_at(&bi, io("mode")) & 0o7777, 0o600);

    // Xattr block: two packed entries.
    let ai = inode(a);
    let x = blk(u64_at(&ai, io("xattr_block")));
    let xa = |n: &str| field(&t, "Xattr block", n).offset;
    assert_eq!(u16_at(&x, xa("count")), 2);
    let xe = |n: &str| field(&t, "Xattr entry", n).offset;
    let hdr = size_of(&t, "Xattr entry");
    let mut p = xa("entries");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let nl = usize::from(x[p + xe("name_len")]);
        let vl = usize::from(u16_at(&x, p + xe("value_len")));
        assert_reserved_zero(&t, "Xattr entry", &x[p..]);
        let name = x[p + hdr..p + hdr + nl].to_vec();
        let value = x[p + hdr + nl..p + hdr + nl + vl].to_vec();
        seen.push((name, value));
        p += hdr + nl + vl;
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (b"user.first".to_vec(), b"1".to_vec()),
            (b"user.second".to_vec(), vec![0xab; 300]),
        ]
    );
    assert_eq!(p - xa("entries"), u32_at(&x, xa("used")) as usize);

    // Extent records and the index chain: two blocks linked through `next`.
    let er = |n: &str| field(&t, "Extent record", n).offset;
    let xo = |n: &str| field(&t, "Extent-index block", n).offset;
    let first = u64_at(&ai, io("index_block"));
    let ix1 = blk(first);
    let second = u64_at(&ix1, xo("next"));
    assert!(g.is_data_block(second), "a second index block is linked");
    let ix2 = blk(second);
    assert_eq!(u32_at(&ix2, xo("magic")), INDEX_MAGIC);
    assert_eq!(u64_at(&ix2, xo("next")), 0);
    assert_reserved_zero(&t, "Extent-index block", &ix1);
    assert_reserved_zero(&t, "Extent-index block", &ix2);
    let records: Vec<&[u8]> = ai[slot0..slot0 + INLINE_SLOTS * 16]
        .chunks(16)
        .chain(ix1[xo("slots")..].chunks(16))
        .chain(ix2[xo("slots")..].chunks(16))
        .filter(|r| u32_at(r, er("len")) > 0)
        .collect();
    assert_eq!(records.len(), extents);
    let mut runs: Vec<(u32, u32, u64)> = records
        .iter()
        .map(|r| {
            (
                u32_at(r, er("logical")),
                u32_at(r, er("len")),
                u64_at(r, er("phys")),
            )
        })
        .collect();
    runs.sort();
    assert_eq!((runs[0].0, runs[0].1), (0, 3), "the three-block extent");
    for (k, r) in runs.iter().enumerate().skip(1) {
        assert_eq!((r.0, r.1), (2 + 2 * k as u32, 1));
        assert!(g.is_data_block(r.2));
    }
    for r in &records {
        let code = ExtentRecord::decode(r);
        assert_eq!(
            (code.logical, code.len, code.phys),
            (
                u32_at(r, er("logical")),
                u32_at(r, er("len")),
                u64_at(r, er("phys"))
            )
        );
    }
}

fn fs_root() -> u64 {
    layout::ROOT_INO
}

/// A strict overwrite inside a block goes to an alternate slot: after a crash (no clean unmount
/// to write it back) its descriptor and the slot block decode at the documented offsets, and
/// the next mount writes it home and clears it.
#[test]
fn real_slot_descriptors_decode_at_documented_offsets() {
    let t = parse_doc();
    let at = |f: &str| field(&t, "Slot descriptor", f).offset;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let fs = fresh_fs(&path, MountOptions::default());
    let g = fs.geometry();
    assert!(g.zone_slots >= 64, "{g:?}");
    let f = fs.create(fs.root(), b"file", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[7u8; 8192]).unwrap();
    fs.write(f, 4096 + 200, &[9u8; 100]).unwrap();
    let home = fs
        .extents(f)
        .unwrap()
        .iter()
        .find(|&&(l, _, n)| l <= 1 && 1 < l + n)
        .map(|&(l, p, _)| p + (1 - l))
        .unwrap();
    fs.simulate_crash();

    let m = Media::open(&path, &g);
    let mut found = Vec::new();
    for p in 0..g.partitions {
        for s in 0..g.zone_slots {
            let d = m.read(g.zone_desc_offset(p, s), 16);
            if u64_at(&d, at("lines")) != 0 {
                found.push((p, s, d));
            }
        }
    }
    assert_eq!(found.len(), 1, "one live slot");
    let (p, s, d) = &found[0];
    let word = u64_at(d, at("home"));
    assert_eq!(word & ((1 << 40) - 1), home);
    let mut c = home.to_le_bytes().to_vec();
    c.extend_from_slice(&p.to_le_bytes());
    c.extend_from_slice(&s.to_le_bytes());
    assert_eq!(word >> 40, u64::from(crc32c::crc32c(&c) >> 8));
    // Bytes 200..300 of the block: lines 3 and 4.
    assert_eq!(u64_at(d, at("lines")), 0b11000);
    let slot = m.read(g.zone_slot_offset(*p, *s), 4096);
    assert_eq!(&slot[200..300], &[9u8; 100][..]);
    assert_eq!(&slot[192..200], &[7u8; 8][..], "the rest of the line comes from home");
    assert_eq!(m.block(home)[200], 7, "home keeps the old bytes until the write-back");
    drop(m);

    let fs = common::mount(&path);
    let mut back = vec![0u8; 8192];
    fs.read(f, 0, &mut back).unwrap();
    let mut want = vec![7u8; 8192];
    want[4096 + 200..4096 + 300].fill(9);
    assert_eq!(back, want);
    fs.unmount().unwrap();
    let m = Media::open(&path, &g);
    assert_eq!(m.block(home)[200], 9, "written home at mount");
    assert_eq!(u64_at(&m.read(g.zone_desc_offset(*p, *s), 16), at("lines")), 0);
}

/// A zone that grew (more blocks hold their newest lines in slots than its own slots keep
/// free): after a crash its extension word and a descriptor and slot of the unit decode at the
/// documented offsets, and mount writes the unit's slots home and clears the word.
#[test]
fn real_zone_extension_words_decode_at_documented_offsets() {
    let t = parse_doc();
    let unit_at = field(&t, "Zone extension word", "unit").offset;
    let at = |f: &str| field(&t, "Slot descriptor", f).offset;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let fs = fresh_fs(&path, MountOptions::default());
    let g = fs.geometry();
    assert!(g.zone_growth, "{g:?}");
    let s = g.zone_slots;
    let f = fs.create_file("/f").unwrap().ino();
    let blocks = u64::from(s) + 64;
    fs.write(f, 0, &vec![1u8; (blocks * 4096) as usize]).unwrap();
    // One line (line b % 64) in each block: each takes a slot of its own.
    for b in 0..blocks {
        fs.write(f, b * 4096 + b % 64 * 64, &[2u8; 64]).unwrap();
    }
    let extents = fs.extents(f).unwrap();
    fs.simulate_crash();

    let m = Media::open(&path, &g);
    let word = u64_at(&m.read(g.zone_table_offset(0), 8), unit_at);
    assert_ne!(word, 0, "unit 0 of zone 0 is named");
    let start = word & ((1 << 40) - 1);
    let mut c = start.to_le_bytes().to_vec();
    c.extend_from_slice(&0u32.to_le_bytes());
    c.extend_from_slice(&(1u32 << 31).to_le_bytes());
    assert_eq!(word >> 40, u64::from(crc32c::crc32c(&c) >> 8));
    assert_eq!(start % 512, 0);
    assert!(g.is_data_block(start) && g.is_data_block(start + 511));
    // The unit's live descriptors: slot i is zone slot S + i, named in its home word's check.
    let descs = m.read(start * 4096, 510 * 16);
    let mut live = 0;
    for (i, d) in descs.chunks_exact(16).enumerate() {
        let lines = u64_at(d, at("lines"));
        if lines == 0 {
            continue;
        }
        live += 1;
        let home_word = u64_at(d, at("home"));
        let home = home_word & ((1 << 40) - 1);
        let mut c = home.to_le_bytes().to_vec();
        c.extend_from_slice(&0u32.to_le_bytes());
        c.extend_from_slice(&(s + i as u32).to_le_bytes());
        assert_eq!(home_word >> 40, u64::from(crc32c::crc32c(&c) >> 8), "descriptor {i}");
        let (l, p, _) = *extents.iter().find(|&&(_, p, n)| p <= home && home < p + n).unwrap();
        let b = l + (home - p);
        assert_eq!(lines, 1 << (b % 64), "block {b}'s one line");
        let slot = m.read((start + 2 + i as u64) * 4096, 4096);
        assert_eq!(&slot[(b % 64 * 64) as usize..][..64], &[2u8; 64][..]);
        assert_eq!(m.block(home)[(b % 64 * 64) as usize], 1, "home keeps the old line");
    }
    assert!(live > 0, "the unit holds live slots");
    drop(m);

    let fs = common::mount(&path);
    let mut back = vec![0u8; 4096];
    for b in 0..blocks {
        fs.read(f, b * 4096, &mut back).unwrap();
        let line = (b % 64 * 64) as usize;
        assert!(back[..line].iter().chain(&back[line + 64..]).all(|&x| x == 1), "block {b}");
        assert!(back[line..line + 64].iter().all(|&x| x == 2), "block {b}");
    }
    fs.unmount().unwrap();
    let m = Media::open(&path, &g);
    assert_eq!(u64_at(&m.read(g.zone_table_offset(0), 8), unit_at), 0, "cleared");
}
