//! Mount time (issue 18, item 4): how long `Fs::mount` takes on a pool holding many files in
//! many directories, after a clean unmount and after a crash (a process that exits while the
//! pool is mounted), in files per second.
//!
//! `cargo run --release --example mount_time -- [FILES] [DIRS] [POOL]` (default 1,000,000 files
//! in 1,000 directories, a pool in /dev/shm). The pool is made for the run and removed after it.
//! The files are made, and the crash happens, in a child process (this program run again), so
//! the mounts timed here start from a pool no process holds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

fn options() -> MountOptions {
    MountOptions {
        consistency: Consistency::Strict,
        // The background prefault is not part of the mount; keep it from competing.
        no_prefault: true,
        ..Default::default()
    }
}

/// Child, "populate": make `files` empty files spread over `dirs` directories, unmount cleanly.
fn populate(pool: &Path, files: u64, dirs: u64) -> winefs::Result<()> {
    let fs = Fs::mount(pool, options())?;
    let dir_inos = (0..dirs)
        .map(|d| Ok(fs.mkdir(fs.root(), format!("d{d:05}").as_bytes(), 0o755, 0, 0)?.ino))
        .collect::<winefs::Result<Vec<u64>>>()?;
    for i in 0..files {
        let dir = dir_inos[(i % dirs) as usize];
        fs.create(dir, format!("f{i:08}").as_bytes(), 0o644, 0, 0)?;
    }
    fs.unmount()
}

/// Child, "crash": mount, make one more file (named `name`), and exit without unmounting.
fn crash(pool: &Path, name: &str) -> winefs::Result<()> {
    let fs = Fs::mount(pool, options())?;
    fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0)?;
    std::process::exit(0)
}

fn child(args: &[&str]) {
    let exe = std::env::current_exe().expect("this program's path");
    let status = Command::new(exe).args(args).status().expect("run the child");
    assert!(status.success(), "child {args:?}: {status}");
}

/// Mount, time it, count what the mount sees, unmount; (seconds, inodes in use).
fn timed_mount(pool: &Path) -> winefs::Result<(f64, u64)> {
    let start = Instant::now();
    let fs = Fs::mount(pool, options())?;
    let secs = start.elapsed().as_secs_f64();
    let st = fs.statfs();
    let used = st.inodes - st.free_inodes;
    fs.unmount()?;
    Ok((secs, used))
}

fn main() -> winefs::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("populate") => {
            return populate(Path::new(&args[1]), args[2].parse().unwrap(), args[3].parse().unwrap());
        }
        Some("crash") => return crash(Path::new(&args[1]), &args[2]),
        // Mount an existing pool once (to profile the mount alone).
        Some("mount") => {
            let (secs, used) = timed_mount(Path::new(&args[1]))?;
            println!("{used} inodes: mount {secs:.3} s");
            return Ok(());
        }
        _ => {}
    }
    let files: u64 = args.first().map_or(1_000_000, |s| s.parse().expect("FILES is a number"));
    let dirs: u64 = args.get(1).map_or(1000, |s| s.parse().expect("DIRS is a number")).max(1);
    let pool = args.get(2).map_or_else(
        || PathBuf::from(format!("/dev/shm/winefs-mount-{}.pool", std::process::id())),
        PathBuf::from,
    );
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some((files * 8192).max(1 << 30)),
            inodes: Some(files + dirs + 1024),
            ..Default::default()
        },
    )?;
    let p = pool.to_str().expect("a UTF-8 pool path");
    let t = Instant::now();
    child(&["populate", p, &files.to_string(), &dirs.to_string()]);
    println!(
        "made {files} files in {dirs} directories in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for round in 1..=3 {
        let (clean, used) = timed_mount(&pool)?;
        child(&["crash", p, &format!("crashed-{round}")]);
        let (crashed, _) = timed_mount(&pool)?;
        println!(
            "round {round}: {used} inodes; clean mount {:.3} s ({:.0} files/s), mount after a crash {:.3} s ({:.0} files/s)",
            clean,
            used as f64 / clean,
            crashed,
            used as f64 / crashed
        );
    }
    std::fs::remove_file(&pool).map_err(|e| winefs::Error::io("remove the pool", e))?;
    Ok(())
}
