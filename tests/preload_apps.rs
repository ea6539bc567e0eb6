//! Unmodified programs from Debian packages on a FUSE-mounted pool, run with
//! `LD_PRELOAD=libwinefs_preload.so` (the direct data path: their mmap, read and write on files of
//! the mount go straight to the pool): liblmdb's tools (mdb_load, mdb_dump, mdb_stat, mdb_copy)
//! and Python's `lmdb` (over 200 MB, with and without writemap), sqlite3 in WAL and DELETE
//! journal modes (and WAL reading through mmap), and RocksDB's db_bench, ldb and sst_dump (over
//! 200 MB, reads through mmap and through pread). Each program runs twice: on the mount under
//! the library, and without it on a plain directory (in the temporary directory); its output,
//! and the files it wrote where their format is deterministic, must be the same byte for byte. After every program on the mount the
//! pool is unmounted (`umount`), the daemon must report a clean unmount and `winefs fsck` must
//! call the pool clean; the next step mounts it again, so whatever is read next comes from the
//! pool, not from the kernel's page cache.
//!
//! With `WINEFS_PRELOAD_STATS` set, the library appends one JSON line per process at exit; each
//! run on the mount must leave such lines (proof that the library was loaded and saw the
//! program's files; it writes none for a process that made no counted call on a winefs file)
//! and prints which share of its calls went direct. Two runs assert a share: the LMDB writemap
//! run's mappings of the mount must have gone direct, and at least 90% of db_bench's writes
//! (its appends).
//!
//! Runs as root, like the other FUSE tests: the pools live on a `huge=always` tmpfs each test
//! mounts for itself (without root, or without hugepage tmpfs, in the temporary directory). A
//! missing program fails the test with the Debian package to install (scripts/install-deps.sh
//! installs them all). The tests take turns, one at a time, so a 2-core machine runs each at
//! full speed and holds one pool at a time.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use winefs::rng::Rng;
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

const MIB: u64 = 1 << 20;

/// How long one program may run before it counts as a hang.
const APP_WAIT: Duration = Duration::from_secs(300);

/// How long a mount may take to appear and an unmounted daemon to exit.
const MOUNT_WAIT: Duration = Duration::from_secs(20);

/// Debian's Python, the one python3-lmdb installs for (a `python3` earlier on PATH, say from
/// pyenv, would not have the module).
const PYTHON: &str = "/usr/bin/python3";

// ---------------------------------------------------------------------------------------------
// Programs and packages.

/// Fail (never skip) when `tool` is not installed, naming the Debian package that has it.
fn require(tool: &str, package: &str) {
    let found = if tool.contains('/') {
        Path::new(tool).is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
    };
    assert!(
        found,
        "`{tool}` is not installed: install the {package} package (apt-get install {package})"
    );
}

fn require_all(tools: &[(&str, &str)]) {
    for &(tool, package) in [("umount", "mount"), ("mount", "mount")]
        .iter()
        .chain(tools)
    {
        require(tool, package);
    }
}

/// Debian's Python 3 with the `lmdb` module (python3-lmdb).
fn require_python_lmdb() {
    require(PYTHON, "python3");
    let out = Command::new(PYTHON)
        .args(["-c", "import lmdb"])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}"));
    assert!(
        out.status.success(),
        "{PYTHON} has no `lmdb` module: install the python3-lmdb package (apt-get install \
         python3-lmdb): {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn cmd(program: &str) -> Command {
    Command::new(program)
}

fn describe(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last `n` bytes of a file, as text, for failure messages.
fn tail(path: &Path, n: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(n)));
    let mut v = Vec::new();
    let _ = f.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
}

/// Run `c` to completion (stdin closed, stdout and stderr to the given files); a command still
/// running after `limit` is killed and fails the test as a hang.
fn run_to_files(c: &mut Command, stdout: &Path, stderr: &Path, limit: Duration) -> ExitStatus {
    let desc = describe(c);
    c.stdin(Stdio::null())
        .stdout(File::create(stdout).unwrap())
        .stderr(File::create(stderr).unwrap());
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{desc}`: {e}"));
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{desc}` did not finish within {limit:?} (winefs hung?); stderr:\n{}",
                tail(stderr, 2000)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------
// The preload library and what it counted.

/// Build libwinefs_preload.so (`cargo test` does not) once per test process; its path, from
/// cargo's own report of what it built.
fn preload_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(&cargo)
            .args(["build", "--release", "-p", "winefs-preload"])
            .arg("--message-format=json")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.to_string_lossy()));
        assert!(
            out.status.success(),
            "cargo build --release -p winefs-preload failed ({})",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lib = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| {
                m["reason"] == "compiler-artifact" && m["target"]["name"] == "winefs_preload"
            })
            .flat_map(|m| {
                m["filenames"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|f| f.as_str().map(PathBuf::from))
            })
            .find(|f| f.extension().is_some_and(|e| e == "so"))
            .expect("cargo built no libwinefs_preload.so");
        assert!(lib.is_file(), "{} is missing", lib.display());
        lib
    })
}

