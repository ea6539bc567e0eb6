//! Hugepage pools: the embedded default is a file on a hugepage tmpfs that winefs mounts itself when it
//! runs as root, else a plain file on /dev/shm with a warning that the pool is 4 KiB-mapped.

use std::path::{Path, PathBuf};

/// Where the CLI mounts its hugepage tmpfs.
pub const HUGE_DIR: &str = "/mnt/winefs-huge";

/// Size limit of that tmpfs (pages are only used when written).
const HUGE_TMPFS_SIZE: &str = "4G";

/// Whether `dir` is a mount point, and if so whether it is hugepage-capable.
pub(crate) fn hugepage_mount(dir: &str) -> Option<bool> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut found = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 4 && f[1] == dir {
            let huge = f[2] == "hugetlbfs"
                || (f[2] == "tmpfs"
                    && f[3]
                        .split(',')
                        .any(|o| o == "huge=always" || o == "huge=within_size"));
            found = Some(huge);
        }
    }
    found
}

/// A default pool location: the file `name` on the CLI's hugepage tmpfs when one is (or, as
/// root, can be) mounted, else `/dev/shm/winefs-<name>`, with a warning saying why.
pub fn default_pool(name: &str) -> (PathBuf, Option<String>) {
    // One check-and-mount at a time in this process (threads racing here would stack mounts).
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let fallback = PathBuf::from(format!("/dev/shm/winefs-{name}"));
    match hugepage_mount(HUGE_DIR) {
        Some(true) => return (Path::new(HUGE_DIR).join(name), None),
        Some(false) => {
            return (
                fallback,
                Some(format!(
                    "{HUGE_DIR} is mounted without huge=always; using /dev/shm, the pool is 4 KiB-mapped"
                )),
            );
        }
        None => {}
    }
    let root = crate::sys::euid() == 0;
    if root {
        let _ = std::fs::create_dir_all(HUGE_DIR);
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={HUGE_TMPFS_SIZE},huge=always"),
                "none",
                HUGE_DIR,
            ])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok && hugepage_mount(HUGE_DIR) == Some(true) {
            log::info!("mounted a hugepage tmpfs (huge=always, {HUGE_TMPFS_SIZE}) on {HUGE_DIR}");
            return (Path::new(HUGE_DIR).join(name), None);
        }
        let _ = std::fs::remove_dir(HUGE_DIR);
    }
    let why = if root {
        "could not mount a huge=always tmpfs"
    } else {
        "not root, cannot mount a huge=always tmpfs"
    };
    (
        fallback,
        Some(format!(
            "hugepages unavailable ({why}); using /dev/shm, the pool is 4 KiB-mapped"
        )),
    )
}
