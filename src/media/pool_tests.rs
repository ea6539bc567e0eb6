//! Unit tests of the pool (`media::pool`), kept beside it in their own file.

use super::*;
use crate::media::pool_copy::VECTOR_COPY_MAX;

/// A lock held only for a moment (a forked child's copy of a closed descriptor, until it
/// execs) does not refuse the pool; a lock still held after the retry window does.
#[test]
fn a_briefly_held_lock_is_waited_out_a_held_one_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    drop(Pool::create(&p, 8 << 20).unwrap());
    // Another open file description of the pool, locked like a mount's.
    let other = File::open(&p).unwrap();
    other.lock().unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(other);
    });
    assert!(Pool::open(&p, false).is_ok(), "a lock released after 20 ms");
    release.join().unwrap();
    let _held = Pool::open(&p, false).unwrap();
    let t = std::time::Instant::now();
    assert!(matches!(Pool::open(&p, false), Err(Error::Busy(_))));
    assert!(matches!(Pool::open(&p, true), Err(Error::Busy(_))));
    assert!(
        t.elapsed() >= 2 * LOCK_RETRY,
        "refused only after the retry window"
    );
}

#[test]
fn mapping_is_2mib_aligned_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    let pool = Pool::create(&p, 8 << 20).unwrap();
    assert_eq!(pool.base_addr() % HUGE, 0);
    pool.write_flush(4096, b"hello", Category::Data).unwrap();
    pool.fence();
    let mut b = [0u8; 5];
    pool.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    let s = pool.stats();
    assert_eq!(s.bytes_written[0], 5);
    assert_eq!(s.lines_flushed[0], 1);
    assert_eq!(s.fences, 1);
    drop(pool);
    let reopened = Pool::open(&p, false).unwrap();
    reopened.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"hello");
}

/// Reads of every length around the vector copy's bounds and steps, from and to unaligned
/// addresses, return exactly the pool's bytes and write nothing past the buffer.
#[test]
fn whole_lines_are_stored_counted_and_anything_else_refused() {
    // One store per line where the processor has them, and the ordered word stores elsewhere.
    for line_stores in [true, false] {
        whole_lines_stored(line_stores);
    }
}

fn whole_lines_stored(line_stores: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = Pool::create(&dir.path().join("pool"), 8 << 20).unwrap();
    pool.line_stores &= line_stores;
    let lines: Vec<u8> = (0..192u32).map(|i| (i * 7 % 251) as u8).collect();
    pool.write_lines_flush(8192, &lines, Category::Journal).unwrap();
    pool.fence();
    let mut back = vec![0u8; 192];
    pool.read(8192, &mut back).unwrap();
    assert_eq!(back, lines);
    let journal = Category::Journal as usize;
    assert_eq!(pool.stats().bytes_written[journal], 192);
    // Not whole lines: refused, nothing stored.
    for (off, len) in [(8192 + 8, 64), (8192, 65), (8192, 32)] {
        let e = pool.write_lines_flush(off, &vec![1u8; len], Category::Journal);
        assert!(matches!(e, Err(Error::Invalid(_))), "{off}+{len}: {e:?}");
    }
    pool.read(8192, &mut back).unwrap();
    assert_eq!(back, lines);
    assert_eq!(pool.stats().bytes_written[journal], 192);
}

#[test]
fn reads_of_every_size_copy_exactly_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(&dir.path().join("pool"), 1 << 20).unwrap();
    let byte = |i: u32| (i.wrapping_mul(7) + i / 251).to_le_bytes()[0];
    let img: Vec<u8> = (0..(128u32 << 10)).map(byte).collect();
    pool.write(0, &img, Category::Data).unwrap();
    let lens = [1, 31, 127, 128, 129, 511, 512, 513, 640, 4095, 4096, 4097, 16_384, 32_767];
    let lens = lens.into_iter().chain([VECTOR_COPY_MAX, VECTOR_COPY_MAX + 1, 65_536]);
    for len in lens {
        for (from, at) in [(0usize, 0usize), (3, 1), (64, 17), (4093, 32)] {
            let mut buf = vec![0xeeu8; len + at + 8];
            pool.read(from as u64, &mut buf[at..at + len]).unwrap();
            assert_eq!(&buf[at..at + len], &img[from..from + len], "len {len} from {from}");
            assert!(buf[..at].iter().chain(&buf[at + len..]).all(|&b| b == 0xee));
        }
    }
}

#[test]
fn out_of_bounds_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(&dir.path().join("pool"), 1 << 20).unwrap();
    let mut b = [0u8; 8];
    assert!(matches!(
        pool.read((1 << 20) - 4, &mut b),
        Err(Error::Corrupted(_))
    ));
    assert!(pool.write(u64::MAX - 2, &b, Category::Data).is_err());
}

#[test]
fn private_mapping_never_reaches_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    Pool::create(&p, 1 << 20).unwrap();
    let private = Pool::open(&p, true).unwrap();
    private.write(0, b"xyz", Category::Metadata).unwrap();
    drop(private);
    let shared = Pool::open(&p, false).unwrap();
    assert_eq!(shared.read_array::<3>(0).unwrap(), [0, 0, 0]);
}

#[test]
fn create_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pool");
    Pool::create(&p, 1 << 20).unwrap();
    assert!(matches!(Pool::create(&p, 1 << 20), Err(Error::Io { .. })));
}
