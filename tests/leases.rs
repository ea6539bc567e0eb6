//! Direct-path leases in the core (docs/DESIGN.md §7b), through the library API the mount's
//! channel uses: a lease fills holes (aligned units for large ranges), pins the file's blocks
//! (no rewrite, no scatter, strict writes in place, no collapse), keeps them through truncate,
//! punch hole and zero range (zeroing in place what the client sees), and keeps an unlinked
//! file alive.

mod common;

use common::{fresh_pool, mount, pattern};
use std::os::unix::fs::FileExt;
use winefs::state::size_word;
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

/// Bytes [off, off+len) of the file as the leased blocks `extents` hold them: what a client's
/// mapping loads.
fn load(pool: &std::fs::File, extents: &[(u64, u64, u64)], off: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    for (i, b) in out.iter_mut().enumerate() {
        pool.read_exact_at(std::slice::from_mut(b), pool_offset(extents, off + i as u64)).unwrap();
    }
    out
}

/// A fresh 64 MiB pool mounted, the pool file open as a client holds it, and an empty file.
fn pool_and_file() -> (tempfile::TempDir, Fs, std::fs::File, winefs::File, u64) {
    let (d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let pool = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let f = fs.create_file("/q").unwrap();
    let ino = f.ino();
    (d, fs, pool, f, ino)
}

#[test]
fn a_leased_file_keeps_its_blocks_through_punch_zero_range_and_truncate_and_its_client_sees_zeros() {
    let (_d, fs, pool, f, ino) = pool_and_file();
    f.write_at(0, &vec![7u8; 4 * MIB as usize]).unwrap();
    let before = free(&fs);
    let l = fs.lease(ino, 0, 4 * MIB, true).unwrap();
    fs.lease(ino, 0, MIB, true).unwrap();
    let zeros = |off: u64, len: u64| load(&pool, &l.extents, off, len).iter().all(|&b| b == 0);
    // A punched hole and a zeroed range read zeros where the client's mapping reaches (as a
    // kernel mapping would show), and the bytes around them are the file's.
    // The punch spans three of the in-place zeroing's 1 MiB transactions.
    fs.punch_hole(ino, MIB + 100, 2 * MIB).unwrap();
    fs.zero_range(ino, 3 * MIB + 8192, 5000, false).unwrap();
    assert!(zeros(MIB + 100, 2 * MIB), "the client's mapping shows a punched range's old bytes");
    assert!(zeros(3 * MIB + 8192, 5000), "the client's mapping shows a zeroed range's old bytes");
    for at in [MIB + 99, 3 * MIB + 100, 3 * MIB + 8191, 3 * MIB + 8192 + 5000] {
        assert_eq!(load(&pool, &l.extents, at, 1), [7], "byte {at} changed");
    }
    assert_eq!(fs.extents(ino).unwrap(), l.extents, "a leased file's blocks moved");
    assert_eq!(free(&fs), before, "blocks a client maps were freed");
    // Truncated and grown back: the grown part reads zeros through the client's blocks, which
    // are still the file's, so what the client stores there afterwards is in the file.
    f.set_len(100).unwrap();
    assert_eq!((free(&fs), fs.quarantined_blocks()), (before, 0), "a truncate under a lease gave blocks up");
    f.set_len(4 * MIB).unwrap();
    assert_eq!(load(&pool, &l.extents, 0, 100), vec![7u8; 100]);
    assert!(zeros(100, 4 * MIB - 100), "the grown part shows the bytes the file had before");
    store(&pool, &l.extents, 2 * MIB + 5, b"client");
    let mut buf = [0u8; 6];
    f.read_at(2 * MIB + 5, &mut buf).unwrap();
    assert_eq!(&buf, b"client", "a store through the mapping after the truncate is not the file's");
    f.write_at(3 * MIB, b"daemon").unwrap();
    assert_eq!(load(&pool, &l.extents, 3 * MIB, 6), b"daemon");
    // Ranges past the end: nothing inside the file to zero; zero range allocates (KEEP_SIZE).
    fs.zero_range(ino, 5 * MIB, 4096, true).unwrap();
    fs.punch_hole(ino, 6 * MIB, 4096).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, 4 * MIB);
    let before = before - 1;
    assert_eq!(free(&fs), before);
    // Shrunk again: when the last lease goes, what the truncate kept past the end is speculative
    // preallocation (free space), given back at the last close of the now small file.
    f.set_len(100).unwrap();
    fs.unlease(ino).unwrap();
    assert_eq!(free(&fs), before, "the first of two leases let the blocks go");
    fs.unlease(ino).unwrap();
    assert!(free(&fs) >= before + 1023, "kept blocks not counted free after the last lease: {}", free(&fs));
    drop(f);
    assert_eq!(fs.extents(ino).unwrap().iter().map(|e| e.2).sum::<u64>(), 1, "the kept blocks stayed");
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

#[test]
fn a_zero_range_of_a_leased_file_refused_for_lack_of_space_leaves_every_byte_as_it_was() {
    // Zero range of a leased file zeroes the mapped bytes in place and allocates the range's
    // holes: the holes come first, so a pool too full for them refuses the call before a byte
    // is zeroed (it zeroed in place first, then failed with ENOSPC, leaving the range zeroed).
    let (_d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/leased").unwrap();
    let data = pattern(MIB as usize, 3);
    f.write_at(0, &data).unwrap();
    // A hole of 2 MiB past the data, inside the file.
    f.set_len(4 * MIB).unwrap();
    fs.lease(f.ino(), 0, MIB, false).unwrap();
    let big = fs.create_file("/big").unwrap();
    let chunk = vec![1u8; 64 << 10];
    let mut off = 0;
    while big.write_at(off, &chunk).is_ok_and(|n| n == chunk.len()) {
        off += chunk.len() as u64;
    }
    let err = fs.zero_range(f.ino(), 4096, 3 * MIB, false).unwrap_err();
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    let mut back = vec![0u8; MIB as usize];
    f.read_at(0, &mut back).unwrap();
    assert!(back == data, "a refused zero range changed the leased file's bytes");
    assert_eq!(fs.getattr(f.ino()).unwrap().size, 4 * MIB);
    // With space it zeroes, and the holes are allocated.
    drop(big);
    fs.unlink(fs.root(), b"big").unwrap();
    fs.zero_range(f.ino(), 4096, 3 * MIB, false).unwrap();
    f.read_at(0, &mut back).unwrap();
    assert!(back[..4096] == data[..4096] && back[4096..].iter().all(|&b| b == 0));
    let blocks: u64 = fs.extents(f.ino()).unwrap().iter().map(|e| e.2).sum();
    assert!(blocks >= 769, "holes left in the zeroed range: {blocks} blocks");
    fs.unlease(f.ino()).unwrap();
    drop(f);
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

/// The size board through `/proc/self/fd` (as a client maps it): one word per inode.
struct Board(std::fs::File);

impl Board {
    fn open(fs: &Fs) -> Board {
        let (fd, _) = fs.size_board().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .unwrap();
        Board(f)
    }
    fn word(&self, ino: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, ino * 16).unwrap();
        u64::from_le_bytes(b)
    }
    /// What a client's swap does (single-threaded here, so a plain store).
    fn set(&self, ino: u64, w: u64) {
        self.0.write_all_at(&w.to_le_bytes(), ino * 16).unwrap();
    }
}

/// Store `data` at file offset `off` into the leased blocks `extents`, as a client does.
fn store(pool: &std::fs::File, extents: &[(u64, u64, u64)], off: u64, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        pool.write_all_at(&[b], pool_offset(extents, off + i as u64)).unwrap();
    }
}

/// Where byte `at` of the file lies in the pool, by the leased blocks `extents`.
fn pool_offset(extents: &[(u64, u64, u64)], at: u64) -> u64 {
    let blk = at / 4096;
    let &(fb, pb, _) = extents
        .iter()
        .find(|e| e.0 <= blk && blk < e.0 + e.2)
        .unwrap_or_else(|| panic!("offset {at} is not leased: {extents:?}"));
    (pb + blk - fb) * 4096 + at % 4096
}

#[test]
fn a_direct_append_is_pulled_in_by_any_look_at_the_file_survives_a_crash_once_synced_and_never_shows_stray_bytes() {
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/wal").unwrap();
    f.write_at(0, &[1u8; 100]).unwrap();
    let ino = f.ino();
    let board = Board::open(&fs); // made at a client's hello, before its first lease
    let l = fs.lease_append(ino, 0, 2 * MIB).unwrap();
    assert_eq!(l.size, 100);
    let blocks: u64 = l.extents.iter().map(|e| e.2).sum();
    assert_eq!(blocks, 512, "the whole range is reserved, past the end too: {:?}", l.extents);
    assert!(fs.changed_directly(ino));
    let w = board.word(ino);
    assert!(!size_word::frozen(w) && size_word::size(w) == 100, "word {w:#x}");
    let pool = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    // The client stores 5000 bytes after the end, then grows the size with one swap.
    store(&pool, &l.extents, 100, &pattern(5000, 3));
    let grown = size_word::grown(w, 5100).unwrap();
    board.set(ino, grown);
    // Any look at the file takes the size from the board (and makes it durable).
    assert_eq!(fs.getattr(ino).unwrap().size, 5100);
    let mut back = vec![0u8; 6000];
    assert_eq!(fs.read(ino, 0, &mut back).unwrap(), 5100);
    assert_eq!(&back[100..5100], &pattern(5000, 3)[..]);
    // Those looks changed nothing: the word is back as the client left it, so its next swap
    // (from the word it read before them) still succeeds.
    let w2 = board.word(ino);
    assert_eq!(w2, grown, "a look moved the word on");
    // More appends, synced; then bytes past the end whose swap never happened.
    store(&pool, &l.extents, 5100, &pattern(3000, 4));
    board.set(ino, size_word::grown(w2, 8100).unwrap());
    fs.fsync(ino).unwrap();
    store(&pool, &l.extents, 8100, &[0xEE; 4000]);
    drop(f);
    fs.simulate_crash();

    let fs = mount(&p);
    let f = fs.open_file("/wal").unwrap();
    let ino = f.ino();
    assert_eq!(fs.getattr(ino).unwrap().size, 8100, "the synced appends survive the crash");
    let mut back = vec![0u8; 8100];
    fs.read(ino, 0, &mut back).unwrap();
    assert_eq!(&back[5100..8100], &pattern(3000, 4)[..]);
    // Growing the file exposes zeros, never the bytes a client left past the end.
    fs.truncate(ino, 20_000).unwrap();
    let mut tail = vec![1u8; 20_000 - 8100];
    fs.read(ino, 8100, &mut tail).unwrap();
    assert!(tail.iter().all(|&b| b == 0), "stray bytes exposed by truncate");
    f.write_at(30_000, b"x").unwrap();
    let mut gap = vec![1u8; 10_000];
    fs.read(ino, 20_000, &mut gap).unwrap();
    assert!(gap.iter().all(|&b| b == 0), "stray bytes exposed by a write past the end");
    drop(f);
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn a_change_by_the_daemon_freezes_out_appenders_and_a_given_back_append_lease_cannot_grow_the_file() {
    let (_d, p) = fresh_pool(64 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/log").unwrap();
    f.write_at(0, &[2u8; 3 * 4096]).unwrap();
    let ino = f.ino();
    let board = Board::open(&fs);
    let owned = |fs: &Fs| fs.getattr(ino).unwrap().blocks / 8; // 512-byte units
    let before = free(&fs) + owned(&fs);
    let l = fs.lease_append(ino, 0, 4 * MIB).unwrap();
    let w = board.word(ino);
    // Another process truncates: the word moves on (an appender's swap from `w` fails) and the
    // blocks past the new end stay with the file, since the client may still store into them.
    let held = owned(&fs);
    fs.truncate(ino, 100).unwrap();
    let w2 = board.word(ino);
    assert_eq!(size_word::size(w2), 100);
    assert!(!size_word::same_epoch(w, w2));
    assert_eq!((owned(&fs), fs.quarantined_blocks()), (held, 0), "a truncate under a lease gave blocks up");
    assert!(fs.collapse_range(ino, 0, 4096).is_err(), "collapse under a lease");
    // A write through the daemon by another process (O_APPEND) lands at the true end.
    board.set(ino, size_word::grown(w2, 300).unwrap());
    let (_, at) = fs.append(ino, b"tail").unwrap();
    assert_eq!(at, 300, "appended at the size the client published");
    fs.unlease_append(ino).unwrap();
    assert!(!fs.changed_directly(ino));
    let w3 = board.word(ino);
    assert!(size_word::frozen(w3), "a file with no appender keeps its word frozen: {w3:#x}");
    assert_eq!(size_word::grown(w3, 1 << 20), None);
    assert!(fs.unlease_append(ino).is_err(), "an append lease given back twice");
    assert_eq!(fs.quarantined_blocks(), 0);
    // The reservation left is speculative: the last close of the small file gives it back.
    let _ = l;
    drop(f);
    assert_eq!(fs.extents(ino).unwrap().iter().map(|e| e.2).sum::<u64>(), 1, "the reservation stayed");
    assert_eq!(free(&fs) + owned(&fs), before, "blocks leaked");
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn a_leased_file_truncated_in_steps_then_written_past_its_end_shows_its_client_the_zeros() {
    // Truncates to a smaller and then a larger size, both under the lease, keep the blocks the
    // client maps; a write past the end fills the gap with zeros in those same blocks.
    let (_d, fs, pool, f, ino) = pool_and_file();
    f.set_len(3 * MIB).unwrap();
    let l = fs.lease(ino, 0, 3 * MIB, true).unwrap();
    store(&pool, &l.extents, 0, &vec![0xaa; 3 * MIB as usize]);
    f.set_len(139_677).unwrap();
    f.set_len(146_391).unwrap();
    f.write_at(1_023_303, &[0x11; 16_418]).unwrap();
    let end = 1_023_303 + 16_418;
    let seen = load(&pool, &l.extents, 0, end);
    let mut file = vec![0u8; end as usize];
    f.read_at(0, &mut file).unwrap();
    let first = seen.iter().zip(&file).position(|(a, b)| a != b);
    assert_eq!(first, None, "the client's blocks and the file differ from this offset on");
    assert!(file[139_677..1_023_303].iter().all(|&b| b == 0));
    fs.unlease(ino).unwrap();
    drop(f);
    let r = fs.check();
    assert!(r.is_clean(), "{r:?}");
    fs.unmount().unwrap();
}

#[test]
fn a_file_a_client_wrote_directly_gets_new_times_at_the_next_look_and_at_the_lease_s_end() {
    let (_d, p) = fresh_pool(64 << 20, None);
    let fs = mount(&p);
    let f = fs.create_file("/written").unwrap();
    f.write_at(0, &[1u8; 8192]).unwrap();
    let ino = f.ino();
    let board = Board::open(&fs);
    fs.lease(ino, 0, 8192, true).unwrap();
    assert!(fs.changed_directly(ino), "a leased file's attributes may change without a request");
    let generation = |b: &Board| {
        let mut w = [0u8; 8];
        b.0.read_exact_at(&mut w, ino * 16 + 8).unwrap();
        u64::from_le_bytes(w)
    };
    // What a client does after a direct write (`Client::mark_written`).
    let mark = |b: &Board| {
        let w = generation(b) | size_word::WRITTEN;
        b.0.write_all_at(&w.to_le_bytes(), ino * 16 + 8).unwrap();
    };
    let t0 = fs.getattr(ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(fs.getattr(ino).unwrap().mtime, t0.mtime, "no direct write, no new time");
    mark(&board);
    let t1 = fs.getattr(ino).unwrap();
    assert!(t1.mtime > t0.mtime && t1.ctime >= t1.mtime, "{t0:?} then {t1:?}");
    assert_eq!(generation(&board) & size_word::WRITTEN, 0, "the flag was taken");
    assert_eq!(fs.getattr(ino).unwrap().mtime, t1.mtime);
    // A layout generation bump keeps a client's flag.
    mark(&board);
    let before = size_word::generation(generation(&board));
    fs.set_inode_flags(ino, winefs::media::layout::INODE_APPEND_ONLY).unwrap();
    assert_eq!(size_word::generation(generation(&board)), before + 1, "chattr +a bumps the generation");
    assert_ne!(generation(&board) & size_word::WRITTEN, 0, "the flag went with a generation bump");
    fs.set_inode_flags(ino, 0).unwrap();
    // Flagged at the lease's end: stamped then, durably.
    std::thread::sleep(std::time::Duration::from_millis(5));
    fs.unlease(ino).unwrap();
    assert!(!fs.changed_directly(ino));
    let t2 = fs.getattr(ino).unwrap();
    assert!(t2.mtime > t1.mtime, "{t1:?} then {t2:?}");
    drop(f);
    drop(fs);
    let fs = mount(&p);
    assert_eq!(fs.getattr(ino).unwrap().mtime, t2.mtime, "the times are on media");
}
