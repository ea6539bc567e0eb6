//! A second mount point for a pool a daemon already serves: as ext4 shares one file system
//! between two mounts of a device, the second mount is a bind mount of the first (one daemon,
//! one FUSE connection, the same files through both; either may be unmounted first, and the
//! daemon stops with the last). What the daemon decides for both (mode, ACLs, direct path,
//! threads, ...) must be what the second mount asks for, or it is refused in one line; the
//! kernel's per-mount flags (`ro`, `nosuid`, `nodev`, `noexec`) are the second mount's own.
//! A signal to the daemon (`winefs mount`'s SIGTERM) unmounts every mount point of its pool.

use crate::fail::{Fail, fail};
use std::path::Path;
use winefs::fuse::{SETTINGS_IOCTL, SETTINGS_LEN};
use winefs::sys::{self, mountinfo::Mount};

/// The mount of `pool` (canonical) a winefs daemon serves, if there is one: a read-write one
/// if any is. A mount whose daemon is gone (ENOTCONN) is passed over: the pool is free then,
/// and mounts as any pool.
pub(crate) fn serving(pool: &Path) -> Option<Mount> {
    let mut alive: Vec<Mount> = mounts_of(pool)
        .filter(|m| std::fs::metadata(&m.point).is_ok())
        .collect();
    alive.sort_by_key(|m| m.options.iter().any(|o| o == "ro"));
    alive.into_iter().next()
}

/// The settings the daemon serving the mount whose root is open as `root` reports
/// (`fuse::SETTINGS_IOCTL`: `key=value,...`).
pub(crate) fn daemon_settings(root: &std::fs::File) -> std::io::Result<String> {
    let mut settings = [0u8; SETTINGS_LEN];
    sys::ioctl_read(root, SETTINGS_IOCTL, &mut settings)?;
    let end = settings.iter().position(|&b| b == 0).unwrap_or(SETTINGS_LEN);
    Ok(String::from_utf8_lossy(&settings[..end]).into_owned())
}

/// Every point `pool` (canonical) is mounted on by winefs.
pub(crate) fn mount_points(pool: &Path) -> Vec<std::path::PathBuf> {
    mounts_of(pool).map(|m| m.point).collect()
}

/// The winefs mounts of `pool` (canonical) in the mount table.
fn mounts_of(pool: &Path) -> impl Iterator<Item = Mount> + '_ {
    sys::mountinfo::mounts()
        .into_iter()
        .filter(move |m| m.fstype == "fuse.winefs" && m.source == pool)
}

/// What a second mount asks for: the daemon settings it names (setting, value, the option
/// that asked for it), and its own kernel flags.
pub(crate) struct Wanted {
    pub(crate) settings: Vec<(&'static str, String, String)>,
    pub(crate) flags: sys::RemountFlags,
    /// Print nothing (mount(8)'s helper without `-v`).
    pub(crate) quiet: bool,
}

/// Mount `first`'s tree on `mnt` too, as `want` asks; `p` names the pool in messages.
pub(crate) fn second_mount(want: &Wanted, first: &Mount, mnt: &Path, p: &str) -> Result<u8, Fail> {
    let what = format!("mount {p}");
    let served = format!("it is served on {}", first.point.display());
    if sys::euid() != 0 {
        return Err(fail(&what, format!("{served}; a second mount point is a bind mount, which needs root")));
    }
    if first.options.iter().any(|o| o == "ro") && !want.flags.read_only {
        return Err(fail(&what, format!("{served} read-only; mount it read-only here too (ro)")));
    }
    if first.options.iter().any(|o| o == "noatime") != want.flags.noatime {
        return Err(fail(
            &what,
            format!("{served}, where the daemon stores access times by its own rule; give noatime to both or neither"),
        ));
    }
    let root = std::fs::File::open(&first.point).map_err(|e| fail(&what, e))?;
    let settings = daemon_settings(&root)
        .map_err(|e| fail(&what, format!("{served}, and its daemon did not say how ({e})")))?;
    if let Some(why) = contradicted(&want.settings, &settings) {
        return Err(fail(&what, format!("{served}: {why}")));
    }
    sys::bind_mount(&first.point, mnt, want.flags).map_err(|e| fail(&what, e))?;
    if !want.quiet {
        println!(
            "winefs: mounted {p} on {} as well (a bind mount of {}: one daemon serves both)",
            mnt.display(),
            first.point.display()
        );
    }
    Ok(0)
}

/// The first of `expect` (setting, value, the option that asked for it) that the daemon's
/// `settings` (`key=value,...`) contradict, as the reason to refuse a remount or a second
/// mount.
pub(crate) fn contradicted(expect: &[(&str, String, String)], settings: &str) -> Option<String> {
    let has: std::collections::HashMap<&str, &str> =
        settings.split(',').filter_map(|kv| kv.split_once('=')).collect();
    expect.iter().find_map(|(setting, want, opt)| {
        let now = has.get(setting).copied().unwrap_or("?");
        (now != want).then(|| {
            format!("option {opt}: the daemon serves with {setting}={now}")
        })
    })
}