/// A call counted by the library: (direct, through FUSE).
#[derive(Debug, Default, Clone, Copy)]
struct Split {
    direct: u64,
    fuse: u64,
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = self.direct + self.fuse;
        if all == 0 {
            return write!(f, "none");
        }
        write!(
            f,
            "{}/{all} direct ({:.1}%)",
            self.direct,
            100.0 * self.direct as f64 / all as f64
        )
    }
}

/// The sum of the lines the library appended to `WINEFS_PRELOAD_STATS`, one per process.
#[derive(Debug, Default)]
struct Stats {
    processes: u64,
    mmap: Split,
    read: Split,
    write: Split,
}

impl Stats {
    /// None when the file does not exist (no process counted anything).
    fn load(path: &Path) -> Option<Stats> {
        let text = fs::read_to_string(path).ok()?;
        let mut s = Stats::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: bad line {line:?}: {e}", path.display()));
            let n = |k: &str| {
                v[k].as_u64()
                    .unwrap_or_else(|| panic!("{}: no count {k} in {line:?}", path.display()))
            };
            s.processes += 1;
            for (split, what) in [
                (&mut s.mmap, "mmap"),
                (&mut s.read, "read"),
                (&mut s.write, "write"),
            ] {
                split.direct += n(&format!("{what}_direct"));
                split.fuse += n(&format!("{what}_fuse"));
            }
        }
        Some(s)
    }
}

// ---------------------------------------------------------------------------------------------
// Comparing outputs.

/// `len` bytes of `path` from `off` (fewer at its end), as text.
fn excerpt(path: &Path, off: u64, len: usize) -> String {
    let mut f = File::open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    let mut v = vec![0; len];
    let n = f.read(&mut v).unwrap_or(0);
    v.truncate(n);
    format!("{:?}", String::from_utf8_lossy(&v))
}

/// Fill `buf` from `r` as far as the data goes; how much was read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    n
}

/// `got` must equal `want` byte for byte (streamed: the files may be hundreds of MB); a
/// difference is reported with its offset, its line and both sides' text there.
fn assert_same_file(got: &Path, want: &Path, what: &str) {
    let open = |p: &Path| File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let (mut a, mut b) = (open(got), open(want));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let (mut off, mut line) = (0u64, 1u64);
    loop {
        let (na, nb) = (fill(&mut a, &mut ba), fill(&mut b, &mut bb));
        let n = na.min(nb);
        if let Some(i) = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y) {
            let at = off + i as u64;
            line += ba[..i].iter().filter(|&&c| c == b'\n').count() as u64;
            let from = at.saturating_sub(60);
            panic!(
                "{what}: {} differs from {} at byte {at} (line {line}):\n  got  {}\n  want {}",
                got.display(),
                want.display(),
                excerpt(got, from, 160),
                excerpt(want, from, 160)
            );
        }
        if na != nb {
            let (len_a, len_b) = (
                fs::metadata(got).unwrap().len(),
                fs::metadata(want).unwrap().len(),
            );
            panic!(
                "{what}: {} has {len_a} bytes, {} has {len_b} (the same up to byte {})",
                got.display(),
                want.display(),
                off + n as u64
            );
        }
        if na == 0 {
            return;
        }
        line += ba[..n].iter().filter(|&&c| c == b'\n').count() as u64;
        off += n as u64;
    }
}

// ---------------------------------------------------------------------------------------------
// The mount table and the hugepage tmpfs.

fn is_mounted(dir: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let want = dir.to_string_lossy();
    info.lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&*want))
}

fn umount(dir: &Path, lazy: bool) -> std::io::Result<std::process::Output> {
    let mut c = Command::new("umount");
    if lazy {
        c.arg("-l");
    }
    c.arg(dir).stdin(Stdio::null()).output()
}

