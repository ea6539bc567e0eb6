//! The FUSE front end end to end: `winefs mount -f` on a fresh pool, driven by ordinary tools
//! (cp, tar, rsync, git, sqlite3, fio) and by std::fs, with the content checked against the
//! source after every step and after remounts; `kill -9` of the daemon with fsynced files that
//! must survive; the CLI's refusals (one line on stderr, nothing left mounted); and read-only
//! mounts (`--read-only`: every change EROFS), the one way a pool flagged "needs fsck" mounts.
//!
//! Runs as root with FUSE available. A missing tool fails the test with the package to install.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

/// How long a mount may take to appear and a stopped daemon to exit.
const MOUNT_WAIT: Duration = Duration::from_secs(15);

/// How long any external command may run before it counts as a hang.
const CMD_WAIT: u64 = 120;

// ---------------------------------------------------------------------------------------------
// Tools and commands.

/// Fail (never skip) when `tool` is not installed, naming the Debian package that has it.
fn require(tool: &str, package: &str) {
    match Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{tool}` is not installed: install the {package} package (apt-get install {package})"
        ),
        Err(e) => panic!("cannot run `{tool}` (package {package}): {e}"),
    }
}

/// The basic tools every test here uses.
fn require_base() {
    for (tool, package) in [
        ("cp", "coreutils"),
        ("touch", "coreutils"),
        ("sha256sum", "coreutils"),
        ("kill", "procps"),
        ("umount", "mount"),
    ] {
        require(tool, package);
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run `cmd` to completion (stdin closed, output captured); a command still running after
/// `secs` seconds is killed and fails the test as a hang.
fn run_timeout(cmd: &mut Command, secs: u64) -> Output {
    let desc = describe(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{desc}`: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let tout = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let terr = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{desc}` did not finish within {secs} s (winefs hung?)");
        }
        thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: tout.join().unwrap(),
        stderr: terr.join().unwrap(),
    }
}

/// Run `cmd`, require success, return its stdout.
fn ok(cmd: &mut Command) -> String {
    let desc = describe(cmd);
    let out = run_timeout(cmd, CMD_WAIT);
    assert!(
        out.status.success(),
        "`{desc}` failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cmd(program: &str) -> Command {
    Command::new(program)
}

/// Deterministic pseudo-random bytes (xorshift64*), different for every seed.
fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Where two byte strings first differ, for messages.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i} ({:#04x} != {:#04x})",
            a[i], b[i]
        ),
        None => format!("lengths differ: {} != {}", a.len(), b.len()),
    }
}

fn assert_bytes(path: &Path, want: &[u8]) {
    let got = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    if got != want {
        panic!(
            "{}: wrong content ({} bytes, expected {}): {}",
            path.display(),
            got.len(),
            want.len(),
            first_difference(&got, want)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The mount table.

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// How many mounts /proc/self/mountinfo lists on `dir`.
fn mount_count(dir: &Path) -> usize {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let want = dir.to_string_lossy();
    info.lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .map(unescape_mountinfo)
                .as_deref()
                == Some(&*want)
        })
        .count()
}

fn is_mounted(dir: &Path) -> bool {
    mount_count(dir) > 0
}

fn lazy_umount(dir: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `umount DIR`, tried again for two seconds while the kernel answers "target is busy": a test
/// running beside this one may fork while a thread here holds a file under DIR open, and the
/// child keeps its copy of the descriptor until its exec closes it. A hold that outlasts that
/// fails, naming the processes that hold something under DIR.
fn umount(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let out = run_timeout(cmd("umount").arg(dir), CMD_WAIT);
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("target is busy") || Instant::now() > deadline {
            let held_by = holders(dir);
            panic!("`umount {}` failed ({}): {}; held by: {held_by}", dir.display(), out.status, err.trim());
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The processes whose working directory, root or an open descriptor lies under `dir`.
fn holders(dir: &Path) -> String {
    let mut found = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = proc_entry.path();
        let links = ["cwd", "root"].map(|l| pid.join(l)).into_iter();
        let fds = fs::read_dir(pid.join("fd")).into_iter().flatten().flatten().map(|e| e.path());
        if links.chain(fds).any(|l| fs::read_link(l).is_ok_and(|t| t.starts_with(dir))) {
            let comm = fs::read_to_string(pid.join("comm")).unwrap_or_default();
            found.push(format!("{} ({})", pid.display(), comm.trim()));
        }
    }
    if found.is_empty() {
        return "no process".into();
    }
    found.join(", ")
}

/// Unmounts (lazily) what is still mounted on its points when dropped: mount points a test
/// adds beside [`Mounted`]'s, which a failed assertion would otherwise leave behind.
struct ExtraPoints(Vec<PathBuf>);

impl Drop for ExtraPoints {
    fn drop(&mut self) {
        for point in &self.0 {
            for _ in 0..5 {
                if !is_mounted(point) {
                    break;
                }
                lazy_umount(point);
            }
        }
    }
}

fn mkfs(pool: &Path) {
    let out = ok(Command::new(BIN)
        .arg("mkfs")
        .arg(pool)
        .args(["--size", "256M"]));
    assert!(out.starts_with("formatted "), "mkfs said: {out}");
}

/// `winefs fsck POOL` must exit 0 and say "clean: ...".
fn fsck_clean(pool: &Path) {
    let out = run_timeout(Command::new(BIN).arg("fsck").arg(pool), CMD_WAIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() == Some(0) && stdout.starts_with("clean: "),
        "winefs fsck {} is not clean ({}):\n{stdout}{}",
        pool.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// A mounted pool.

/// A fresh 256 MiB pool in a temporary directory, mounted with `winefs mount -f` on `mnt/`.
struct Mounted {
    /// Holds the pool, the mountpoint and the log; removed last.
    _dir: tempfile::TempDir,
    pool: PathBuf,
    mnt: PathBuf,
    log: PathBuf,
    /// Where the current daemon's part of the log begins.
    log_start: usize,
    daemon: Option<Child>,
    /// Options `start` adds to `winefs mount POOL MNT -f` (and `--threads 4` unless they set
    /// `--threads`).
    args: Vec<&'static str>,
    /// CPUs the daemon is started on (`taskset -c`), if not every one.
    cpus: Option<&'static str>,
    /// Environment variables the daemon is started with (`RUST_LOG` to log its requests).
    env: Vec<(&'static str, &'static str)>,
}

impl Mounted {
    fn new() -> Mounted {
        require_base();
        let dir = tempfile::Builder::new()
            .prefix("winefs-fuse")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        let pool = root.join("pool");
        let mnt = root.join("mnt");
        fs::create_dir(&mnt).unwrap();
        mkfs(&pool);
        let mut m = Mounted {
            log: root.join("daemon.log"),
            _dir: dir,
            log_start: 0,
            pool,
            mnt,
            daemon: None,
            args: Vec::new(),
            cpus: None,
            env: Vec::new(),
        };
        m.start();
        m
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// What the current (or last) daemon wrote to its log.
    fn daemon_log(&self) -> String {
        let all = fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(all.get(self.log_start..).unwrap_or_default()).into_owned()
    }

    /// Start the daemon on the pool and wait until it says it is mounted and the kernel lists
    /// the mount.
    fn start(&mut self) {
        assert!(self.daemon.is_none(), "already mounted");
        assert!(
            !is_mounted(&self.mnt),
            "{} is still mounted before start",
            self.mnt.display()
        );
        self.log_start = fs::metadata(&self.log).map_or(0, |m| m.len() as usize);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = match self.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus, BIN]);
                c
            }
            None => Command::new(BIN),
        }
            .arg("mount")
            .arg(&self.pool)
            .arg(&self.mnt)
            .arg("-f")
            .args(if self.args.contains(&"--threads") { &[][..] } else { &["--threads", "4"][..] })
            .args(&self.args)
            .envs(self.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start winefs mount");
        let stdout = child.stdout.take().unwrap();
        // From here on, Drop cleans up whatever happens.
        self.daemon = Some(child);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Keep draining after the test stopped listening.
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + MOUNT_WAIT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("winefs: mounted") => break,
                Ok(line) => seen.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "winefs mount printed no \"winefs: mounted\" line within {MOUNT_WAIT:?}; \
                     stdout: {seen:?}; log:\n{}",
                    self.daemon_log()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.daemon.as_mut().unwrap().wait().unwrap();
                    self.daemon = None;
                    panic!(
                        "winefs mount exited ({status}) before mounting; stdout: {seen:?}; log:\n{}",
                        self.daemon_log()
                    );
                }
            }
        }
        while !is_mounted(&self.mnt) {
            assert!(
                Instant::now() < deadline,
                "{} is not in /proc/self/mountinfo {MOUNT_WAIT:?} after \"mounted\"",
                self.mnt.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn pid(&self) -> u32 {
        self.daemon.as_ref().expect("not mounted").id()
    }

    /// Wait up to MOUNT_WAIT for the daemon to exit.
    fn wait_daemon(&mut self) -> ExitStatus {
        let deadline = Instant::now() + MOUNT_WAIT;
        loop {
            if let Some(s) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                self.daemon = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the winefs daemon did not exit within {MOUNT_WAIT:?}; log:\n{}",
                self.daemon_log()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM: the daemon must unmount, exit 0, and leave a pool that fsck calls clean.
    fn stop(&mut self) {
        let pid = self.pid();
        ok(cmd("kill").args(["-TERM", &pid.to_string()]));
        let status = self.wait_daemon();
        assert!(
            status.success(),
            "winefs mount exited with {status} after SIGTERM; log:\n{}",
            self.daemon_log()
        );
        assert!(
            !is_mounted(&self.mnt),
            "{} is still mounted after the daemon exited",
            self.mnt.display()
        );
        let log = self.daemon_log();
        assert!(
            log.contains(&format!("unmounted {} cleanly", self.pool.display())),
            "the daemon did not report a clean unmount; log:\n{log}"
        );
        fsck_clean(&self.pool);
    }

    fn remount(&mut self) {
        self.stop();
        self.start();
    }

    /// `kill -9` the daemon and clear the dead mount with `umount -l`.
    fn crash(&mut self) {
        let pid = self.pid();
        ok(cmd("kill").args(["-9", &pid.to_string()]));
        let status = self.wait_daemon();
        assert!(!status.success(), "the daemon survived kill -9: {status}");
        ok(cmd("umount").arg("-l").arg(&self.mnt));
        assert!(
            !is_mounted(&self.mnt),
            "{} still mounted after umount -l",
            self.mnt.display()
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for _ in 0..5 {
            if !is_mounted(&self.mnt) {
                break;
            }
            lazy_umount(&self.mnt);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests: everything cp -a / tar / rsync promise to keep.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Regular files and symlinks.
    size: Option<u64>,
    mtime: i64,
    target: Option<PathBuf>,
    sha256: Option<String>,
    /// Regular files: link count and the paths in the tree that share the inode.
    nlink: Option<u64>,
    same_inode: Option<Vec<String>>,
}

/// sha256 of every listed file (relative to `root`), with one `sha256sum` run.
fn sha256_many(root: &Path, rels: &[String]) -> HashMap<String, String> {
    let mut res = HashMap::new();
    for chunk in rels.chunks(500) {
        let out = ok(cmd("sha256sum")
            .arg("-z")
            .arg("--")
            .args(chunk)
            .current_dir(root));
        for rec in out.split('\0').filter(|r| !r.is_empty()) {
            let (hash, name) = rec.split_at(64);
            res.insert(name[2..].to_string(), hash.to_string());
        }
    }
    assert_eq!(res.len(), rels.len(), "sha256sum under {}", root.display());
    res
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<(String, fs::Metadata)>) {
    let p = root.join(rel);
    let meta = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let name = if rel.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rel.to_string_lossy().into_owned()
    };
    let is_dir = meta.is_dir();
    out.push((name, meta));
    if is_dir {
        for e in fs::read_dir(&p).unwrap_or_else(|e| panic!("readdir {}: {e}", p.display())) {
            let e = e.unwrap();
            walk(root, &rel.join(e.file_name()), out);
        }
    }
}

fn manifest(root: &Path) -> BTreeMap<String, Entry> {
    let mut items = Vec::new();
    walk(root, Path::new(""), &mut items);
    let files: Vec<String> = items
        .iter()
        .filter(|(_, m)| m.file_type().is_file())
        .map(|(n, _)| n.clone())
        .collect();
    let hashes = sha256_many(root, &files);
    let mut by_inode: HashMap<u64, Vec<String>> = HashMap::new();
    for (n, m) in &items {
        if m.file_type().is_file() {
            by_inode.entry(m.ino()).or_default().push(n.clone());
        }
    }
    let mut res = BTreeMap::new();
    for (n, m) in &items {
        let ft = m.file_type();
        let kind = if ft.is_file() {
            "file"
        } else if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        let entry = Entry {
            kind,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            size: (!ft.is_dir()).then(|| m.size()),
            mtime: m.mtime(),
            target: ft
                .is_symlink()
                .then(|| fs::read_link(root.join(n)).unwrap()),
            sha256: ft.is_file().then(|| hashes[n].clone()),
            nlink: ft.is_file().then(|| m.nlink()),
            same_inode: ft.is_file().then(|| {
                let mut v = by_inode[&m.ino()].clone();
                v.sort();
                v
            }),
        };
        res.insert(n.clone(), entry);
    }
    res
}

fn assert_same_tree(want: &BTreeMap<String, Entry>, got: &BTreeMap<String, Entry>, what: &str) {
    let mut diffs = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => diffs.push(format!("missing {k}: {w:?}")),
            Some(g) if g != w => diffs.push(format!("differs {k}:\n  want {w:?}\n  got  {g:?}")),
            Some(_) => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        diffs.push(format!("unexpected {k}: {:?}", got[k]));
    }
    assert!(
        diffs.is_empty(),
        "{what}: {} difference(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

fn touch(path: &Path, when: &str) {
    // -h: a symlink's own time (never its target's).
    ok(cmd("touch").arg("-h").arg("-d").arg(when).arg(path));
}

fn write_file(root: &Path, rel: &str, data: &[u8], mode: u32, when: &str) {
    let p = root.join(rel);
    fs::write(&p, data).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    touch(&p, when);
}

/// A source tree with what copies tend to get wrong: nested and empty directories, empty and
/// odd-sized files, a 3 MiB file, a sparse file, symlinks (dangling, to a directory), hard links, unusual
/// modes and owners, a name with a space and non-ASCII, a pre-1970 mtime, and a directory of
/// 300 entries (more than one readdir page).
fn build_tree(root: &Path) {
    for d in [
        "a/b/c/d",
        "empty-dir",
        "private",
        "sticky",
        "many",
        "a/b/c/e",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    write_file(root, "empty", b"", 0o644, "@1000000000");
    write_file(root, "one", b"x", 0o600, "@1000000001");
    let five: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    write_file(root, "five", &five, 0o640, "2001-02-03 04:05:06 UTC");
    write_file(
        root,
        "exec.sh",
        b"#!/bin/sh\necho hi\n",
        0o755,
        "@1234567890",
    );
    write_file(root, "suid", b"setuid\n", 0o4755, "@1300000000");
    write_file(
        root,
        "big.bin",
        &pseudo_random(3, 3 << 20),
        0o644,
        "@1400000000",
    );
    write_file(root, "with space é.txt", b"spaced\n", 0o644, "@1500000000");
    write_file(root, "old", b"from 1969\n", 0o644, "@-1000000");
    // Sparse: 6 MiB with data only in its first and sixth MiB.
    {
        use std::os::unix::fs::FileExt;
        let f = File::create(root.join("sparse")).unwrap();
        f.set_len(6 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&pseudo_random(6, 10_000), 5 << 20).unwrap();
        drop(f);
        touch(&root.join("sparse"), "@1450000000");
    }
    write_file(root, "owned", b"not root's\n", 0o664, "@1600000000");
    std::os::unix::fs::chown(root.join("owned"), Some(1234), Some(5678)).unwrap();
    write_file(root, "a/b/c/deep.txt", b"deep down\n", 0o644, "@1100000000");
    write_file(
        root,
        "a/b/c/e/f",
        &pseudo_random(4, 70_000),
        0o600,
        "@1100000001",
    );
    write_file(root, "private/secret", b"s3cr3t\n", 0o600, "@1200000000");
    write_file(root, "sticky/f", b"sticky\n", 0o666, "@1200000001");
    // Three names for one inode.
    write_file(
        root,
        "a/hard1",
        &pseudo_random(5, 10_000),
        0o644,
        "@1250000000",
    );
    fs::hard_link(root.join("a/hard1"), root.join("a/b/hard2")).unwrap();
    fs::hard_link(root.join("a/hard1"), root.join("hard3")).unwrap();
    for i in 0..300 {
        let data = format!("file {i}\n").repeat(i % 7);
        write_file(
            root,
            &format!("many/f{i:03}"),
            data.as_bytes(),
            0o644,
            "@1700000000",
        );
    }
    std::os::unix::fs::symlink("a/b/c/deep.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("a/b", root.join("dirlink")).unwrap();
    touch(&root.join("link"), "@1010000000");
    touch(&root.join("dangling"), "@1020000000");
    touch(&root.join("dirlink"), "@1030000000");
    // Directories last (deepest first), since creating entries changes their mtime.
    for (d, mode, when) in [
        ("a/b/c/d", 0o700, "@900000000"),
        ("a/b/c/e", 0o755, "@900000001"),
        ("a/b/c", 0o755, "@900000002"),
        ("a/b", 0o750, "@900000003"),
        ("a", 0o755, "@900000004"),
        ("empty-dir", 0o755, "@900000005"),
        ("private", 0o700, "@900000006"),
        ("sticky", 0o1777, "@900000007"),
        ("many", 0o755, "@900000008"),
        ("", 0o755, "@900000009"),
    ] {
        let p = root.join(d);
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        touch(&p, when);
    }
}

fn source_tree(parent: &tempfile::TempDir) -> PathBuf {
    require_base();
    let src = parent.path().canonicalize().unwrap().join("src");
    fs::create_dir(&src).unwrap();
    build_tree(&src);
    src
}

// ---------------------------------------------------------------------------------------------
// 1. cp -a

#[test]
fn cp_a_copies_tree_exactly_and_it_survives_remount() {
    require_base();
    let tmp = tempfile::tempdir().unwrap();
    let src = source_tree(&tmp);
    let want = manifest(&src);
    assert_eq!(want["hard3"].nlink, Some(3), "source tree built wrong");

    let mut m = Mounted::new();
    let dst = m.path("copy");
    ok(cmd("cp").arg("-a").arg(&src).arg(&dst));
    assert_same_tree(&want, &manifest(&dst), "cp -a onto the mount");

    m.remount();
    assert_same_tree(&want, &manifest(&dst), "cp -a copy after a remount");

    // And back out again, to a file system that is not winefs.
    let back = tmp.path().join("back");
    ok(cmd("cp").arg("-a").arg(&dst).arg(&back));
    assert_same_tree(&want, &manifest(&back), "cp -a from the mount");
    m.stop();
}

/// Free inodes and free blocks of the file system holding `path` (`stat -f`).
fn free_inodes_and_blocks(path: &Path) -> (u64, u64) {
    let out = ok(cmd("stat").args(["-f", "-c", "%d %f"]).arg(path));
    let mut it = out.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// `ln -L /proc/SELF/fd/N dest`: linkat(2) following the descriptor's link, which names an
/// `O_TMPFILE` file; the command's output, and whether it succeeded.
fn link_descriptor(f: &File, dest: &Path) -> (bool, String) {
    use std::os::fd::AsRawFd;
    let fd_path = format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd());
    let out = run_timeout(cmd("ln").arg("-L").arg(fd_path).arg(dest), CMD_WAIT);
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// open(2) with `O_TMPFILE` (the kernel's FUSE_TMPFILE): a file in no directory, which a link
/// names, or which goes at close, and after a kill -9 at the next mount; with `O_EXCL` no link
/// takes it. Without the request served, the open fails with EOPNOTSUPP.
#[test]
fn o_tmpfile_files_are_named_by_a_link_or_go_at_close_and_after_a_crash() {
    let mut m = Mounted::new();
    fs::create_dir(m.path("d")).unwrap();
    let open_tmp = |m: &Mounted, flags: i32| {
        File::options()
            .read(true)
            .write(true)
            .mode(0o640)
            .custom_flags(libc::O_TMPFILE | flags)
            .open(m.path("d"))
            .expect("open(O_TMPFILE) on the mount")
    };
    let data = pseudo_random(21, 300_000);
    let before = free_inodes_and_blocks(&m.mnt);

    let mut f = open_tmp(&m, 0);
    f.write_all(&data).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 0, "named by nothing yet");
    let (linked, why) = link_descriptor(&f, &m.path("d/kept"));
    assert!(linked, "ln -L of an O_TMPFILE descriptor: {why}");
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    drop(f);
    assert_bytes(&m.path("d/kept"), &data);
    assert_eq!(fs::metadata(m.path("d/kept")).unwrap().permissions().mode() & 0o777, 0o640);

    let mut g = open_tmp(&m, 0);
    g.write_all(&data).unwrap();
    drop(g);
    let x = open_tmp(&m, libc::O_EXCL);
    let (linked, why) = link_descriptor(&x, &m.path("d/never"));
    assert!(!linked && why.contains("No such file"), "O_EXCL file linked: {why}");
    drop(x);
    // The kernel sends a close's RELEASE without waiting for it: look until it has been served.
    let t = std::time::Instant::now();
    while free_inodes_and_blocks(&m.mnt).0 != before.0 - 1 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        free_inodes_and_blocks(&m.mnt).0,
        before.0 - 1,
        "only the linked file keeps an inode"
    );
    m.remount(); // fsck clean
    assert_bytes(&m.path("d/kept"), &data);

    // Open and synced when the daemon dies: the next mount frees it.
    let before_crash = free_inodes_and_blocks(&m.mnt);
    let mut h = open_tmp(&m, 0);
    h.write_all(&pseudo_random(22, 3 << 20)).unwrap();
    h.sync_all().unwrap();
    assert!(free_inodes_and_blocks(&m.mnt).1 < before_crash.1);
    m.crash();
    drop(h);
    m.start();
    assert_eq!(free_inodes_and_blocks(&m.mnt), before_crash, "freed at the mount after the crash");
    assert_bytes(&m.path("d/kept"), &data);
    m.stop();
}

/// A directory removed while a process has it open (rmdir, or a rename over it; xfstests'
/// generic/035) answers fstat with no links instead of ESTALE, takes no new entries, and its
/// inode goes when the last descriptor closes.
/// `tests/data/nsdiff.py`: random creates, links, symlinks, renames (plain, NOREPLACE,
/// EXCHANGE), removals, chmods, rewrites, stats and listings, the same on a local directory and
/// on the mount; every result and, every fifth operation, the whole trees must agree. The
/// kernel's name, attribute and negative-entry caches of the mount are on the path.
#[test]
fn random_name_changes_agree_with_a_local_directory() {
    require("python3", "python3");
    let mut m = Mounted::new();
    let reference = tempfile::tempdir().unwrap();
    fs::create_dir(m.path("ns")).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nsdiff.py");
    for seed in ["1", "2", "3"] {
        let out = run_timeout(
            cmd("python3").arg(&script).arg(reference.path()).arg(m.path("ns")).args([seed, "800"]),
            120,
        );
        assert!(
            out.status.success(),
            "nsdiff seed {seed}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // On a full pool: a change refused with ENOSPC must have changed nothing.
    // The blocks the filler takes for its own metadata depend on the partition count (so on
    // the CPU count): write it leaving two more than the headroom (what two partitions take),
    // then top it up until at most the headroom is left, whatever the machine.
    const HEADROOM: u64 = 4;
    let room = free_inodes_and_blocks(&m.mnt).1.saturating_sub(HEADROOM + 2) * 4096;
    fs::write(m.path("filler"), vec![0u8; room as usize]).unwrap();
    let mut filler = File::options().append(true).open(m.path("filler")).unwrap();
    while free_inodes_and_blocks(&m.mnt).1 > HEADROOM {
        filler.write_all(&[0u8; 4096]).unwrap();
    }
    drop(filler);
    let mut refused = 0;
    for seed in ["4", "5", "6"] {
        let out = run_timeout(
            cmd("python3").arg(&script).arg("--enospc").arg(reference.path()).arg(m.path("ns")).args([seed, "800"]),
            120,
        );
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "nsdiff --enospc seed {seed}: {said}{}", String::from_utf8_lossy(&out.stderr));
        refused += said.rsplit(", ").next().and_then(|t| t.split(' ').next()).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    assert!(refused >= 10, "the full pool refused only {refused} changes");
    fs::remove_file(m.path("filler")).unwrap();
    m.remount(); // fsck clean
    m.stop();
}

#[test]
fn random_name_changes_survive_kill_9_as_the_tree_before_or_with_the_change_in_flight() {
    // Strict mode: a name change is durable and atomic when it returns. nsdiff.py runs until
    // the daemon is killed under it and saves the local directory's tree (and the trees the
    // change in flight may leave); after a new daemon the mount must hold one of them.
    require("python3", "python3");
    let mut m = Mounted::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nsdiff.py");
    for round in 1..=6u64 {
        let reference = tempfile::tempdir().unwrap();
        let state = reference.path().join("state");
        let subject = m.path(&format!("ns{round}"));
        let local = reference.path().join("tree");
        fs::create_dir(&subject).unwrap();
        fs::create_dir(&local).unwrap();
        let mut child = cmd("python3")
            .arg(&script)
            .arg("--kill-state")
            .arg(&state)
            .arg(&local)
            .arg(&subject)
            .args([&round.to_string(), "100000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "round {round}: nsdiff did not start");
        thread::sleep(Duration::from_millis(60 + round * 157 % 600));
        m.crash();
        let done = child.wait_with_output().unwrap();
        // Status 3: it ran until the mount went away, with no difference before.
        assert_eq!(
            done.status.code(),
            Some(3),
            "round {round}: {line}{}{}",
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
        m.start();
        let out = run_timeout(cmd("python3").arg(&script).arg("--verify").arg(&state).arg(&subject), 60);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && said.starts_with("ok"), "round {round}: {said}");
    }
    m.remount(); // fsck clean
    m.stop();
}

#[test]
fn an_open_directory_answers_fstat_after_its_removal() {
    use std::os::fd::AsRawFd;
    let mut m = Mounted::new();
    fs::create_dir(m.path("keep")).unwrap(); // the root's directory block, before the count
    let before = free_inodes_and_blocks(&m.mnt);
    for d in ["gone", "victim", "src"] {
        fs::create_dir(m.path(d)).unwrap();
    }
    let gone = File::open(m.path("gone")).unwrap();
    let victim = File::open(m.path("victim")).unwrap();
    fs::remove_dir(m.path("gone")).unwrap();
    fs::rename(m.path("src"), m.path("victim")).unwrap();
    for dir in [&gone, &victim] {
        let st = dir.metadata().expect("fstat of a removed directory");
        assert!(st.is_dir());
        assert_eq!(st.nlink(), 0);
        // Through the descriptor's /proc link, which names the removed directory itself.
        let inside = format!("/proc/self/fd/{}/x", dir.as_raw_fd());
        let err = fs::create_dir(&inside).expect_err("mkdir in a removed directory");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    }
    drop(gone);
    drop(victim);
    fs::remove_dir(m.path("victim")).unwrap();
    // RELEASEDIR is sent without waiting for it: look until it has been served.
    let t = std::time::Instant::now();
    while free_inodes_and_blocks(&m.mnt) != before && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(free_inodes_and_blocks(&m.mnt), before, "freed at the last close");
    m.remount(); // fsck clean
    m.stop();
}

/// What `held_after_removal` runs in a process of its own: it removes names of inodes it holds
/// without an open handle (its working directory; `O_PATH` descriptors), checks they are still
/// usable, says "ok" and waits for a line before it exits.
const HELD_AFTER_REMOVAL: &str = r#"
import os, sys
m = sys.argv[1]
os.chdir(m + "/cwd")
os.rmdir(m + "/cwd")
st = os.stat(".")
assert st.st_nlink == 0, st
assert os.listdir(".") == [], os.listdir(".")
try:
    open("x", "w")
    sys.exit("created a file in a removed working directory")
except FileNotFoundError:
    pass
held = os.open(m + "/held", os.O_PATH)
os.unlink(m + "/held")
st = os.fstat(held)
assert (st.st_nlink, st.st_size) == (0, int(sys.argv[2])), st
again = "/proc/self/fd/%d" % held
assert open(again, "rb").read() == open(sys.argv[3], "rb").read(), "the unlinked file's bytes"
with open(again, "ab") as f:
    f.write(b"tail")
assert os.stat(again).st_size == int(sys.argv[2]) + 4
victim = os.open(m + "/victim", os.O_PATH)
os.rename(m + "/src", m + "/victim")
assert open("/proc/self/fd/%d" % victim, "rb").read() == b"replaced", "the replaced file"
assert open(m + "/victim", "rb").read() == b"new"
print("ok", flush=True)
sys.stdin.readline()
"#;

/// Starts `HELD_AFTER_REMOVAL` on `m` (which holds `cwd/`, `held` with the bytes of file
/// `want`, `victim` and `src`) and waits for its "ok".
fn held_after_removal(m: &Mounted, want: &Path) -> Child {
    let size = fs::metadata(want).unwrap().len();
    let mut child = cmd("python3")
        .args(["-c", HELD_AFTER_REMOVAL])
        .arg(&m.mnt)
        .arg(size.to_string())
        .arg(want)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    out.read_line(&mut said).unwrap();
    if said != "ok\n" {
        let _ = child.kill();
        let done = child.wait_with_output().unwrap();
        panic!("held_after_removal: {said}{}", String::from_utf8_lossy(&done.stderr));
    }
    child
}

/// A name removed while the kernel holds its inode without an open handle (a process's working
/// directory, an `O_PATH` descriptor, a file reopened through `/proc/self/fd`, a file a rename
/// replaced) leaves the inode usable as on ext4 — it answered ESTALE — until the kernel forgets
/// it: then its inode and blocks go, and after a kill -9 of the daemon, at the next mount.
#[test]
fn a_name_removed_while_the_kernel_holds_its_inode_leaves_it_usable_until_the_kernel_lets_go() {
    require("python3", "python3");
    let mut m = Mounted::new();
    let wait_for = |m: &Mounted, want: u64, what: &str| {
        // FORGET and RELEASE are sent without waiting for them: look until they were served.
        let t = Instant::now();
        while free_inodes_and_blocks(&m.mnt).0 != want && t.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(free_inodes_and_blocks(&m.mnt).0, want, "{what}");
    };
    fs::write(m.path("victim"), b"").unwrap(); // the root's directory block, before the count
    let made = free_inodes_and_blocks(&m.mnt).0;
    fs::remove_file(m.path("victim")).unwrap();
    wait_for(&m, made + 1, "the first file's inode, freed at its FORGET");
    let before = free_inodes_and_blocks(&m.mnt);
    let data = pseudo_random(35, 1 << 20);
    let want = tempfile::NamedTempFile::new().unwrap();
    fs::write(want.path(), &data).unwrap();
    let make = |m: &Mounted| {
        fs::create_dir(m.path("cwd")).unwrap();
        fs::write(m.path("held"), &data).unwrap();
        fs::write(m.path("victim"), b"replaced").unwrap();
        fs::write(m.path("src"), b"new").unwrap();
    };
    make(&m);
    let mut child = held_after_removal(&m, want.path());
    let (held_inodes, held_blocks) = free_inodes_and_blocks(&m.mnt);
    assert_eq!(held_inodes, before.0 - 4, "three inodes kept, one named");
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    assert!(child.wait().unwrap().success());
    wait_for(&m, before.0 - 1, "the kernel let go: only the named file keeps an inode");
    assert!(
        free_inodes_and_blocks(&m.mnt).1 >= held_blocks + 256,
        "the unlinked file's blocks came back"
    );
    m.remount(); // fsck clean
    assert_eq!(fs::read(m.path("victim")).unwrap(), b"new");

    // Held when the daemon dies: the next mount frees them.
    fs::remove_file(m.path("victim")).unwrap();
    wait_for(&m, before.0, "all gone");
    make(&m);
    let mut child = held_after_removal(&m, want.path());
    m.crash();
    let _ = child.kill();
    let _ = child.wait();
    m.start();
    assert_eq!(free_inodes_and_blocks(&m.mnt).0, before.0 - 1, "freed at the mount after the crash");
    assert_eq!(fs::read(m.path("victim")).unwrap(), b"new");
    m.stop(); // fsck clean
}

/// A pool a daemon serves mounts on a second point as a bind mount of the first, as ext4 shares
/// one file system between two mounts of a device (xfstests generic/732): renames through one
/// show through the other, each point has its own kernel flags (a read-only one refuses writes
/// the first takes), a second mount asking the daemon for another mode is refused in one line,
/// either point may go first, and the daemon stops with the last; SIGTERM unmounts them all;
/// a mount left by a daemon that died is no mount to share.
#[test]
fn a_served_pool_mounts_on_a_second_point_as_one_file_system() {
    let mut m = Mounted::new();
    let dir = m.mnt.parent().unwrap().to_path_buf();
    let (second, third) = (dir.join("second"), dir.join("third"));
    fs::create_dir(&second).unwrap();
    fs::create_dir(&third).unwrap();
    let _points = ExtraPoints(vec![second.clone(), third.clone()]);
    let pool = m.pool.clone();
    let winefs_mount = |args: &[&str], at: &Path| {
        run_timeout(Command::new(BIN).arg("mount").args(args).arg(&pool).arg(at), CMD_WAIT)
    };
    let out = winefs_mount(&["--relaxed"], &second);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("mode=strict") && err.trim().lines().count() == 1, "{err}");
    assert!(!is_mounted(&second));
    assert!(winefs_mount(&[], &second).status.success());
    assert!(winefs_mount(&["--read-only"], &third).status.success());
    fs::create_dir(m.path("A")).unwrap();
    fs::create_dir(m.path("B")).unwrap();
    fs::write(m.path("A/f"), b"x").unwrap();
    fs::rename(m.path("A/f"), m.path("B/f")).unwrap();
    assert_eq!(fs::read(second.join("B/f")).unwrap(), b"x");
    fs::rename(second.join("B/f"), second.join("A/f")).unwrap();
    assert_eq!(fs::read(m.path("A/f")).unwrap(), b"x");
    let refused = fs::write(third.join("A/f"), b"z").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    assert_eq!(fs::read(third.join("A/f")).unwrap(), b"x");
    // The first point goes; the others serve on.
    umount(&m.mnt);
    fs::write(second.join("g"), b"y").unwrap();
    assert_eq!(fs::read(third.join("g")).unwrap(), b"y");
    umount(&third);
    assert!(m.daemon.as_mut().unwrap().try_wait().unwrap().is_none(), "the daemon stopped early");
    umount(&second);
    assert!(m.wait_daemon().success());
    fsck_clean(&m.pool);
    // SIGTERM with a second point mounted unmounts both.
    m.start();
    assert!(winefs_mount(&[], &second).status.success());
    m.stop();
    assert!(!is_mounted(&second), "SIGTERM left the second mount point");
    // A mount whose daemon died (kill -9, the mount left behind) is passed over: the pool is
    // free and mounts afresh on the second point (a bind of the dead mount would fail).
    m.start();
    ok(cmd("kill").args(["-9", &m.pid().to_string()]));
    assert!(!m.wait_daemon().success());
    assert!(winefs_mount(&[], &second).status.success());
    assert_eq!(fs::read(second.join("g")).unwrap(), b"y");
    umount(&second);
    ok(cmd("umount").arg("-l").arg(&m.mnt));
}

/// overlayfs (container images' file system) takes a directory of the mount as its upper
/// layer: it needs RENAME_WHITEOUT, trusted.* attributes and d_type there. Deleting a lower
/// file leaves a whiteout (a character device 0:0), copy-up and rename work, a directory made
/// again over a lower one is opaque; the merged view is the same after the overlay and winefs
/// are both unmounted and mounted again.
#[test]
fn overlayfs_takes_a_directory_of_the_mount_as_its_upper_layer() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    require_base();
    let mut m = Mounted::new();
    let tmp = tempfile::tempdir().unwrap();
    let (lower, merged) = (tmp.path().join("lower"), tmp.path().join("merged"));
    for d in [&lower, &lower.join("d"), &merged, &m.path("upper"), &m.path("work")] {
        fs::create_dir_all(d).unwrap();
    }
    for (f, text) in [("a", "lower a"), ("b", "lower b"), ("d/x", "lower x")] {
        fs::write(lower.join(f), text).unwrap();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        m.path("upper").display(),
        m.path("work").display()
    );
    let mount_overlay = || {
        ok(cmd("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(&merged));
    };
    mount_overlay();
    fs::remove_file(merged.join("a")).unwrap();
    fs::write(merged.join("b"), "upper b").unwrap();
    fs::rename(merged.join("b"), merged.join("c")).unwrap();
    fs::remove_dir_all(merged.join("d")).unwrap();
    fs::create_dir(merged.join("d")).unwrap();
    let whiteout = fs::symlink_metadata(m.path("upper/a")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0, "{whiteout:?}");
    let check = || {
        let mut names: Vec<String> = fs::read_dir(&merged)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["c", "d"]);
        assert_eq!(fs::read_to_string(merged.join("c")).unwrap(), "upper b");
        assert_eq!(fs::read_dir(merged.join("d")).unwrap().count(), 0, "opaque");
    };
    check();
    umount(&merged);
    m.remount(); // fsck clean
    mount_overlay();
    check();
    umount(&merged);
    m.stop();
}

/// Reads that reach the daemon and directory listings store access times as ext4's default
/// `relatime` does (the kernel leaves them to a FUSE server); an `O_NOATIME` open's reads and
/// a `--noatime` mount store none.
#[test]
fn reads_store_access_times_as_relatime_does_and_o_noatime_reads_do_not() {
    use std::fs::FileTimes;
    use std::time::{SystemTime, UNIX_EPOCH};
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let set_old = |p: &Path| {
        // futimens(2) through a descriptor opened for reading (directories too).
        File::open(p).unwrap().set_times(FileTimes::new().set_accessed(old)).unwrap();
    };
    let atime = |p: &Path| fs::metadata(p).unwrap().accessed().unwrap();
    let mut m = Mounted::new();
    let f = m.path("f");
    fs::write(&f, b"hello").unwrap();
    set_old(&f);
    let mut buf = Vec::new();
    File::options()
        .read(true)
        .custom_flags(libc::O_NOATIME | libc::O_DIRECT)
        .open(&f)
        .unwrap()
        .read_to_end(&mut buf)
        .unwrap();
    assert_eq!(atime(&f), old, "an O_NOATIME read stored an access time");
    // O_DIRECT: the read reaches the daemon whatever the kernel kept.
    File::options().read(true).custom_flags(libc::O_DIRECT).open(&f).unwrap().read_to_end(&mut buf).unwrap();
    assert!(atime(&f) > SystemTime::now() - Duration::from_secs(60), "a read stored none");
    fs::create_dir(m.path("d")).unwrap();
    set_old(&m.path("d"));
    fs::read_dir(m.path("d")).unwrap().for_each(drop);
    assert!(atime(&m.path("d")) > old, "a listing stored none");
    set_old(&f);
    m.stop();
    m.args = vec!["--noatime"];
    m.start();
    File::options().read(true).custom_flags(libc::O_DIRECT).open(&f).unwrap().read_to_end(&mut buf).unwrap();
    assert_eq!(atime(&f), old, "a --noatime mount stored an access time");
    m.stop();
}

/// Times set with nanoseconds, before the epoch too (`touch -d '1969-12-31 23:59:59.5'`, which
/// the kernel sends as -1 s and 500,000,000 ns), read back as set, from the kernel's cache and
/// from the pool after a remount. Before the epoch they were 1 - 2 * ns / 1e9 s early.
#[test]
fn times_with_nanoseconds_before_and_after_the_epoch_are_kept_as_set() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let mut m = Mounted::new();
    let cases: [(i64, i64); 5] = [(-1, 500_000_000), (-1, 999_999_999), (-2_000, 1), (-1, 0), (1_700_000_000, 123_456_789)];
    let at = |(s, ns): (i64, i64)| match s >= 0 {
        true => UNIX_EPOCH + Duration::new(s as u64, ns as u32),
        false => UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + Duration::from_nanos(ns as u64),
    };
    for (i, &(s, ns)) in cases.iter().enumerate() {
        let f = File::create(m.path(&format!("t{i}"))).unwrap();
        // mtime as given; atime one second later, so the two cannot be swapped unseen.
        let times = fs::FileTimes::new().set_modified(at((s, ns))).set_accessed(at((s + 1, ns)));
        f.set_times(times).unwrap();
    }
    let check = |m: &Mounted, when: &str| {
        for (i, &(s, ns)) in cases.iter().enumerate() {
            let st = fs::metadata(m.path(&format!("t{i}"))).unwrap();
            assert_eq!((st.mtime(), st.mtime_nsec()), (s, ns), "t{i} mtime, {when}");
            assert_eq!((st.atime(), st.atime_nsec()), (s + 1, ns), "t{i} atime, {when}");
            let modified: SystemTime = st.modified().unwrap();
            assert_eq!(modified, at((s, ns)), "t{i}, {when}");
        }
    };
    check(&m, "mounted");
    m.remount();
    check(&m, "after a remount");
    m.stop();
}

/// statx(2) shows each file's birth time, as on ext4 (GNU `stat`'s "Birth"): when it was made,
/// not changed by writes, the same after a remount.
#[test]
fn statx_shows_the_birth_time() {
    let birth = |p: &Path| {
        let out = run_timeout(cmd("stat").args(["-c", "%W %Y"]).arg(p), CMD_WAIT);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let v: Vec<i64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        assert!(out.status.success() && v.len() == 2, "stat: {text}");
        (v[0], v[1])
    };
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let mut m = Mounted::new();
    let f = m.path("f");
    let before = now();
    fs::write(&f, b"x").unwrap();
    let (born, _) = birth(&f);
    assert!(born >= before && born <= now(), "birth {born}, made between {before} and {}", now());
    // Two seconds later a write moves the modification time, not the birth time.
    std::thread::sleep(Duration::from_millis(2100));
    fs::write(&f, b"y").unwrap();
    let (again, modified) = birth(&f);
    assert_eq!(again, born);
    assert!(modified > born, "modified {modified}, born {born}");
    m.stop();
    m.start();
    assert_eq!(birth(&f).0, born);
    m.stop();
}

/// `lsattr`, `chattr` and `xfs_io`'s flag commands work on the mount, and the daemon refuses
/// what Linux refuses on immutable and append-only files (the kernel enforces no flag of a FUSE
/// inode itself); the kernel's own check that only `CAP_LINUX_IMMUTABLE` sets those two holds.
#[test]
fn chattr_flags_are_kept_and_enforced_through_the_mount() {
    require("chattr", "e2fsprogs");
    require("xfs_io", "xfsprogs");
    require("setpriv", "util-linux");
    let flags = |p: &Path| {
        let out = run_timeout(cmd("lsattr").arg("-d").arg(p), CMD_WAIT);
        assert!(out.status.success(), "lsattr: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
    };
    let chattr = |how: &str, p: &Path| run_timeout(cmd("chattr").arg(how).arg(p), CMD_WAIT);
    let eperm = |r: std::io::Result<File>, what: &str| match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{what}: {e}"),
        Ok(_) => panic!("{what} was allowed"),
    };
    let mut m = Mounted::new();
    let f = m.path("f");
    fs::write(&f, b"kept\n").unwrap();
    assert!(!flags(&f).contains('i'), "{}", flags(&f));
    assert!(chattr("+i", &f).status.success());
    assert!(flags(&f).contains('i'), "{}", flags(&f));
    eperm(File::options().append(true).open(&f), "an append open");
    eperm(File::options().write(true).open(&f), "a write open");
    let e = fs::remove_file(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "unlink: {e}");
    let e = fs::rename(&f, m.path("g")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "rename: {e}");
    assert_eq!(fs::read(&f).unwrap(), b"kept\n");
    // Append-only: an O_APPEND open writes at the end; nothing else changes the file.
    assert!(chattr("=a", &f).status.success());
    File::options().append(true).open(&f).unwrap().write_all(b"more\n").unwrap();
    eperm(File::options().write(true).open(&f), "a write open without O_APPEND");
    assert_eq!(fs::read(&f).unwrap(), b"kept\nmore\n");
    // The flags as xfs_io reads and sets them (FS_IOC_FSGETXATTR / FSSETXATTR).
    let xfs_io = |c: &str| run_timeout(cmd("xfs_io").args(["-r", "-c", c]).arg(&f), CMD_WAIT);
    assert!(xfs_io("chattr -a").status.success());
    assert!(xfs_io("chattr +d").status.success());
    let out = String::from_utf8_lossy(&xfs_io("lsattr").stdout).to_string();
    // The flag letters only: the path after them is a temporary name of any letters.
    let letters = out.split_whitespace().next().unwrap_or("");
    assert!(letters.contains('d') && !letters.contains('a'), "{out}");
    assert_eq!(flags(&f).matches(|c: char| c != '-').collect::<String>(), "d");
    // Flags winefs does not keep are refused, not dropped.
    let out = chattr("+c", &f);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not supported"));
    // The owner sets the other flags; immutable needs CAP_LINUX_IMMUTABLE, which the kernel checks.
    std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
    let as_nobody = |how: &str| {
        run_timeout(
            cmd("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", "chattr", how]).arg(&f),
            CMD_WAIT,
        )
    };
    assert!(as_nobody("+A").status.success(), "{}", String::from_utf8_lossy(&as_nobody("+A").stderr));
    assert!(!as_nobody("+i").status.success());
    assert!(flags(&f).contains('A') && !flags(&f).contains('i'), "{}", flags(&f));
    // A new file in a no-atime directory is no-atime too.
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    assert!(chattr("+A", &d).status.success());
    fs::write(d.join("n"), b"").unwrap();
    assert!(flags(&d.join("n")).contains('A'), "{}", flags(&d.join("n")));
    m.stop();
}

/// Extended attribute names are answered as ext4 answers them: EOPNOTSUPP outside `user.`,
/// `trusted.`, `security.` and the POSIX ACLs, EINVAL for a namespace alone.
#[test]
fn xattr_names_outside_the_kept_namespaces_are_refused() {
    require("setfattr", "attr");
    let mut m = Mounted::new();
    let f = m.path("f");
    fs::write(&f, b"x").unwrap();
    setfattr(&f, "trusted.kept", Some("1"));
    setfattr(&f, "security.kept", Some("1"));
    // An ACL's value (version 2; user::rw-, group::r--, other::r--) under a `system.` name
    // that is no ACL.
    let acl = "0x0200000001000600ffffffff04000400ffffffff20000400ffffffff";
    for (name, value, why) in [
        ("bogus.x", "0x02", "Operation not supported"),
        ("system.posix_acl_other", acl, "Operation not supported"),
        ("user.", "0x02", "Invalid argument"),
    ] {
        let out = run_timeout(cmd("setfattr").args(["-n", name, "-v", value]).arg(&f), CMD_WAIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "setfattr -n {name}: {err}");
    }
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 2. tar

#[test]
fn tar_round_trip_through_the_mount() {
    require("tar", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let src = source_tree(&tmp);
    let want = manifest(&src);

    let mut m = Mounted::new();
    let archive = m.path("a.tar");
    ok(cmd("tar")
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&archive)
        .arg("."));
    let x = m.path("x");
    fs::create_dir(&x).unwrap();
    ok(cmd("tar")
        .arg("-C")
        .arg(&x)
        .arg("-xpf")
        .arg(&archive)
        .arg("--same-owner"));
    assert_same_tree(&want, &manifest(&x), "tar extracted in the mount");

    // The archive in the mount lists what a listing of the source archive would.
    let in_mount = ok(cmd("tar").arg("-tvf").arg(&archive));
    let out_tar = tmp.path().join("src.tar");
    ok(cmd("tar")
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&out_tar)
        .arg("."));
    let outside = ok(cmd("tar").arg("-tvf").arg(&out_tar));
    let sorted = |s: &str| {
        let mut v: Vec<String> = s.lines().map(str::to_string).collect();
        v.sort();
        v
    };
    assert_eq!(
        sorted(&in_mount),
        sorted(&outside),
        "tar -tv of the archive written in the mount"
    );

    // Out again: every file's sha256 matches the source.
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let b = tmp.path().join("b.tar");
    ok(cmd("tar").arg("-C").arg(&x).arg("-cf").arg(&b).arg("."));
    ok(cmd("tar").arg("-C").arg(&out).arg("-xpf").arg(&b));
    let got = manifest(&out);
    let mut checked = 0;
    for (k, w) in &want {
        if w.kind == "file" {
            assert_eq!(
                got.get(k).and_then(|e| e.sha256.as_ref()),
                w.sha256.as_ref(),
                "sha256 of {k} after tar out of the mount"
            );
            checked += 1;
        }
    }
    assert!(checked > 300);
    assert_same_tree(&want, &got, "tar out of the mount");
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 3. rsync -aX with user xattrs

/// `getfattr -R -d -m '^user\.' -e hex` under `root`: path -> name -> hex value.
fn user_xattrs(root: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let out = ok(cmd("getfattr")
        .args(["-R", "-h", "-d", "-m", "^user\\.", "-e", "hex", "."])
        .current_dir(root));
    let mut res: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in out.lines() {
        if let Some(f) = line.strip_prefix("# file: ") {
            cur = Some(f.to_string());
            res.entry(f.to_string()).or_default();
        } else if !line.is_empty() {
            let (k, v) = line.split_once('=').unwrap_or((line, ""));
            let f = cur.clone().expect("getfattr output without a file line");
            res.get_mut(&f)
                .unwrap()
                .insert(k.to_string(), v.to_string());
        }
    }
    res
}

fn setfattr(path: &Path, name: &str, value: Option<&str>) {
    let mut c = cmd("setfattr");
    c.arg("-n").arg(name);
    if let Some(v) = value {
        c.arg("-v").arg(v);
    }
    ok(c.arg(path));
}

#[test]
fn rsync_ax_keeps_xattrs_and_second_run_transfers_nothing() {
    require("rsync", "rsync");
    require("getfattr", "attr");
    require("setfattr", "attr");
    let tmp = tempfile::tempdir().unwrap();
    let src = source_tree(&tmp);
    setfattr(&src.join("five"), "user.color", Some("red"));
    setfattr(&src.join("five"), "user.shape", Some("\"round thing\""));
    setfattr(&src.join("big.bin"), "user.bin", Some("0x00ff10ab00"));
    setfattr(&src.join("empty"), "user.empty", None);
    setfattr(&src.join("a/b"), "user.dir", Some("yes"));
    setfattr(&src.join("a/hard1"), "user.linked", Some("shared"));
    let long_hex = format!(
        "0x{}",
        pseudo_random(9, 3000)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    setfattr(&src.join("one"), "user.long", Some(&long_hex));
    for i in 0..20 {
        setfattr(
            &src.join("exec.sh"),
            &format!("user.k{i:02}"),
            Some(&format!("v{}", i * i)),
        );
    }
    // Setting xattrs does not touch mtimes, but take the manifest afterwards anyway.
    let want = manifest(&src);
    let want_x = user_xattrs(&src);
    assert!(
        want_x.len() >= 7 && want_x["exec.sh"].len() == 20,
        "source xattrs not set: {want_x:?}"
    );
    assert_eq!(want_x["one"]["user.long"], long_hex);

    let mut m = Mounted::new();
    let dst = m.path("dst");
    let s = format!("{}/", src.display());
    let d = format!("{}/", dst.display());
    // -H as well, so the hard links stay hard links and the manifests compare in full.
    ok(cmd("rsync").args(["-aHX", &s, &d]));
    assert_same_tree(&want, &manifest(&dst), "rsync -aHX onto the mount");
    assert_eq!(want_x, user_xattrs(&dst), "user xattrs after rsync -aHX");

    let again = ok(cmd("rsync").args(["-aHXi", &s, &d]));
    assert!(
        again.trim().is_empty(),
        "a second rsync -aHXi transferred or changed something:\n{again}"
    );

    m.remount();
    assert_same_tree(&want, &manifest(&dst), "rsync copy after remount");
    assert_eq!(want_x, user_xattrs(&dst), "user xattrs after remount");
    let again = ok(cmd("rsync").args(["-aHXi", &s, &d]));
    assert!(
        again.trim().is_empty(),
        "rsync -aHXi after a remount transferred or changed something:\n{again}"
    );
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 4. git

fn git(home: &Path) -> Command {
    let mut c = cmd("git");
    c.env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE");
    c
}

#[test]
fn git_repository_in_the_mount() {
    require("git", "git");
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(
        home.join(".gitconfig"),
        "[user]\n\tname = Test\n\temail = test@example.com\n[init]\n\tdefaultBranch = main\n\
         [gc]\n\tautoDetach = false\n[core]\n\tfsync = all\n",
    )
    .unwrap();

    let mut m = Mounted::new();
    let repo = m.path("repo");
    ok(git(&home).arg("init").arg("-q").arg(&repo));
    let mut files: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    files.insert("README", b"hello\n".to_vec());
    files.insert("src/lib.c", b"int f(void) { return 1; }\n".to_vec());
    files.insert("data/blob.bin", pseudo_random(11, 300_000));
    files.insert("data/gone.txt", b"to be removed\n".to_vec());
    for (k, v) in &files {
        let p = repo.join(k);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, v).unwrap();
    }
    ok(git(&home).arg("-C").arg(&repo).args(["add", "-A"]));
    ok(git(&home)
        .arg("-C")
        .arg(&repo)
        .args(["commit", "-q", "-m", "first commit"]));

    files.insert("README", b"hello\nsecond line\n".to_vec());
    files.insert("src/new.c", pseudo_random(12, 5000));
    files.remove("data/gone.txt");
    fs::write(repo.join("README"), &files["README"]).unwrap();
    fs::write(repo.join("src/new.c"), &files["src/new.c"]).unwrap();
    fs::remove_file(repo.join("data/gone.txt")).unwrap();
    ok(git(&home).arg("-C").arg(&repo).args(["add", "-A"]));
    ok(git(&home)
        .arg("-C")
        .arg(&repo)
        .args(["commit", "-q", "-m", "second commit"]));

    let check = |m: &Mounted, when: &str| {
        let log = ok(git(&home).arg("-C").arg(&repo).args(["log", "--format=%s"]));
        assert_eq!(log, "second commit\nfirst commit\n", "git log {when}");
        ok(git(&home).arg("-C").arg(&repo).args(["fsck", "--full"]));
        let status = ok(git(&home)
            .arg("-C")
            .arg(&repo)
            .args(["status", "--porcelain"]));
        assert_eq!(status, "", "git status {when}");
        let tracked = ok(git(&home).arg("-C").arg(&repo).args(["ls-files"]));
        let mut want: Vec<&str> = files.keys().copied().collect();
        want.sort();
        assert_eq!(
            tracked.lines().collect::<Vec<_>>(),
            want,
            "git ls-files {when}"
        );
        for (k, v) in &files {
            assert_bytes(&m.mnt.join("repo").join(k), v);
        }
    };
    check(&m, "after two commits");
    // Repack: writes packs, renames and deletes loose objects.
    ok(git(&home).arg("-C").arg(&repo).args(["gc", "-q"]));
    check(&m, "after git gc");

    let clone = tmp.path().join("clone");
    ok(git(&home).arg("clone").arg("-q").arg(&repo).arg(&clone));
    for (k, v) in &files {
        assert_bytes(&clone.join(k), v);
    }
    assert!(!clone.join("data/gone.txt").exists());
    let head_src = ok(git(&home).arg("-C").arg(&repo).args(["rev-parse", "HEAD"]));
    let head_clone = ok(git(&home).arg("-C").arg(&clone).args(["rev-parse", "HEAD"]));
    assert_eq!(head_src, head_clone);

    m.remount();
    check(&m, "after a remount");
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 5. sqlite3

fn sqlite(db: &Path, sql: &str) -> String {
    ok(cmd("sqlite3").args(["-batch", "-bail"]).arg(db).arg(sql))
}

/// 3 * (1 + ... + 2000) = 6003000; every s is 100 hex digits; nothing of the rolled-back
/// transaction is visible.
fn sqlite_check(db: &Path, when: &str) {
    let got = sqlite(
        db,
        "SELECT count(*), sum(v), sum(length(s)), max(id), min(id) FROM t;",
    );
    assert_eq!(
        got.trim(),
        "2000|6003000|200000|2000|1",
        "{}: count|sum(v)|sum(length(s))|max(id)|min(id) {when}",
        db.display()
    );
    let integrity = sqlite(db, "PRAGMA integrity_check;");
    assert_eq!(
        integrity.trim(),
        "ok",
        "{}: integrity_check {when}",
        db.display()
    );
    let odd = sqlite(db, "SELECT count(*) FROM t WHERE v != 3 * id OR s = 'x';");
    assert_eq!(odd.trim(), "0", "{}: rows changed {when}", db.display());
}

#[test]
fn sqlite_transactions_commit_roll_back_and_survive_remount() {
    require("sqlite3", "sqlite3");
    let mut m = Mounted::new();
    fs::create_dir(m.path("db")).unwrap();
    // The default rollback journal, and a write-ahead log (which sqlite maps shared).
    let modes = ["delete", "wal"];
    for mode in modes {
        let db = m.path(&format!("db/{mode}.sqlite"));
        let set = sqlite(&db, &format!("PRAGMA journal_mode = {mode};"));
        assert_eq!(set.trim(), mode);
        sqlite(
            &db,
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER NOT NULL, s TEXT NOT NULL);",
        );
        sqlite(
            &db,
            "BEGIN; \
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000) \
             INSERT INTO t SELECT x, 3 * x, hex(randomblob(50)) FROM c; \
             COMMIT;",
        );
        // A transaction that touches every page, then is rolled back.
        sqlite(
            &db,
            "BEGIN; \
             WITH RECURSIVE c(x) AS (SELECT 2001 UNION ALL SELECT x + 1 FROM c WHERE x < 2500) \
             INSERT INTO t SELECT x, 1, 'rolled back' FROM c; \
             UPDATE t SET v = 0, s = 'x'; \
             DELETE FROM t WHERE id % 3 = 0; \
             ROLLBACK;",
        );
        sqlite_check(&db, "after commit and rollback");
        assert!(
            !m.path(&format!("db/{mode}.sqlite-journal")).exists(),
            "a hot journal was left behind"
        );
    }
    m.remount();
    for mode in modes {
        let db = m.path(&format!("db/{mode}.sqlite"));
        sqlite_check(&db, "after a remount");
        let got = sqlite(&db, "PRAGMA journal_mode;");
        assert_eq!(got.trim(), mode, "journal mode after a remount");
    }
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 6. fio with verification

/// Run fio with crc32c verification; it must succeed, report no verify error, and have read
/// back (verified) every byte it wrote.
fn fio(m: &Mounted, name: &str, extra: &[&str], verify_only: bool) {
    let file = m.path(&format!("{name}.fio"));
    let mut c = cmd("fio");
    // fio leaves *-verify.state files in its working directory: keep them out of the tree.
    c.current_dir(m.mnt.parent().unwrap());
    c.arg(format!("--name={name}"))
        .arg(format!("--filename={}", file.display()))
        .args([
            "--size=32m",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--output-format=normal",
        ])
        .args(extra);
    if verify_only {
        c.arg("--verify_only");
    } else {
        c.arg("--do_verify=1");
    }
    let desc = describe(&c);
    let out = run_timeout(&mut c, CMD_WAIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "`{desc}` failed:\n{text}");
    assert!(
        text.contains("err= 0"),
        "`{desc}` reported an error:\n{text}"
    );
    for bad in ["verify failed", "bad magic", "bad header", "verify: "] {
        assert!(
            !text.contains(bad),
            "`{desc}` reported a verify error ({bad}):\n{text}"
        );
    }
    // "issued rwts: total=READS,WRITES,..." : all 32 MiB read back and checked.
    let bs: u64 = if extra.contains(&"--bs=1m") {
        1 << 20
    } else {
        4096
    };
    let blocks = (32u64 << 20) / bs;
    let issued = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("issued rwts: total="))
        .unwrap_or_else(|| panic!("no issued line from `{desc}`:\n{text}"));
    let n: Vec<u64> = issued
        .split(|c: char| c == ',' || c.is_whitespace())
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    // (--verify_only still counts the writes it skips as issued.)
    assert_eq!(
        n,
        vec![blocks, blocks],
        "`{desc}` did not write and verify every block:\n{text}"
    );
    assert_eq!(fs::metadata(&file).unwrap().len(), 32 << 20);
}

#[test]
fn fio_verified_writes() {
    require("fio", "fio");
    let mut m = Mounted::new();
    let jobs: [(&str, &[&str]); 5] = [
        ("seq-sync", &["--rw=write", "--bs=4k", "--sync=1"]),
        ("rand-sync", &["--rw=randwrite", "--bs=4k", "--sync=1"]),
        ("seq-fsync", &["--rw=write", "--bs=4k", "--fsync=1"]),
        ("rand-fsync", &["--rw=randwrite", "--bs=4k", "--fsync=1"]),
        ("seq-1m", &["--rw=write", "--bs=1m"]),
    ];
    for (name, extra) in jobs {
        fio(&m, name, extra, false);
    }
    // The data is still there, and still verifies, after a clean remount.
    m.remount();
    for (name, extra) in jobs {
        let keep: Vec<&str> = extra
            .iter()
            .copied()
            .filter(|a| a.starts_with("--rw=") || a.starts_with("--bs="))
            .collect();
        fio(&m, name, &keep, true);
    }
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 7. Concurrent writers

const WRITER_SIZE: usize = 8 << 20;
const CHUNK: usize = 64 << 10;

/// Byte `off` of writer `t`'s file: depends on both, so a chunk in the wrong place or file shows.
fn writer_byte(t: usize, off: usize) -> u8 {
    ((off / 4096) as u8)
        .wrapping_mul(31)
        .wrapping_add(off as u8)
        .wrapping_add((t as u8).wrapping_mul(97))
        ^ ((off >> 16) as u8)
}

fn writer_content(t: usize) -> Vec<u8> {
    (0..WRITER_SIZE).map(|o| writer_byte(t, o)).collect()
}

/// Records of varying length, each filled with its own index.
fn append_records() -> Vec<Vec<u8>> {
    (0..600usize)
        .map(|i| {
            let len = 1 + (i * 7919) % 9000;
            let mut r = format!("[{i}]").into_bytes();
            r.resize(len.max(r.len()), (i % 251) as u8);
            r
        })
        .collect()
}

fn join_all(handles: Vec<thread::JoinHandle<()>>, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while !handles.iter().all(|h| h.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "{what}: threads still running after {limit:?} (winefs hung?)"
        );
        thread::sleep(Duration::from_millis(10));
    }
    for h in handles {
        if let Err(e) = h.join() {
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn concurrent_writers_and_appender() {
    let mut m = Mounted::new();
    let dir = m.path("par");
    fs::create_dir(&dir).unwrap();
    let mut handles = Vec::new();
    for t in 0..4 {
        let p = dir.join(format!("w{t}"));
        handles.push(thread::spawn(move || {
            let data = writer_content(t);
            let mut f = File::create(&p).unwrap();
            for c in data.chunks(CHUNK) {
                f.write_all(c).unwrap();
            }
            f.sync_all().unwrap();
        }));
    }
    let log = dir.join("append.log");
    {
        let log = log.clone();
        handles.push(thread::spawn(move || {
            let mut f = File::options()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            for r in append_records() {
                f.write_all(&r).unwrap();
            }
        }));
    }
    join_all(handles, Duration::from_secs(120), "concurrent writers");

    let check = |when: &str| {
        for t in 0..4 {
            let p = dir.join(format!("w{t}"));
            let got = fs::read(&p).unwrap();
            assert!(
                got.len() == WRITER_SIZE && got == writer_content(t),
                "{} {when}: {}",
                p.display(),
                first_difference(&got, &writer_content(t))
            );
        }
        assert_bytes(&log, &append_records().concat());
    };
    check("after the writers finished");
    m.remount();
    check("after a remount");
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 8. kill -9 of the daemon

/// A file the workload wrote and fsynced: its name and how to regenerate its content.
#[derive(Clone)]
struct Synced {
    name: String,
    seed: u64,
    len: usize,
}

fn crash_content(s: &Synced) -> Vec<u8> {
    pseudo_random(s.seed, s.len)
}

#[test]
fn kill_9_keeps_every_fsynced_file() {
    let mut m = Mounted::new();
    let mut synced: Vec<Synced> = Vec::new();
    for round in 0..3u64 {
        let dir = m.path(&format!("round{round}"));
        fs::create_dir(&dir).unwrap();
        let done = Arc::new(Mutex::new(HashMap::<String, Synced>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // Set just before the kill: an error before that is a failure of winefs.
        let killing = Arc::new(AtomicBool::new(false));
        let early = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut handles = Vec::new();
        for t in 0..3u64 {
            let (dir, done, stop) = (dir.clone(), Arc::clone(&done), Arc::clone(&stop));
            let (killing, early) = (Arc::clone(&killing), Arc::clone(&early));
            handles.push(thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let seed = (round << 40) | (t << 32) | n;
                    let len = 1 + (seed.wrapping_mul(2654435761) % (96 << 10)) as usize;
                    // A rotating set of names: later files replace (truncate and rewrite)
                    // earlier ones, which then no longer count as synced.
                    let file = format!("t{t}-{:03}", n % 150);
                    let name = format!("round{round}/{file}");
                    let data = pseudo_random(seed, len);
                    done.lock().unwrap().remove(&name);
                    let res = File::create(dir.join(&file)).and_then(|mut f| {
                        f.write_all(&data)?;
                        f.sync_all()
                    });
                    match res {
                        Ok(()) => {
                            done.lock()
                                .unwrap()
                                .insert(name.clone(), Synced { name, seed, len });
                        }
                        // ENOTCONN (and friends) once the daemon is dead.
                        Err(e) => {
                            if !killing.load(Ordering::SeqCst) {
                                early.lock().unwrap().push(format!("{name}: {e}"));
                            }
                            return;
                        }
                    }
                    n += 1;
                }
            }));
        }
        thread::sleep(Duration::from_millis(600 + 150 * round));
        killing.store(true, Ordering::SeqCst);
        m.crash();
        stop.store(true, Ordering::Relaxed);
        join_all(handles, Duration::from_secs(15), "writers after kill -9");
        let done = std::mem::take(&mut *done.lock().unwrap());
        let early = early.lock().unwrap();
        assert!(
            early.is_empty(),
            "round {round}: writes failed before the daemon was killed: {early:?}; log:\n{}",
            m.daemon_log()
        );
        assert!(
            done.len() >= 10,
            "round {round}: only {} files were written before the kill",
            done.len()
        );
        synced.extend(done.into_values());

        m.start();
        for s in &synced {
            assert_bytes(&m.path(&s.name), &crash_content(s));
        }
    }
    m.stop();
    // And once more after a clean unmount.
    m.start();
    for s in &synced {
        assert_bytes(&m.path(&s.name), &crash_content(s));
    }
    m.stop();
}

// ---------------------------------------------------------------------------------------------
// 9. CLI refusals

/// Run a `winefs mount ... -f` that must be refused: non-zero exit, exactly one stderr line
/// "winefs: ..." containing `want`. A mount that wrongly succeeds is killed and unmounted.
fn refused(c: &mut Command, mnt: &Path, want: &str) -> String {
    let desc = describe(c);
    let before = mount_count(mnt);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + MOUNT_WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        while mount_count(mnt) > before {
            lazy_umount(mnt);
        }
        panic!("`{desc}` was not refused: it was still running after {MOUNT_WAIT:?}");
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let after = mount_count(mnt);
    if after > before {
        while mount_count(mnt) > before {
            lazy_umount(mnt);
        }
        panic!("`{desc}` left a mount on {}", mnt.display());
    }
    assert!(!status.success(), "`{desc}` succeeded; stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("winefs: ") && lines[0].contains(want),
        "`{desc}`: expected one stderr line \"winefs: ...{want}...\", got ({status}):\n{err}"
    );
    assert_eq!(out, "", "`{desc}` printed on stdout");
    lines[0].to_string()
}

fn mount_cmd(pool: &Path, mnt: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("mount").arg(pool).arg(mnt).arg("-f");
    c
}

fn info(pool: &Path) -> String {
    ok(Command::new(BIN).arg("info").arg(pool))
}

#[test]
fn cli_refusals_are_one_line_and_leave_nothing_mounted() {
    require_base();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();

    // A file of random bytes: refused, and never written.
    let junk = root.join("junk");
    let bytes = pseudo_random(77, 4 << 20);
    fs::write(&junk, &bytes).unwrap();
    refused(&mut mount_cmd(&junk, &mnt), &mnt, "not a winefs pool");
    assert_bytes(&junk, &bytes);
    assert!(!is_mounted(&mnt));

    // A missing mountpoint.
    let pool = root.join("pool");
    mkfs(&pool);
    let info_before = info(&pool);
    refused(
        &mut mount_cmd(&pool, &root.join("nowhere")),
        &root.join("nowhere"),
        "does not exist",
    );
    assert!(!root.join("nowhere").exists());
    assert_eq!(info(&pool), info_before, "a refused mount changed the pool");

    // A mountpoint in use, and a pool in use.
    let mut m = Mounted::new();
    fs::write(m.path("keep"), b"still here\n").unwrap();
    refused(&mut mount_cmd(&pool, &m.mnt), &m.mnt, "in use");
    assert_eq!(mount_count(&m.mnt), 1);
    assert_eq!(info(&pool), info_before, "a refused mount changed the pool");
    let other = root.join("other");
    fs::create_dir(&other).unwrap();
    // A second mount point of a served pool is a bind mount (see
    // `a_served_pool_mounts_on_a_second_point_as_one_file_system`), refused when it asks the
    // daemon for what it does not do.
    refused(
        mount_cmd(&m.pool, &other).arg("--relaxed"),
        &other,
        "option relaxed: the daemon serves with mode=strict",
    );
    assert!(!is_mounted(&other));
    // The first mount is untouched and still serves its files.
    assert_bytes(&m.path("keep"), b"still here\n");
    fs::write(m.path("keep2"), b"and more\n").unwrap();
    assert_bytes(&m.path("keep2"), b"and more\n");
    m.remount();
    assert_bytes(&m.path("keep"), b"still here\n");
    assert_bytes(&m.path("keep2"), b"and more\n");
    m.stop();

    // Without permission: user nobody on a directory root owns.
    require("runuser", "util-linux");
    let mut p = PathBuf::from("/");
    for c in Path::new(BIN).components().skip(1) {
        p.push(c);
        let mode = fs::metadata(&p).unwrap().permissions().mode();
        assert!(
            mode & 0o001 != 0,
            "user nobody cannot reach {BIN}: {} has mode {:o} (needs o+x, e.g. chmod o+x {})",
            p.display(),
            mode & 0o7777,
            p.display()
        );
    }
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&pool, fs::Permissions::from_mode(0o666)).unwrap();
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        fs::metadata(&mnt).unwrap().uid(),
        0,
        "run the tests as root"
    );
    let mut c = cmd("runuser");
    c.args(["-u", "nobody", "--", BIN, "mount"])
        .arg(&pool)
        .arg(&mnt)
        .arg("-f");
    let line = refused(&mut c, &mnt, "permission denied");
    assert!(line.contains(&mnt.display().to_string()), "{line}");
    assert_eq!(info(&pool), info_before, "a refused mount changed the pool");
    fsck_clean(&pool);
}

/// `r` is EROFS (what `what` did on a read-only mount).
fn erofs(what: &str, r: std::io::Result<()>) {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {}
        other => panic!("{what} on a read-only mount: {other:?}, expected EROFS"),
    }
}

/// A tool's change through a read-only mount fails, saying so.
fn tool_erofs(c: &mut Command) {
    let desc = describe(c);
    let out = run_timeout(c, CMD_WAIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Read-only file system"),
        "`{desc}` on a read-only mount ({}): {err}",
        out.status
    );
}

/// Every kind of change through the mount of `m` is EROFS.
fn every_write_is_erofs(m: &Mounted) {
    erofs("create", File::create(m.path("new")).map(drop));
    erofs(
        "open for writing",
        File::options().write(true).open(m.path("keep")).map(drop),
    );
    erofs(
        "open for appending",
        File::options().append(true).open(m.path("keep")).map(drop),
    );
    erofs("unlink", fs::remove_file(m.path("keep")));
    erofs("mkdir", fs::create_dir(m.path("d2")));
    erofs("rmdir", fs::remove_dir(m.path("dir")));
    erofs("rename", fs::rename(m.path("keep"), m.path("k2")));
    erofs(
        "chmod",
        fs::set_permissions(m.path("keep"), fs::Permissions::from_mode(0o600)),
    );
    erofs("symlink", std::os::unix::fs::symlink("x", m.path("l2")));
    erofs("link", fs::hard_link(m.path("keep"), m.path("h")));
    erofs(
        "utimes",
        File::open(m.path("keep")).and_then(|f| f.set_modified(std::time::SystemTime::UNIX_EPOCH)),
    );
    tool_erofs(cmd("mkfifo").arg(m.path("fifo")));
    tool_erofs(
        cmd("setfattr")
            .args(["-n", "user.ro", "-v", "v"])
            .arg(m.path("keep")),
    );
    tool_erofs(cmd("truncate").args(["-s", "0"]).arg(m.path("keep")));
}

#[test]
fn read_only_mounts_refuse_writes_and_a_flagged_pool_mounts_only_read_only() {
    require("setfattr", "attr");
    let mut m = Mounted::new();
    fs::write(m.path("keep"), b"kept\n").unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    std::os::unix::fs::symlink("target-fz5/x", m.path("ln")).unwrap();
    m.stop();
    let before = fs::read(&m.pool).unwrap();
    m.args = vec!["--read-only"];
    m.start();
    assert_bytes(&m.path("keep"), b"kept\n");
    assert_eq!(
        fs::read_link(m.path("ln")).unwrap(),
        Path::new("target-fz5/x")
    );
    every_write_is_erofs(&m);
    assert_bytes(&m.path("keep"), b"kept\n");
    m.stop();
    assert!(
        fs::read(&m.pool).unwrap() == before,
        "a read-only mount wrote to the pool"
    );

    // A symlink target damaged under a mount: EIO, and the pool is flagged "needs fsck".
    let fs = winefs::Fs::mount(&m.pool, winefs::MountOptions::default()).unwrap();
    let ln = fs.resolve("/ln", false).unwrap();
    let at = fs.extents(ln).unwrap()[0].1 * 4096;
    let mut f = File::options()
        .read(true)
        .write(true)
        .open(&m.pool)
        .unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(at)).unwrap();
    f.write_all(b"T").unwrap();
    drop(f);
    assert!(fs.readlink(ln).is_err());
    fs.unmount().unwrap();
    let flagged = fs::read(&m.pool).unwrap();
    refused(
        &mut mount_cmd(&m.pool, &m.mnt),
        &m.mnt,
        "pool needs fsck: a checksum failed at run time (a symlink target failed its checksum); run `winefs fsck --repair",
    );
    assert!(
        fs::read(&m.pool).unwrap() == flagged,
        "a refused mount wrote to the pool"
    );
    // Read-only, it is served: reads work, the damaged target is EIO, writes are EROFS.
    m.start();
    assert_bytes(&m.path("keep"), b"kept\n");
    let e = fs::read_link(m.path("ln")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    every_write_is_erofs(&m);
    let pid = m.pid();
    ok(cmd("kill").args(["-TERM", &pid.to_string()]));
    assert!(m.wait_daemon().success(), "log:\n{}", m.daemon_log());
    assert!(!is_mounted(&m.mnt));
    assert!(
        fs::read(&m.pool).unwrap() == flagged,
        "a read-only mount wrote to the pool"
    );
}

