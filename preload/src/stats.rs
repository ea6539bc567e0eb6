//! What went direct and what did not: counters of the data calls on winefs files, the
//! `WINEFS_PRELOAD_LOG=1` log on standard error, and the `WINEFS_PRELOAD_STATS=FILE` line each
//! process appends at exit.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counted kind of call.
#[derive(Clone, Copy)]
pub enum Counter {
    MmapDirect,
    MmapFuse,
    ReadDirect,
    ReadFuse,
    WriteDirect,
    WriteFuse,
    /// Writes that grew the file directly (also counted in `WriteDirect`).
    AppendDirect,
}

const NAMES: [&str; 7] =
    ["mmap_direct", "mmap_fuse", "read_direct", "read_fuse", "write_direct", "write_fuse", "append_direct"];

static COUNTS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// Count one call.
pub fn count(c: Counter) {
    COUNTS[c as usize].fetch_add(1, Ordering::Relaxed);
}

fn logging() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("WINEFS_PRELOAD_LOG").is_some_and(|v| v != "0" && !v.is_empty()))
}

/// One line on standard error when `WINEFS_PRELOAD_LOG` is set.
pub fn log(msg: &str) {
    if logging() {
        eprintln!("winefs-preload[{}]: {msg}", std::process::id());
    }
}

/// The counters as one JSON object.
fn json() -> String {
    let fields: Vec<String> = NAMES
        .iter()
        .zip(&COUNTS)
        .map(|(n, c)| format!("\"{n}\":{}", c.load(Ordering::Relaxed)))
        .collect();
    format!("{{\"pid\":{},{}}}", std::process::id(), fields.join(","))
}

/// At exit: the summary line and the stats file.
pub fn at_exit() {
    let any = COUNTS.iter().any(|c| c.load(Ordering::Relaxed) > 0);
    if !any {
        return;
    }
    log(&format!("summary {}", json()));
    if let Some(p) = std::env::var_os("WINEFS_PRELOAD_STATS") {
        crate::sys::append_line(std::path::Path::new(&p), &format!("{}\n", json()));
    }
}
