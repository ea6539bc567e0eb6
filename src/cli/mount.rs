//! `winefs mount`: serve a pool through FUSE until it is unmounted or signalled.
//!
//! Life of a mount: every check that can fail with a clear message (mountpoint, FUSE, pool)
//! runs first, in the foreground. Then, unless `-f`, the process forks while it still has one
//! thread; the parent waits for the child to report "mounted" or the reason it could not, prints
//! it and exits. The child serves requests with a pool of threads until the kernel mount goes
//! away (`umount`, `fusermount3 -u`) or SIGINT/SIGTERM/SIGHUP asks for it, then unmounts the
//! pool cleanly (allocator state saved, superblock marked clean).
//!
//! The daemon's standard output and error go to its log file; its diagnostics (and the core's
//! warnings and errors) reach it through the `log` macros, which write to standard error.

use crate::bind;
use crate::fail::{Ctx, Fail, fail};
use fuser::{Config, MountOption, Session, SessionACL};
use winefs::fuse::channel::Channel;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use winefs::fuse::WinefsFuse;
use winefs::hugepool::default_pool;
use winefs::sys::{self, Forked};
use winefs::units::format_size as human;
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

#[derive(Debug)]
pub struct MountArgs {
    pub pool: Option<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    pub consistency: Consistency,
    pub threads: Option<usize>,
    pub foreground: bool,
    /// Mount over a directory that has entries (hiding them while mounted).
    pub nonempty: bool,
    /// Serve reads only (FUSE `ro`; the pool is never written).
    pub read_only: bool,
    /// Start no direct-path channel (the preload library then keeps to FUSE).
    pub no_direct: bool,
    /// The kernel caches file data and writes it back (relaxed mode only; no direct path).
    pub writeback_cache: bool,
    /// How FUSE requests travel.
    pub transport: Transport,
    /// Wear-aware allocation (`MountOptions::wear_aware`).
    pub wear_aware: bool,
    /// Store no access times (`MountOptions::noatime`).
    pub noatime: bool,
    /// Keep no POSIX ACLs (`WinefsFuse::without_acl`).
    pub noacl: bool,
    /// Idle file states kept at most (`MountOptions::cached_inodes`; 0: the default).
    pub cached_inodes: u64,
    /// Size of a new default pool (None: [`DEFAULT_SIZE`]).
    pub size: Option<u64>,
    pub log: Option<PathBuf>,
    /// Kernel mount flags asked for by mount(8)'s helper (`suid`/`nosuid`, `dev`/`nodev`,
    /// `exec`/`noexec`).
    pub kernel_flags: Vec<MountOption>,
    /// Print nothing on success (mount(8)'s helper without `-v`).
    pub quiet: bool,
}

/// How FUSE requests travel between the kernel and the daemon (docs/DESIGN.md, "FUSE over
/// io_uring").
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it, else /dev/fuse.
    Auto,
    /// FUSE over io_uring, or no mount.
    Uring,
    /// Reads and writes on /dev/fuse.
    Dev,
}

impl Transport {
    /// The name `--transport` and the mount option `transport=` take.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value().map_or_else(String::new, |v| v.get_name().to_string())
    }
}

/// Name of the default pool file (on the hugepage tmpfs, or /dev/shm).
const DEFAULT_POOL: &str = "winefs.pool";

/// Size of a new default pool.
const DEFAULT_SIZE: u64 = 1 << 30;

const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn default_mountpoint() -> PathBuf {
    if sys::euid() == 0 {
        PathBuf::from("/mnt/winefs")
    } else {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join("winefs")
    }
}

/// The file system mounted at `dir`, if `dir` is a mount point.
fn mounted_fstype(dir: &Path) -> Option<String> {
    sys::mountinfo::mounts()
        .into_iter()
        .find(|m| m.point == dir)
        .map(|m| m.fstype)
}