// ---------------------------------------------------------------------------------------------
// Alignment hint through ordinary tools.

/// Whether every extent of `path` in the (unmounted) pool is a whole 2 MiB-aligned unit.
fn aligned_in_pool(fs: &winefs::Fs, path: &str) -> bool {
    let ino = fs.resolve(path, true).unwrap();
    let ext = fs.extents(ino).unwrap();
    !ext.is_empty()
        && ext
            .iter()
            .all(|&(l, p, n)| l % 512 == 0 && p % 512 == 0 && n % 512 == 0)
}

#[test]
fn hugepage_hint_stays_in_the_pool_and_hinted_directories_align_copies() {
    require_base();
    require("fallocate", "util-linux");
    require("getfattr", "attr");
    require("setfattr", "attr");
    let mut m = Mounted::new();
    // One CPU, so one allocator partition: the plain copy below lands in the holes the
    // earlier allocations left there. Served from a CPU whose partition had none, its two
    // 1 MiB writes would carve the start of a fresh aligned extent and look aligned.
    m.stop();
    m.cpus = Some("0");
    m.start();
    let data = pseudo_random(77, 2 << 20);
    // An aligned original: fallocate gives it an aligned extent (and so the hint), then the
    // data is written in place.
    ok(cmd("fallocate").args(["-l", "2MiB"]).arg(m.path("orig")));
    let mut f = File::options().write(true).open(m.path("orig")).unwrap();
    f.write_all(&data).unwrap();
    drop(f);
    setfattr(&m.path("orig"), "user.note", Some("kept"));
    // The hint is there by name ...
    let hint = ok(cmd("getfattr")
        .args(["--only-values", "-n", "user.winefs.hugepage"])
        .arg(m.path("orig")));
    assert_eq!(hint, "1", "the original carries no hint");
    // ... but not listed, so tools that copy every listed attribute leave it behind.
    let dump = ok(cmd("getfattr").args(["-d", "-m", "-"]).arg(m.path("orig")));
    assert!(
        dump.contains("user.note") && !dump.contains("winefs.hugepage"),
        "getfattr -d lists: {dump}"
    );
    let outside = tempfile::tempdir().unwrap();
    ok(cmd("cp").arg("-a").arg(m.path("orig")).arg(outside.path()));
    let dump = ok(cmd("getfattr")
        .args(["-d", "-m", "-"])
        .arg(outside.path().join("orig")));
    assert!(
        dump.contains("user.note") && !dump.contains("winefs.hugepage"),
        "cp -a carried to the host: {dump}"
    );
    // Inside the pool, a hinted directory keeps what is copied into it aligned: cp writes the
    // copy in 1 MiB FUSE requests (holes, for a file this small) unless the file inherited the
    // hint when it was created. A copy elsewhere stays where its small writes put it.
    fs::create_dir(m.path("hinted")).unwrap();
    setfattr(&m.path("hinted"), "user.winefs.hugepage", Some("1"));
    ok(cmd("cp")
        .arg("--preserve=xattr")
        .arg(m.path("orig"))
        .arg(m.path("hinted/copy")));
    ok(cmd("cp")
        .arg("--preserve=xattr")
        .arg(m.path("orig"))
        .arg(m.path("plain")));
    assert_bytes(&m.path("hinted/copy"), &data);
    m.stop(); // a clean unmount lets queued rewrites finish
    let fs = winefs::Fs::mount(
        &m.pool,
        winefs::MountOptions {
            private: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(aligned_in_pool(&fs, "/orig"));
    assert!(
        aligned_in_pool(&fs, "/hinted/copy"),
        "the copy in the hinted directory is not aligned"
    );
    assert!(
        !aligned_in_pool(&fs, "/plain"),
        "a copy outside it should have stayed in holes (the test lost its contrast)"
    );
    let plain = fs.resolve("/plain", true).unwrap();
    assert!(
        fs.getxattr(plain, winefs::meta::xattr::HUGEPAGE_HINT)
            .is_err(),
        "cp --preserve=xattr carried the hint"
    );
    let ino = fs.resolve("/hinted/copy", true).unwrap();
    let mut got = vec![0u8; data.len()];
    fs.read(ino, 0, &mut got).unwrap();
    assert!(got == data, "the copy differs");
}

// ---------------------------------------------------------------------------------------------
// 10. Operator safety and POSIX details

#[test]
fn mount_refuses_a_nonempty_mountpoint_unless_asked() {
    let mut m = Mounted::new();
    fs::write(m.path("inside"), b"in the pool\n").unwrap();
    m.stop();
    // Something in the mountpoint itself, which a mount would hide.
    fs::write(m.mnt.join("underneath"), b"on the host\n").unwrap();
    let info_before = info(&m.pool);
    let line = refused(&mut mount_cmd(&m.pool, &m.mnt), &m.mnt, "not empty");
    assert!(line.contains("--nonempty"), "{line}");
    assert_eq!(
        info(&m.pool),
        info_before,
        "a refused mount changed the pool"
    );
    // Asked for, it mounts over them; they are back once it is gone.
    m.args.push("--nonempty");
    m.start();
    assert_bytes(&m.path("inside"), b"in the pool\n");
    assert!(!m.path("underneath").exists());
    m.stop();
    assert_bytes(&m.mnt.join("underneath"), b"on the host\n");
}

#[test]
fn mkfs_force_refuses_the_pool_a_daemon_serves() {
    let mut m = Mounted::new();
    let data = pseudo_random(5, 3 << 20);
    fs::write(m.path("keep"), &data).unwrap();
    let len = fs::metadata(&m.pool).unwrap().len();
    for size in ["512M", "64M"] {
        let out = run_timeout(
            Command::new(BIN)
                .arg("mkfs")
                .arg(&m.pool)
                .args(["--size", size, "--force"]),
            CMD_WAIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.lines().count() == 1 && err.contains("in use"),
            "mkfs --force of a mounted pool: {} {err}",
            out.status
        );
        assert_eq!(
            fs::metadata(&m.pool).unwrap().len(),
            len,
            "the pool was resized"
        );
    }
    // The daemon is alive and its pool intact.
    assert_bytes(&m.path("keep"), &data);
    fs::write(m.path("more"), b"after\n").unwrap();
    m.stop(); // fsck clean
}

#[test]
fn a_write_removes_file_capabilities_and_a_write_to_a_file_without_any_keeps_its_attributes() {
    require_base();
    require("setfattr", "attr");
    require("getfattr", "attr");
    let mut m = Mounted::new();
    let p = m.path("capable");
    fs::write(&p, b"x").unwrap();
    // A version-2 capability set (CAP_NET_RAW permitted), as setcap would store it.
    let cap = "0x0000000200200000000000000000000000000000";
    ok(cmd("setfattr").args(["-n", "security.capability", "-v", cap]).arg(&p));
    ok(cmd("setfattr").args(["-n", "user.keep", "-v", "1"]).arg(&p));
    let shown = |name: &str| {
        cmd("getfattr")
            .args(["--absolute-names", "-n", name])
            .arg(&p)
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(shown("security.capability"), "the capability was not stored");
    // Any write removes it (as the kernel does for local file systems), root's too; other
    // attributes stay.
    fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"y").unwrap();
    assert!(!shown("security.capability"), "a write left the file capability in place");
    assert!(shown("user.keep"), "a write removed an unrelated attribute");
    // On a full pool as well (the attributes' block is rewritten in place: there is no block
    // for a copy), and an attribute can still be removed by hand.
    ok(cmd("setfattr").args(["-n", "security.capability", "-v", cap]).arg(&p));
    let room = free_inodes_and_blocks(&m.mnt).1 * 4096;
    let mut filler = File::create(m.path("filler")).unwrap();
    let _ = filler.write_all(&vec![0u8; room as usize]); // as far as it goes
    drop(filler);
    assert_eq!(free_inodes_and_blocks(&m.mnt).1, 0, "the pool is not full");
    fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"z").unwrap();
    assert!(!shown("security.capability"), "a write to a full pool left the file capability in place");
    ok(cmd("setfattr").args(["-x", "user.keep"]).arg(&p));
    assert!(!shown("user.keep"), "an attribute removed on a full pool is still there");
    fs::remove_file(m.path("filler")).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"xyz");
    // A file with no attributes at all is written as before.
    let q = m.path("plain");
    fs::write(&q, b"a").unwrap();
    fs::OpenOptions::new().append(true).open(&q).unwrap().write_all(b"b").unwrap();
    assert_eq!(fs::read(&q).unwrap(), b"ab");
    m.stop();
}

