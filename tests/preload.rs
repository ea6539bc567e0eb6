//! The direct path for unmodified programs (docs/DESIGN.md §7b): an ordinary C program
//! (`tests/data/preload_client.c`, compiled here) run with and without `libwinefs_preload.so`
//! on a mounted pool — hugepage mappings, coherence with processes that use FUSE, fork,
//! truncate and unlink under a mapping, kill -9 of a client and of the daemon, and the
//! fallbacks (a mount with no direct path, a user who is not the pool's owner, a static
//! binary). Needs root (FUSE, a hugepage tmpfs), like the other FUSE tests.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The preload library, built once per test run (`cargo test` builds only rlibs).
fn preload_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        ok(Command::new(cargo)
            .args(["build", "--release", "-p", "winefs-preload"])
            .current_dir(root));
        let lib = root.join("target/release/libwinefs_preload.so");
        assert!(lib.exists(), "{} was not built", lib.display());
        lib
    })
}

/// The test program, compiled once (dynamically linked, and a static copy).
fn client(static_link: bool) -> &'static Path {
    static DYN: OnceLock<PathBuf> = OnceLock::new();
    static STAT: OnceLock<PathBuf> = OnceLock::new();
    let cell = if static_link { &STAT } else { &DYN };
    cell.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/preload_client.c");
        // In the build's own scratch directory, replaced by the next run rather than left in
        // the temporary directory run after run; built under this process's name and renamed
        // over the last one, which a process still running it keeps.
        let name = format!("winefs-preload-client{}", if static_link { "-static" } else { "" });
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(&name);
        let fresh = out.with_file_name(format!("{name}.{}", std::process::id()));
        let mut cc = Command::new("cc");
        cc.arg("-O2").arg("-o").arg(&fresh).arg(&src);
        if static_link {
            cc.arg("-static");
        }
        ok(&mut cc);
        std::fs::rename(&fresh, &out).expect("put the test program in place");
        out
    })
}

/// A pool on a hugepage tmpfs, FUSE-mounted; everything is unmounted on drop.
struct Mount {
    dir: tempfile::TempDir,
    pool: PathBuf,
    mnt: PathBuf,
    huge: PathBuf,
    daemon: Option<Child>,
    args: Vec<&'static str>,
    /// `RUST_LOG` for the daemon, if any (its log is `daemon.log` in `dir`).
    log: Option<&'static str>,
}

