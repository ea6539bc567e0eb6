//! Memory mappings: hugepage (PMD) mapping of aligned files, scattered files, fault-time
//! allocation of sparse files under concurrent faults, and mapping changes on truncate, punch,
//! grow and unlink. Pools live on a hugepage tmpfs (mounted by `winefs::hugepool` as root).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use winefs::Fs;
use winefs::sys::thread_page_faults;

mod common;

const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;

/// A fresh pool of `size` bytes on the hugepage tmpfs; removed when dropped.
struct HugePool {
    path: PathBuf,
}

impl HugePool {
    fn new(name: &str, size: u64) -> HugePool {
        let (path, warning) = winefs::hugepool::default_pool(&format!("test-{name}.pool"));
        assert!(
            warning.is_none(),
            "these tests need a hugepage tmpfs (run as root, or mount one on {}): {warning:?}",
            winefs::hugepool::HUGE_DIR
        );
        let _ = std::fs::remove_file(&path);
        common::format(&path, size, Some(2));
        HugePool { path }
    }
    fn mount(&self) -> Fs {
        common::mount(&self.path)
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn assert_clean(fs: &Fs) {
    let r = fs.check();
    assert!(r.is_clean(), "fsck: {r:?}");
}

/// Every block of the file lies in a 2 MiB-aligned extent covering its whole unit.
fn all_units_aligned(fs: &Fs, ino: u64) -> bool {
    fs.extents(ino)
        .unwrap()
        .iter()
        .all(|&(l, p, n)| l % 512 == 0 && p % 512 == 0 && n % 512 == 0)
}

#[test]
fn aligned_file_is_hugepage_mapped_with_one_fault_per_2mib() {
    let pool = HugePool::new("aligned", 256 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/big").unwrap();
    let data = pattern((16 * HUGE) as usize, 7);
    for (i, chunk) in data.chunks(HUGE as usize).enumerate() {
        f.write_at(i as u64 * HUGE, chunk).unwrap();
    }
    assert!(all_units_aligned(&fs, f.ino()), "{:?}", fs.extents(f.ino()));
    let m = f.mmap(0, data.len()).unwrap();
    assert_eq!(m.as_ptr() as u64 % HUGE, 0);
    let before = thread_page_faults();
    let mut got = vec![0u8; data.len()];
    m.read(0, &mut got).unwrap();
    let faults = thread_page_faults() - before;
    assert!(got == data, "content read through the mapping differs");
    assert_eq!(m.pmd_mapped_bytes().unwrap(), 16 * HUGE);
    // One fault per 2 MiB (plus a few for the destination buffer's own pages, which are
    // anonymous memory faulted as it is written).
    assert!(
        faults <= 16 + (data.len() as u64 / 4096) + 8,
        "{faults} faults"
    );
    // Stores through the mapping are what read(2) sees.
    m.write(3 * HUGE as usize + 5, b"mapped").unwrap();
    let mut b = [0u8; 6];
    f.read_at(3 * HUGE + 5, &mut b).unwrap();
    assert_eq!(&b, b"mapped");
    m.msync(0, m.len()).unwrap();
    drop(m);
    assert_clean(&fs);
}

#[test]
fn pmd_mapping_takes_one_fault_per_unit() {
    let pool = HugePool::new("faults", 256 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/f").unwrap();
    f.fallocate(0, 32 * HUGE).unwrap();
    assert!(all_units_aligned(&fs, f.ino()));
    let m = f.mmap(0, (32 * HUGE) as usize).unwrap();
    let before = thread_page_faults();
    for off in (0..m.len()).step_by(4096) {
        m.write(off, &[1]).unwrap();
    }
    let faults = thread_page_faults() - before;
    assert!(faults <= 32 + 3, "{faults} faults for 32 units");
    assert_eq!(m.pmd_mapped_bytes().unwrap(), 32 * HUGE);
}

#[test]
fn scattered_file_maps_reads_back_and_is_rewritten_onto_hugepages() {
    // Interleaved writes scatter two files only while both allocate in one partition (the
    // CPU's): keep this thread on one CPU, or a move to the other gives each file its own.
    let _ = winefs::sys::run_only_on_cpu(0);
    let pool = HugePool::new("scattered", 128 * MIB);
    let fs = pool.mount();
    let a = fs.create_file("/a").unwrap();
    let b = fs.create_file("/b").unwrap();
    let data = pattern(2 * MIB as usize, 3);
    // Interleaved 4 KiB writes to two small files scatter both over 4 KiB holes.
    for (i, chunk) in data.chunks(4096).enumerate() {
        a.write_at(i as u64 * 4096, chunk).unwrap();
        b.write_at(i as u64 * 4096, &[i as u8; 100]).unwrap();
    }
    let ext = fs.extents(a.ino()).unwrap();
    assert!(
        ext.len() > 100,
        "expected a scattered file, got {} extents",
        ext.len()
    );
    // Mapping it queues a background rewrite; reads are right before, during and after it.
    let m = a.mmap(0, data.len()).unwrap();
    let mut got = vec![0u8; data.len()];
    m.read(0, &mut got).unwrap();
    assert!(got == data);
    let done = fs
        .settle_rewrites(std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(done.units_rewritten, 1);
    assert!(all_units_aligned(&fs, a.ino()), "{:?}", fs.extents(a.ino()));
    let mut got = vec![0u8; data.len()];
    m.read(0, &mut got).unwrap();
    assert!(got == data, "content changed by the rewrite");
    assert_eq!(m.pmd_mapped_bytes().unwrap(), 2 * MIB);
    assert_eq!(
        fs.getxattr(a.ino(), winefs::meta::xattr::HUGEPAGE_HINT)
            .unwrap(),
        b"1"
    );
    // An unaligned mapping offset also works.
    let m2 = b.mmap(12288, 3 * 4096 + 1).unwrap();
    let mut got = vec![0u8; 3 * 4096];
    m2.read(0, &mut got).unwrap();
    assert_eq!(&got[..100], &[3u8; 100]);
    drop((m, m2));
    assert_clean(&fs);
}

#[test]
fn rewrite_under_concurrent_stores_loses_nothing() {
    let pool = HugePool::new("rewrite-race", 128 * MIB);
    let fs = pool.mount();
    let a = fs.create_file("/a").unwrap();
    let size = 6 * MIB;
    a.fallocate(0, size).unwrap();
    // Punch a block out of every unit and write it back: each unit now holds a 4 KiB hole
    // block, so none is one aligned extent.
    for u in 0..size / HUGE {
        fs.punch_hole(a.ino(), u * HUGE + 40960, 4096).unwrap();
        a.write_at(u * HUGE + 40960, &[0u8; 4096]).unwrap();
    }
    assert!(!all_units_aligned(&fs, a.ino()));
    let m = a.mmap(0, size as usize).unwrap(); // also queues a background rewrite
    let slots = size as usize / 4096;
    let fg = std::thread::scope(|s| {
        let m = &m;
        let writer = s.spawn(move || {
            // Each page's slot is stored once, in order, while the rewrites run: a store
            // lost to a rewrite stays lost.
            for slot in 0..slots {
                m.store(slot * 4096 + 8, &(slot as u64 + 1).to_le_bytes())
                    .unwrap();
                if slot % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let st = fs.rewrite(a.ino()).unwrap();
        writer.join().unwrap();
        st
    });
    let bg = fs
        .settle_rewrites(std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(fg.units_rewritten + bg.units_rewritten, 3, "{fg:?} {bg:?}");
    for slot in 0..slots {
        let mut b = [0u8; 8];
        a.read_at(slot as u64 * 4096 + 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), slot as u64 + 1, "slot {slot}");
    }
    assert!(all_units_aligned(&fs, a.ino()), "{:?}", fs.extents(a.ino()));
    drop(m);
    assert_clean(&fs);
}

#[test]
fn alignment_hint_is_recorded_inherited_and_honoured() {
    // Interleaved writes scatter two files only while both allocate in one partition (the
    // CPU's): keep this thread on one CPU, or a move to the other gives each file its own.
    let _ = winefs::sys::run_only_on_cpu(0);
    let pool = HugePool::new("hint", 128 * MIB);
    let fs = pool.mount();
    let hint = winefs::meta::xattr::HUGEPAGE_HINT;
    // A file that receives an aligned extent records the hint.
    let big = fs.create_file("/big").unwrap();
    big.write_at(0, &pattern(HUGE as usize, 1)).unwrap();
    assert_eq!(fs.getxattr(big.ino(), hint).unwrap(), b"1");
    // It is read by name but never listed (copying tools would carry it elsewhere); the
    // file's own attributes are listed as ever.
    fs.setxattr(big.ino(), b"user.mine", b"v", Default::default())
        .unwrap();
    assert_eq!(
        fs.listxattr(big.ino()).unwrap(),
        vec![b"user.mine".to_vec()]
    );
    // A small file does not.
    let small = fs.create_file("/small").unwrap();
    small.write_at(0, b"tiny").unwrap();
    assert!(fs.getxattr(small.ino(), hint).is_err());
    // Files created directly in a hinted directory inherit it and get aligned units even when
    // written 4 KiB at a time, interleaved with another file.
    let d = fs.mkdir_path("/aligned").unwrap();
    fs.setxattr(d.ino, hint, b"1", Default::default()).unwrap();
    let f = fs.create_file("/aligned/f").unwrap();
    let other = fs.create_file("/other").unwrap();
    let data = pattern(MIB as usize + 4096 * 3, 2);
    for (i, c) in data.chunks(4096).enumerate() {
        f.write_at(i as u64 * 4096, c).unwrap();
        other.write_at(i as u64 * 4096, c).unwrap();
    }
    assert_eq!(fs.getxattr(f.ino(), hint).unwrap(), b"1");
    assert!(all_units_aligned(&fs, f.ino()), "{:?}", fs.extents(f.ino()));
    assert_eq!(f.read_all().unwrap(), data);
    // A file written large and sequentially without any hint: every unit ends up aligned
    // (units past the first by whole-unit allocation, the first by a background rewrite).
    let seq = fs.create_file("/seq").unwrap();
    let data = pattern(8 * MIB as usize, 4);
    for (i, c) in data.chunks(4096).enumerate() {
        seq.write_at(i as u64 * 4096, c).unwrap();
        other.write_at(MIB * 4 + i as u64 * 4096, b"y").unwrap();
    }
    fs.settle_rewrites(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(
        all_units_aligned(&fs, seq.ino()),
        "{:?}",
        fs.extents(seq.ino())
    );
    assert_eq!(seq.read_all().unwrap(), data);
    // The hint set after the data was written (as cp --preserve=xattr does) rewrites it.
    let late = fs.create_file("/late").unwrap();
    let data = pattern(2 * MIB as usize, 5);
    for (i, c) in data.chunks(4096).enumerate() {
        late.write_at(i as u64 * 4096, c).unwrap();
        other.write_at(MIB * 20 + i as u64 * 4096, b"z").unwrap();
    }
    assert!(!all_units_aligned(&fs, late.ino()));
    fs.setxattr(late.ino(), hint, b"1", Default::default())
        .unwrap();
    fs.settle_rewrites(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(
        all_units_aligned(&fs, late.ino()),
        "{:?}",
        fs.extents(late.ino())
    );
    assert_eq!(late.read_all().unwrap(), data);
    assert_clean(&fs);
}

#[test]
fn sparse_file_gets_aligned_extents_on_concurrent_first_touch() {
    let pool = HugePool::new("sparse", 256 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/lmdb").unwrap();
    let size = 64 * MIB;
    f.set_len(size).unwrap();
    let free0 = fs.statfs().free_blocks;
    let m = Arc::new(f.mmap(0, size as usize).unwrap());
    let threads = 8;
    std::thread::scope(|s| {
        for t in 0..threads {
            let m = m.clone();
            s.spawn(move || {
                // Every thread touches every unit (many threads fault on the same unit at once)
                // and stamps its own slot in each page it writes.
                for page in (0..size / 4096).step_by(37) {
                    let at = (page * 4096 + t * 8) as usize;
                    m.write(at, &(page ^ t).to_le_bytes()).unwrap();
                }
            });
        }
    });
    for page in (0..size / 4096).step_by(37) {
        for t in 0..threads {
            let mut b = [0u8; 8];
            f.read_at(page * 4096 + t * 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), page ^ t, "page {page} thread {t}");
        }
    }
    assert!(all_units_aligned(&fs, f.ino()), "{:?}", fs.extents(f.ino()));
    let data_blocks: u64 = fs.extents(f.ino()).unwrap().iter().map(|e| e.2).sum();
    assert_eq!(data_blocks, size / 4096);
    // Data plus at most a few extent-index blocks.
    assert!(free0 - fs.statfs().free_blocks <= size / 4096 + 4);
    assert_eq!(m.pmd_mapped_bytes().unwrap(), size);
    // Untouched bytes of allocated units are zero.
    let mut z = [1u8; 64];
    f.read_at(4096 * 36 + 100, &mut z).unwrap();
    assert_eq!(z, [0u8; 64]);
    drop(m);
    assert_clean(&fs);
    drop(f);
    drop(fs);
    let fs = pool.mount();
    assert_clean(&fs);
}

#[test]
fn truncate_and_grow_while_mapped() {
    let pool = HugePool::new("truncate", 128 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/t").unwrap();
    let data = pattern((4 * HUGE) as usize, 9);
    f.write_at(0, &data).unwrap();
    let m = f.mmap(0, data.len()).unwrap();
    let mut got = vec![0u8; data.len()];
    m.read(0, &mut got).unwrap();
    assert!(got == data);
    let free_before = fs.statfs().free_blocks;
    let cut = 3 * MIB + 100;
    f.set_len(cut).unwrap();
    // The blocks past the end were freed while mapped.
    assert!(fs.statfs().free_blocks > free_before);
    assert!(matches!(
        m.read(cut as usize + 5000, &mut [0u8; 8]),
        Err(winefs::Error::NoSuchOffset)
    ));
    let mut head = vec![0u8; cut as usize];
    m.read(0, &mut head).unwrap();
    assert_eq!(&head[..], &data[..cut as usize]);
    // A store past EOF inside the last page must not reappear when the file grows again.
    m.write(cut as usize + 10, b"ghost").unwrap_err();
    m.store(cut as usize + 10, b"ghost").unwrap();
    f.set_len(4 * HUGE).unwrap();
    let mut tail = vec![1u8; (4 * HUGE - cut) as usize];
    m.read(cut as usize, &mut tail).unwrap();
    assert!(
        tail.iter().all(|&b| b == 0),
        "bytes past the old end are not zero"
    );
    let mut t2 = vec![1u8; tail.len()];
    f.read_at(cut, &mut t2).unwrap();
    assert!(t2.iter().all(|&b| b == 0));
    // The regrown range allocates on touch and reads back.
    m.write(7 * MIB as usize, b"regrown").unwrap();
    let mut b = [0u8; 7];
    f.read_at(7 * MIB, &mut b).unwrap();
    assert_eq!(&b, b"regrown");
    drop(m);
    assert_clean(&fs);
}

#[test]
fn punch_unlink_and_write_coherence_while_mapped() {
    let pool = HugePool::new("punch", 128 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/p").unwrap();
    // A hole-backed (unaligned) file: strict writes to it would normally copy on write.
    let data = pattern(300 * 1024, 5);
    f.write_at(0, &data).unwrap();
    let m = f.mmap(0, data.len()).unwrap();
    f.write_at(4096, b"via write(2)").unwrap();
    let mut b = [0u8; 12];
    m.read(4096, &mut b).unwrap();
    assert_eq!(
        &b, b"via write(2)",
        "write(2) not visible through the mapping"
    );
    m.write(8192, b"via store").unwrap();
    let mut b = [0u8; 9];
    f.read_at(8192, &mut b).unwrap();
    assert_eq!(&b, b"via store");
    fs.punch_hole(f.ino(), 64 * 1024, 128 * 1024).unwrap();
    let mut z = vec![1u8; 128 * 1024];
    m.read(64 * 1024, &mut z).unwrap();
    assert!(
        z.iter().all(|&b| b == 0),
        "punched range not zero through the mapping"
    );
    m.write(70 * 1024, b"refilled").unwrap();
    let mut b = [0u8; 8];
    f.read_at(70 * 1024, &mut b).unwrap();
    assert_eq!(&b, b"refilled");
    // Unlinked while mapped: the data stays reachable until the mapping goes.
    let ino = f.ino();
    drop(f);
    let free_mapped = fs.statfs().free_blocks;
    fs.unlink_path("/p").unwrap();
    let mut b = [0u8; 9];
    m.read(8192, &mut b).unwrap();
    assert_eq!(&b, b"via store");
    assert_eq!(fs.statfs().free_blocks, free_mapped);
    drop(m);
    assert!(fs.getattr(ino).is_err());
    assert!(fs.statfs().free_blocks > free_mapped);
    assert_clean(&fs);
}

#[test]
fn bad_mapping_requests_are_refused() {
    let pool = HugePool::new("refuse", 64 * MIB);
    let fs = pool.mount();
    let f = fs.create_file("/f").unwrap();
    f.set_len(MIB).unwrap();
    assert!(matches!(f.mmap(100, 4096), Err(winefs::Error::Invalid(_))));
    assert!(matches!(f.mmap(0, 0), Err(winefs::Error::Invalid(_))));
    assert!(matches!(
        f.mmap(0, usize::MAX - 10),
        Err(winefs::Error::FileTooBig)
    ));
    fs.mkdir_path("/d").unwrap();
    assert!(matches!(fs.open_file("/d"), Err(winefs::Error::IsDir)));
}

// ---- SIGBUS cases run in a child process (the signal ends it) ----

const CHILD_ENV: &str = "WINEFS_MMAP_CHILD";

/// Run the child side of a SIGBUS test (`child_sigbus_probe`) on `pool` and return its status.
fn run_child(case: &str, pool: &std::path::Path) -> std::process::ExitStatus {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_sigbus_probe",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{case}:{}", pool.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
}

/// Child side: does nothing unless started by `run_child`.
#[test]
fn child_sigbus_probe() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (case, path) = spec.split_once(':').unwrap();
    let fs = common::mount(std::path::Path::new(path));
    let f = fs.open_file("/f").unwrap();
    let m = f.mmap(0, (8 * HUGE) as usize).unwrap();
    let at = match case {
        "beyond-eof" => 3 * HUGE as usize,
        "enospc" => 0,
        _ => unreachable!(),
    };
    // Unchecked store: the SIGBUS is the point.
    m.store(at, b"x").unwrap();
    std::process::exit(0);
}

#[test]
fn touching_past_eof_raises_sigbus() {
    let pool = HugePool::new("sigbus-eof", 64 * MIB);
    {
        let fs = pool.mount();
        let f = fs.create_file("/f").unwrap();
        f.write_at(0, &[1u8; 4096]).unwrap();
        fs.unmount().unwrap();
    }
    let st = run_child("beyond-eof", &pool.path);
    assert_eq!(st.signal(), Some(libc::SIGBUS), "{st:?}");
    assert_clean(&pool.mount());
}

#[test]
fn fault_on_a_full_pool_raises_sigbus() {
    let pool = HugePool::new("sigbus-full", 64 * MIB);
    {
        let fs = pool.mount();
        let f = fs.create_file("/f").unwrap();
        f.set_len(8 * HUGE).unwrap();
        let filler = fs.create_file("/filler").unwrap();
        let free = fs.statfs().free_blocks * 4096;
        let _ = filler.fallocate(0, free);
        while fs.statfs().free_blocks > 0 {
            let n = fs.statfs().free_blocks * 4096;
            let at = filler.metadata().unwrap().size;
            if filler.fallocate(at, n).is_err() {
                break;
            }
        }
        fs.unmount().unwrap();
    }
    let st = run_child("enospc", &pool.path);
    assert_eq!(st.signal(), Some(libc::SIGBUS), "{st:?}");
    assert_clean(&pool.mount());
}

/// LMDB's pattern (the reproduction report's finding): grow the file with ftruncate, map it,
/// and let page faults allocate as records are written. Returns the writing thread's faults.
fn lmdb_fill(fs: &Fs, size: u64) -> (u64, u64) {
    let f = fs.create_file("/data.mdb").unwrap();
    f.set_len(size).unwrap();
    let m = f.mmap(0, size as usize).unwrap();
    let record = [0x5au8; 1024];
    let before = thread_page_faults();
    for at in (0..size as usize).step_by(record.len()) {
        m.store(at, &record).unwrap();
    }
    let faults = thread_page_faults() - before;
    let pmd = m.pmd_mapped_bytes().unwrap();
    (faults, pmd)
}

/// Age a mounted pool: fill it to `util` with files of mixed sizes (mostly small, some
/// large), then delete and recreate files until `churn` times the pool size has been written.
fn age(fs: &Fs, util: f64, churn: u64, seed: u64) {
    let st = fs.statfs();
    let total = st.blocks * 4096;
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<(String, u64)> = Vec::new();
    let mut used = 0u64;
    let mut written = 0u64;
    let mut id = 0u64;
    let buf = vec![0xa5u8; 4 * MIB as usize];
    while written < churn * total {
        let want_create = (used as f64) < util * total as f64;
        if want_create || live.is_empty() {
            // 70% small (4-64 KiB), 25% medium (64 KiB-1 MiB), 5% large (1-4 MiB).
            let r = next() % 100;
            let size = match r {
                0..70 => 4096 * (1 + next() % 16),
                70..95 => 65536 + next() % (MIB - 65536),
                _ => MIB + next() % (3 * MIB),
            };
            let name = format!("/age{id}");
            id += 1;
            let f = fs.create_file(&name).unwrap();
            // Written in 64 KiB pieces, as most tools do.
            let mut off = 0;
            while off < size {
                let n = (size - off).min(65536);
                f.write_at(off, &buf[..n as usize]).unwrap();
                off += n;
            }
            used += size;
            written += size;
            live.push((name, size));
        } else {
            let i = (next() % live.len() as u64) as usize;
            let (name, size) = live.swap_remove(i);
            fs.unlink_path(&name).unwrap();
            used -= size;
        }
    }
}

#[test]
fn aged_pool_keeps_lmdb_fault_count_near_clean() {
    let size = 64 * MIB;
    let clean = HugePool::new("lmdb-clean", 512 * MIB);
    let (clean_faults, clean_pmd) = lmdb_fill(&clean.mount(), size);
    let aged = HugePool::new("lmdb-aged", 512 * MIB);
    let fs = aged.mount();
    age(&fs, 0.75, 3, 42);
    let st = fs.statfs();
    let util = 1.0 - st.free_blocks as f64 / st.blocks as f64;
    assert!(util > 0.6, "aging reached only {util:.2} utilization");
    let (aged_faults, aged_pmd) = lmdb_fill(&fs, size);
    eprintln!(
        "LMDB pattern, 64 MiB: clean {clean_faults} faults, aged ({:.0}% full) {aged_faults} faults",
        util * 100.0
    );
    assert_eq!(clean_pmd, size);
    assert_eq!(
        aged_pmd, size,
        "aged pool: not every unit is hugepage-mapped"
    );
    assert!(
        aged_faults as f64 <= 1.2 * clean_faults as f64,
        "aged {aged_faults} faults vs clean {clean_faults}"
    );
    assert_clean(&fs);
}

#[test]
fn atomic_msync_writes_back_only_dirty_pages_all_or_nothing() {
    let pool = HugePool::new("atomic", 128 * MIB);
    let old = pattern((4 * HUGE) as usize, 1);
    let dirty_pages = [3usize, 4, 700, 1500];
    {
        let fs = pool.mount();
        let f = fs.create_file("/db").unwrap();
        f.write_at(0, &old).unwrap();
        let m = f.mmap_atomic(0, old.len()).unwrap();
        for &p in &dirty_pages {
            m.store(p * 4096 + 10, b"NEW").unwrap();
        }
        // Stores stay private until msync: the file still reads the old bytes.
        let mut b = [0u8; 3];
        f.read_at(3 * 4096 + 10, &mut b).unwrap();
        assert_eq!(&b[..], &old[3 * 4096 + 10..3 * 4096 + 13]);
        // A crash inside msync's transaction (after its in-place writes, before COMMIT).
        fs.inject_crash_before_commit(1);
        assert!(m.msync(0, m.len()).is_err());
        drop(m);
        drop(f);
        drop(fs); // the crash: no clean unmount
    }
    let mut new = old.clone();
    for &p in &dirty_pages {
        new[p * 4096 + 10..p * 4096 + 13].copy_from_slice(b"NEW");
    }
    {
        let fs = pool.mount();
        assert_clean(&fs);
        let f = fs.open_file("/db").unwrap();
        assert!(
            f.read_all().unwrap() == old,
            "a crash during msync left part of the new content"
        );
        drop(f);
        // A crash at the k-th commit after msync started: one transaction means the second
        // and later never happen, so msync succeeds whole. (Writing pages in several
        // transactions would leave a mix here.)
        for k in 2..=dirty_pages.len() as u64 {
            let f = fs.open_file("/db").unwrap();
            f.write_at(0, &old).unwrap();
            let m = f.mmap_atomic(0, old.len()).unwrap();
            for &p in &dirty_pages {
                m.store(p * 4096 + 10, b"NEW").unwrap();
            }
            fs.inject_crash_before_commit(k);
            m.msync(0, m.len()).unwrap();
            assert!(f.read_all().unwrap() == new, "k={k}");
            fs.inject_crash_before_commit(0);
        }
        let f = fs.open_file("/db").unwrap();
        f.write_at(0, &old).unwrap();
        // Again without the crash: exactly the dirty pages are written back, all of them.
        let m = f.mmap_atomic(0, old.len()).unwrap();
        let mut probe = [0u8; 16];
        m.load(50 * 4096, &mut probe).unwrap(); // a read does not dirty a page
        for &p in &dirty_pages {
            m.store(p * 4096 + 10, b"NEW").unwrap();
        }
        let data0 = fs.persist_stats().bytes_written[0];
        assert_eq!(
            m.msync(0, m.len()).unwrap(),
            dirty_pages.len() as u64 * 4096
        );
        let data_bytes = fs.persist_stats().bytes_written[0] - data0;
        assert!(
            data_bytes <= 2 * dirty_pages.len() as u64 * 4096,
            "{data_bytes} data bytes written for {} dirty pages",
            dirty_pages.len()
        );
        // Nothing is dirty any more; a second msync writes nothing.
        assert_eq!(m.msync(0, m.len()).unwrap(), 0);
        m.store(9 * 4096, b"again").unwrap();
        assert_eq!(m.msync(0, m.len()).unwrap(), 4096);
        drop(m);
        drop(f);
        drop(fs);
    }
    let fs = pool.mount();
    let got = fs.open_file("/db").unwrap().read_all().unwrap();
    let mut want = new;
    want[9 * 4096..9 * 4096 + 5].copy_from_slice(b"again");
    assert!(got == want, "msynced content not durable");
    assert_clean(&fs);
}

/// A pool in memory is faulted in by a background thread after mount, so stores into parts of
/// it never touched before take no page fault (on a 4 KiB-page tmpfs each took one, about
/// 1.5 µs: two per 4 KiB append into a fresh unit, more than the append itself). Mounted with
/// `no_prefault`, the same appends fault on every page.
#[test]
fn a_pool_in_memory_is_faulted_in_after_mount() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "this test needs the tmpfs at /dev/shm");
    let dir = tempfile::tempdir_in(shm).unwrap();
    let pool = dir.path().join("prefault.pool");
    let size = 64 * MIB;
    common::format(&pool, size, Some(1));
    let buf = vec![0x5a_u8; 4096];
    for prefault in [false, true] {
        let fs = common::mount_opts(
            &pool,
            winefs::MountOptions { no_prefault: !prefault, ..Default::default() },
        );
        if prefault {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while fs.prefaulted_bytes() < size {
                assert!(std::time::Instant::now() < deadline, "the pool was not faulted in within 60 s");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(fs.prefaulted_bytes(), 0, "no_prefault: nothing is faulted in");
        }
        let ino = fs.create(fs.root(), b"appended", 0o644, 0, 0).unwrap().ino;
        let before = thread_page_faults();
        for _ in 0..2048 {
            fs.append(ino, &buf).unwrap(); // 8 MiB into fresh units
        }
        let faults = thread_page_faults() - before;
        fs.unlink(fs.root(), b"appended").unwrap();
        fs.unmount().unwrap();
        if prefault {
            assert!(faults < 64, "{faults} page faults appending 8 MiB to a faulted-in pool");
        } else {
            assert!(faults >= 1024, "only {faults} page faults appending 8 MiB without prefault");
        }
    }
}

/// The prefault thread holds the mount while it runs; dropping the `Fs` stops it first, so the
/// mount is unmounted — cleanly — by the caller, before the drop returns, not later on that
/// thread (or never, should the process exit first).
#[test]
fn dropping_a_mount_while_it_is_faulted_in_unmounts_it_at_once() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let pool = dir.path().join("prefault-drop.pool");
    let size = 512 * MIB;
    common::format(&pool, size, Some(1));
    let fs = common::mount_opts(&pool, winefs::MountOptions::default());
    fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    let done = fs.prefaulted_bytes();
    drop(fs);
    let (_, state) = winefs::state::mount::read_superblock(&pool).unwrap();
    assert!(state.clean, "the pool is not clean right after its mount was dropped");
    assert!(done < size, "the pool was faulted in before the drop ({done} bytes): nothing was tested");
    let fs = common::mount_opts(&pool, winefs::MountOptions { no_prefault: true, ..Default::default() });
    assert!(fs.recovery_report().rolled_back.is_empty());
}

/// An append cut by a crash before its size store leaves its bytes past the end of the file;
/// read never shows them, and neither does a mapping of the last block: it reads zeros past
/// the end.
#[test]
fn a_mapping_reads_zeros_past_the_end_after_a_cut_append() {
    let pool = HugePool::new("cut-append", 64 * MIB);
    {
        let fs = pool.mount();
        let f = fs.create_file("/log").unwrap();
        fs.fallocate(f.ino(), 0, MIB, true).unwrap();
        f.write_at(0, &[7u8; 1000]).unwrap();
        fs.inject_crash_before_commit(1);
        assert!(f.write_at(1000, &[0xEE; 2000]).is_err(), "cut before its size store");
        drop(f);
        drop(fs); // the crash: no clean unmount
    }
    let fs = pool.mount();
    let f = fs.open_file("/log").unwrap();
    assert_eq!(f.metadata().unwrap().size, 1000);
    let m = f.mmap(0, 4096).unwrap();
    let mut page = vec![0u8; 4096];
    m.load(0, &mut page).unwrap();
    assert!(page[..1000].iter().all(|&b| b == 7));
    assert!(page[1000..].iter().all(|&b| b == 0), "the cut append shows through the mapping");
    drop(m);
    drop(f);
    assert_clean(&fs);
}