/// Prepare files with set-user/group-ID bits in `dir` (as root), let uid 1000 (no
/// supplementary groups) append to them and truncate one, and return what `stat` shows right
/// after each change, one "name mode" line each.
fn set_id_changes(dir: &Path) -> String {
    use std::os::unix::fs::chown;
    let files = [
        ("suid", 0o4755, 1000),
        ("sgid_other_group", 0o2767, 0),
        ("sgid_own_group", 0o2767, 1000),
        ("sgid_group_exec", 0o2777, 1000),
        ("trunc_other_group", 0o2767, 0),
        ("falloc_suid", 0o4755, 1000),
        ("punch_other_group", 0o2767, 0),
        ("zero_own_group", 0o2767, 1000),
    ];
    for (name, mode, gid) in files {
        let p = dir.join(name);
        fs::write(&p, b"x\n").unwrap();
        chown(&p, Some(1000), Some(gid)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let script = "for f in suid sgid_other_group sgid_own_group sgid_group_exec; do \
                  echo more >> $f && stat -c \"$f %a\" $f; done; \
                  truncate -s 1 trunc_other_group && stat -c \"trunc_other_group %a\" trunc_other_group; \
                  fallocate -l 8192 falloc_suid && stat -c \"falloc_suid %a\" falloc_suid; \
                  fallocate -p -o 0 -l 1 punch_other_group && stat -c \"punch_other_group %a\" punch_other_group; \
                  fallocate -z -o 0 -l 1 zero_own_group && stat -c \"zero_own_group %a\" zero_own_group";
    ok(cmd("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .current_dir(dir))
}

#[test]
fn writes_drop_set_id_bits_as_ext4_does_and_stat_shows_it_at_once() {
    require_base();
    require("setpriv", "util-linux");
    require("stat", "coreutils");
    let m = Mounted::new();
    // uid 1000 must reach the mount: the test's directory is private.
    fs::set_permissions(m.mnt.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    let got = set_id_changes(&m.mnt);
    // What ext4 does on Linux 6.18 (checked on a loop-mounted image, below when possible): a
    // write, truncate or fallocate (xfstests generic/683-685) by a caller without CAP_FSETID
    // drops set-user-ID, and set-group-ID
    // when the group may execute or the caller is not in the file's group. stat right after
    // the write shows it (the kernel's attribute cache once showed the old mode for a second).
    let want = "suid 755\nsgid_other_group 767\nsgid_own_group 2767\nsgid_group_exec 777\n\
                trunc_other_group 767\nfalloc_suid 755\npunch_other_group 767\nzero_own_group 2767\n";
    assert_eq!(got, want, "modes after unprivileged writes on winefs");
    // Root (CAP_FSETID) keeps them.
    let p = m.path("root_suid");
    fs::write(&p, b"x").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o4755)).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o4755);
    if let Some(ext4) = on_ext4(set_id_changes) {
        assert_eq!(got, ext4, "winefs and ext4 differ");
    }
}

/// What `run` prints when run in a fresh ext4 file system on a loop-mounted image (reachable
/// by every user), or None when no loop device can be had here.
fn on_ext4(run: impl Fn(&Path) -> String) -> Option<String> {
    on_ext4_of(32 << 20, &[], run)
}

/// [`on_ext4`] on an image of `size` bytes made with `mkfs.ext4 -q ARGS`.
fn on_ext4_of(size: u64, args: &[&str], run: impl Fn(&Path) -> String) -> Option<String> {
    require("mkfs.ext4", "e2fsprogs");
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let img = tmp.path().join("ext4.img");
    let dir = tmp.path().join("ext4");
    fs::create_dir(&dir).unwrap();
    File::create(&img).unwrap().set_len(size).unwrap();
    ok(cmd("mkfs.ext4").arg("-q").args(args).arg(&img));
    let mounted = run_timeout(
        cmd("mount").args(["-o", "loop"]).arg(&img).arg(&dir),
        CMD_WAIT,
    );
    if !mounted.status.success() {
        eprintln!(
            "skipping the ext4 comparison: cannot loop-mount an image here ({})",
            String::from_utf8_lossy(&mounted.stderr).trim()
        );
        return None;
    }
    let out = run(&dir);
    umount(&dir);
    Some(out)
}

/// `tests/data/edgediff.py`: 229 edge cases of POSIX calls (its docstring lists them) answer
/// on the mount as on ext4 (a loop device), line for line. It found stop 57's three faults: a
/// removed working directory answered ESTALE, a time before the epoch with nanoseconds was
/// stored up to a second early, and `chown(f, -1, -1)` left ctime and set-ID bits alone.
#[test]
fn edge_cases_of_posix_calls_answer_as_on_ext4() {
    require("python3", "python3");
    let mut m = Mounted::new();
    // Checks run as other users (uid 65534 and 1000) too: the mount must be reachable.
    fs::set_permissions(m.mnt.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/edgediff.py");
    let run = |dir: &Path| ok(cmd("python3").arg(&script).arg(dir));
    let got = run(&m.mnt);
    assert!(got.lines().count() > 150, "edgediff.py stopped early:\n{got}");
    // 4 KiB blocks, as winefs's (a small image would get 1 KiB ones: shorter symlink targets).
    if let Some(ext4) = on_ext4_of(128 << 20, &["-b", "4096"], run) {
        let differ = common::transcript_differences(("ext4:  ", &ext4), ("winefs:", &got));
        assert!(differ.is_empty(), "winefs and ext4 differ:\n{}", differ.join("\n"));
    }
    m.remount(); // fsck clean
    m.stop();
}

/// setfacl and getfacl's tour: access and default ACLs on a directory, what files and
/// directories made in it inherit (with the umask ignored), chmod's rewrite of the mask,
/// `setfacl -b` and an ACL equal to the mode (stored as the mode alone), removing what is not
/// there, a default ACL on a file (refused), and the kernel enforcing an ACL for another user
/// (uid 65534) beyond the mode bits. Returns the transcript; `dir` must be reachable by all.
fn acl_tour(dir: &Path) -> String {
    let script = r#"
        umask 077
        mkdir d && setfacl -m u:65534:rwx,g::r-x d && getfacl -cn d
        setfacl -d -m u:65534:rw,g::rx,o::- d && getfacl -cn d
        touch d/f && mkdir d/sub && mknod d/p p && getfacl -cn d/f d/sub d/p
        stat -c '%A %n' d/f d/sub d/p
        chmod 640 d/f && getfacl -cn d/f
        setfacl -b d/f && getfacl -cn d/f && stat -c '%A %n' d/f
        setfacl -m u::rw,g::r,o::r d/f && stat -c '%A %n' d/f && getfattr -m - -d d/f
        setfacl -x u:65534 d && getfacl -cn d
        setfacl -k d && getfacl -cn d && setfacl -k d && echo removed-twice
        setfacl -d -m u:65534:r d/f 2>&1 || echo refused
        setfattr -x system.posix_acl_access d/f && echo removed-absent
        echo secret > g && chmod 600 g && setfacl -m u:65534:r g
        setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'cat g; echo x >> g || echo no-write' 2>&1
        chmod 600 g && getfacl -cn g
        setpriv --reuid=65534 --regid=65534 --clear-groups cat g 2>&1 || echo no-read
        getfattr -m - -d g d
    "#;
    ok(cmd("sh").args(["-c", script]).current_dir(dir))
}

/// `ls -l` of files the kernel holds asks the daemon nothing about them the second time: a
/// READDIRPLUS gives such files by name alone, so the kernel keeps the ACLs it cached (linked
/// again, it forgets them, and every listing asked for every file's ACL). The listing stays
/// right across an ACL change, a new file under an old name and dropped caches.
#[test]
fn listing_again_keeps_what_the_kernel_holds_of_its_files() {
    require_base();
    require("setfacl", "acl");
    let mut m = Mounted::new();
    m.stop();
    m.env.push(("RUST_LOG", "fuser::request=debug"));
    m.start();
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    for i in 0..40 {
        fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    ok(cmd("setfacl").args(["-m", "u:65534:r"]).arg(d.join("f7")));
    let ls = || ok(cmd("ls").arg("-ln").arg(&d));
    let line = |listing: &str, name: &str| {
        let l = listing.lines().find(|l| l.ends_with(&format!(" {name}")));
        l.unwrap_or_else(|| panic!("no {name} in:\n{listing}")).to_string()
    };
    // Requests about the listed files in the daemon's log since `from`.
    let asked = |m: &Mounted, from: usize| {
        let log = m.daemon_log();
        let since = &log[from..];
        let n = |what: &str| since.lines().filter(|l| l.contains(what)).count();
        (n("GETXATTR name \"system.posix_acl_access\""), n(" LOOKUP "), since.to_string())
    };
    let first = ls();
    let from = m.daemon_log().len();
    let second = ls();
    assert_eq!(second, first);
    let (acls, lookups, log) = asked(&m, from);
    assert_eq!((acls, lookups), (0, 0), "the second listing asked for ACLs or names:\n{log}");
    assert!(line(&second, "f7").starts_with("-rw-r--r--+"), "{second}");
    assert!(line(&second, "f8").starts_with("-rw-r--r-- "), "{second}");

    // Changes through the mount show in the next listing.
    ok(cmd("setfacl").arg("-b").arg(d.join("f7")));
    fs::remove_file(d.join("f8")).unwrap();
    fs::write(d.join("f8"), b"yy").unwrap();
    ok(cmd("setfacl").args(["-m", "u:65534:rw"]).arg(d.join("f8")));
    let third = ls();
    assert!(line(&third, "f7").starts_with("-rw-r--r-- "), "{third}");
    let f8 = line(&third, "f8");
    assert!(f8.starts_with("-rw-rw-r--+") && f8.contains(" 2 "), "{third}");
    // The kernel drops what it holds (FORGET): the next listing links the files again.
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    assert_eq!(ls(), third);
    assert_eq!(ls(), third);
    m.stop();
    fsck_clean(&m.pool);
}

#[test]
fn posix_acls_behave_as_on_ext4_and_stay_after_a_remount() {
    require_base();
    require("setfacl", "acl");
    require("setfattr", "attr");
    require("setpriv", "util-linux");
    let mut m = Mounted::new();
    fs::set_permissions(m.mnt.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    let got = acl_tour(&m.mnt);
    // What must hold whatever ext4 says: inheritance (the umask 077 ignored under a default
    // ACL), chmod narrowing the mask, and uid 65534 reading a mode-600 file by its ACL entry.
    for want in [
        "user::rw-\nuser:65534:rw-\ngroup::r-x\t#effective:r--\nmask::rw-\nother::---",
        "-rw-rw---- d/f\ndrwxrwx--- d/sub\nprw-rw---- d/p",
        "user:65534:rw-\t#effective:r--\ngroup::r-x\t#effective:r--\nmask::r--",
        "-rw-r--r-- d/f",
        "secret\nsh: 1: cannot create g: Permission denied\nno-write",
        "cat: g: Permission denied\nno-read",
    ] {
        assert!(got.contains(want), "missing {want:?} in:\n{got}");
    }
    let listing = |m: &Mounted| ok(cmd("getfacl").args(["-Rn", "."]).current_dir(&m.mnt));
    // A named entry refusing what the mode's others class allows.
    let h = m.path("h");
    fs::write(&h, b"x").unwrap();
    fs::set_permissions(&h, fs::Permissions::from_mode(0o644)).unwrap();
    ok(cmd("setfacl").args(["-m", "u:65534:---"]).arg(&h));
    let read_as_65534 = |h: &Path| {
        run_timeout(
            cmd("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"]).arg(h),
            CMD_WAIT,
        )
        .status
        .success()
    };
    assert!(!read_as_65534(&h), "the ACL entry refuses uid 65534");
    let before = listing(&m);
    m.remount();
    assert_eq!(listing(&m), before, "ACLs after a remount");
    assert!(!read_as_65534(&h), "the ACL entry refuses uid 65534 after a remount");
    // Mounted --noacl (ext4's noacl): ACLs are refused and not enforced, but kept in the pool.
    m.stop();
    m.args = vec!["--noacl"];
    m.start();
    let out = run_timeout(cmd("setfacl").args(["-m", "u:65534:r"]).arg(&h), CMD_WAIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Operation not supported"), "{err}");
    assert!(read_as_65534(&h), "without ACLs the mode (0644) lets uid 65534 read");
    // A file made there under a default ACL takes the umask and no ACL, as on ext4 `noacl`.
    ok(cmd("sh").args(["-c", "umask 022 && touch d/sub/n"]).current_dir(&m.mnt));
    m.stop();
    m.args = Vec::new();
    m.start();
    let n = ok(cmd("getfacl").args(["-cn", "d/sub/n"]).current_dir(&m.mnt));
    assert_eq!(n, "user::rw-\ngroup::r--\nother::r--\n\n", "a file made on a noacl mount");
    fs::remove_file(m.path("d/sub/n")).unwrap();
    assert_eq!(listing(&m), before, "ACLs after a mount without them");
    m.stop();
    if let Some(ext4) = on_ext4(acl_tour) {
        assert_eq!(got, ext4, "winefs and ext4 differ");
    }
}

#[test]
fn fallocate_zero_range_through_the_mount() {
    use libc::{
        FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE,
    };
    use winefs::sys::fallocate_mode;
    let mut m = Mounted::new();
    let mut want = pseudo_random(9, 3 << 20);
    fs::write(m.path("z"), &want).unwrap();
    let f = File::options()
        .read(true)
        .write(true)
        .open(m.path("z"))
        .unwrap();
    // Read first, so the kernel's page cache holds the old bytes it must drop.
    assert_bytes(&m.path("z"), &want);
    fallocate_mode(&f, FALLOC_FL_ZERO_RANGE, 1000, 70_000).unwrap();
    want[1000..71_000].fill(0);
    assert_bytes(&m.path("z"), &want);
    fallocate_mode(
        &f,
        FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
        (3 << 20) - 10,
        5000,
    )
    .unwrap();
    want[(3 << 20) - 10..].fill(0);
    assert_bytes(&m.path("z"), &want);
    fallocate_mode(&f, FALLOC_FL_ZERO_RANGE, 3 << 20, 4096).unwrap();
    want.resize((3 << 20) + 4096, 0);
    assert_bytes(&m.path("z"), &want);
    // Collapse and insert: the kernel's FUSE client refuses them itself (Linux 6.18); should a
    // kernel pass them on, the daemon serves them, and the bytes must be right.
    match fallocate_mode(&f, FALLOC_FL_COLLAPSE_RANGE, 0, 1 << 20) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        Ok(()) => {
            want.drain(..1 << 20);
            assert_bytes(&m.path("z"), &want);
        }
    }
    match fallocate_mode(&f, FALLOC_FL_INSERT_RANGE, 0, 1 << 20) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        Ok(()) => {
            want.splice(..0, std::iter::repeat_n(0, 1 << 20));
            assert_bytes(&m.path("z"), &want);
        }
    }
    drop(f);
    m.stop(); // fsck clean
}

/// `winefs stat` of a live mount: the writes made through it are counted (the caller's bytes,
/// and at least as many stored), by mount point and by pool file; after unmount it refuses with
/// one line.
#[test]
fn stat_reports_the_write_accounting_of_a_live_mount() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::new();
    let f = File::create(m.path("acc")).unwrap();
    let block = pseudo_random(3, 4096);
    for i in 0..64u64 {
        f.write_all_at(&block, i * 4096).unwrap();
    }
    for i in 0..16u64 {
        f.write_all_at(&block[..512], i * 8192 + 100).unwrap();
    }
    drop(f);
    fs::write(m.path("other"), b"x").unwrap();
    let json = ok(Command::new(BIN).args(["stat", "--json"]).arg(&m.pool));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let op = |name: &str| {
        v["ops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["op"] == name)
            .unwrap_or_else(|| panic!("no {name} row in {json}"))
            .clone()
    };
    let w = op("write");
    let user = 64 * 4096 + 16 * 512 + 1;
    assert_eq!(w["user_bytes"], user, "{json}");
    assert!(w["ops"].as_u64().unwrap() >= 81, "{json}");
    let stored: u64 = w["bytes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b[0] != "metadata" && b[0] != "journal")
        .map(|b| b[1].as_u64().unwrap())
        .sum();
    assert!(stored >= user, "file bytes stored {stored} < written {user}: {json}");
    assert!(op("create")["bytes"][1][1].as_u64().unwrap() > 0, "{json}");
    // The table by mount point names the same rows.
    let table = ok(Command::new(BIN).arg("stat").arg(&m.mnt));
    assert!(table.contains("| write ") && table.contains("| pool total |"), "{table}");
    m.stop();
    let out = run_timeout(Command::new(BIN).arg("stat").arg(&m.pool), CMD_WAIT);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("only while a pool is mounted"), "{err}");
}

/// The kernel keeps attributes, entries and missing names for an hour (`fuse::TTL`): every
/// change made through the mount must still show at once, past the old one-second cache too.
#[test]
fn long_cached_metadata_follows_every_change() {
    use std::os::unix::fs::symlink;
    let mut m = Mounted::new();
    let gone = |rel: &str| {
        let e = fs::symlink_metadata(m.path(rel)).expect_err(rel);
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{rel}: {e}");
    };
    // Missing names, cached as missing, then made by each kind of request.
    for rel in ["file", "dir", "link", "sym", "moved"] {
        gone(rel);
    }
    // Older than any one-second cache.
    thread::sleep(Duration::from_millis(1200));
    fs::write(m.path("file"), b"abc").unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    fs::hard_link(m.path("file"), m.path("link")).unwrap();
    symlink("file", m.path("sym")).unwrap();
    fs::write(m.path("src"), b"12345").unwrap();
    fs::rename(m.path("src"), m.path("moved")).unwrap();
    gone("src");
    assert_eq!(fs::metadata(m.path("file")).unwrap().nlink(), 2);
    assert!(fs::metadata(m.path("dir")).unwrap().is_dir());
    assert_eq!(fs::read_link(m.path("sym")).unwrap(), Path::new("file"));
    assert_eq!(fs::metadata(m.path("moved")).unwrap().len(), 5);
    thread::sleep(Duration::from_millis(1200));
    // A link dropped by another name, and a rename over the other link: the surviving inode's
    // link count and ctime come from the daemon, not a stale copy.
    let before = fs::symlink_metadata(m.path("file")).unwrap();
    fs::remove_file(m.path("link")).unwrap();
    let after = fs::symlink_metadata(m.path("file")).unwrap();
    assert_eq!(after.nlink(), 1);
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "ctime {} after unlinking another name, was {}",
        after.ctime(),
        before.ctime()
    );
    gone("link");
    fs::hard_link(m.path("moved"), m.path("second")).unwrap();
    fs::rename(m.path("file"), m.path("second")).unwrap();
    assert_eq!(fs::metadata(m.path("moved")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.path("second")).unwrap(), b"abc");
    gone("file");
    // A name removed comes back as a new inode with its own attributes.
    fs::remove_file(m.path("moved")).unwrap();
    gone("moved");
    fs::write(m.path("moved"), b"xy").unwrap();
    assert_eq!(fs::metadata(m.path("moved")).unwrap().len(), 2);
    // An extended attribute changes ctime; chmod and truncate show at once.
    let before = fs::symlink_metadata(m.path("second")).unwrap();
    thread::sleep(Duration::from_millis(20));
    setfattr(&m.path("second"), "user.k", Some("v"));
    let after = fs::symlink_metadata(m.path("second")).unwrap();
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "ctime after setxattr"
    );
    fs::set_permissions(m.path("second"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.path("second")).unwrap().mode() & 0o7777, 0o600);
    File::options().write(true).open(m.path("second")).unwrap().set_len(10_000).unwrap();
    assert_eq!(fs::metadata(m.path("second")).unwrap().len(), 10_000);
    // Removing a directory and making a file by its name.
    fs::remove_dir(m.path("dir")).unwrap();
    fs::write(m.path("dir"), b"now a file").unwrap();
    assert!(fs::metadata(m.path("dir")).unwrap().is_file());
    m.stop(); // fsck clean
}

/// What the kernel cached answers without the daemon: with it stopped (SIGSTOP), `stat` of files
/// and of a missing name seen more than a second ago (the old cache's life) returns at once.
#[test]
fn cached_names_and_attributes_answer_while_the_daemon_is_stopped() {
    let mut m = Mounted::new();
    fs::create_dir(m.path("d")).unwrap();
    for i in 0..50 {
        fs::write(m.path(&format!("d/f{i}")), vec![7u8; i]).unwrap();
    }
    let missing = m.path("d/missing");
    assert!(fs::symlink_metadata(&missing).is_err());
    for i in 0..50 {
        fs::symlink_metadata(m.path(&format!("d/f{i}"))).unwrap();
    }
    thread::sleep(Duration::from_millis(1500));
    let pid = m.daemon.as_ref().unwrap().id().to_string();
    ok(cmd("kill").args(["-STOP", &pid]));
    // `stat` in a child killed after 10 s: a request to the stopped daemon would hang it.
    let mut probe = Command::new("timeout");
    probe.args(["-s", "KILL", "10", "stat", "-c", "%s"]);
    for i in 0..50 {
        probe.arg(m.path(&format!("d/f{i}")));
    }
    probe.arg(&missing);
    let out = run_timeout(&mut probe, 30);
    ok(cmd("kill").args(["-CONT", &pid]));
    let sizes: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    let want: Vec<String> = (0..50).map(|i| i.to_string()).collect();
    assert_eq!(sizes, want, "stat with the daemon stopped: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && err.contains("No such file or directory"),
        "the missing name, with the daemon stopped: {out:?}"
    );
    m.stop(); // fsck clean
}

/// Which file a handle opens, by its content and inode number.
fn open_handle(m: &Mounted, h: &winefs::sys::FileHandle) -> std::io::Result<(Vec<u8>, u64)> {
    let root = File::open(&m.mnt).unwrap();
    let mut f = winefs::sys::open_by_handle(&root, h)?;
    let ino = f.metadata().unwrap().ino();
    let mut data = Vec::new();
    if f.metadata().unwrap().is_file() {
        f.read_to_end(&mut data).unwrap();
    }
    Ok((data, ino))
}

fn drop_kernel_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (root)");
}

