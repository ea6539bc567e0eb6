//! `winefs stat`: a mounted pool's write accounting (bytes stored per kind of operation and
//! per category of traffic), read from the virtual xattr of the mount's root.

use crate::fail::{Fail, fail};
use std::path::{Path, PathBuf};
use winefs::fuse::proto::STATS_XATTR;
use winefs::state::accounting::WriteStats;

/// Print the write accounting of the mount at `target`, or of the FUSE mount serving the pool
/// file `target`.
pub(crate) fn stat(target: &Path, json: bool) -> Result<u8, Fail> {
    let shown = target.display();
    let mountpoint = if target.is_dir() {
        target.to_path_buf()
    } else {
        mount_of_pool(target).ok_or_else(|| {
            fail(
                format!("stat {shown}"),
                "not a winefs mount, and no winefs mount serves it as its pool (live \
                 counters exist only while a pool is mounted)",
            )
        })?
    };
    let raw = winefs::sys::get_xattr(&mountpoint, STATS_XATTR).map_err(|e| {
        fail(
            format!("stat {}", mountpoint.display()),
            format!("not a winefs mount ({STATS_XATTR}: {e})"),
        )
    })?;
    let stats: WriteStats = serde_json::from_slice(&raw)
        .map_err(|e| fail(format!("stat {}", mountpoint.display()), e))?;
    if json {
        let text = serde_json::to_string_pretty(&stats).map_err(|e| fail("stat", e))?;
        println!("{text}");
    } else {
        println!("write accounting of {} since mount:\n", mountpoint.display());
        println!("{stats}");
    }
    Ok(0)
}

/// The mount point of the winefs FUSE mount whose pool is `pool` (the mount's source names
/// its pool file; the type is `fuse` or `fuse.winefs`), from /proc/self/mountinfo.
fn mount_of_pool(pool: &Path) -> Option<PathBuf> {
    let pool = std::fs::canonicalize(pool).ok()?;
    winefs::sys::mountinfo::mounts()
        .into_iter()
        .find(|m| matches!(m.fstype.as_str(), "fuse" | "fuse.winefs") && m.source == pool)
        .map(|m| m.point)
}
