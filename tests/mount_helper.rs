//! winefs as mount(8)'s helper: `mount -t winefs POOL DIR -o ...`, a line of an fstab file
//! (`mount -T FILE DIR`, as at boot), and the helper's argument form under its other name
//! (`mount.fuse.winefs`, for `-t fuse.winefs`). Options reach the mount (kernel flags in the
//! mount table, read-only, no-exec), mount(8)'s own are passed over, and a refused option or
//! a missing pool is one line with mount(8)'s exit status and nothing mounted.
//!
//! Runs as root with FUSE available; installs `/sbin/mount.winefs` (a link to this build) for
//! the test's duration and puts back what was there.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

/// Where mount(8) looks for the helpers: `-t winefs`, and `fuse.winefs` (the type in the
/// mount table, which a remount goes by).
const SBIN_HELPERS: [&str; 2] = ["/sbin/mount.winefs", "/sbin/mount.fuse.winefs"];

/// The helpers in /sbin pointing at this build while the guard lives.
struct HelperLinks {
    before: Vec<Option<PathBuf>>,
}

impl HelperLinks {
    fn install() -> HelperLinks {
        let before = SBIN_HELPERS.iter().map(|h| fs::read_link(h).ok()).collect();
        for h in SBIN_HELPERS {
            let _ = fs::remove_file(h);
            std::os::unix::fs::symlink(BIN, h)
                .unwrap_or_else(|e| panic!("link {h} (run as root): {e}"));
        }
        HelperLinks { before }
    }
}

impl Drop for HelperLinks {
    fn drop(&mut self) {
        for (h, before) in SBIN_HELPERS.iter().zip(&self.before) {
            let _ = fs::remove_file(h);
            if let Some(target) = before {
                let _ = std::os::unix::fs::symlink(target, h);
            }
        }
    }
}

/// One test at a time touches /sbin's helpers (the test harness runs tests in threads).
static SBIN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A mount that is unmounted (lazily, if need be) when the test ends, even by a panic.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_line(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The mountinfo line of the mount on `dir`, if there is one.
fn mount_line(dir: &Path) -> Option<String> {
    let dir = dir.to_str()?;
    fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(dir))
        .map(str::to_string)
}

/// The per-mount flags (mountinfo's sixth field) of the mount on `dir`.
fn mount_flags(dir: &Path) -> Vec<String> {
    let line = mount_line(dir).unwrap_or_else(|| panic!("{} is not mounted", dir.display()));
    line.split(' ').nth(5).unwrap().split(',').map(str::to_string).collect()
}

fn umount(dir: &Path) {
    let out = run(Command::new("umount").arg(dir));
    assert!(out.status.success(), "umount: {}", text(&out.stderr));
}

/// Run `program args`, waiting out the moment after an unmount in which the last daemon still
/// holds the pool (its lock goes when it has closed the pool: until then the pool is "in use").
fn retrying(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = run(Command::new(&program).args(args));
        if out.status.success() || !text(&out.stderr).contains("in use") || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`retrying`] `mount`.
fn mount_retrying(args: &[&str]) -> Output {
    retrying("mount", args)
}

fn fresh() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let pool = root.join("pool");
    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = run(Command::new(BIN).arg("mkfs").arg(&pool).args(["--size", "256M"]));
    assert!(out.status.success(), "mkfs: {}", text(&out.stderr));
    (dir, pool, mnt)
}