impl Mount {
    fn new(args: &[&'static str]) -> Mount {
        Mount::new_logging(args, None)
    }

    fn new_logging(args: &[&'static str], log: Option<&'static str>) -> Mount {
        Mount::with_pool(args, log, "1G")
    }

    /// A mount of a pool of `size` (as `mkfs --size` takes it).
    fn with_pool(args: &[&'static str], log: Option<&'static str>, size: &str) -> Mount {
        assert_eq!(winefs::sys::euid(), 0, "the preload tests need root (FUSE, tmpfs)");
        let dir = tempfile::Builder::new().prefix("winefs-preload").tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let huge = root.join("huge");
        let mnt = root.join("mnt");
        fs::create_dir(&huge).unwrap();
        fs::create_dir(&mnt).unwrap();
        ok(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1200M,huge=always", "none"])
            .arg(&huge));
        let pool = huge.join("pool");
        ok(Command::new(BIN).arg("mkfs").arg(&pool).args(["--size", size]));
        let mut m = Mount {
            dir,
            pool,
            mnt,
            huge,
            daemon: None,
            args: args.to_vec(),
            log,
        };
        m.start();
        m
    }

    fn start(&mut self) {
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .unwrap();
        let mut child = Command::new(BIN)
            .arg("mount")
            .arg(&self.pool)
            .arg(&self.mnt)
            .arg("-f")
            .args(&self.args)
            .envs(self.log.map(|l| ("RUST_LOG", l)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("winefs: mounted"), "mount said {line:?}");
        self.daemon = Some(child);
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmount (waiting out a mount kept busy a moment by a client going away), then fsck.
    fn stop_and_fsck(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = run(Command::new("umount").arg(&self.mnt));
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "umount: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let st = self.daemon.take().unwrap().wait().unwrap();
        assert!(st.success(), "the daemon exited with {st}");
        let out = ok(Command::new(BIN).arg("fsck").arg(&self.pool));
        assert!(out.contains("clean"), "fsck: {out}");
    }

    /// Free blocks of the mounted file system (`stat -f`).
    fn free_blocks(&self) -> u64 {
        let out = ok(Command::new("stat").args(["-f", "-c", "%f"]).arg(&self.mnt));
        out.trim().parse().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = run(Command::new("umount").arg("-l").arg(&self.mnt));
        let _ = run(Command::new("umount").arg("-l").arg(&self.huge));
    }
}

/// Run the test program (with the preload library unless `plain`), returning its output and
/// the stats line it appended.
fn client_run(args: &[&str], plain: bool, stats: &Path) -> (Output, String) {
    let _ = fs::remove_file(stats);
    let mut c = Command::new(client(false));
    c.args(args).env("WINEFS_PRELOAD_STATS", stats);
    if !plain {
        c.env("LD_PRELOAD", preload_lib());
    }
    let out = run(&mut c);
    (out, fs::read_to_string(stats).unwrap_or_default())
}

/// The value of counter `name` in a stats line.
fn counter(stats: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(stats.lines().next().unwrap_or("{}")).unwrap();
    v[name].as_u64().unwrap_or(0)
}

/// A `hold` process: maps a file and answers r/w/s commands on stdin.
struct Holder {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Holder {
    fn start(file: &Path, mib: u64) -> Holder {
        Holder::start_counting(file, mib, None)
    }
    /// As `start`, the library's counters written to `stats` when the holder quits.
    fn start_counting(file: &Path, mib: u64, stats: Option<&Path>) -> Holder {
        let mut cmd = Command::new(client(false));
        if let Some(p) = stats {
            let _ = fs::remove_file(p);
            cmd.env("WINEFS_PRELOAD_STATS", p);
        }
        Holder::spawn(cmd.env("LD_PRELOAD", preload_lib()), file, mib)
    }
    /// A holder without the library: its mapping is the kernel's, through FUSE.
    fn start_plain(file: &Path, mib: u64) -> Holder {
        Holder::spawn(&mut Command::new(client(false)), file, mib)
    }
    fn spawn(cmd: &mut Command, file: &Path, mib: u64) -> Holder {
        let mut child = cmd
            .args(["hold", file.to_str().unwrap(), &mib.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the holder did not map the file");
        Holder { child, input, output }
    }
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.input, "{cmd}").unwrap();
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
    fn read(&mut self, off: u64) -> u8 {
        self.ask(&format!("r {off}")).parse().unwrap()
    }
    fn write(&mut self, off: u64, v: u8) {
        assert_eq!(self.ask(&format!("w {off} {v}")), "done");
    }
    fn sum(&mut self, off: u64, len: u64) -> u64 {
        self.ask(&format!("s {off} {len}")).parse().unwrap()
    }
    fn quit(mut self) {
        let _ = writeln!(self.input, "q");
        assert!(self.child.wait().unwrap().success());
    }
}

/// Grow `path` to `size` + 1 bytes through FUSE, the last byte `v`.
fn plain_append(path: &Path, size: u64, v: u8) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_at(&[v], size).unwrap();
}

/// Whether the pool file's mapping of `pid` has 2 MiB pages.
fn pmd_mapped_kb(pid: u32) -> u64 {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    smaps
        .lines()
        .filter(|l| l.starts_with("ShmemPmdMapped:") || l.starts_with("FilePmdMapped:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// A process started with the library makes itself known to every winefs mount's daemon
/// without touching the mounts: the channel's name comes from the mount table and a stat of the
/// pool file. Before, each process opened every mount's root to ask it, and an unmount that
/// met such an open was refused as busy (mount(8)'s tests saw "target is busy" while other
/// tests started programs with the library).
#[test]
fn starting_a_process_with_the_library_sends_the_mounts_no_request() {
    let mut m = Mount::new_logging(&[], Some("fuser::request=debug,winefs::fuse::channel=debug"));
    let log = m.dir.path().join("daemon.log");
    let before = fs::read_to_string(&log).unwrap().len();
    // Processes of other tests started with the library announce themselves here too: look
    // for these three by their ids.
    let pids: Vec<u32> = (0..3)
        .map(|_| {
            let mut c = Command::new("true").env("LD_PRELOAD", preload_lib()).spawn().unwrap();
            assert!(c.wait().unwrap().success());
            c.id()
        })
        .collect();
    let known = |log: &str, pid: u32| log.contains(&format!("process {pid} is known"));
    // The daemon notes a process it learns of on the channel's thread: wait for all three.
    let deadline = Instant::now() + Duration::from_secs(10);
    let since = loop {
        let all = fs::read_to_string(&log).unwrap();
        let since = all[before..].to_string();
        if pids.iter().all(|&p| known(&since, p)) || Instant::now() > deadline {
            break since;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(pids.iter().all(|&p| known(&since, p)), "processes {pids:?} announced:\n{since}");
    let requests: Vec<&str> = since.lines().filter(|l| l.contains("fuser::request")).collect();
    assert!(requests.is_empty(), "requests reached the mount: {requests:?}");
    m.stop_and_fsck();
}

#[test]
fn a_mapping_of_a_sparse_file_gets_hugepages_and_its_bytes_reach_fuse_readers() {
    let mut m = Mount::new(&[]);
    let f = m.path("sparse");
    let stats = m.dir.path().join("stats");
    // ftruncate, then map and touch (the LMDB pattern): one fault per 2 MiB, not per 4 KiB.
    let (out, st) = client_run(&["fill", f.to_str().unwrap(), "64", "5"], false, &stats);
    assert!(out.status.success(), "{out:?}");
    let faults: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("faults ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(faults < 64 * 512 / 8, "{faults} faults for 64 MiB: not hugepage-mapped");
    assert_eq!(counter(&st, "mmap_direct"), 1, "stats: {st}");
    // The same bytes through FUSE (a process without the library) and through a fresh map.
    let (out, _) = client_run(&["check", f.to_str().unwrap(), "64", "5"], true, &stats);
    assert!(out.status.success(), "plain check: {out:?}");
    let data = fs::read(&f).unwrap();
    assert_eq!(data.len(), 64 << 20);
    // And the plain run goes through the page cache: many more faults (the gap this closes).
    let (out, _) = client_run(&["fill", m.path("plain").to_str().unwrap(), "16", "1"], true, &stats);
    let plain_faults: u64 = String::from_utf8_lossy(&out.stdout).trim()[7..].parse().unwrap();
    assert!(plain_faults >= 16 * 256, "plain FUSE mapping: {plain_faults} faults");
    m.stop_and_fsck();
}

#[test]
fn the_holder_sees_hugepages_while_it_maps() {
    let mut m = Mount::new(&[]);
    let f = m.path("held");
    fs::File::create(&f).unwrap().set_len(8 << 20).unwrap();
    let mut h = Holder::start(&f, 8);
    for u in 0..4u64 {
        h.write(u << 21, 1);
    }
    assert!(
        pmd_mapped_kb(h.child.id()) >= 8 << 10,
        "8 MiB mapped and touched, but {} KiB on 2 MiB pages",
        pmd_mapped_kb(h.child.id())
    );
    // The mapping keeps the mount busy, as a kernel mapping would (the holder closed its
    // descriptor long ago).
    let out = run(Command::new("umount").arg(&m.mnt));
    assert!(!out.status.success(), "unmounted under a live direct mapping");
    h.quit();
    m.stop_and_fsck();
}

#[test]
fn writes_through_fuse_and_stores_through_a_direct_mapping_see_each_other_at_once() {
    let mut m = Mount::new(&[]);
    let f = m.path("shared");
    fs::write(&f, vec![7u8; 3 << 20]).unwrap();
    let mut h = Holder::start(&f, 3);
    // FUSE → direct: a write(2) by another process is seen through the mapping at once.
    let plain = fs::OpenOptions::new().read(true).write(true).open(&f).unwrap();
    for (off, v) in [(0u64, 11u8), (4095, 12), (2 << 20, 13), ((3 << 20) - 1, 14)] {
        plain.write_at(&[v], off).unwrap();
        assert_eq!(h.read(off), v, "a write through FUSE at {off} not seen in the mapping");
    }
    // Direct → FUSE: a store through the mapping is seen by read(2) through the mount at once
    // (the file is leased: every open of it is direct I/O, no stale page cache).
    let mut b = [0u8; 1];
    plain.read_at(&mut b, 100).unwrap(); // cache whatever could be cached
    for (off, v) in [(100u64, 21u8), (1 << 20, 22), ((3 << 20) - 2, 23)] {
        h.write(off, v);
        plain.read_at(&mut b, off).unwrap();
        assert_eq!(b[0], v, "a store through the mapping at {off} not seen by read(2)");
    }
    // Growth by another process: the part of the mapping past the old end is the kernel's
    // mapping of the FUSE file, and shows the new bytes.
    let g = m.path("grows");
    fs::write(&g, vec![1u8; 1 << 20]).unwrap();
    let mut h2 = Holder::start(&g, 4);
    plain_append(&g, 3 << 20, 42);
    assert_eq!(h2.read(3 << 20), 42, "growth by another process not seen through the mapping");
    h2.quit();
    h.quit();
    drop(plain);
    let data = fs::read(&f).unwrap();
    assert_eq!((data[100], data[1 << 20], data[0]), (21, 22, 11));
    m.stop_and_fsck();
}

#[test]
fn pages_the_kernel_cached_while_a_file_was_leased_go_when_the_lease_ends() {
    let mut m = Mount::new(&[]);
    let f = m.path("leased");
    fs::write(&f, vec![7u8; 4 << 20]).unwrap();
    let mut h = Holder::start(&f, 4);
    // A process without the library maps the leased file through FUSE: its page comes from
    // the kernel's page cache, which the client's stores then go behind.
    let mut plain = Holder::start_plain(&f, 4);
    assert_eq!(plain.read(100), 7);
    h.write(100, 9);
    plain.quit();
    h.quit();
    // Opens keep what the kernel cached from one open to the next: the page read during the
    // lease must have gone with it.
    let mut b = [0u8; 1];
    fs::File::open(&f).unwrap().read_at(&mut b, 100).unwrap();
    assert_eq!(b[0], 9, "a page cached during the lease served after it");
    m.stop_and_fsck();
}

#[test]
fn a_file_open_through_the_page_cache_is_not_leased_and_every_store_is_seen() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("cached");
    fs::write(&f, vec![7u8; 4 << 20]).unwrap();
    // A process without the library opens the file to read it first: the kernel caches what
    // it reads. (Its open for writing only is direct I/O and would not stop a lease.)
    let plain = fs::File::open(&f).unwrap();
    let writer = fs::OpenOptions::new().write(true).open(&f).unwrap();
    let mut b = [0u8; 1];
    for off in [100u64, 3 << 20] {
        plain.read_at(&mut b, off).unwrap();
        assert_eq!(b[0], 7);
    }
    // The holder's mapping is the kernel's then, not the pool's: a direct store would leave
    // the reader's cached pages stale.
    let mut h = Holder::start_counting(&f, 4, Some(&stats));
    // (Mapping a file drops its cached pages: cache them again.)
    for off in [100u64, 3 << 20] {
        plain.read_at(&mut b, off).unwrap();
        assert_eq!(b[0], 7);
    }
    for (off, v) in [(100u64, 21u8), (3 << 20, 22)] {
        h.write(off, v);
        plain.read_at(&mut b, off).unwrap();
        assert_eq!(b[0], v, "a store through the mapping at {off} not seen by a cached reader");
    }
    writer.write_at(&[23], 5000).unwrap();
    assert_eq!(h.read(5000), 23, "a write through FUSE not seen through the mapping");
    plain.read_at(&mut b, 5000).unwrap();
    assert_eq!(b[0], 23, "a write through FUSE not seen by a cached reader");
    h.quit();
    let st = fs::read_to_string(&stats).unwrap_or_default();
    assert_eq!(counter(&st, "mmap_direct"), 0, "leased while a cached open was left: {st}");
    assert_eq!(counter(&st, "mmap_fuse"), 1, "stats: {st}");
    drop((plain, writer));
    // Nobody has it open now: the next holder maps the pool, and a reader that opens it
    // afterwards reads through FUSE every time (direct I/O) and sees every store at once.
    let mut h = Holder::start_counting(&f, 4, Some(&stats));
    let plain = fs::File::open(&f).unwrap();
    for (off, v) in [(100u64, 31u8), (3 << 20, 32)] {
        h.write(off, v);
        plain.read_at(&mut b, off).unwrap();
        assert_eq!(b[0], v, "a direct store at {off} not seen by a later reader");
    }
    h.quit();
    let st = fs::read_to_string(&stats).unwrap_or_default();
    assert_eq!(counter(&st, "mmap_direct"), 1, "stats: {st}");
    drop(plain);
    let data = fs::read(&f).unwrap();
    assert_eq!((data[100], data[5000], data[3 << 20], data[0]), (31, 23, 32, 7));
    m.stop_and_fsck();
}

#[test]
fn pread_and_pwrite_inside_a_mapping_go_direct_and_stay_posix() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("pio");
    let (out, st) = client_run(&["pio", f.to_str().unwrap(), "9"], false, &stats);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(counter(&st, "read_direct") >= 8, "stats: {st}");
    assert!(counter(&st, "write_direct") >= 8, "stats: {st}");
    // The growing pwrite went through the daemon: the size moved.
    assert_eq!(fs::metadata(&f).unwrap().len(), (4 << 20) + 100);
    // The same program without the library gives the same file.
    let g = m.path("pio-plain");
    let (out, _) = client_run(&["pio", g.to_str().unwrap(), "9"], true, &stats);
    assert!(out.status.success(), "{out:?}");
    assert!(fs::read(&f).unwrap() == fs::read(&g).unwrap(), "direct and FUSE runs differ");
    m.stop_and_fsck();
}

#[test]
fn reads_and_writes_of_a_file_nobody_maps_go_direct_after_the_first_and_fill_no_hole() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("rw");
    let (out, st) = client_run(&["rw", f.to_str().unwrap(), "4"], false, &stats);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(counter(&st, "read_direct") >= 150, "stats: {st}");
    assert!(counter(&st, "write_direct") >= 150, "stats: {st}");
    assert_eq!(counter(&st, "mmap_direct"), 0, "the program mapped nothing: {st}");
    // Reading a sparse file through the library allocates nothing.
    assert_eq!(said.trim(), "blocks 0", "{said}");
    // The same bytes as the program's run without the library.
    let g = m.path("rw-plain");
    let (out, _) = client_run(&["rw", g.to_str().unwrap(), "4"], true, &stats);
    assert!(out.status.success(), "{out:?}");
    assert!(fs::read(&f).unwrap() == fs::read(&g).unwrap(), "direct and FUSE runs differ");
    m.stop_and_fsck();
}

#[test]
fn a_mapping_reads_zeros_after_its_own_punch_zero_range_and_truncate_and_an_odd_unmap_is_forgotten() {
    // A program that maps a file and then cuts it through its descriptor: with the library its
    // mapping is the pool's blocks, which the daemon keeps and zeroes in place while leased.
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("shrink");
    let (out, st) = client_run(&["shrink", f.to_str().unwrap()], false, &stats);
    assert!(out.status.success(), "{} {:?} (stats {st})", String::from_utf8_lossy(&out.stdout), out.status);
    assert!(counter(&st, "mmap_direct") >= 1, "the mapping did not go direct: {st}");
    let g = m.path("shrink-plain");
    let (out, _) = client_run(&["shrink", g.to_str().unwrap()], true, &stats);
    assert!(out.status.success(), "without the library: {}", String::from_utf8_lossy(&out.stdout));
    assert!(fs::read(&f).unwrap() == fs::read(&g).unwrap(), "direct and FUSE runs differ");
    m.stop_and_fsck();
}

/// `tests/data/fsx.py` on the mount: random writes, reads, truncates, fallocate modes and
/// mapped stores and loads of one file, each checked against a model of its bytes.
fn fsx(m: &Mount, name: &str, args: &[&str], preload: bool) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fsx.py");
    let mut c = Command::new("python3");
    c.arg(script).arg(m.path(name)).args(args);
    if preload {
        c.env("LD_PRELOAD", preload_lib());
    }
    let out = run(&mut c);
    assert!(
        out.status.success(),
        "fsx {args:?} (library: {preload}) failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn random_operations_read_as_a_model_of_the_file_with_and_without_the_library() {
    // With the library the second data call of a descriptor leases the file and maps it
    // (hidden), each `mmap` maps the pool, and a long-lived mapping (`--mapping`) sees every
    // truncate, punch and zero range the program makes through its descriptor.
    let mut m = Mount::new(&[]);
    fsx(&m, "plain", &["--seed", "1", "--ops", "1500", "--mapping"], false);
    fsx(&m, "direct", &["--seed", "2", "--ops", "1500", "--max-len", "4194304"], true);
    fsx(&m, "direct-mapped", &["--seed", "3", "--ops", "1500", "--mapping"], true);
    // Threads with regions of their own, whose mmap and munmap must not disturb each other's
    // direct reads and writes (the library's copies went through mappings another thread
    // unmapped: a fault in one run of two).
    for seed in ["5", "6", "7", "8"] {
        fsx(&m, "threads", &["--seed", seed, "--ops", "1500", "--threads", "4"], true);
    }
    fsx(&m, "threads-mapped", &["--seed", "9", "--ops", "1500", "--threads", "4", "--mapping"], true);
    // Four processes on one file, two threads each on regions of their own, two with the
    // library and two without (whose cached opens keep the file from being leased while they
    // last): each reads its regions as its model.
    let shared = m.path("shared");
    fs::File::create(&shared).unwrap().set_len(8 * (512 << 10)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fsx.py");
    let runs: Vec<_> = [0, 2, 4, 6]
        .iter()
        .map(|&k| {
            let mut c = Command::new("python3");
            c.arg(&script).arg(&shared).args(["--seed", "10", "--ops", "800", "--threads", "2", "--region", &k.to_string()]);
            if k < 4 {
                c.env("LD_PRELOAD", preload_lib());
            }
            c.stdout(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    for r in runs {
        let out = r.wait_with_output().unwrap();
        assert!(out.status.success(), "shared file: {}", String::from_utf8_lossy(&out.stdout));
    }
    m.stop_and_fsck();
    let mut m = Mount::new(&["--relaxed"]);
    fsx(&m, "relaxed-mapped", &["--seed", "4", "--ops", "1500", "--mapping"], true);
    m.stop_and_fsck();
}

/// `tests/data/fsx.py` started on file `name` of the mount for endless operations up to
/// `max_len` bytes, keeping its state for a kill (`how`: `--kill-state` or `--client-state`) in
/// a directory of the test's; returns the script, that directory and the process, once it has
/// said it is ready.
fn fsx_running(m: &Mount, name: &str, seed: u64, max_len: &str, how: &str, preload: bool) -> (PathBuf, PathBuf, Child) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fsx.py");
    let state = m.dir.path().join(format!("{name}.state"));
    let mut c = Command::new("python3");
    c.arg(&script)
        .arg(m.path(name))
        .args(["--seed", &seed.to_string(), "--ops", "100000000", "--max-len", max_len, how])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if preload {
        c.env("LD_PRELOAD", preload_lib());
    }
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    // fsx prints nothing more until it ends, so the buffer holds no more than this line and
    // the pipe goes back to the child for the caller's `wait_with_output`.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "fsx {name} did not start");
    child.stdout = Some(out.into_inner());
    (script, state, child)
}

/// `tests/data/fsx.py --kill-state` on the mount, the daemon killed with SIGKILL `kill_after`
/// the operations start, then a new daemon: the file must read as the model of every call
/// that returned, or as that model with the call in flight at the kill made whole
/// (`fsx.py --verify`).
fn fsx_killed(m: &mut Mount, name: &str, seed: u64, kill_after: Duration, preload: bool) {
    let max_len = ((seed % 3 + 1) << 20).to_string();
    let (script, state, child) = fsx_running(m, name, seed, &max_len, "--kill-state", preload);
    std::thread::sleep(kill_after);
    let mut d = m.daemon.take().unwrap();
    d.kill().unwrap();
    d.wait().unwrap();
    let fsx = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&fsx.stdout).into_owned() + &String::from_utf8_lossy(&fsx.stderr);
    // Status 3: it ran until the mount went away (not to the end, not to a difference).
    assert_eq!(fsx.status.code(), Some(3), "fsx {name} (library: {preload}): {said}");
    ok(Command::new("umount").arg("-l").arg(&m.mnt));
    m.start();
    let checked = ok(Command::new("python3").arg(&script).arg(m.path(name)).arg("--verify").arg(&state));
    assert!(checked.starts_with("ok"), "fsx {name}: {checked}");
}

/// `tests/data/fsx.py --client-state` on the mount, itself killed with SIGKILL `kill_after`
/// its operations start: the file must read as the model of every call that returned, each
/// byte of the call in flight as it was or as the call would leave it (`--verify --torn`).
fn fsx_client_killed(m: &Mount, name: &str, seed: u64, kill_after: Duration, preload: bool) {
    let (script, state, mut child) = fsx_running(m, name, seed, "131072", "--client-state", preload);
    std::thread::sleep(kill_after);
    child.kill().unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), None, "fsx {name} ended before the kill ({st})");
    let checked = ok(Command::new("python3").arg(&script).arg(m.path(name)).arg("--verify").arg(&state).arg("--torn"));
    assert!(checked.starts_with("ok"), "fsx {name}: {checked}");
}

#[test]
fn a_program_killed_at_random_leaves_its_file_as_the_calls_that_returned_made_it() {
    // A client killed mid-call: its leases go back, an appender's size is pulled in (every
    // append whose write returned is kept, DESIGN §7b), and nothing else of the file changes.
    let mut m = Mount::new(&[]);
    for seed in 1..=8u64 {
        let after = Duration::from_millis(30 + seed * 97 % 400);
        fsx_client_killed(&m, &format!("client-killed-{seed}"), seed, after, seed > 2);
    }
    m.stop_and_fsck();
}

#[test]
fn random_operations_keep_every_call_that_returned_through_kill_9_of_the_daemon() {
    // Strict mode: a call through the mount is durable and atomic when it returns, so after
    // a kill and a new daemon the file is the model of the calls that returned, and a call in
    // flight is there whole or not at all. With the library, pwrites that go direct and
    // appends whose size the daemon pulls in at each fstat (DESIGN §7b, "Crash semantics").
    let mut m = Mount::new(&[]);
    for seed in 1..=6u64 {
        let after = Duration::from_millis(40 + seed * 113 % 500);
        fsx_killed(&mut m, &format!("killed-{seed}"), seed, after, false);
    }
    for seed in 7..=10u64 {
        let after = Duration::from_millis(40 + seed * 113 % 500);
        fsx_killed(&mut m, &format!("killed-direct-{seed}"), seed, after, true);
    }
    m.stop_and_fsck();
}

/// `tests/data/edgediff.py` (229 edge cases of POSIX calls, which `tests/fuse_mount.rs` holds to
/// ext4's answers) answers the same with the library as without it: the direct path, which
/// serves some of its reads, writes and mappings, changes no result.
#[test]
fn edge_cases_of_posix_calls_answer_the_same_with_the_library() {
    use std::os::unix::fs::PermissionsExt;
    let mut m = Mount::new(&[]);
    // Checks run as other users (uid 65534 and 1000) too: the mount must be reachable.
    fs::set_permissions(m.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/edgediff.py");
    let stats = m.dir.path().join("edge.stats");
    let plain = ok(Command::new("python3").arg(&script).arg(&m.mnt));
    let with = ok(Command::new("python3")
        .arg(&script)
        .arg(&m.mnt)
        .env("LD_PRELOAD", preload_lib())
        .env("WINEFS_PRELOAD_STATS", &stats));
    assert!(plain.lines().count() > 150, "edgediff.py stopped early:\n{plain}");
    let differ = common::transcript_differences(("without:", &plain), ("with:   ", &with));
    assert!(differ.is_empty(), "the library changes results:\n{}", differ.join("\n"));
    let st = fs::read_to_string(&stats).unwrap();
    let direct: u64 = ["read_direct", "write_direct", "mmap_direct"].iter().map(|c| counter(&st, c)).sum();
    assert!(direct > 0, "the library served nothing directly: {st}");
    m.stop_and_fsck();
}

/// Python `script` run on `file` with the library (its counters to `stats`), talking to the
/// test through piped stdin and stdout.
fn python_with_library(script: &str, file: &Path, stats: &Path) -> Child {
    Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .env("LD_PRELOAD", preload_lib())
        .env("WINEFS_PRELOAD_STATS", stats)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_direct_write_from_inside_the_file_past_its_end_keeps_its_inside_bytes_through_kill_9_of_the_daemon() {
    // The bytes a direct write stores inside the file are durable when it returns; those past
    // the end come with the size at the daemon's next pull (DESIGN §7b, "Crash semantics"),
    // which a killed daemon never makes. The kill run above met it once in CI, among hundreds
    // of rounds: the file must hold the inside bytes at its old size, and never the rest.
    let mut m = Mount::new(&[]);
    let f = m.path("straddled");
    let stats = m.dir.path().join("straddled.stats");
    let script = "import os, sys\n\
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n\
        os.pwrite(fd, b'a' * 409565, 0)\n\
        os.fsync(fd)\n\
        assert os.fstat(fd).st_size == 409565\n\
        assert os.pwrite(fd, b'b' * 35648, 399717) == 35648\n\
        print('written', flush=True)\n\
        sys.stdin.readline()\n";
    let mut child = python_with_library(script, &f, &stats);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "written\n");
    let mut d = m.daemon.take().unwrap();
    d.kill().unwrap();
    d.wait().unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let st = fs::read_to_string(&stats).unwrap();
    assert_eq!(counter(&st, "append_direct"), 1, "the write did not go direct: {st}");
    ok(Command::new("umount").arg("-l").arg(&m.mnt));
    m.start();
    let bytes = fs::read(&f).unwrap();
    assert_eq!(bytes.len(), 409565, "the size the daemon never pulled in");
    assert!(bytes[..399717].iter().all(|&b| b == b'a'), "bytes before the write changed");
    assert!(bytes[399717..].iter().all(|&b| b == b'b'), "the write's bytes inside the file were lost");
    // What the write stored past the old end never shows, even when the file grows over it.
    fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(1 << 20).unwrap();
    let grown = fs::read(&f).unwrap();
    assert!(grown[409565..].iter().all(|&b| b == 0), "stray bytes past the old end");
    m.stop_and_fsck();
}

#[test]
fn a_direct_write_gives_the_file_new_times_seen_by_every_process() {
    // A direct write reaches neither the kernel nor the daemon; without its times a backup
    // that compares size and mtime (rsync's quick check) would skip a file overwritten in
    // place. The daemon gives new times at its next look after a direct write (DESIGN §7b).
    let m = Mount::new(&[]);
    let f = m.path("stamped");
    fs::write(&f, vec![7u8; 100_000]).unwrap();
    let stats = m.dir.path().join("stamped.stats");
    let script = "import os, sys, time\n\
        p = sys.argv[1]\n\
        fd = os.open(p, os.O_RDWR)\n\
        os.pread(fd, 10, 0)\n\
        os.pwrite(fd, b'x', 0)\n\
        m0 = os.stat(p).st_mtime_ns\n\
        time.sleep(0.02)\n\
        os.pwrite(fd, b'y' * 100, 100)\n\
        m1 = os.stat(p).st_mtime_ns\n\
        time.sleep(0.02)\n\
        os.pwrite(fd, b'z' * 100, 5000)\n\
        print(m0, m1, flush=True)\n\
        sys.stdin.readline()\n\
        os.pwrite(fd, b'w' * 100, 9000)\n\
        time.sleep(0.02)\n\
        os.close(fd)\n\
        import mmap\n\
        fd = os.open(p, os.O_RDWR)\n\
        m = mmap.mmap(fd, 65536)\n\
        m4 = os.stat(p).st_mtime_ns\n\
        time.sleep(0.02)\n\
        m[4464:4469] = b'store'\n\
        m.flush()\n\
        print(m4, os.stat(p).st_mtime_ns, flush=True)\n\
        m.close()\n\
        os.close(fd)\n";
    let mut child = python_with_library(script, &f, &stats);
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let times: Vec<i128> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert!(times[1] > times[0], "the writer's own stat after its direct write: {times:?}");
    // Another process, while the writer still holds the file.
    let mtime = |f: &Path| {
        let md = fs::metadata(f).unwrap();
        (md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128, md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128)
    };
    let (m2, c2) = mtime(&f);
    assert!(m2 > times[1] && c2 >= m2, "another process after the third write: {m2} {c2}, {times:?}");
    let again = mtime(&f);
    assert_eq!(again, (m2, c2), "a look with no write between changed the times");
    // A write just before the close: its times are given when the lease goes.
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // Then stores through a mapping, synced while it is held.
    line.clear();
    out.read_line(&mut line).unwrap();
    let synced: Vec<i128> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert!(child.wait().unwrap().success());
    assert!(synced[0] > m2, "the write before the close: {synced:?} after {m2}");
    assert!(synced[1] > synced[0], "stores through a mapping, msync'd: {synced:?}");
    assert_eq!(&fs::read(&f).unwrap()[4464..4469], b"store");
    let st = fs::read_to_string(&stats).unwrap();
    assert!(counter(&st, "write_direct") >= 4, "the writes did not go direct: {st}");
    assert!(counter(&st, "mmap_direct") >= 1, "the mapping was not direct: {st}");
}

#[test]
fn random_operations_on_a_full_pool_are_refused_whole_or_cut_short_and_lose_nothing() {
    // fsx.py --enospc with about 1 MiB free and files up to 8 MiB: a call refused with ENOSPC
    // must leave the file as it was, a write short of space must say how much it wrote, and
    // the file must read as the model after every call. Found: copy_file_range reported
    // every byte copied when the write under it was cut short (the rest read as zeros), and
    // zero range of a leased file zeroed in place before finding no space for its holes.
    let mut m = Mount::with_pool(&[], None, "64M");
    let filler = m.path("filler");
    let room = m.free_blocks().saturating_sub(256) * 4096;
    fs::write(&filler, vec![0x5au8; room as usize]).unwrap();
    for (seed, preload) in [("1", false), ("3", false), ("11", true), ("12", true)] {
        let name = format!("full-{seed}");
        let said = fsx(&m, &name, &["--seed", seed, "--ops", "1500", "--max-len", "8388608", "--enospc"], preload);
        let refused: u64 = said
            .rsplit(", ")
            .next()
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(refused >= 50, "fsx seed {seed} hardly met a full pool: {said}");
        fs::remove_file(m.path(&name)).unwrap();
    }
    assert!(fs::read(&filler).unwrap().iter().all(|&b| b == 0x5a), "the filler changed");
    m.stop_and_fsck();
}

/// A program that lowers `RLIMIT_FSIZE` (as `ulimit -f` does) and writes past it.
const FSIZE_SCRIPT: &str = r#"
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.pwrite(fd, b"a" * 4096, 0)
os.pwrite(fd, b"a" * 4096, 4096)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))
print("cut to", os.pwrite(fd, b"b" * 30000, 4096))
print("inside", os.pwrite(fd, b"c" * 100, 8000))
try:
    os.pwrite(fd, b"d", 20000)
    print("at the limit: written")
except OSError as e:
    print("at the limit:", e.strerror)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("lifted", os.pwrite(fd, b"e" * 30000, 4096), os.fstat(fd).st_size)
"#;

/// Run the Python `script` on file `name-plain` of the mount, then on `name-direct` with the
/// library: both outputs, which must agree, and the library's counters (`counted`, such as
/// "write_direct", must have counted).
fn script_with_and_without_library(m: &Mount, script: &str, name: &str, counted: &str) -> (String, String) {
    let stats = m.dir.path().join(format!("{name}.stats"));
    let plain = ok(Command::new("python3").args(["-c", script]).arg(m.path(&format!("{name}-plain"))));
    let direct = ok(Command::new("python3")
        .args(["-c", script])
        .arg(m.path(&format!("{name}-direct")))
        .env("LD_PRELOAD", preload_lib())
        .env("WINEFS_PRELOAD_STATS", &stats));
    assert_eq!(direct, plain, "{name}: with the library");
    let st = fs::read_to_string(&stats).unwrap();
    assert!(counter(&st, counted) >= 1, "{name}: nothing went direct: {st}");
    (plain, st)
}

#[test]
fn writes_past_the_file_size_limit_are_cut_or_refused_as_the_kernel_does_them() {
    // Direct writes never reach the kernel's checks: a write reaching past RLIMIT_FSIZE must
    // go to it (it wrote every byte before).
    let mut m = Mount::new(&[]);
    let (plain, st) = script_with_and_without_library(&m, FSIZE_SCRIPT, "limited", "write_direct");
    assert!(plain.contains("cut to 15904\n") && plain.contains("File too large"), "{plain}");
    assert!(counter(&st, "write_direct") >= 2, "nothing went direct: {st}");
    assert!(fs::read(m.path("limited-direct")).unwrap() == fs::read(m.path("limited-plain")).unwrap());
    m.stop_and_fsck();
}

/// A program that writes a file after leasing it with two reads: whatever carries privileges
/// must lose them at the write, as the kernel drops them, also when they are set while the
/// file is leased. argv: the file, "cap" (file capabilities, as root) or "suid".
const PRIVS_SCRIPT: &str = r#"
import os, subprocess, sys
p, kind = sys.argv[1], sys.argv[2]
def privileged():
    if kind == "cap":
        return subprocess.run(["getfattr", "-n", "security.capability", p], capture_output=True).returncode == 0
    return os.stat(p).st_mode & 0o4000 != 0
def grant():
    if kind == "cap":
        subprocess.run(["setfattr", "-n", "security.capability", "-v", "0x0000000200200000000000000000000000000000", p], check=True)
    else:
        os.chmod(p, 0o4755)
with open(p, "wb") as f:
    f.write(b"\0" * 8192)
grant()
fd = os.open(p, os.O_RDWR)
os.pread(fd, 100, 0)
os.pread(fd, 100, 0)
os.pwrite(fd, b"y" * 100, 0)
print("after a write:", privileged())
grant()
os.pwrite(fd, b"z" * 100, 100)
print("granted while leased, after a write:", privileged())
os.close(fd)
"#;

#[test]
fn a_write_through_the_library_drops_file_capabilities_and_set_user_id_as_the_kernel_does() {
    // Direct writes never reached the daemon, which drops privileges (`fuse::privs`): a file
    // leased by two reads kept its capabilities and set-user-ID bit through every write.
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let run_it = |file: PathBuf, kind: &str, user: Option<&str>, stats: Option<&Path>| {
        let mut c = match user {
            Some(u) => {
                let mut c = Command::new("setpriv");
                // The system's interpreter: one under root's home is not for other users.
                c.args([&format!("--reuid={u}"), &format!("--regid={u}"), "--clear-groups", "/usr/bin/python3"]);
                c
            }
            None => Command::new("python3"),
        };
        c.args(["-c", PRIVS_SCRIPT]).arg(file).arg(kind);
        if let Some(st) = stats {
            c.env("LD_PRELOAD", preload_lib()).env("WINEFS_PRELOAD_STATS", st);
        }
        ok(&mut c)
    };
    let dropped = "after a write: False\ngranted while leased, after a write: False\n";
    assert_eq!(run_it(m.path("cap-plain"), "cap", None, None), dropped, "without the library");
    assert_eq!(run_it(m.path("cap-direct"), "cap", None, Some(&stats)), dropped, "with the library");
    let st = fs::read_to_string(&stats).unwrap();
    assert!(counter(&st, "read_direct") >= 1, "the file was not leased: {st}");
    // Set-user-ID: a writer without CAP_FSETID, which has the direct path as the pool's owner.
    m.stop_and_fsck();
    ok(Command::new("chown").arg("1000").arg(&m.pool));
    m.start();
    let dir = m.path("u");
    fs::create_dir(&dir).unwrap();
    ok(Command::new("chown").arg("1000:1000").arg(&dir));
    let st2 = dir.join("stats");
    assert_eq!(run_it(m.path("u/suid-direct"), "suid", Some("1000"), Some(&st2)), dropped, "with the library");
    let st = fs::read_to_string(&st2).unwrap();
    assert!(counter(&st, "read_direct") >= 1, "the file was not leased: {st}");
    m.stop_and_fsck();
}

/// A program that leases a file with two reads and writes it, then sets the immutable flag
/// and then the append-only one (as root, `chattr`) and tries again.
const FLAGS_SCRIPT: &str = r#"
import os, subprocess, sys
p = sys.argv[1]
with open(p, "wb") as f:
    f.write(b"\0" * 8192)
fd = os.open(p, os.O_RDWR)
os.pread(fd, 100, 0)
os.pread(fd, 100, 0)
os.pwrite(fd, b"y" * 100, 0)
for flag in ("+i", "+a"):
    subprocess.run(["chattr", flag, p], check=True)
    try:
        os.pwrite(fd, b"z" * 100, 100)
        print(flag, "write allowed")
    except OSError as e:
        print(flag, e.strerror)
    subprocess.run(["chattr", "-" + flag[1], p], check=True)
"#;

#[test]
fn an_immutable_or_append_only_flag_set_while_a_file_is_leased_stops_its_direct_writes() {
    let mut m = Mount::new(&[]);
    let (plain, _) = script_with_and_without_library(&m, FLAGS_SCRIPT, "flags", "write_direct");
    assert_eq!(plain, "+i Operation not permitted\n+a Operation not permitted\n");
    m.stop_and_fsck();
}

/// Map a file opened read-only, shared and readable, then ask `mprotect` for writing.
const MPROTECT_SCRIPT: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
fd = os.open(sys.argv[1], os.O_RDONLY)
n = 4 << 20
a = libc.mmap(None, n, 1, 1, fd, 0)
assert a != ctypes.c_void_p(-1).value
r = libc.mprotect(a, n, 3)
print("mprotect:", os.strerror(ctypes.get_errno()) if r else "writable")
if r == 0:
    ctypes.memset(a, 0x41, 10)
"#;

#[test]
fn a_mapping_of_a_file_opened_read_only_cannot_be_made_writable() {
    // A direct mapping was made from the pool's read-write descriptor: mprotect made it
    // writable and the stores changed a file the program could only read.
    let mut m = Mount::new(&[]);
    for f in ["read-only-plain", "read-only-direct"] {
        fs::write(m.path(f), vec![0u8; 4 << 20]).unwrap();
    }
    let (plain, _) = script_with_and_without_library(&m, MPROTECT_SCRIPT, "read-only", "mmap_direct");
    assert_eq!(plain, "mprotect: Permission denied\n");
    assert!(fs::read(m.path("read-only-direct")).unwrap().iter().all(|&b| b == 0), "the file changed");
    m.stop_and_fsck();
}

#[test]
fn a_read_only_map_past_the_end_sees_pwrites_into_pages_the_file_grew_into() {
    // liblmdb without MDB_WRITEMAP: pages are written with pwrite(v) and read through a
    // read-only map of the whole map size. A page the file grew into after the map was made
    // must show every later pwrite, however that pwrite is served.
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let (out, st) = client_run(&["grow", m.path("grow").to_str().unwrap()], false, &stats);
    assert!(out.status.success(), "{} (stats {st})", String::from_utf8_lossy(&out.stdout));
    assert!(counter(&st, "write_direct") >= 1, "no pwrite went direct: {st}");
    m.stop_and_fsck();
}

#[test]
fn a_forked_child_shares_the_mapping_and_its_unmap_leaves_the_parents() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let (out, st) = client_run(&["fork", m.path("forked").to_str().unwrap()], false, &stats);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(st.contains("\"mmap_direct\":1"), "stats: {st}");
    m.stop_and_fsck();
}

#[test]
fn truncate_and_unlink_by_another_process_never_hand_a_mapped_block_to_another_file() {
    let mut m = Mount::new(&[]);
    let f = m.path("victim");
    fs::write(&f, vec![1u8; 4 << 20]).unwrap();
    let free_before = m.free_blocks();
    let mut h = Holder::start(&f, 4);
    // Truncate to zero under the mapping: its blocks stay with the file, not reused.
    fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(0).unwrap();
    let others: Vec<PathBuf> = (0..6).map(|i| m.path(&format!("other{i}"))).collect();
    for o in &others {
        fs::write(o, vec![0xEEu8; 4 << 20]).unwrap();
    }
    // Whatever the holder sees, it is never another file's bytes (0xEE); its stores land in
    // no other file.
    for unit in 0..2u64 {
        let s = h.sum(unit << 21, 1 << 21);
        assert_eq!(s % (1 << 21), 0, "unit {unit} of the stale mapping reads foreign bytes (sum {s})");
        assert!(s == 1 << 21 || s == 0, "sum {s}");
        h.write(unit << 21, 0x55);
    }
    for o in &others {
        assert!(fs::read(o).unwrap().iter().all(|&b| b == 0xEE), "{} changed", o.display());
    }
    // Grown back by this process: the holder reads zeros there (its stores past the end went
    // nowhere), and what it stores now is the file's, as through a kernel mapping.
    fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(4 << 20).unwrap();
    assert_eq!(h.sum(0, 4 << 20), 0, "the grown file shows old bytes through the mapping");
    h.write((3 << 20) + 7, 0x42);
    assert_eq!(fs::read(&f).unwrap()[(3 << 20) + 7], 0x42, "a store after the regrowth is not the file's");
    // A hole punched under a mapping reads zeros through it at once, through fallocate(2).
    let p = m.path("punched");
    fs::write(&p, vec![2u8; 4 << 20]).unwrap();
    let mut hp = Holder::start(&p, 4);
    ok(Command::new("fallocate").args(["--punch-hole", "--offset", "0", "--length", "4194304"]).arg(&p));
    fs::write(m.path("after-punch"), vec![0xEEu8; 4 << 20]).unwrap();
    let s = hp.sum(0, 4 << 20);
    assert_eq!(s, 0, "a punched, mapped range reads old or foreign bytes (sum {s})");
    // Zero range too (refused with EBUSY while leased before).
    fs::write(&p, vec![3u8; 4 << 20]).unwrap();
    ok(Command::new("fallocate").args(["--zero-range", "--offset", "1048576", "--length", "4096"]).arg(&p));
    assert_eq!(hp.sum(0, 4 << 20), 3 * ((4 << 20) - 4096), "zero range through the mapping");
    hp.quit();
    assert!(fs::read(m.path("after-punch")).unwrap().iter().all(|&b| b == 0xEE));
    fs::remove_file(m.path("after-punch")).unwrap();
    fs::remove_file(&p).unwrap();
    // Unlink while mapped: the file lives (and its blocks stay out of use) until the holder
    // lets go; then every block comes back.
    fs::remove_file(&f).unwrap();
    for o in &others {
        fs::remove_file(o).unwrap();
    }
    h.write(100, 9);
    h.quit();
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.free_blocks() < free_before + (4 << 20) / 4096 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        m.free_blocks() >= free_before + (4 << 20) / 4096,
        "blocks of the unlinked, unmapped file not freed: {} free, {} before",
        m.free_blocks(),
        free_before
    );
    m.stop_and_fsck();
}

#[test]
fn appends_by_write_go_direct_with_every_size_seen_at_once_and_o_append_writers_land_at_the_true_end() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("wal");
    let (out, st) = client_run(&["append", f.to_str().unwrap(), "30000", "5"], false, &stats);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    // All but the first (which makes the file) and the O_APPEND one went direct.
    assert!(counter(&st, "append_direct") >= 29_990, "stats: {st}");
    assert!(counter(&st, "write_fuse") <= 5, "stats: {st}");
    // The same bytes as the program's run without the library.
    let g = m.path("wal-plain");
    let (out, _) = client_run(&["append", g.to_str().unwrap(), "30000", "5"], true, &stats);
    assert!(out.status.success(), "{out:?}");
    assert!(fs::read(&f).unwrap() == fs::read(&g).unwrap(), "direct and FUSE runs differ");
    m.stop_and_fsck();
}

#[test]
fn a_client_killed_mid_append_keeps_every_write_that_returned_and_leaves_no_stray_bytes() {
    let mut m = Mount::new(&[]);
    let f = m.path("killed-wal");
    let mut child = Command::new(client(false))
        .args(["append", f.to_str().unwrap(), "100000000", "9", "every"])
        .env("LD_PRELOAD", preload_lib())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut reported = 0u64;
    let mut line = String::new();
    while reported < 4 << 20 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the appender stopped");
        reported = line.trim().strip_prefix("progress ").and_then(|n| n.parse().ok()).unwrap_or(reported);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The daemon took the size the client published when its channel closed: every write
    // that returned is there, with its bytes (the last ones were never looked at before).
    let deadline = Instant::now() + Duration::from_secs(5);
    let size = loop {
        let size = fs::metadata(&f).unwrap().len();
        if size >= reported || Instant::now() > deadline {
            break size;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(size >= reported, "size {size} after writes up to {reported} returned");
    let bytes = fs::read(&f).unwrap();
    for (i, &b) in bytes.iter().enumerate() {
        assert_eq!(b, append_pattern(i, 9), "byte {i} of {size}");
    }
    // Bytes the client stored past the end without growing the size never show.
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    h.set_len(size + (1 << 20)).unwrap();
    drop(h);
    let grown = fs::read(&f).unwrap();
    assert!(grown[size as usize..].iter().all(|&b| b == 0), "stray bytes after the end");
    m.stop_and_fsck();
}

#[test]
fn threads_writing_one_descriptor_get_distinct_ranges_and_every_record_lands_once() {
    let mut m = Mount::new(&[]);
    let stats = m.dir.path().join("stats");
    let f = m.path("shared-fd");
    let (out, st) = client_run(&["tappend", f.to_str().unwrap()], false, &stats);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    assert_eq!(said.trim(), "records 80000");
    assert!(counter(&st, "append_direct") > 40_000, "stats: {st}");
    m.stop_and_fsck();
}

/// Byte `i` of what the `append` command writes with `seed`.
fn append_pattern(i: usize, seed: usize) -> u8 {
    ((i / 4096) * 7 + (i % 4096) * 13 + seed) as u8
}

#[test]
fn appends_that_fill_the_pool_fail_with_enospc_and_keep_what_was_written() {
    let mut m = Mount::new(&[]);
    // Leave about 3 MiB free.
    let filler = m.path("filler");
    let free = m.free_blocks() * 4096;
    let f = fs::File::create(&filler).unwrap();
    f.set_len(free - (3 << 20)).unwrap();
    let mut left = free - (3 << 20);
    let chunk = vec![1u8; 1 << 20];
    let mut w = std::io::BufWriter::new(&f);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    drop(w);
    drop(f);
    let g = m.path("full-wal");
    let out = run(Command::new(client(false))
        .args(["append", g.to_str().unwrap(), "1000000", "4"])
        .env("LD_PRELOAD", preload_lib()));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("write: No space left on device"), "{said}");
    // Everything written before the pool filled is there.
    let bytes = fs::read(&g).unwrap();
    assert!(bytes.len() > 1 << 20, "only {} bytes", bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        assert_eq!(b, append_pattern(i, 4), "byte {i} of {}", bytes.len());
    }
    m.stop_and_fsck();
}

#[test]
fn a_client_killed_mid_store_gives_its_leases_back() {
    let mut m = Mount::new(&[]);
    let f = m.path("killed");
    fs::write(&f, vec![3u8; 4 << 20]).unwrap();
    let free_before = m.free_blocks();
    let mut h = Holder::start(&f, 4);
    h.write(5, 4);
    fs::remove_file(&f).unwrap();
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    // The channel closed with the process: the lease went, so the unlinked file is freed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.free_blocks() < free_before + (4 << 20) / 4096 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(m.free_blocks() >= free_before + (4 << 20) / 4096, "the dead client's file was not freed");
    m.stop_and_fsck();
}

#[test]
fn a_killed_daemon_revokes_direct_mappings_and_the_pool_mounts_again_clean() {
    let mut m = Mount::new(&[]);
    let f = m.path("orphaned");
    fs::write(&f, vec![5u8; 2 << 20]).unwrap();
    let mut h = Holder::start(&f, 2);
    h.write(10, 6);
    let mut d = m.daemon.take().unwrap();
    d.kill().unwrap();
    d.wait().unwrap();
    ok(Command::new("umount").arg("-l").arg(&m.mnt));
    // The holder lets go of the pool within moments (its watcher saw the channel close), so
    // the pool is not "in use" and mounts again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(Command::new(BIN).arg("fsck").arg(&m.pool));
        if out.status.success() {
            break;
        }
        let why = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("in use") && Instant::now() < deadline, "fsck after the daemon died: {why}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The holder's mapping is gone: touching it kills the holder, it never reads the pool.
    writeln!(h.input, "r 10").unwrap();
    let st = h.child.wait().unwrap();
    assert!(!st.success(), "a revoked mapping was still readable");
    m.start();
    assert_eq!(fs::read(&f).unwrap()[10], 6, "a store made before the daemon died is lost");
    m.stop_and_fsck();
}

#[test]
fn without_a_direct_path_everything_still_works_through_fuse() {
    // A mount that offers none, a user who does not own the pool, a static binary.
    let mut m = Mount::new(&["--no-direct"]);
    let stats = m.dir.path().join("stats");
    let f = m.path("nodirect");
    let (out, st) = client_run(&["fill", f.to_str().unwrap(), "4", "2"], false, &stats);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(counter(&st, "mmap_direct"), 0, "stats: {st}");
    assert_eq!(counter(&st, "mmap_fuse"), 1, "stats: {st}");
    let (out, _) = client_run(&["check", f.to_str().unwrap(), "4", "2"], true, &stats);
    assert!(out.status.success(), "{out:?}");
    m.stop_and_fsck();

    let mut m = Mount::new(&[]);
    let dir = m.path("nobody");
    fs::create_dir(&dir).unwrap();
    ok(Command::new("chown").arg("65534:65534").arg(&dir));
    let f = dir.join("file");
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(client(false))
        .args(["fill", f.to_str().unwrap(), "4", "8"])
        .env("LD_PRELOAD", preload_lib())
        .env("WINEFS_PRELOAD_LOG", "1"));
    assert!(out.status.success(), "{out:?}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("refused the direct path"), "log: {log}");
    let (out, _) = client_run(&["check", f.to_str().unwrap(), "4", "8"], false, &stats);
    assert!(out.status.success(), "{out:?}");

    let g = m.path("static");
    let out = run(Command::new(client(true))
        .args(["fill", g.to_str().unwrap(), "4", "9"])
        .env("LD_PRELOAD", preload_lib()));
    assert!(out.status.success(), "{out:?}");
    let (out, _) = client_run(&["check", g.to_str().unwrap(), "4", "9"], false, &stats);
    assert!(out.status.success(), "{out:?}");
    m.stop_and_fsck();
}