/// Everything about the mountpoint that would make the kernel mount fail, or hide files
/// without being asked to (`nonempty`), as one clear line.
pub(crate) fn check_mountpoint(mnt: &Path, nonempty: bool) -> Result<PathBuf, Fail> {
    let m = mnt.display();
    let meta = match std::fs::metadata(mnt) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail(
                format!("mount on {m}"),
                "the mountpoint does not exist (create it with mkdir)",
            ));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(fail(
                format!("mount on {m}"),
                format!(
                    "a dead FUSE mount is still there (its daemon was killed); clear it with: umount -l {m}"
                ),
            ));
        }
        Err(e) => return Err(fail(format!("mount on {m}"), e)),
    };
    if !meta.is_dir() {
        return Err(fail(
            format!("mount on {m}"),
            "the mountpoint is not a directory",
        ));
    }
    let canon = std::fs::canonicalize(mnt).map_err(|e| fail(format!("mount on {m}"), e))?;
    if let Some(fstype) = mounted_fstype(&canon) {
        return Err(fail(
            format!("mount on {m}"),
            format!(
                "the mountpoint is in use: {fstype} is already mounted there (unmount it first)"
            ),
        ));
    }
    if sys::euid() != 0 {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != sys::euid() {
            return Err(fail(
                format!("mount on {m}"),
                "permission denied: a user can only mount on a directory they own (or run as root)",
            ));
        }
    }
    if !nonempty {
        let mut entries =
            std::fs::read_dir(&canon).map_err(|e| fail(format!("mount on {m}"), e))?;
        if entries.next().is_some() {
            return Err(fail(
                format!("mount on {m}"),
                "the mountpoint is not empty: its files would be hidden while mounted (pass --nonempty to mount over them)",
            ));
        }
    }
    Ok(canon)
}

/// FUSE itself: the device, and for users the setuid helper.
fn check_fuse() -> Result<(), Fail> {
    if !Path::new("/dev/fuse").exists() {
        return Err(fail(
            "mount",
            "FUSE is not available: /dev/fuse is missing (load the module: modprobe fuse)",
        ));
    }
    if sys::euid() != 0 {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()));
        if !found {
            return Err(fail(
                "mount",
                "fusermount3 not found: install the fuse3 package (apt-get install fuse3), or run as root",
            ));
        }
    }
    Ok(())
}

fn default_log(mnt: &Path) -> PathBuf {
    let tag: String = mnt
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::env::temp_dir().join(format!("winefs-mount{tag}.log"))
}