/// Mount a `huge=always` tmpfs of `size` bytes on `dir` (as root); false when that cannot be
/// done, with the reason printed.
fn mount_huge_tmpfs(dir: &Path, size: u64) -> bool {
    if winefs::sys::euid() != 0 {
        println!("not root: the pool is a plain file in the temporary directory (4 KiB pages)");
        return false;
    }
    fs::create_dir(dir).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={size},huge=always"))
        .arg("winefs-preload-apps")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run mount");
    let huge = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && Path::new(f[1]) == dir && f[3].split(',').any(|o| o == "huge=always")
        });
    if !huge {
        if is_mounted(dir) {
            let _ = umount(dir, true);
        }
        println!(
            "no huge=always tmpfs ({}): the pool is a plain file in the temporary directory",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    huge
}

// ---------------------------------------------------------------------------------------------
// A test's world: a pool mounted on demand, and the plain directory beside it.

/// One test at a time (see the top of the file).
static TURN: Mutex<()> = Mutex::new(());

/// What a program printed, and what the library counted.
struct Ran {
    stdout: PathBuf,
    stderr: PathBuf,
    /// All zero for runs on the plain directory.
    stats: Stats,
}

impl Ran {
    fn text(&self) -> String {
        fs::read_to_string(&self.stdout)
            .unwrap_or_else(|e| panic!("read {}: {e}", self.stdout.display()))
    }
    fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// A fresh pool (on a hugepage tmpfs of its own when root), its FUSE mountpoint, and a plain
/// directory to run the same programs in. Programs run on the mount under the preload library,
/// one at a time; after each the pool is unmounted and checked, and the next step mounts it.
struct World {
    dir: tempfile::TempDir,
    /// The hugepage tmpfs holding the pool, when mounted here.
    huge: Option<PathBuf>,
    pool: PathBuf,
    mnt: PathBuf,
    plain: PathBuf,
    log: PathBuf,
    daemon: Option<Child>,
    /// Programs run so far (numbers the output files).
    runs: usize,
    /// Dropped last: the next test starts once this one has cleaned up.
    _turn: MutexGuard<'static, ()>,
}

impl World {
    fn new(name: &str, pool_size: u64) -> World {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        preload_library();
        let dir = tempfile::Builder::new()
            .prefix(&format!("winefs-apps-{name}"))
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in ["mnt", "plain", "out"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        let huge_dir = root.join("huge");
        let huge = mount_huge_tmpfs(&huge_dir, pool_size + 16 * MIB).then_some(huge_dir);
        let pool = huge.as_ref().unwrap_or(&root).join("pool");
        let mut w = World {
            mnt: root.join("mnt"),
            plain: root.join("plain"),
            log: root.join("daemon.log"),
            pool,
            huge,
            dir,
            daemon: None,
            runs: 0,
            _turn: turn,
        };
        let out = cmd(BIN)
            .arg("mkfs")
            .arg(&w.pool)
            .args(["--size", &pool_size.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("run winefs mkfs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.starts_with("formatted "),
            "winefs mkfs {} failed ({}): {said}{}",
            w.pool.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        w.mount();
        w
    }

    /// A file in the test's temporary directory (not on the mount).
    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn daemon_log(&self) -> String {
        tail(&self.log, 4000)
    }

    /// Start `winefs mount POOL MNT -f` unless it runs (its output goes to the log), and wait
    /// until the kernel lists the mount.
    fn mount(&mut self) {
        if self.daemon.is_some() {
            return;
        }
        assert!(
            !is_mounted(&self.mnt),
            "{} is already mounted",
            self.mnt.display()
        );
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.daemon = Some(
            cmd(BIN)
                .arg("mount")
                .arg(&self.pool)
                .arg(&self.mnt)
                .arg("-f")
                .env_remove("LD_PRELOAD")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start winefs mount"),
        );
        let deadline = Instant::now() + MOUNT_WAIT;
        while !is_mounted(&self.mnt) {
            if let Some(status) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                self.daemon = None;
                panic!(
                    "winefs mount exited ({status}) before mounting; log:\n{}",
                    self.daemon_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} is not mounted {MOUNT_WAIT:?} after winefs mount started; log:\n{}",
                self.mnt.display(),
                self.daemon_log()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// `umount MNT`: the daemon must exit 0 having unmounted the pool cleanly, and `winefs
    /// fsck POOL` must exit 0 and call it clean.
    fn unmount_and_check(&mut self, after: &str) {
        let Some(mut daemon) = self.daemon.take() else {
            return;
        };
        let out = umount(&self.mnt, false).expect("run umount");
        if !out.status.success() {
            self.daemon = Some(daemon);
            panic!(
                "umount {} after {after} failed: {}",
                self.mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let deadline = Instant::now() + MOUNT_WAIT;
        let status = loop {
            if let Some(s) = daemon.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                self.daemon = Some(daemon);
                panic!(
                    "the winefs daemon did not exit {MOUNT_WAIT:?} after umount (after {after}); \
                     log:\n{}",
                    self.daemon_log()
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let log = self.daemon_log();
        assert!(
            status.success() && log.contains(&format!("unmounted {} cleanly", self.pool.display())),
            "after {after}: the daemon exited with {status} without a clean unmount; log:\n{log}"
        );
        let out = cmd(BIN)
            .arg("fsck")
            .arg(&self.pool)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.code() == Some(0) && stdout.starts_with("clean: "),
            "after {after}: winefs fsck {} is not clean ({}):\n{stdout}{}",
            self.pool.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Run one program: on the mount under the preload library (then unmount and fsck), or on
    /// the plain directory without it. `make` builds the command given the directory to work in.
    fn run(&mut self, what: &str, on_mount: bool, make: &dyn Fn(&Path) -> Command) -> Ran {
        self.runs += 1;
        let side = if on_mount { "mount" } else { "plain" };
        let slug: String = what
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let base = format!("{:02}-{slug}.{side}", self.runs);
        let with = |ext: &str| self.dir.path().join("out").join(format!("{base}.{ext}"));
        let (stdout, stderr, stats) = (with("stdout"), with("stderr"), with("stats"));
        let mut c = if on_mount {
            self.mount();
            let mut c = make(&self.mnt);
            c.env("LD_PRELOAD", preload_library())
                .env("WINEFS_PRELOAD_STATS", &stats);
            c
        } else {
            let mut c = make(&self.plain);
            c.env_remove("LD_PRELOAD")
                .env_remove("WINEFS_PRELOAD_STATS");
            c
        };
        let desc = describe(&c);
        let started = Instant::now();
        let status = run_to_files(&mut c, &stdout, &stderr, APP_WAIT);
        let took = started.elapsed();
        assert!(
            status.success(),
            "{what} on the {side} directory: `{desc}` failed ({status}):\nstdout:\n{}\nstderr:\n{}{}",
            tail(&stdout, 3000),
            tail(&stderr, 3000),
            if on_mount {
                format!("\ndaemon log:\n{}", self.daemon_log())
            } else {
                String::new()
            }
        );
        println!("{what} ({side}): {:.1} s", took.as_secs_f64());
        let stats = if on_mount {
            self.unmount_and_check(what);
            let s = Stats::load(&stats).unwrap_or_else(|| {
                panic!(
                    "{what}: the preload library wrote no statistics to {} (not loaded, or it \
                     saw no call on the mount's files); stderr:\n{}",
                    stats.display(),
                    tail(&stderr, 3000)
                )
            });
            println!(
                "  preload, {} process(es): mmap {}, read {}, write {}",
                s.processes, s.mmap, s.read, s.write
            );
            s
        } else {
            Stats::default()
        };
        Ran {
            stdout,
            stderr,
            stats,
        }
    }

    /// Run a program on the mount and on the plain directory: [mount, plain].
    fn both(&mut self, what: &str, make: impl Fn(&Path) -> Command) -> [Ran; 2] {
        [self.run(what, true, &make), self.run(what, false, &make)]
    }

    /// [`World::both`], and the two must print the same bytes; the run on the mount.
    fn both_same(&mut self, what: &str, make: impl Fn(&Path) -> Command) -> Ran {
        let [m, p] = self.both(what, make);
        assert_same_file(&m.stdout, &p.stdout, &format!("{what}: output"));
        m
    }

    /// Directories on both sides (through the mount).
    fn mkdir(&mut self, rel: &str) {
        self.mount();
        for root in [&self.mnt, &self.plain] {
            fs::create_dir_all(root.join(rel)).unwrap();
        }
    }

    /// The file `rel` must be the same on the mount as on the plain directory.
    fn same_file(&mut self, rel: &str) {
        self.mount();
        assert_same_file(&self.mnt.join(rel), &self.plain.join(rel), rel);
    }

    /// The names and sizes of the files in directory `rel` must be the same on both sides.
    fn same_listing(&mut self, rel: &str) {
        self.mount();
        let list = |root: &Path| {
            let mut v: Vec<(String, u64)> = fs::read_dir(root.join(rel))
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        e.metadata().unwrap().len(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            list(&self.mnt),
            list(&self.plain),
            "{rel}: files on the mount vs plain"
        );
    }

    /// The end of a test: the pool unmounted and checked.
    fn finish(mut self) {
        self.unmount_and_check("the last step");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // A test that failed: stop the daemon, detach its mount, drop the pool and its tmpfs.
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = umount(&self.mnt, true);
        }
        let _ = fs::remove_file(&self.pool);
        if let Some(h) = &self.huge
            && umount(h, false).is_ok_and(|o| !o.status.success())
        {
            let _ = umount(h, true);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. liblmdb's tools.

/// `len` seeded pseudo-random bytes.
fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An `mdb_load` input in mdb_dump's bytevalue format: database `alpha` (3000 unique binary keys,
/// values from 1 byte to 20 KB, so leaf and overflow pages) and database `beta` (sorted
/// duplicates: 60 keys with up to 100 values each). About 15 MB of data.
fn lmdb_input(path: &Path) {
    let mut rng = Rng(0x6c6d_6462);
    let mut s = String::new();
    let header = |s: &mut String, name: &str, dupsort: bool| {
        s.push_str("VERSION=3\nformat=bytevalue\n");
        s.push_str(&format!("database={name}\ntype=btree\n"));
        if dupsort {
            s.push_str("dupsort=1\n");
        }
        s.push_str("mapsize=268435456\nHEADER=END\n");
    };
    header(&mut s, "alpha", false);
    for i in 0..3000u32 {
        let mut key = i.to_be_bytes().to_vec();
        key.extend(random_bytes(&mut rng, 1 + (i % 40) as usize));
        let len = [1, 10, 100, 1000, 2500, 5000, 20000][rng.below(7) as usize];
        s.push_str(&format!(" {}\n {}\n", hex(&key), hex(&random_bytes(&mut rng, len))));
    }
    s.push_str("DATA=END\n");
    header(&mut s, "beta", true);
    for k in 0..60u32 {
        for _ in 0..1 + rng.below(100) {
            let len = 1 + rng.below(200) as usize;
            s.push_str(&format!(
                " {}\n {}\n",
                hex(format!("beta{k:04}").as_bytes()),
                hex(&random_bytes(&mut rng, len))
            ));
        }
    }
    s.push_str("DATA=END\n");
    fs::write(path, s).unwrap();
}

#[test]
fn lmdb_tools_load_dump_stat_and_copy() {
    require_all(&[
        ("mdb_load", "lmdb-utils"),
        ("mdb_dump", "lmdb-utils"),
        ("mdb_stat", "lmdb-utils"),
        ("mdb_copy", "lmdb-utils"),
    ]);
    let mut w = World::new("lmdb-tools", 256 * MIB);
    let input = w.scratch("lmdb-input.txt");
    lmdb_input(&input);
    w.mkdir("env");
    w.mkdir("copy");
    w.both_same("mdb_load", |r| {
        let mut c = cmd("mdb_load");
        c.arg("-f").arg(&input).arg(r.join("env"));
        c
    });
    let dump = w.both_same("mdb_dump", |r| {
        let mut c = cmd("mdb_dump");
        c.arg("-a").arg(r.join("env"));
        c
    });
    let text = dump.text();
    for db in ["database=alpha", "database=beta", "dupsort=1"] {
        assert!(text.contains(db), "mdb_dump -a printed no {db}");
    }
    assert!(
        text.len() as u64 > fs::metadata(&input).unwrap().len() * 9 / 10,
        "mdb_dump -a printed {} bytes for an input of {}",
        text.len(),
        fs::metadata(&input).unwrap().len()
    );
    // One process, no readers: LMDB writes the same pages in the same places.
    w.same_file("env/data.mdb");
    w.both_same("mdb_stat", |r| {
        let mut c = cmd("mdb_stat");
        c.arg("-aefr").arg(r.join("env"));
        c
    });
    // A compacting copy (mdb_copy writes its file with O_DIRECT where it may).
    w.both_same("mdb_copy", |r| {
        let mut c = cmd("mdb_copy");
        c.arg("-c").arg(r.join("env")).arg(r.join("copy"));
        c
    });
    w.same_file("copy/data.mdb");
    let copy_dump = w.both_same("mdb_dump of the copy", |r| {
        let mut c = cmd("mdb_dump");
        c.arg("-a").arg(r.join("copy"));
        c
    });
    assert_same_file(
        &copy_dump.stdout,
        &dump.stdout,
        "the copy's dump vs the original's",
    );
    w.same_listing("env");
    w.finish();
}

// ---------------------------------------------------------------------------------------------
// 1b. Python's lmdb, over 200 MB.

/// `lmdb_app.py write|verify ENV WRITEMAP MAP_SIZE`: write 52000 values of 4000 bytes (208 MB)
/// in transactions of 2000, rewrite every 7th with 6000 bytes (45 MB more), delete every 10th;
/// then (and in `verify` only) check every key's value, and print the count, a digest of
/// everything in cursor order and the environment's statistics.
const LMDB_APP: &str = r#"
import hashlib, random, sys
import lmdb

mode, path, writemap, map_size = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
N, SIZE, SIZE2, STEP = 52000, 4000, 6000, 2000
pool = random.Random(7).randbytes(1 << 20)

def key(i):
    return b"%010d" % (i * 2654435761 % 4294967291)

def value(i, size):
    o = i * 7919 % (len(pool) - size)
    return i.to_bytes(8, "little") + pool[o:o + size - 8]

def expected(i):
    if i % 10 == 0:
        return None
    return value(i, SIZE2) if i % 7 == 0 else value(i, SIZE)

def open_env():
    return lmdb.open(path, map_size=map_size, writemap=writemap)

if mode == "write":
    env = open_env()
    written = 0
    for s in range(0, N, STEP):
        with env.begin(write=True) as t:
            for i in range(s, min(N, s + STEP)):
                v = value(i, SIZE)
                t.put(key(i), v)
                written += len(v)
    for s in range(0, N, 7 * STEP):
        with env.begin(write=True) as t:
            for i in range(s, min(N, s + 7 * STEP), 7):
                v = value(i, SIZE2)
                t.put(key(i), v)
                written += len(v)
    with env.begin(write=True) as t:
        for i in range(0, N, 10):
            if not t.delete(key(i)):
                sys.exit("key %d was not there to delete" % i)
    env.close()
    print("wrote %d bytes" % written)

env = open_env()
digest, count, listed = hashlib.sha256(), 0, 0
with env.begin() as t:
    for i in range(N):
        got, want = t.get(key(i)), expected(i)
        if got != want:
            sys.exit("key %d (i=%d): got %s, expected %s" % (
                int(key(i)), i, None if got is None else "%d bytes" % len(got),
                None if want is None else "%d bytes" % len(want)))
        count += want is not None
    for k, v in t.cursor():
        digest.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
        listed += 1
if listed != count:
    sys.exit("the cursor listed %d records, expected %d" % (listed, count))
info = env.info()
print("verified %d values, sha256 %s" % (count, digest.hexdigest()))
print("stat", sorted(env.stat().items()))
print("info last_pgno %d last_txnid %d map_size %d" % (info["last_pgno"], info["last_txnid"], info["map_size"]))
env.close()
"#;

#[test]
fn python_lmdb_over_200mb_with_and_without_writemap() {
    require_all(&[]);
    require_python_lmdb();
    // Each environment's file may reach its map size (a writemap file is that size from the
    // start, sparse): the pool holds both at full size.
    let map_size = 512 * MIB;
    let mut w = World::new("python-lmdb", 3 * map_size);
    let script = w.scratch("lmdb_app.py");
    fs::write(&script, LMDB_APP).unwrap();
    for (dir, writemap) in [("writemap", true), ("pwrite", false)] {
        w.mkdir(dir);
        let app = |mode: &'static str| {
            let script = script.clone();
            move |r: &Path| {
                let mut c = cmd(PYTHON);
                c.arg(&script)
                    .arg(mode)
                    .arg(r.join(dir))
                    .arg(if writemap { "1" } else { "0" })
                    .arg(map_size.to_string());
                c
            }
        };
        let ran = w.both_same(&format!("python lmdb {dir}: write"), app("write"));
        let out = ran.text();
        let wrote = 52000 * 4000 + 52000usize.div_ceil(7) * 6000;
        assert!(
            out.contains(&format!("wrote {wrote} bytes\n"))
                && out.contains("verified 46800 values"),
            "python lmdb {dir}: unexpected output:\n{out}"
        );
        assert!(
            !writemap || ran.stats.mmap.direct > 0,
            "python lmdb writemap: no mapping of the mount went direct ({:?}); stderr:\n{}",
            ran.stats,
            ran.stderr_text()
        );
        // After a remount: what the pool holds, not the page cache.
        let again = w.both_same(&format!("python lmdb {dir}: verify"), app("verify"));
        assert!(
            out.ends_with(&again.text()),
            "python lmdb {dir}: the verify run printed\n{}\nafter the write run printed\n{out}",
            again.text()
        );
        w.same_file(&format!("{dir}/data.mdb"));
    }
    w.finish();
}

// ---------------------------------------------------------------------------------------------
// 2. sqlite3.

/// The first script: about 30 MB of rows, an index, updates, deletes, a savepoint rolled back
/// and a transaction rolled back, with a 2 MB page cache so transactions spill; `mmap` bytes of
/// the database read through a mapping (0: none, sqlite's default).
fn sqlite_script_1(journal: &str, mmap: u64) -> String {
    format!(
        "pragma journal_mode={journal};
pragma mmap_size={mmap};
pragma cache_size=-2048;
create table t(id integer primary key, k text not null, payload text, n integer);
create index t_k on t(k);
with recursive c(i, x) as (
  select 1, 12345
  union all
  select i + 1, (x * 1103515245 + 12345) % 2147483648 from c where i < 30000)
insert into t
  select i, printf('k%08d', x % 100000000),
         substr(replace(hex(zeroblob(800)), '0', printf('%x', x)), 1, 400 + x % 1200), x
  from c;
update t set payload = payload || printf('+%d', id), n = n + 1 where id % 3 = 0;
delete from t where id % 7 = 0;
begin;
create table u(id integer primary key, k text, h text);
insert into u select id, k, substr(payload, 1, 64) from t where id % 5 = 1;
savepoint s1;
delete from u where id < 5000;
rollback to s1;
delete from u where id % 2 = 0;
commit;
begin;
delete from t where id > 20000;
rollback;
select 'rows', count(*), sum(n), sum(length(payload)) from t;
select 'u', count(*), min(id), max(id) from u;
pragma integrity_check;
"
    )
}

/// The second script, in a new process: more updates and inserts, a new index, and a VACUUM
/// that rewrites the whole database.
fn sqlite_script_2(mmap: u64) -> String {
    format!(
        "pragma journal_mode;
pragma mmap_size={mmap};
update t set payload = substr(payload, 1, 100) where id % 11 = 0;
insert into t(id, k, payload, n) select id + 100000, k || '-copy', payload, n from t where id % 13 = 0;
drop index t_k;
create index t_kn on t(k, n);
delete from u where id % 3 = 0;
vacuum;
select 'rows', count(*), sum(n), sum(length(payload)) from t;
pragma integrity_check;
"
    )
}

fn sqlite3(db: PathBuf, sql: String) -> impl Fn(&Path) -> Command {
    move |r: &Path| {
        let mut c = cmd("sqlite3");
        c.args(["-batch", "-bail"]).arg(r.join(&db)).arg(&sql);
        c
    }
}

#[test]
fn sqlite3_wal_and_delete_journal_modes_and_mmap_reads() {
    require_all(&[("sqlite3", "sqlite3")]);
    let mut w = World::new("sqlite", 512 * MIB);
    // WAL and DELETE with sqlite's default reads (pread), and WAL reading the database through
    // a shared mapping while writing it with pwrite.
    for (mode, journal, mmap) in [
        ("wal", "wal", 0),
        ("delete", "delete", 0),
        ("wal-mmap", "wal", 256 * MIB),
    ] {
        let db = PathBuf::from(format!("{mode}/db.sqlite"));
        w.mkdir(mode);
        for (n, sql) in [
            (1, sqlite_script_1(journal, mmap)),
            (2, sqlite_script_2(mmap)),
        ] {
            let script = w.scratch(&format!("{mode}-{n}.sql"));
            fs::write(&script, sql).unwrap();
            let read = format!(".read {}", script.display());
            let out = w
                .both_same(
                    &format!("sqlite3 {mode}: script {n}"),
                    sqlite3(db.clone(), read),
                )
                .text();
            assert!(
                out.starts_with(&format!("{journal}\n{mmap}\n")) && out.ends_with("\nok\n"),
                "sqlite3 {mode}: script {n} printed:\n{out}"
            );
        }
        let check = w.both_same(
            &format!("sqlite3 {mode}: integrity_check"),
            sqlite3(db.clone(), "pragma integrity_check;".into()),
        );
        assert_eq!(check.text(), "ok\n", "sqlite3 {mode}: integrity_check");
        let dump = w.both_same(
            &format!("sqlite3 {mode}: .dump"),
            sqlite3(db.clone(), ".dump".into()),
        );
        let size = fs::metadata(&dump.stdout).unwrap().len();
        assert!(
            size > 20 * MIB,
            "sqlite3 {mode}: the dump has only {size} bytes"
        );
        // The journal or WAL is gone after the last connection closed, and the database file
        // is the one sqlite writes on any file system.
        w.same_listing(mode);
        w.same_file(&db.to_string_lossy());
    }
    w.finish();
}

// ---------------------------------------------------------------------------------------------
// 3. RocksDB.

/// What db_bench's readrandom found: "31709 of 50000 found".
fn readrandom_found(ran: &Ran) -> String {
    let out = ran.text();
    let line = out
        .lines()
        .find(|l| l.starts_with("readrandom"))
        .unwrap_or_else(|| panic!("db_bench printed no readrandom line:\n{out}"));
    let found = line
        .rsplit_once('(')
        .and_then(|(_, f)| f.strip_suffix(')'))
        .filter(|f| f.ends_with(" found"))
        .unwrap_or_else(|| panic!("db_bench: no \"(N of M found)\" in {line:?}"));
    found.to_string()
}

/// db_bench fillrandom of 50000 values of 4096 bytes (205 MB, uncompressed, with its write-ahead
/// log) and readrandom, a fixed seed, small memtables so it flushes and compacts; then
/// `ldb scan` of the whole database compared with the plain directory's, and `sst_dump
/// --command=check --verify_checksum` on every table file.
fn rocksdb(name: &str, mmap_read: bool) {
    require_all(&[
        ("db_bench", "rocksdb-tools"),
        ("ldb", "rocksdb-tools"),
        ("sst_dump", "rocksdb-tools"),
    ]);
    let mut w = World::new(name, 1536 * MIB);
    let mmap = format!("--mmap_read={}", u8::from(mmap_read));
    let [m, p] = w.both(&format!("db_bench {mmap}"), |r| {
        let mut c = cmd("db_bench");
        c.arg("--benchmarks=fillrandom,readrandom")
            .arg(format!("--db={}", r.join("db").display()))
            .args([
                "--num=50000",
                "--value_size=4096",
                "--key_size=16",
                "--seed=20211026",
                "--threads=1",
                "--compression_type=none",
                "--write_buffer_size=16777216",
                "--target_file_size_base=16777216",
                "--use_existing_db=0",
            ])
            .arg(&mmap);
        c
    });
    let found = readrandom_found(&m);
    assert_eq!(
        found,
        readrandom_found(&p),
        "db_bench readrandom: mount vs plain"
    );
    assert!(
        !found.starts_with("0 "),
        "db_bench readrandom found nothing: {found}"
    );
    // Its log and table files grow by write(2): appends go direct (all but the first write of
    // each file, and what a truncate at close sends back through FUSE).
    let w_ = m.stats.write;
    assert!(
        w_.direct > 0 && w_.direct >= 9 * w_.fuse,
        "db_bench: its appends did not go direct (writes {w_}); stderr:\n{}",
        m.stderr_text()
    );
    let scan = w.both_same("ldb scan", |r| {
        let mut c = cmd("ldb");
        c.arg(format!("--db={}", r.join("db").display()))
            .args(["scan", "--hex"]);
        c
    });
    // 50000 random keys with repeats: about 1 - 1/e of them distinct.
    let records = BufReader::new(File::open(&scan.stdout).unwrap())
        .lines()
        .count();
    assert!(
        (30000..=33000).contains(&records),
        "ldb scan listed {records} records for 50000 random keys"
    );
    let [m, p] = w.both("sst_dump check", |r| {
        let mut c = cmd("sst_dump");
        c.arg(format!("--file={}", r.join("db").display()))
            .args(["--command=check", "--verify_checksum"]);
        c
    });
    for (side, ran) in [("mount", &m), ("plain", &p)] {
        let out = ran.text() + &ran.stderr_text();
        assert!(
            out.contains("Process ") && !out.contains("Corruption") && !out.contains("rror"),
            "sst_dump --command=check on the {side} directory:\n{out}"
        );
    }
    w.finish();
}

#[test]
fn rocksdb_db_bench_ldb_sst_dump_reading_through_mmap() {
    rocksdb("rocksdb-mmap", true);
}

#[test]
fn rocksdb_db_bench_ldb_sst_dump_reading_through_pread() {
    rocksdb("rocksdb-pread", false);
}