/// File handles, as an NFS server uses them: they open the same file after the kernel dropped
/// its caches, across a rename, an unmount and remount and a `kill -9` of the daemon; a handle
/// of a file that is gone, or whose inode number a new file took, gives ESTALE.
#[test]
fn file_handles_outlive_caches_remounts_and_kill_9_and_go_stale_on_reuse() {
    use winefs::sys::file_handle;
    let mut m = Mounted::new();
    fs::create_dir(m.path("d")).unwrap();
    fs::create_dir(m.path("e")).unwrap();
    let a_data = pseudo_random(1, 10_000);
    fs::write(m.path("a"), &a_data).unwrap();
    fs::write(m.path("d/b"), b"bee").unwrap();
    let ino = |rel: &str| fs::metadata(m.path(rel)).unwrap().ino();
    let (a_ino, b_ino, d_ino) = (ino("a"), ino("d/b"), ino("d"));
    let ha = file_handle(&m.path("a")).unwrap();
    let hb = file_handle(&m.path("d/b")).unwrap();
    let hd = file_handle(&m.path("d")).unwrap();
    let check = |m: &Mounted, when: &str| {
        let open = |h, what| open_handle(m, h).unwrap_or_else(|e| panic!("{when}: {what}: {e}"));
        assert_eq!(open(&ha, "a"), (a_data.clone(), a_ino), "{when}");
        assert_eq!(open(&hb, "b"), (b"bee".to_vec(), b_ino), "{when}");
        assert_eq!(open(&hd, "d").1, d_ino, "{when}");
    };
    check(&m, "mounted");
    // A handle names the file, not its path.
    fs::rename(m.path("d/b"), m.path("e/b")).unwrap();
    drop_kernel_caches();
    check(&m, "after dropping the kernel's caches");
    m.remount();
    check(&m, "after unmount and mount");
    m.crash();
    m.start();
    check(&m, "after kill -9 and mount");
    // Gone: ESTALE, from a fresh kernel view too.
    fs::remove_file(m.path("e/b")).unwrap();
    // The daemon frees an unlinked inode when the kernel forgets it, and the kernel sends that
    // after the unlink, in the background: until then the handle still opens the file (as on
    // ext4 while the inode is in use), so ESTALE is waited for, up to a bound.
    let stale = |m: &Mounted, h: &winefs::sys::FileHandle, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let e = loop {
            match open_handle(m, h) {
                Err(e) => break e,
                Ok(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(got) => panic!("{what}: still opens 10 s after the unlink: {got:?}"),
            }
        };
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{what}: {e}");
    };
    stale(&m, &hb, "an unlinked file");
    drop_kernel_caches();
    stale(&m, &hb, "an unlinked file, caches dropped");
    // Reused: a new file takes a's inode number; a's handle must not open it.
    fs::remove_file(m.path("a")).unwrap();
    // A create takes the lowest free number of the partition of the CPU that serves it (over
    // io_uring, the CPU the request was made on): the creates are spread over every CPU.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut reused = None;
    for i in 0..200 {
        let p = m.path(&format!("n{i}"));
        let cpu = (i % cpus).to_string();
        ok(cmd("taskset").args(["-c", &cpu, "sh", "-c", "printf new > \"$1\"", "sh"]).arg(&p));
        if fs::metadata(&p).unwrap().ino() == a_ino {
            reused = Some(p);
            break;
        }
    }
    let reused = reused.expect("no new file took the freed inode number in 200 creates");
    let hn = file_handle(&reused).unwrap();
    assert_ne!(hn, ha, "a reused inode number must carry a new generation");
    stale(&m, &ha, "a reused inode number");
    m.remount();
    stale(&m, &ha, "a reused inode number, after remount");
    assert_eq!(open_handle(&m, &hn).unwrap(), (b"new".to_vec(), a_ino));
    m.stop(); // fsck clean
}