pub fn run(a: MountArgs) -> Result<u8, Fail> {
    let (pool, mnt, is_default) = match (a.pool.clone(), a.mountpoint.clone()) {
        (Some(_), Some(_)) if a.size.is_some() => {
            return Err(fail(
                "mount",
                "--size only sizes a new default pool; format POOL with winefs mkfs instead",
            ));
        }
        (Some(p), Some(m)) => (p, m, false),
        (None, None) => {
            let (p, warning) = default_pool(DEFAULT_POOL);
            if let Some(w) = warning {
                log::warn!("{w}");
            }
            let m = default_mountpoint();
            // Only a missing directory is created; a dead FUSE mount (ENOTCONN) is reported
            // by check_mountpoint.
            let missing = matches!(std::fs::symlink_metadata(&m), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
            if missing {
                std::fs::create_dir_all(&m)
                    .map_err(|e| fail(format!("create mountpoint {}", m.display()), e))?;
            }
            (p, m, true)
        }
        _ => {
            return Err(fail(
                "mount",
                "give both POOL and MOUNTPOINT, or neither to use the default pool",
            ));
        }
    };
    let canon_mnt = check_mountpoint(&mnt, a.nonempty)?;
    check_fuse()?;
    let p = pool.display().to_string();
    if is_default && !pool.exists() {
        let size = a.size.unwrap_or(DEFAULT_SIZE);
        Fs::mkfs(
            &pool,
            &MkfsOptions {
                size: Some(size),
                ..Default::default()
            },
        )
        .ctx(|| format!("create default pool {p}"))?;
        println!("created pool {p} ({})", human(size));
    } else if is_default && a.size.is_some() {
        return Err(fail(
            format!("mount {p}"),
            "the default pool exists already; --size only sizes a new one",
        ));
    }
    // An absolute path for the mount table and the messages (the daemon runs from "/").
    let pool = std::fs::canonicalize(&pool).unwrap_or(pool);
    let p = pool.display().to_string();
    // A pool a daemon serves already gets a second mount point, as a device ext4 has mounted.
    if let Some(first) = bind::serving(&pool) {
        return bind::second_mount(&wanted(&a), &first, &canon_mnt, &p);
    }
    let fs = Fs::mount(
        &pool,
        MountOptions {
            consistency: a.consistency,
            read_only: a.read_only,
            wear_aware: a.wear_aware,
            noatime: a.noatime,
            cached_inodes: a.cached_inodes,
            // Started by `serve`: a fork keeps no threads.
            no_prefault: true,
            ..Default::default()
        },
    )
    .ctx(|| format!("mount {p}"))?;
    let rolled = fs.recovery_report().rolled_back.len();
    if rolled > 0 {
        let how = if a.read_only { " (in memory only: read-only)" } else { "" };
        println!("recovered {p}: rolled back {rolled} unfinished transaction(s){how}");
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .clamp(1, 64);
    let consistency = match a.consistency {
        Consistency::Strict => "strict",
        Consistency::Relaxed => "relaxed",
    };
    let mode = if a.read_only { "read-only" } else { consistency };
    // What a remount's options, and a second mount point's, are held to (`mount.winefs -o
    // remount`, `bind`), as mount options.
    let mut settings: Vec<String> = chosen_settings(&a).into_iter().map(|(k, v, _)| format!("{k}={v}")).collect();
    settings.push(format!("threads={threads}"));
    settings.push(format!("transport={}", a.transport.name()));
    settings.push(format!("cached_inodes={}", fs.cached_inodes()));
    let settings = settings.join(",");
    let front = Front {
        // Stores through the pool would bypass the kernel's cache of the same bytes.
        direct: !a.no_direct && !a.writeback_cache,
        writeback_cache: a.writeback_cache,
        acl: !a.noacl,
        transport: a.transport,
        kernel_flags: a.kernel_flags,
        settings,
    };
    let quiet = a.quiet;
    let cache = if a.writeback_cache { ", writeback cache" } else { "" };
    let cache = if fs.disk_syncs().is_some() {
        format!("{cache}, a disk file: fdatasync at every commit, no direct path")
    } else {
        cache.to_string()
    };
    // Closed by the transport, which the daemon decides once the kernel has answered INIT.
    let summary = format!(
        "mounted {p} on {} ({mode} mode{cache}, {threads} threads",
        canon_mnt.display()
    );
    let how_to_unmount = if sys::euid() == 0 {
        format!("umount {}", canon_mnt.display())
    } else {
        format!("fusermount3 -u {}", canon_mnt.display())
    };
    if a.foreground {
        return serve(fs, &pool, &canon_mnt, threads, front, |r| {
            // A failure is returned by `serve`, and `main` prints it.
            if let Ok(transport) = r {
                println!("winefs: {summary}, {transport}); stop with Ctrl-C or: {how_to_unmount}");
                let _ = std::io::stdout().flush();
            }
        });
    }

    let log = a.log.unwrap_or_else(|| default_log(&canon_mnt));
    let (reader, mut writer) =
        std::io::pipe().map_err(|e| fail("create a pipe to the daemon", e))?;
    // No thread has been started yet (clap, mkfs and mount are single-threaded), so forking
    // here is sound; the daemon starts its threads after the fork.
    match sys::fork().map_err(|e| fail("fork the mount daemon", e))? {
        Forked::Parent { child } => {
            drop(writer);
            // The child owns the pool now: this copy must neither write nor unmap it.
            std::mem::forget(fs);
            log::debug!("forked the mount daemon, pid {child}; waiting for it to mount");
            let mut line = String::new();
            let _ = BufReader::new(reader).read_line(&mut line);
            match line.trim_end().strip_prefix("ok ") {
                Some(transport) => {
                    if !quiet {
                        println!("winefs: {summary}, {transport}), daemon pid {child}");
                        println!("  log:     {}", log.display());
                        println!("  unmount: {how_to_unmount}");
                    }
                    Ok(0)
                }
                None => {
                    let why = line
                        .trim_end()
                        .strip_prefix("err ")
                        .map(str::to_string)
                        .unwrap_or_else(|| {
                            format!("the daemon exited before mounting; see {}", log.display())
                        });
                    Err(fail(format!("mount on {}", canon_mnt.display()), why))
                }
            }
        }
        Forked::Child => {
            drop(reader);
            // Leave the caller's directory, so the daemon never keeps it busy.
            let detach = sys::setsid()
                .and_then(|()| sys::redirect_stdio(&log))
                .and_then(|()| std::env::set_current_dir("/"));
            if let Err(e) = detach {
                let _ = writeln!(writer, "err cannot start the daemon: {e}");
                return Ok(1);
            }
            log::info!("pid {} serving {summary})", std::process::id());
            serve(fs, &pool, &canon_mnt, threads, front, move |r| {
                let _ = match r {
                    Ok(transport) => writeln!(writer, "ok {transport}"),
                    Err(e) => writeln!(writer, "err {e}"),
                };
                // `writer` drops here, closing the pipe: the parent stops waiting.
            })
        }
    }
}

/// The daemon settings a mount of `a` fixes whatever its defaults are (key, value, the
/// option that asks for it); threads, transport and cached inodes come on top.
fn chosen_settings(a: &MountArgs) -> Vec<(&'static str, String, String)> {
    let flag = |on: bool| if on { "1" } else { "0" }.to_string();
    let mode = match a.consistency {
        Consistency::Strict => "strict",
        Consistency::Relaxed => "relaxed",
    };
    vec![
        ("mode", mode.to_string(), mode.to_string()),
        ("wear_aware", flag(a.wear_aware), format!("wear_aware={}", flag(a.wear_aware))),
        ("no_direct", flag(a.no_direct), format!("no_direct={}", flag(a.no_direct))),
        ("writeback_cache", flag(a.writeback_cache), format!("writeback_cache={}", flag(a.writeback_cache))),
        ("acl", flag(!a.noacl), if a.noacl { "noacl" } else { "acl" }.to_string()),
    ]
}

/// What a second mount point of a served pool asks for (`bind`): the daemon settings `a`
/// names — those it leaves to their defaults (threads, transport, cached inodes) are the
/// serving daemon's to decide — and its kernel flags, as `winefs mount` mounts (nosuid and
/// nodev unless mount(8)'s helper asked otherwise).
fn wanted(a: &MountArgs) -> bind::Wanted {
    let mut settings = chosen_settings(a);
    if let Some(t) = a.threads {
        settings.push(("threads", t.to_string(), format!("threads={t}")));
    }
    if a.transport != Transport::Auto {
        settings.push(("transport", a.transport.name(), format!("transport={}", a.transport.name())));
    }
    if a.cached_inodes != 0 {
        settings.push(("cached_inodes", a.cached_inodes.to_string(), format!("cached_inodes={}", a.cached_inodes)));
    }
    let flags = sys::RemountFlags {
        read_only: a.read_only,
        nosuid: !a.kernel_flags.contains(&MountOption::Suid),
        nodev: !a.kernel_flags.contains(&MountOption::Dev),
        noexec: a.kernel_flags.contains(&MountOption::NoExec),
        noatime: a.noatime,
    };
    bind::Wanted { settings, flags, quiet: a.quiet }
}

/// How the FUSE front end serves a mount.
struct Front {
    /// Offer the direct-path channel.
    direct: bool,
    /// Ask for the kernel's writeback cache.
    writeback_cache: bool,
    /// Keep POSIX ACLs.
    acl: bool,
    transport: Transport,
    /// Kernel mount flags beyond those every winefs mount has.
    kernel_flags: Vec<MountOption>,
    /// The daemon's settings as mount options (`WinefsFuse::with_settings`).
    settings: String,
}

/// Mount `fs` on `mnt` and serve it until unmounted; `ready` hears whether the kernel mount
/// worked. Returns the exit code.
fn serve(
    fs: Fs,
    pool: &Path,
    mnt: &Path,
    threads: usize,
    front: Front,
    ready: impl FnOnce(Result<String, String>),
) -> Result<u8, Fail> {
    // Every thread started from here on inherits the mask; only the signal thread sees them.
    sys::block_signals(&SIGNALS).map_err(|e| fail("block signals", e))?;
    fs.prefault();
    let fs = Arc::new(fs);
    let root = sys::euid() == 0;
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(pool.display().to_string()),
        MountOption::Subtype("winefs".into()),
        MountOption::DefaultPermissions,
        if fs.is_read_only() {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    // Shown in the mount table; the daemon is the one that stores access times.
    if fs.is_noatime() {
        cfg.mount_options.push(MountOption::NoAtime);
    }
    cfg.mount_options.extend(front.kernel_flags.iter().cloned());
    // With the kernel checking permissions, root's mount may serve every user.
    cfg.acl = if root {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(threads);
    cfg.clone_fd = true;
    cfg.dev_spin = winefs::fuse::DEV_SPIN;
    cfg.io_uring = front.transport != Transport::Dev;
    let mut adapter = WinefsFuse::new(Arc::clone(&fs)).with_settings(front.settings.clone());
    if front.writeback_cache {
        adapter = adapter.with_writeback_cache();
    }
    if !front.acl {
        adapter = adapter.without_acl();
    }
    let notifier = adapter.notifier_slot();
    // The direct path (docs/DESIGN.md §7b): not on a read-only mount, which writes nothing.
    let channel = if front.direct && !fs.is_read_only() {
        match Channel::start(Arc::clone(&fs), Arc::clone(&notifier), adapter.cache_gate()) {
            Ok(ch) => {
                adapter = adapter.with_channel(ch.name());
                Some(ch)
            }
            Err(e) => {
                log::warn!("no direct path (every process uses FUSE): {e}");
                None
            }
        }
    } else {
        None
    };
    // No direct path: every store goes through the kernel, which may then cache file data.
    if channel.is_none() {
        adapter = adapter.with_page_cache();
    }
    let stop_channel = || {
        if let Some(ch) = &channel {
            ch.stop();
        }
    };
    // The session, and the transport it serves by; or why there is no mount.
    let started = Session::new(adapter, mnt, &cfg)
        .map_err(|e| explain_mount_error(&e))
        .and_then(|session| match (front.transport, session.io_uring()) {
            (_, Ok(queues)) => Ok((session, format!("FUSE over io_uring, {queues} queues"))),
            // Dropping the session unmounts it.
            (Transport::Uring, Err(e)) => Err(format!("no FUSE over io_uring: {e}")),
            (Transport::Auto, Err(e)) => {
                log::info!("serving over /dev/fuse: {e}");
                Ok((session, "/dev/fuse".to_string()))
            }
            (Transport::Dev, Err(_)) => Ok((session, "/dev/fuse".to_string())),
        });
    let (mut session, transport) = match started {
        Ok(s) => s,
        Err(why) => {
            ready(Err(why.clone()));
            stop_channel();
            // Nothing was served: the pool is still consistent, so close it cleanly.
            if let Ok(fs) = Arc::try_unwrap(fs) {
                let _ = fs.unmount();
            }
            return Err(fail(format!("mount on {}", mnt.display()), why));
        }
    };
    log::info!("requests travel by {transport}");
    let _ = notifier.set(session.notifier());
    ready(Ok(transport));

    let mut unmounter = session.unmount_callable();
    let mnt_owned = mnt.to_path_buf();
    let pool_owned = pool.to_path_buf();
    std::thread::Builder::new()
        .name("winefs-signals".into())
        .spawn(move || {
            loop {
                let Ok(sig) = sys::wait_signal(&SIGNALS) else {
                    return;
                };
                log::info!("signal {sig}: unmounting {}", mnt_owned.display());
                // The pool's other mount points (`bind`) keep the connection open: they go
                // first, detached, so the daemon ends with the last user of any of them.
                for other in bind::mount_points(&pool_owned).into_iter().filter(|m| *m != mnt_owned) {
                    log::info!("signal {sig}: detaching {}, a second mount point", other.display());
                    if let Err(e) = sys::lazy_unmount(&other) {
                        log::error!("cannot unmount {}: {e}", other.display());
                    }
                }
                match unmounter.unmount() {
                    Ok(()) => return,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        // Still in use: detach now, serve the open files until they close.
                        match sys::lazy_unmount(&mnt_owned) {
                            Ok(()) => {
                                log::warn!(
                                    "{} is busy; detached it, finishing when its last user lets go",
                                    mnt_owned.display()
                                );
                                return;
                            }
                            Err(e) => log::error!("cannot unmount: {e}"),
                        }
                    }
                    Err(e) => log::error!("cannot unmount: {e}"),
                }
            }
        })
        .map_err(|e| fail("start the signal thread", e))?;

    log::debug!("serving {} with {threads} threads", mnt.display());
    let served = session.run();
    // Clients let go of the pool before it is closed (they see the channel go).
    stop_channel();
    drop(channel);
    // The session has dropped its handle; ours is the last one.
    let fs = Arc::try_unwrap(fs).map_err(|_| fail("unmount", "the pool is still referenced"))?;
    if let Err(e) = served {
        log::error!("FUSE session ended with an error: {e}");
    }
    log::debug!(
        "FUSE session on {} ended; unmounting the pool",
        mnt.display()
    );
    fs.unmount().ctx(|| format!("unmount {}", pool.display()))?;
    log::info!("unmounted {} cleanly", pool.display());
    Ok(0)
}

/// The kernel's or fusermount's refusal, in words a user can act on.
fn explain_mount_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            format!("permission denied by the kernel ({e}); run as root or check /etc/fuse.conf")
        }
        Some(libc::ENODEV) => "the kernel has no FUSE support (modprobe fuse)".into(),
        Some(libc::EBUSY) => "the mountpoint is busy".into(),
        _ => e.to_string(),
    }
}