#[test]
fn mount_t_winefs_and_an_fstab_line_mount_the_pool() {
    let (dir, pool, mnt) = fresh();
    let _one = SBIN.lock().unwrap_or_else(|e| e.into_inner());
    let _links = HelperLinks::install();
    let _unmount = Unmount(mnt.clone());
    let (p, m) = (pool.to_str().unwrap(), mnt.to_str().unwrap());

    // mount -t winefs, with winefs's options, kernel flags and fstab-only ones side by side.
    let out = run(Command::new("mount").args([
        "-t",
        "winefs",
        "-o",
        "relaxed,noexec,noatime,nofail,x-systemd.automount,_netdev",
        p,
        m,
    ]));
    assert!(out.status.success(), "mount -t winefs: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "", "a helper says nothing on success");
    assert_eq!(text(&out.stderr), "", "a helper says nothing on success");
    let line = mount_line(&mnt).expect("mounted");
    assert!(line.contains(&format!(" - fuse.winefs {p} ")), "{line}");
    let flags = mount_flags(&mnt);
    for f in ["rw", "noexec", "noatime"] {
        assert!(flags.contains(&f.to_string()), "{f} missing from {flags:?}");
    }
    // As ext4's mount: set-user-ID bits and devices count unless an option says otherwise.
    for f in ["nosuid", "nodev"] {
        assert!(!flags.contains(&f.to_string()), "{f} not asked for: {flags:?}");
    }
    let script = mnt.join("hello.sh");
    fs::write(&script, "#!/bin/sh\necho hello\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let err = Command::new(&script).output().expect_err("noexec");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    umount(&mnt);

    // A line of an fstab file, as mount(8) reads /etc/fstab at boot.
    let fstab = dir.path().join("fstab");
    fs::write(&fstab, format!("# pool\n{p} {m} winefs ro,nosuid,nofail 0 0\n")).unwrap();
    let out = mount_retrying(&["-T", fstab.to_str().unwrap(), m]);
    assert!(out.status.success(), "mount -T fstab: {}", text(&out.stderr));
    let flags = mount_flags(&mnt);
    assert!(flags.contains(&"ro".to_string()), "{flags:?}");
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    assert_eq!(fs::read(&script).unwrap(), b"#!/bin/sh\necho hello\n");
    let err = fs::write(mnt.join("new"), b"x").expect_err("read-only");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    umount(&mnt);

    // Refusals: one line each, mount(8)'s status (1: wrong invocation, 32: mount failed),
    // nothing mounted.
    let missing = dir.path().join("no-such-pool");
    for (args, status, says) in [
        (vec!["-t", "winefs", "-o", "compress=zstd", p, m], 1, "option compress=zstd"),
        (vec!["-t", "winefs", "-o", "relaxed,sync", p, m], 1, "durable at fsync"),
        (vec!["-t", "winefs", missing.to_str().unwrap(), m], 32, "no-such-pool"),
    ] {
        let out = mount_retrying(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(mount_line(&mnt).is_none(), "{args:?} mounted");
    }

    // Sloppy: the unknown option is a warning and the mount goes ahead.
    let out = mount_retrying(&["-s", "-t", "winefs", "-o", "compress=zstd", p, m]);
    assert!(out.status.success(), "mount -s: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("ignored option compress=zstd"), "{}", text(&out.stderr));
    assert_eq!(fs::read(&script).unwrap(), b"#!/bin/sh\necho hello\n");
    umount(&mnt);
}

#[test]
fn the_helper_answers_to_mount_fuse_winefs() {
    let (dir, pool, mnt) = fresh();
    let _unmount = Unmount(mnt.clone());
    let helper = dir.path().join("mount.fuse.winefs");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let (p, m) = (pool.to_str().unwrap(), mnt.to_str().unwrap());

    // -f (fake): everything checked, nothing mounted.
    let out = run(Command::new(&helper).args([p, m, "-f", "-o", "strict", "-t", "fuse.winefs"]));
    assert!(out.status.success(), "-f: {}", text(&out.stderr));
    assert!(mount_line(&mnt).is_none(), "-f mounted");
    let out = run(Command::new(&helper).args(["/no/such/pool", m, "-f"]));
    assert_eq!(out.status.code(), Some(1), "-f checks the pool: {}", text(&out.stderr));

    // The argument form mount(8) uses, with -v: what was mounted is said.
    let out = run(Command::new(&helper).args([p, m, "-nv", "-o", "rw,threads=2", "-t", "fuse.winefs"]));
    assert!(out.status.success(), "helper: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("mounted {p} on {m}")), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("2 threads"), "{}", text(&out.stdout));
    fs::write(mnt.join("f"), b"through the helper").unwrap();
    umount(&mnt);

    // Another file system type is not this helper's to mount.
    let out = run(Command::new(&helper).args([p, m, "-t", "ext4"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("type ext4"), "{}", text(&out.stderr));
    assert!(mount_line(&mnt).is_none());

    // What was written is in the pool (read back through the library's fsck and a remount).
    let out = retrying(&helper, &[p, m, "-o", "ro"]);
    assert!(out.status.success(), "mount again: {}", text(&out.stderr));
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"through the helper");
    umount(&mnt);
}

/// `mount -o remount,ro` and `remount,rw` in place: refused while a file is open for writing
/// or when an option names another mode than the daemon's, then every change EROFS with the
/// other flags kept, then writable again; a pool mounted read-only from the start is not made
/// read-write (its recovery was in memory only).
#[test]
fn remount_ro_and_rw_in_place() {
    let (_dir, pool, mnt) = fresh();
    let _one = SBIN.lock().unwrap_or_else(|e| e.into_inner());
    let _links = HelperLinks::install();
    let _unmount = Unmount(mnt.clone());
    let (p, m) = (pool.to_str().unwrap(), mnt.to_str().unwrap());
    let out = run(Command::new("mount").args(["-t", "winefs", "-o", "noexec", p, m]));
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    fs::write(mnt.join("f"), b"before").unwrap();

    let writer = fs::OpenOptions::new().append(true).open(mnt.join("f")).unwrap();
    let out = run(Command::new("mount").args(["-o", "remount,ro", m]));
    assert_eq!(out.status.code(), Some(32), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr).lines().count(), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("open for writing"), "{}", text(&out.stderr));
    assert!(!mount_flags(&mnt).contains(&"ro".to_string()));
    drop(writer);

    // Options naming what the daemon was started with pass if they name what it has (mount(8)
    // passes an fstab line's options again); another mode or thread count is refused.
    let out = run(Command::new("mount").args(["-o", "remount,ro,relaxed", m]));
    assert_eq!(out.status.code(), Some(32), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("serves with mode=strict"), "{}", text(&out.stderr));
    assert!(!mount_flags(&mnt).contains(&"ro".to_string()));
    let out = run(Command::new("mount").args(["-o", "remount,ro,strict,nonempty", m]));
    assert!(out.status.success(), "remount,ro: {}", text(&out.stderr));
    let flags = mount_flags(&mnt);
    assert!(flags.contains(&"ro".to_string()) && flags.contains(&"noexec".to_string()), "{flags:?}");
    for err in [
        fs::write(mnt.join("g"), b"x").unwrap_err(),
        fs::create_dir(mnt.join("d")).unwrap_err(),
        fs::remove_file(mnt.join("f")).unwrap_err(),
    ] {
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    }
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"before");

    let out = run(Command::new("mount").args(["-o", "remount,rw", m]));
    assert!(out.status.success(), "remount,rw: {}", text(&out.stderr));
    let flags = mount_flags(&mnt);
    assert!(flags.contains(&"rw".to_string()) && flags.contains(&"noexec".to_string()), "{flags:?}");
    fs::write(mnt.join("g"), b"after").unwrap();
    // The daemon keeps the access-time rule it started with: a remount may not claim another.
    let out = run(Command::new("mount").args(["-o", "remount,noatime", m]));
    assert_eq!(out.status.code(), Some(32), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("noatime is not changed"), "{}", text(&out.stderr));
    assert!(!mount_flags(&mnt).contains(&"noatime".to_string()));
    umount(&mnt);

    // Read-only from the start: never read-write in place.
    let out = mount_retrying(&["-t", "winefs", "-o", "ro", p, m]);
    assert!(out.status.success(), "mount ro: {}", text(&out.stderr));
    let out = run(Command::new("mount").args(["-o", "remount,rw", m]));
    assert_eq!(out.status.code(), Some(32), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("mount it read-write"), "{}", text(&out.stderr));
    assert!(mount_flags(&mnt).contains(&"ro".to_string()));
    assert_eq!(fs::read(mnt.join("g")).unwrap(), b"after");
    umount(&mnt);
    let out = retrying(BIN, &["fsck", p]);
    assert!(out.status.success(), "fsck: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("clean"), "{}", text(&out.stdout));
}