/// A running NFS-Ganesha exporting a directory over NFSv3 on 127.0.0.1 (its VFS backend, which
/// keeps file handles of the exported file system), stopped on drop.
struct Ganesha {
    child: Child,
    log: PathBuf,
    /// rpcbind, when this test had to start it.
    started_rpcbind: bool,
}

/// Ports the test's NFS server listens on (not the standard ones, which a system NFS server
/// may hold).
const NFS_PORT: u16 = 20049;
const MOUNTD_PORT: u16 = 20048;

impl Ganesha {
    fn export(dir: &Path, work: &Path) -> Ganesha {
        require("ganesha.nfsd", "nfs-ganesha");
        require("nfs-cp", "libnfs-utils");
        require("rpcinfo", "rpcbind");
        // Whether a command exits 0 (its output thrown away).
        let succeeds = |c: &mut Command| {
            c.stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        assert!(
            succeeds(Command::new("sh").args(["-c", "ls /usr/lib/*/ganesha/libfsalvfs.so"])),
            "NFS-Ganesha's VFS backend is not installed: apt-get install nfs-ganesha-vfs"
        );
        // NFSv3 finds the server's ports through rpcbind.
        let rpcbind_up = || succeeds(Command::new("rpcinfo").args(["-p", "127.0.0.1"]));
        let started_rpcbind = !rpcbind_up();
        if started_rpcbind {
            ok(cmd("rpcbind").arg("-w"));
            let t = Instant::now();
            while !rpcbind_up() {
                assert!(t.elapsed() < MOUNT_WAIT, "rpcbind did not start");
                thread::sleep(Duration::from_millis(100));
            }
        }
        for d in ["/var/run/ganesha", "/var/lib/nfs/ganesha"] {
            fs::create_dir_all(d).unwrap();
        }
        let conf = work.join("ganesha.conf");
        fs::write(
            &conf,
            format!(
                "NFS_CORE_PARAM {{ Protocols = 3; NFS_Port = {NFS_PORT}; MNT_Port = {MOUNTD_PORT}; \
                 Bind_addr = 127.0.0.1; Enable_NLM = false; Enable_RQUOTA = false; }}\n\
                 NFSV4 {{ Graceless = true; }}\n\
                 EXPORT {{ Export_Id = 1; Path = {}; Pseudo = /winefs; Access_Type = RW; \
                 Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys; \
                 FSAL {{ Name = VFS; }} }}\n\
                 LOG {{ Default_Log_Level = EVENT; }}\n",
                dir.display()
            ),
        )
        .unwrap();
        let log = work.join("ganesha.log");
        let child = Command::new("ganesha.nfsd")
            .arg("-F")
            .arg("-f")
            .arg(&conf)
            .arg("-L")
            .arg(&log)
            .arg("-p")
            .arg(work.join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ganesha.nfsd");
        let mut g = Ganesha {
            child,
            log,
            started_rpcbind,
        };
        // Serving once a listing of the export works.
        let t = Instant::now();
        loop {
            if let Ok(Some(status)) = g.child.try_wait() {
                panic!("ganesha.nfsd exited ({status}); its log ends:\n{}", g.log_tail());
            }
            let out = run_timeout(Command::new("nfs-ls").arg(g.url(dir, "")), CMD_WAIT);
            if out.status.success() {
                return g;
            }
            if t.elapsed() > Duration::from_secs(60) {
                // Another NFS server registered with rpcbind would take the test's requests.
                let registered = run_timeout(cmd("rpcinfo").args(["-p", "127.0.0.1"]), CMD_WAIT);
                panic!(
                    "NFS-Ganesha did not serve {} within 60 s (it should listen on port \
                     {NFS_PORT}): {}\nrpcbind lists:\n{}\nits log ends:\n{}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr),
                    String::from_utf8_lossy(&registered.stdout),
                    g.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(500));
        }
    }

    /// The libnfs URL of `rel` in the export of `dir`.
    fn url(&self, dir: &Path, rel: &str) -> String {
        format!("nfs://127.0.0.1{}/{rel}", dir.display())
    }

    fn log_tail(&self) -> String {
        let all = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = all.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = cmd("kill").arg(self.child.id().to_string()).status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.started_rpcbind {
            let _ = cmd("pkill").args(["-x", "rpcbind"]).status();
        }
    }
}

/// The mount exported over NFS by a real server (NFS-Ganesha's VFS backend, which names files by
/// the kernel's file handles of the FUSE mount) and used by a user-space client (libnfs):
/// files copied in arrive byte for byte on the mount, files written on the mount copy out the
/// same, after the kernel dropped its caches too, and the pool checks clean.
#[test]
fn nfs_export_through_ganesha_copies_files_in_and_out() {
    let mut m = Mounted::new();
    let work = tempfile::tempdir().unwrap();
    fs::create_dir(m.path("in")).unwrap();
    let sizes = [0usize, 100, 16_000, 3_000_000, 9 << 20];
    let mut local = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let p = work.path().join(format!("src{i}"));
        fs::write(&p, pseudo_random(100 + i as u64, n)).unwrap();
        local.push(p);
    }
    let out_data = pseudo_random(7, 5 << 20);
    fs::write(m.path("made-here"), &out_data).unwrap();
    let g = Ganesha::export(&m.mnt, work.path());
    for (i, p) in local.iter().enumerate() {
        ok(Command::new("nfs-cp").arg(p).arg(g.url(&m.mnt, &format!("in/f{i}"))));
        assert_bytes(&m.path(&format!("in/f{i}")), &fs::read(p).unwrap());
    }
    let listing = ok(Command::new("nfs-ls").arg(g.url(&m.mnt, "in")));
    for i in 0..sizes.len() {
        assert!(listing.contains(&format!("f{i}")), "f{i} missing from {listing}");
    }
    for round in 0..2 {
        let back = work.path().join(format!("back{round}"));
        let _ = fs::remove_file(&back);
        ok(Command::new("nfs-cp").arg(g.url(&m.mnt, "made-here")).arg(&back));
        assert_bytes(&back, &out_data);
        let back3 = work.path().join(format!("back3-{round}"));
        ok(Command::new("nfs-cp").arg(g.url(&m.mnt, "in/f3")).arg(&back3));
        assert_bytes(&back3, &fs::read(&local[3]).unwrap());
        // The server's handles must work when the kernel no longer caches the inodes.
        drop_kernel_caches();
    }
    drop(g);
    m.stop(); // fsck clean
}

/// `--writeback-cache` (relaxed mounts only): the kernel caches writes and sends them later, so
/// what fsync made durable — bytes, size and the kernel's mtime — survives `kill -9` of the
/// daemon; bytes written after it may or may not, but never tear what was synced.
#[test]
fn writeback_cache_keeps_fsynced_data_size_and_mtime_through_kill_9() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::new();
    // Strict mode promises durability when write(2) returns: no writeback cache there.
    let out = run_timeout(
        Command::new(BIN)
            .arg("mount")
            .arg("--writeback-cache")
            .arg(&m.pool)
            .arg(&m.mnt),
        CMD_WAIT,
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--relaxed"), "{out:?}");
    m.stop();
    m.args = vec!["--relaxed", "--writeback-cache"];
    m.start();
    let mut want = pseudo_random(11, (3 << 20) + 1234);
    let mut f = File::create(m.path("wb")).unwrap();
    for piece in want.chunks(4096) {
        f.write_all(piece).unwrap();
    }
    f.sync_all().unwrap();
    f.write_all_at(&[0xab; 100], 1 << 20).unwrap();
    want[1 << 20..(1 << 20) + 100].fill(0xab);
    f.sync_all().unwrap();
    let synced = f.metadata().unwrap();
    assert_eq!(synced.len(), want.len() as u64);
    // Cached, not synced, when the daemon dies.
    thread::sleep(Duration::from_millis(20));
    f.write_all_at(&[0xcd; 4096], want.len() as u64).unwrap();
    m.crash();
    drop(f);
    m.start();
    let got = fs::read(m.path("wb")).unwrap();
    assert!(
        got.len() == want.len() || got.len() == want.len() + 4096,
        "size {} after kill -9; synced {}",
        got.len(),
        want.len()
    );
    assert!(got[..want.len()] == want[..], "{}", first_difference(&got[..want.len()], &want));
    if got.len() > want.len() {
        assert!(got[want.len()..].iter().all(|&b| b == 0xcd), "the unsynced page tore");
    } else {
        let now = fs::metadata(m.path("wb")).unwrap();
        assert_eq!(
            (now.mtime(), now.mtime_nsec()),
            (synced.mtime(), synced.mtime_nsec()),
            "mtime after kill -9 is not what fsync made durable"
        );
    }
    m.stop(); // fsck clean
}

// ---------------------------------------------------------------------------------------------
// FUSE over io_uring (`--transport`). CI runs this file twice: with the kernel's default
// (`enable_uring` off) and with it on and `WINEFS_TRANSPORT=uring`, so every test above also
// runs on the io_uring transport; this test checks each transport does what it says.

/// The daemon's FUSE threads of one kind — the io_uring queue threads (`fuser-uring-N`) or the
/// `/dev/fuse` event loops (`fuser-N`) — : how many, their voluntary context switches (each wait
/// for a request that then comes is one) and their time on a CPU in nanoseconds.
fn fuse_threads(pid: u32, uring: bool) -> (usize, u64, u64) {
    let (mut threads, mut switches, mut cpu_ns) = (0, 0, 0);
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-") || comm.starts_with("fuser-uring-") != uring {
            continue;
        }
        threads += 1;
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let sched = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        cpu_ns += sched.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    (threads, switches, cpu_ns)
}

/// A new, empty file `p` opened for [`write_records`]: for reading and writing, and `O_DIRECT`,
/// so the kernel caches nothing and sends each `write(2)` as it comes.
fn records_file(p: &Path) -> File {
    File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap()
}

/// Write `n` records of 100 bytes, record `i` all `i as u8` at `i * 100`: through a direct-I/O
/// descriptor ([`records_file`]), each is one WRITE request.
fn write_records(f: &File, n: u64) {
    use std::os::unix::fs::FileExt;
    for i in 0..n {
        f.write_all_at(&[i as u8; 100], i * 100).unwrap();
    }
}

/// The last of `n` records written by [`write_records`] reads back.
fn assert_last_record(f: &File, n: u64) {
    use std::os::unix::fs::FileExt;
    let mut back = vec![0u8; 100];
    f.read_exact_at(&mut back, 100 * (n - 1)).unwrap();
    assert_eq!(back, vec![(n - 1) as u8; 100]);
}

/// Read a 1 MiB file of bytes, then a 1 MiB sparse file: the hole must read as zeros, though the
/// buffers replies are built in (reused, or a ring entry's payload) last held the bytes.
fn holes_read_as_zeros_after_data(m: &Mounted) {
    use std::os::unix::fs::FileExt;
    let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8 | 1).collect();
    fs::write(m.path("full"), &big).unwrap();
    assert_eq!(fs::read(m.path("full")).unwrap(), big);
    let f = File::create(m.path("sparse")).unwrap();
    f.set_len(1 << 20).unwrap();
    f.write_all_at(b"end", (1 << 20) - 3).unwrap();
    drop(f);
    let got = fs::read(m.path("sparse")).unwrap();
    assert_eq!(got.len(), 1 << 20);
    assert!(got[..(1 << 20) - 3].iter().all(|&b| b == 0), "a hole read back non-zero bytes");
    assert_eq!(&got[(1 << 20) - 3..], b"end");
    fs::remove_file(m.path("full")).unwrap();
    fs::remove_file(m.path("sparse")).unwrap();
}

