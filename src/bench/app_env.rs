//! The scaffolding of `winefs bench app` ([`super::app`]): the hugepage tmpfs mounts, the
//! `winefs mount -f` daemons and the aging runs it makes, the C helpers it compiles, and the
//! cleanup that unmounts all of it (on success, on error and on panic).

use super::syscall::io_err;
use crate::error::{Error, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The LMDB YCSB-like driver (compiled with `cc ... -llmdb` at run time).
const LMDB_YCSB_C: &str = include_str!("lmdb_ycsb.c");
/// The runner that measures a child's page faults with wait4 (and preloads only the child).
const APP_RUN_C: &str = include_str!("app_run.c");

/// One FUSE daemon: `winefs mount POOL MNT -f`, a child of this process.
struct FuseDaemon {
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
}

/// Everything the benchmark made under its root directory, undone by `Drop` in reverse order:
/// FUSE mounts first, then the tmpfs mounts, then the directory (only when nothing under it is
/// still mounted).
pub(crate) struct AppEnv {
    /// The benchmark's own directory (canonical).
    pub(crate) root: PathBuf,
    /// tmpfs mounts this run made, in mount order.
    tmpfs: Vec<PathBuf>,
    fuse: Option<FuseDaemon>,
    /// The `winefs` executable that runs the mounts and the ager.
    exe: PathBuf,
}

/// Whether `dir` is a mount point now.
fn is_mounted(dir: &Path) -> bool {
    crate::hugepool::hugepage_mount(&dir.to_string_lossy()).is_some()
}

/// Run a command to completion; its failure (with the end of its standard error) as one error.
fn run_quiet(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(io_err(what.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = last_nonempty_line(&err);
        return Err(Error::Invalid(format!("{what}: {} ({last})", out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last non-empty line of `text` (a command's standard error), for error messages.
pub(crate) fn last_nonempty_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// The last non-empty line of a file (a daemon's log), for error messages.
fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|t| last_nonempty_line(&t).to_string())
        .unwrap_or_default()
}

impl AppEnv {
    /// Make `base/winefs-benchapp-PID`; the `winefs` executable is `exe`.
    pub(crate) fn new(base: &Path, exe: PathBuf) -> Result<AppEnv> {
        let root = base.join(format!("winefs-benchapp-{}", std::process::id()));
        std::fs::create_dir_all(&root).map_err(io_err(format!("mkdir {}", root.display())))?;
        let root = root
            .canonicalize()
            .map_err(io_err(format!("resolve {}", root.display())))?;
        Ok(AppEnv {
            root,
            tmpfs: Vec::new(),
            fuse: None,
            exe,
        })
    }

    /// Mount a `huge=always` tmpfs of `size` bytes on `root/name` and check it took.
    pub(crate) fn mount_tmpfs(&mut self, name: &str, size: u64) -> Result<PathBuf> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("mkdir {}", dir.display())))?;
        run_quiet(
            Command::new("mount").args([
                "-t".as_ref(),
                "tmpfs".as_ref(),
                "-o".as_ref(),
                format!("size={size},huge=always").as_ref(),
                "none".as_ref(),
                dir.as_os_str(),
            ]),
            &format!("mount a huge=always tmpfs on {}", dir.display()),
        )?;
        self.tmpfs.push(dir.clone());
        if crate::hugepool::hugepage_mount(&dir.to_string_lossy()) != Some(true) {
            return Err(Error::NoDevice(format!(
                "{} is not a huge=always tmpfs after mounting one there",
                dir.display()
            )));
        }
        Ok(dir)
    }

    /// Unmount the tmpfs on `dir` (one this run mounted).
    pub(crate) fn unmount_tmpfs(&mut self, dir: &Path) -> Result<()> {
        run_quiet(
            Command::new("umount").arg(dir),
            &format!("unmount {}", dir.display()),
        )?;
        self.tmpfs.retain(|d| d != dir);
        std::fs::remove_dir(dir).map_err(io_err(format!("rmdir {}", dir.display())))
    }

    /// Compile `name`.c (embedded) into `root/bin/name` with `cc -O2 ... libs`.
    fn compile(&self, name: &str, source: &str, libs: &[&str], hint: &str) -> Result<PathBuf> {
        let bin = self.root.join("bin");
        std::fs::create_dir_all(&bin).map_err(io_err(format!("mkdir {}", bin.display())))?;
        let src = bin.join(format!("{name}.c"));
        std::fs::write(&src, source).map_err(io_err(format!("write {}", src.display())))?;
        let exe = bin.join(name);
        let what = format!("compile {name} with cc{hint}");
        let out = Command::new("cc")
            .arg("-O2")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .args(libs)
            .output()
            .map_err(io_err(what.clone()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
            return Err(Error::NoDevice(format!("{what}: {first}")));
        }
        Ok(exe)
    }

    /// The LMDB driver and the fault-measuring runner, compiled.
    pub(crate) fn compile_helpers(&self) -> Result<(PathBuf, PathBuf)> {
        let lmdb = self.compile(
            "lmdb_ycsb",
            LMDB_YCSB_C,
            &["-llmdb", "-lm"],
            " and -llmdb (is the Debian package liblmdb-dev installed? apt-get install liblmdb-dev)",
        )?;
        let run = self.compile("app_run", APP_RUN_C, &[], "")?;
        Ok((lmdb, run))
    }

    /// Age a directory (through POSIX calls) or a new pool with `winefs age`; returns the
    /// ager's utilization and writes lines.
    pub(crate) fn age(
        &self,
        target: AgeTarget<'_>,
        util_pct: f64,
        writes: f64,
        seed: u64,
    ) -> Result<String> {
        let mut cmd = Command::new(&self.exe);
        let name = match target {
            AgeTarget::Dir(d) => {
                cmd.arg("age").arg("--dir").arg(d);
                d.display().to_string()
            }
            AgeTarget::Pool(p, size) => {
                cmd.arg("age").arg(p).arg("--size").arg(size.to_string());
                p.display().to_string()
            }
        };
        cmd.args([
            "--util",
            &util_pct.to_string(),
            "--writes",
            &writes.to_string(),
        ])
        .args(["--seed", &seed.to_string(), "--quiet"])
        .stdin(Stdio::null());
        let out = run_quiet(&mut cmd, &format!("age {name}"))?;
        let summary: Vec<&str> = out
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("utilization:") || l.starts_with("writes:"))
            .collect();
        Ok(summary.join("; "))
    }

    /// `winefs mkfs POOL --size SIZE`.
    pub(crate) fn mkfs(&self, pool: &Path, size: u64) -> Result<()> {
        run_quiet(
            Command::new(&self.exe)
                .arg("mkfs")
                .arg(pool)
                .args(["--size", &size.to_string()]),
            &format!("mkfs {}", pool.display()),
        )
        .map(drop)
    }

    /// A copy of an unmounted pool file, holes kept.
    pub(crate) fn copy_pool(&self, from: &Path, to: &Path) -> Result<()> {
        run_quiet(
            Command::new("cp").arg("--sparse=always").arg(from).arg(to),
            &format!("copy {} to {}", from.display(), to.display()),
        )
        .map(drop)
    }

    /// `winefs mount POOL root/mnt -f`; returns the mountpoint once the daemon says it serves.
    pub(crate) fn mount_fuse(&mut self, pool: &Path) -> Result<PathBuf> {
        let mnt = self.root.join("mnt");
        std::fs::create_dir_all(&mnt).map_err(io_err(format!("mkdir {}", mnt.display())))?;
        let log = self.root.join("mount.log");
        let logf =
            std::fs::File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
        let mut child = Command::new(&self.exe)
            .arg("mount")
            .arg(pool)
            .arg(&mnt)
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(logf)
            .spawn()
            .map_err(io_err(format!("start {} mount", self.exe.display())))?;
        let stdout = child.stdout.take();
        self.fuse = Some(FuseDaemon {
            child,
            mnt: mnt.clone(),
            log: log.clone(),
        });
        // The daemon prints one line once the kernel mount is in place (or exits).
        let mut line = String::new();
        if let Some(out) = stdout {
            let mut r = BufReader::new(out);
            let _ = r.read_line(&mut line);
            // Keep draining its standard output so that it never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = r.read_to_end(&mut sink);
            });
        }
        if !line.starts_with("winefs:") || !is_mounted(&mnt) {
            return Err(Error::Invalid(format!(
                "winefs mount {} {}: not mounted ({})",
                pool.display(),
                mnt.display(),
                last_line(&log)
            )));
        }
        Ok(mnt)
    }

    /// Unmount the FUSE mount and wait for its daemon, which must exit cleanly.
    pub(crate) fn unmount_fuse(&mut self) -> Result<()> {
        let Some(mut d) = self.fuse.take() else {
            return Ok(());
        };
        let what = format!("unmount {}", d.mnt.display());
        let unmounted = run_quiet(Command::new("umount").arg(&d.mnt), &what);
        if unmounted.is_err() {
            let _ = crate::sys::lazy_unmount(&d.mnt);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            match d.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break None,
            }
        };
        let _ = std::fs::remove_dir(&d.mnt);
        unmounted?;
        match status {
            Some(st) if st.success() => Ok(()),
            Some(st) => Err(Error::Invalid(format!(
                "{what}: the daemon exited with {st} ({})",
                last_line(&d.log)
            ))),
            None => {
                let _ = crate::sys::kill(d.child.id() as i32, libc::SIGTERM);
                let _ = d.child.wait();
                Err(Error::Busy(format!(
                    "{what}: the daemon did not exit within 60 s; sent SIGTERM"
                )))
            }
        }
    }
}

/// What `AppEnv::age` ages.
pub(crate) enum AgeTarget<'a> {
    /// A directory, through POSIX calls (its file system's capacity).
    Dir(&'a Path),
    /// A new pool file of this size, through the library.
    Pool(&'a Path, u64),
}

impl Drop for AppEnv {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_fuse() {
            eprintln!("winefs: bench app: cleanup: {e}");
        }
        for dir in std::mem::take(&mut self.tmpfs).into_iter().rev() {
            let done = Command::new("umount")
                .arg(&dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !done {
                let _ = crate::sys::lazy_unmount(&dir);
            }
        }
        // Never walk into a live mount: remove the tree only when nothing under it is mounted.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", self.root.display());
        let live: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&prefix) || *m == self.root.to_string_lossy())
            .collect();
        if live.is_empty() {
            let _ = std::fs::remove_dir_all(&self.root);
        } else {
            eprintln!(
                "winefs: bench app: cleanup: still mounted, left in place: {}",
                live.join(" ")
            );
        }
    }
}