#[test]
fn transport_uring_serves_requests_from_its_queues_or_is_refused_in_one_line() {
    let offered = fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|s| s.trim() == "Y");
    let mut m = Mounted::new();
    m.stop();

    // `dev` never registers queues, whatever the kernel offers.
    m.args = vec!["--transport", "dev"];
    m.start();
    assert_eq!(fuse_threads(m.pid(), true).0, 0, "{}", m.daemon_log());
    assert!(m.daemon_log().contains("requests travel by /dev/fuse"), "{}", m.daemon_log());
    fs::write(m.path("f"), b"by /dev/fuse").unwrap();
    holes_read_as_zeros_after_data(&m);
    m.stop();

    // `auto` follows the kernel's offer.
    m.args = vec!["--transport", "auto"];
    m.start();
    let want = if offered { "requests travel by FUSE over io_uring" } else { "requests travel by /dev/fuse" };
    assert!(m.daemon_log().contains(want), "enable_uring {offered}: {}", m.daemon_log());
    assert_eq!(fs::read(m.path("f")).unwrap(), b"by /dev/fuse");
    m.stop();

    if !offered {
        let mut c = mount_cmd(&m.pool, &m.mnt);
        c.args(["--transport", "uring"]);
        refused(&mut c, &m.mnt, "no FUSE over io_uring: the kernel did not offer FUSE over io_uring");
        fsck_clean(&m.pool);
        return;
    }

    // `uring`: one queue thread per possible CPU, and they serve the requests.
    m.args = vec!["--transport", "uring"];
    m.start();
    assert!(m.daemon_log().contains("requests travel by FUSE over io_uring"), "{}", m.daemon_log());
    let possible = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus = cpu_list(&possible).into_iter().max().unwrap() + 1;
    let (threads, _, uring_cpu) = fuse_threads(m.pid(), true);
    assert_eq!(threads, cpus, "queue threads vs possible CPUs ({possible})");
    // The event loops start once the mount is announced.
    let deadline = Instant::now() + MOUNT_WAIT;
    while fuse_threads(m.pid(), false).0 < 4 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let (loops, loop_switches, _) = fuse_threads(m.pid(), false);
    assert_eq!(loops, 4, "/dev/fuse event loops beside the queues (--threads 4)");
    // Every write(2) of a direct-I/O file is one WRITE request. Over /dev/fuse each would wake
    // an event loop; here the queue threads do the work and the event loops sleep on.
    let f = records_file(&m.path("g"));
    const WRITES: u64 = 400;
    write_records(&f, WRITES);
    let (_, loop_switches_after, _) = fuse_threads(m.pid(), false);
    let (_, _, uring_cpu_after) = fuse_threads(m.pid(), true);
    assert!(
        loop_switches_after - loop_switches < WRITES / 10,
        "{WRITES} writes woke the /dev/fuse event loops {} times: the requests did not go over io_uring",
        loop_switches_after - loop_switches
    );
    assert!(uring_cpu_after > uring_cpu, "the io_uring queue threads did not run");
    // Replies carry data (a 1 MiB read fills a ring payload) and errors.
    let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::write(m.path("big"), &big).unwrap();
    assert_eq!(fs::read(m.path("big")).unwrap(), big);
    assert_eq!(fs::read(m.path("missing")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    holes_read_as_zeros_after_data(&m);
    assert_last_record(&f, WRITES);
    drop(f);
    queue_threads_run_on_their_cpu_except_after_large_reads(&m);
    m.stop();
    // A daemon kept off a CPU (`taskset`) leaves that queue's thread on the CPUs it has, and
    // requests made there are answered all the same.
    let online = usable_cpus();
    if online.len() >= 2 && online[0] == 0 {
        m.cpus = Some("0");
        m.start();
        let log = m.daemon_log();
        assert!(log.contains("requests travel by FUSE over io_uring"), "{log}");
        // Requests from each CPU first: a queue thread places itself once it serves.
        for &cpu in &online {
            let path = m.path(&format!("from-cpu{cpu}"));
            append_lines_from(cpu, &path);
            assert_eq!(fs::read(&path).unwrap(), b"x\n".repeat(40));
        }
        for &cpu in &online {
            let list = thread_cpus(m.pid(), &format!("fuser-uring-{cpu}"));
            assert_eq!(list, "0", "queue of CPU {cpu}, daemon on CPU 0");
        }
        m.stop();
        m.cpus = None;
    }
    fsck_clean(&m.pool);
}

/// The CPU list (`Cpus_allowed_list`) in a `/proc` status file.
fn cpus_allowed(status: &Path) -> String {
    let status = fs::read_to_string(status).unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
    list.expect("Cpus_allowed_list").trim().to_string()
}

/// The CPUs this process may run on.
fn usable_cpus() -> Vec<usize> {
    cpu_list(&cpus_allowed(Path::new("/proc/self/status")))
}

/// A CPU list as the kernel writes it (`0-3,6`), as numbers.
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// The CPUs the thread named `name` of process `pid` may run on (`Cpus_allowed_list`).
fn thread_cpus(pid: u32, name: &str) -> String {
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        if fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim() == name {
            return cpus_allowed(&task.path().join("status"));
        }
    }
    panic!("no thread {name} in process {pid}");
}

/// Append a line to `path` 40 times from CPU `cpu` through a shell's `>>`: each is an OPEN, a
/// WRITE, a FLUSH and a RELEASE at least, all sent to that CPU's queue.
fn append_lines_from(cpu: usize, path: &Path) {
    let script = "i=0; while [ $i -lt 40 ]; do echo x >> \"$1\"; i=$((i+1)); done";
    ok(cmd("taskset").args(["-c", &cpu.to_string(), "sh", "-c", script, "sh"]).arg(path));
}

/// A queue thread runs on its queue's CPU; a stream of large reads (readahead) sends it to the
/// daemon's other CPUs, and a run of other requests brings it back (DESIGN "FUSE over
/// io_uring").
fn queue_threads_run_on_their_cpu_except_after_large_reads(m: &Mounted) {
    let online = cpu_list(&cpus_allowed(Path::new(&format!("/proc/{}/status", m.pid()))));
    assert_eq!(online, usable_cpus(), "the daemon may run where the test may");
    // Whatever the test sent before, a run of small requests on each queue pins its thread.
    for &cpu in &online {
        append_lines_from(cpu, &m.path(&format!("appended{cpu}")));
        assert_eq!(fs::read(m.path(&format!("appended{cpu}"))).unwrap(), b"x\n".repeat(40));
    }
    for &cpu in &online {
        let list = thread_cpus(m.pid(), &format!("fuser-uring-{cpu}"));
        assert_eq!(list, cpu.to_string(), "queue of CPU {cpu}");
    }
    if online.len() < 2 {
        return; // pinned and unpinned look alike
    }
    // A read-only open is cached, so reading a file no one has read yet is readahead: READs of
    // up to 1 MiB, sent to the queue of the reader's CPU, and nothing else for a while.
    let cpu = online[0];
    let data: Vec<u8> = (0..(32u32 << 20)).map(|i| b' ' + (i % 95) as u8).collect();
    fs::write(m.path("stream"), &data).unwrap();
    let read = ok(cmd("taskset").args(["-c", &cpu.to_string(), "cat"]).arg(m.path("stream")));
    assert_eq!(read.as_bytes(), data, "what cat read");
    let others: Vec<usize> = online.iter().copied().filter(|&c| c != cpu).collect();
    let after = thread_cpus(m.pid(), &format!("fuser-uring-{cpu}"));
    assert_eq!(cpu_list(&after), others, "queue of CPU {cpu} after readahead: {after}");
    append_lines_from(cpu, &m.path("appended"));
    let list = thread_cpus(m.pid(), &format!("fuser-uring-{cpu}"));
    assert_eq!(list, cpu.to_string(), "queue of CPU {cpu} after appends");
    assert_eq!(fs::read(m.path("stream")).unwrap(), data);
}

/// Mount with `/dev/fuse` and `threads` threads, write `WRITES` records back to back through a
/// direct-I/O descriptor (each one WRITE request) and count how often the daemon's `/dev/fuse`
/// threads slept meanwhile; up to three tries, for a machine busy with other tests, until one
/// stays below `below`. Returns the counts (the records are checked, the pool left clean).
fn back_to_back_sleeps(threads: &'static str, below: u64) -> Vec<u64> {
    const WRITES: u64 = 2000;
    let mut m = Mounted::new();
    m.stop();
    m.args = vec!["--transport", "dev", "--threads", threads];
    m.start();
    let f = records_file(&m.path("g"));
    // Warm up: threads that have waited in read(2) since the mount settle.
    write_records(&f, WRITES);
    let mut sleeps = Vec::new();
    for _ in 0..3 {
        let (loops, before, _) = fuse_threads(m.pid(), false);
        assert_eq!(loops.to_string(), threads, "--threads {threads}");
        write_records(&f, WRITES);
        let (_, after, _) = fuse_threads(m.pid(), false);
        sleeps.push(after - before);
        if after - before < below {
            break;
        }
    }
    assert_last_record(&f, WRITES);
    drop(f);
    m.stop();
    fsck_clean(&m.pool);
    sleeps
}

/// A `/dev/fuse` thread that has just answered reads on without sleeping for a moment
/// (`fuser::Config::dev_spin`, DESIGN "Reading on without sleeping"), so one caller's
/// back-to-back requests seldom wake it. Without that, every request is one wait for the next,
/// one voluntary context switch.
#[test]
fn a_dev_fuse_thread_answering_one_caller_reads_on_without_sleeping() {
    // One thread: no other one to wake for each request. Measured: 1-4 sleeps per 2,000 writes
    // with the spin; 699-2,000 without (when the caller is quicker than the thread's way back
    // to read(2), the request is there already).
    let sleeps = back_to_back_sleeps("1", 100);
    assert!(sleeps.iter().any(|&s| s < 100), "2,000 back-to-back writes: {sleeps:?} sleeps");
}

/// With several `/dev/fuse` threads, the ones not needed while another spins park off the
/// kernel's queue (`vendor/fuser/src/dev_park.rs`): the kernel wakes a thread blocked in
/// read(2) for every request it queues, even when the spinner takes it, so each of one caller's
/// requests cost the daemon a wake-up and a sleep more.
#[test]
fn dev_fuse_threads_not_needed_by_one_caller_stay_parked() {
    // Measured: 0-4 sleeps of the four threads per 2,000 writes with parking; 1,999-2,000
    // without (a thread in read(2) woken per request).
    let sleeps = back_to_back_sleeps("4", 500);
    assert!(sleeps.iter().any(|&s| s < 500), "2,000 back-to-back writes: {sleeps:?} sleeps");
}

#[test]
fn a_small_inode_cache_serves_every_file_unchanged() {
    // Four idle file states at most: the daemon drops and rebuilds states all through.
    let mut m = Mounted::new();
    m.stop();
    m.args = vec!["--cached-inodes", "4"];
    m.start();
    fs::create_dir(m.path("d")).unwrap();
    let content = |i: u64| pseudo_random(i, 100 + (i as usize * 997) % 20_000);
    for i in 0..60 {
        fs::write(m.path(&format!("d/f{i}")), content(i)).unwrap();
    }
    fs::hard_link(m.path("d/f3"), m.path("hard")).unwrap();
    for round in 0..2 {
        for i in 0..60 {
            assert_bytes(&m.path(&format!("d/f{i}")), &content(i));
        }
        assert_eq!(fs::metadata(m.path("hard")).unwrap().nlink(), 2, "round {round}");
    }
    // Appends to files whose states were dropped, a rename and an unlink among them.
    for i in (0..60).step_by(7) {
        let mut f = File::options().append(true).open(m.path(&format!("d/f{i}"))).unwrap();
        f.write_all(b"tail").unwrap();
    }
    fs::rename(m.path("d/f8"), m.path("moved")).unwrap();
    fs::remove_file(m.path("d/f9")).unwrap();
    m.stop();
    fsck_clean(&m.pool);
    m.args = Vec::new();
    m.start();
    for i in (0..60).filter(|&i| i != 8 && i != 9) {
        let mut want = content(i);
        if i % 7 == 0 {
            want.extend_from_slice(b"tail");
        }
        assert_bytes(&m.path(&format!("d/f{i}")), &want);
    }
    assert_bytes(&m.path("moved"), &content(8));
    assert!(!m.path("d/f9").exists());
    // Zero is not a cache size.
    let out = Command::new(BIN)
        .args(["mount", "--cached-inodes", "0"])
        .arg(&m.pool)
        .arg(m.path("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cached-inodes"));
}

/// Reads winefs has served on the mount of `m` (`winefs stat`: the live mount's counters).
fn reads_served(m: &Mounted) -> u64 {
    let json = ok(Command::new(BIN).args(["stat", "--json"]).arg(&m.pool));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ops = v["ops"].as_array().unwrap_or_else(|| panic!("no ops in {json}"));
    ops.iter()
        .find(|o| o["op"] == "read")
        .map_or(0, |o| o["ops"].as_u64().unwrap())
}

#[test]
fn pages_kept_from_one_open_to_the_next_show_every_change_made_through_the_kernel() {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::new();
    let p = m.path("kept");
    let mut want = pseudo_random(31, 200_000);
    fs::write(&p, &want).unwrap();
    // Each check reads through a new cached open, which keeps the pages the last one read.
    assert_bytes(&p, &want);
    // A direct-I/O write (an open for writing only), no cached open left.
    File::options().write(true).open(&p).unwrap().write_all_at(&[1; 5000], 4000).unwrap();
    want[4000..9000].fill(1);
    assert_bytes(&p, &want);
    // A write through a cached open for reading and writing, then a truncate.
    let rw = File::options().read(true).write(true).open(&p).unwrap();
    rw.write_all_at(&[2; 10], 50_000).unwrap();
    rw.set_len(150_000).unwrap();
    drop(rw);
    want[50_000..50_010].fill(2);
    want.truncate(150_000);
    assert_bytes(&p, &want);
    // A punched hole.
    ok(cmd("fallocate").args(["-p", "-o", "0", "-l", "8192"]).arg(&p));
    want[..8192].fill(0);
    assert_bytes(&p, &want);
    // A copy into the file (std::io::copy between files uses copy_file_range).
    let src = m.path("source");
    fs::write(&src, [3u8; 4096]).unwrap();
    let mut to = File::options().write(true).open(&p).unwrap();
    to.seek(SeekFrom::Start(20_000)).unwrap();
    std::io::copy(&mut File::open(&src).unwrap(), &mut to).unwrap();
    drop(to);
    want[20_000..24_096].fill(3);
    assert_bytes(&p, &want);
    m.stop(); // fsck clean
}

/// Read `buf.len()` bytes of `f` from its start five times: how many reads reached winefs.
fn reads_reaching_winefs(m: &Mounted, f: &File, buf: &mut [u8]) -> u64 {
    use std::os::unix::fs::FileExt;
    let before = reads_served(m);
    for _ in 0..5 {
        f.read_exact_at(buf, 0).unwrap();
    }
    reads_served(m) - before
}

#[test]
fn the_kernel_caches_file_data_nobody_stores_into_directly_and_every_write_still_lands() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::new();
    // With the direct path (the default), a file no direct-path client leases is cached too
    // (tests/preload.rs checks the leased ones): repeated reads stay in the kernel.
    let want = pseudo_random(21, (1 << 20) + 333);
    fs::write(m.path("d"), &want).unwrap();
    let f = File::open(m.path("d")).unwrap();
    let mut buf = vec![0u8; want.len()];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == want, "{}", first_difference(&buf, &want));
    assert_eq!(reads_reaching_winefs(&m, &f, &mut buf), 0, "cached reads reached winefs");
    drop(f);
    // The cache outlives the open: nothing stored into the file behind the kernel since.
    let f = File::open(m.path("d")).unwrap();
    let kept = reads_reaching_winefs(&m, &f, &mut buf);
    assert!(buf == want, "{}", first_difference(&buf, &want));
    assert_eq!(kept, 0, "a new open read again what the kernel had cached");
    drop(f);
    // So is an open for reading and writing (a database reading back its pages): its reads
    // stay in the kernel, its writes show at once through the cache and reach winefs before
    // write(2) returns (the daemon is killed -9 below).
    let mut want = want;
    let rw = File::options().read(true).write(true).open(m.path("d")).unwrap();
    let cached = reads_reaching_winefs(&m, &rw, &mut buf);
    assert_eq!(cached, 0, "cached reads of an O_RDWR open reached winefs");
    rw.write_all_at(&[0xa5; 3000], 4000).unwrap();
    want[4000..7000].fill(0xa5);
    rw.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == want, "{}", first_difference(&buf, &want));
    // O_DIRECT opts out, as on ext4: every read is a request.
    let direct = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("d"))
        .unwrap();
    let requests = reads_reaching_winefs(&m, &direct, &mut buf);
    assert!(buf == want, "{}", first_difference(&buf, &want));
    assert!(requests >= 5, "reads of an O_DIRECT open did not reach winefs");
    drop((rw, direct));
    m.crash();

    m.args = vec!["--no-direct"];
    m.start();
    assert_bytes(&m.path("d"), &want);
    let mut want = pseudo_random(22, (1 << 20) + 333);
    let w = File::create(m.path("c")).unwrap();
    w.write_all_at(&want, 0).unwrap();
    let r = File::open(m.path("c")).unwrap();
    r.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == want, "{}", first_difference(&buf, &want));
    // Read again and again: the kernel answers from its cache.
    assert_eq!(reads_reaching_winefs(&m, &r, &mut buf), 0, "cached reads reached winefs");
    // A write through another descriptor shows at once to the cached reader.
    w.write_all_at(&[0x5a; 5000], 70_000).unwrap();
    want[70_000..75_000].fill(0x5a);
    r.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == want, "{}", first_difference(&buf, &want));
    // So does a truncate.
    w.set_len(100_000).unwrap();
    want.truncate(100_000);
    let mut rest = Vec::new();
    File::open(m.path("c")).unwrap().read_to_end(&mut rest).unwrap();
    assert!(rest == want, "{}", first_difference(&rest, &want));
    let mut tail = [0u8; 10];
    assert_eq!(r.read_at(&mut tail, 100_000).unwrap(), 0, "read past the new end");
    // Strict mode: a write is durable when write(2) returns, cache or not.
    w.write_all_at(&[0xc3; 4096], 100_000).unwrap();
    want.extend_from_slice(&[0xc3; 4096]);
    drop((r, w));
    m.crash();
    m.args = Vec::new();
    m.start();
    assert_bytes(&m.path("c"), &want);
    m.stop(); // fsck clean
}
