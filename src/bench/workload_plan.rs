//! What `winefs bench workload` ([`super::workload`]) runs: the workloads and their shapes
//! (Filebench's personalities with the paper's Table 1 counts, the Fig. 6 microbenchmarks, the
//! Fig. 10 scalability loop), the setups they run on, the options, and the [`Plan`] one
//! workload runs with on this machine.

use super::workload_setups::FileRef;
use serde::Serialize;
use std::path::PathBuf;

/// Cores of the paper's machine used for its runs (one socket of 14).
const PAPER_CORES: usize = 14;

/// What runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Filebench varmail: a mail server's small files, fsync after every append.
    Varmail,
    /// Filebench fileserver: whole-file writes, appends and reads of 128 KiB files.
    Fileserver,
    /// Filebench webserver: many whole-file reads, appends to one shared log.
    Webserver,
    /// Filebench webproxy: a proxy cache's creates, unlinks and repeated reads.
    Webproxy,
    /// Fig. 6: 4 KiB appends, fsync every ten.
    AppendFsync,
    /// Fig. 6: sequential 4 KiB reads of one file.
    SeqRead,
    /// Fig. 6: random 4 KiB reads of one file.
    RandRead,
    /// Fig. 6: sequential 4 KiB overwrites in place.
    SeqWrite,
    /// Fig. 6: random 4 KiB overwrites in place.
    RandWrite,
    /// Fig. 10: create, append, fsync, close, unlink per thread, 1..N threads.
    Scale,
}

/// How a workload is shaped (Filebench's defaults for each personality; the paper's Table 1
/// for its thread and file counts).
struct Spec {
    /// Paper's (threads, files), for the Filebench personalities.
    paper: Option<(usize, u64)>,
    /// Files here at scale 1 (about 160 MB of data each).
    files: u64,
    /// Files per directory (Filebench's `meandirwidth`).
    width: u64,
    /// Mean file size (sizes are uniform in 1..=2x this).
    mean_size: u64,
    /// Mean append (uniform in 1..=2x this).
    append_mean: u64,
    /// Percent of the file set made before the timed run (Filebench's `prealloc`).
    prealloc_pct: u64,
    /// Calls per loop of the flow.
    flow: &'static str,
}

impl Workload {
    /// Every workload, in report order.
    pub const ALL: [Workload; 10] = [
        Workload::Varmail,
        Workload::Fileserver,
        Workload::Webserver,
        Workload::Webproxy,
        Workload::AppendFsync,
        Workload::SeqRead,
        Workload::RandRead,
        Workload::SeqWrite,
        Workload::RandWrite,
        Workload::Scale,
    ];

    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Varmail => "varmail",
            Workload::Fileserver => "fileserver",
            Workload::Webserver => "webserver",
            Workload::Webproxy => "webproxy",
            Workload::AppendFsync => "append-fsync",
            Workload::SeqRead => "seq-read",
            Workload::RandRead => "rand-read",
            Workload::SeqWrite => "seq-write",
            Workload::RandWrite => "rand-write",
            Workload::Scale => "scale",
        }
    }

    /// The workload called `name`; Err names the choices.
    pub fn parse(name: &str) -> std::result::Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload {name:?} (choose from {})", all.join(", "))
            })
    }

    /// The calls of one loop.
    pub(crate) fn flow(self) -> &'static str {
        self.spec().flow
    }

    /// The paper's (threads, files) for a Filebench personality (Table 1).
    pub(crate) fn paper(self) -> Option<(usize, u64)> {
        self.spec().paper
    }

    /// How its file set is shaped, in words.
    pub(crate) fn shape(self) -> String {
        let s = self.spec();
        let kib = |b: u64| b >> 10;
        match self {
            w if w.is_filebench() => format!(
                "{}, sizes uniform in 1 B..{} KiB (mean {} KiB), appends 1 B..{} KiB, {}% made \
                 before the timed run, reads and whole-file writes in 1 MiB calls",
                if s.width >= s.files {
                    "one directory".to_string()
                } else {
                    format!("{} files per directory", s.width)
                },
                kib(2 * s.mean_size),
                kib(s.mean_size),
                kib(2 * s.append_mean),
                s.prealloc_pct
            ),
            Workload::Scale => {
                "paper Fig. 10; here 1..N threads (N = CPUs unless --max-threads), 64 KiB files"
                    .to_string()
            }
            _ => "paper Fig. 6 (b, c); one thread, one file, one pass of 4 KiB calls".to_string(),
        }
    }

    pub(super) fn is_filebench(self) -> bool {
        matches!(
            self,
            Workload::Varmail | Workload::Fileserver | Workload::Webserver | Workload::Webproxy
        )
    }

    fn spec(self) -> Spec {
        let micro = Spec {
            paper: None,
            files: 1,
            width: 1,
            mean_size: 0,
            append_mean: 0,
            prealloc_pct: 0,
            flow: "",
        };
        match self {
            Workload::Varmail => Spec {
                paper: Some((16, 1_000_000)),
                files: 10_000,
                width: 1_000_000,
                mean_size: 16 << 10,
                append_mean: 16 << 10,
                prealloc_pct: 80,
                flow: "unlink, create, append, fsync, close, open, read whole, append, fsync, \
                       close, open, read whole, close",
            },
            Workload::Fileserver => Spec {
                paper: Some((50, 500_000)),
                files: 1_250,
                width: 20,
                mean_size: 128 << 10,
                append_mean: 16 << 10,
                prealloc_pct: 80,
                flow: "create, write whole, close, open, append, close, open, read whole, \
                       close, unlink, stat",
            },
            Workload::Webserver => Spec {
                paper: Some((100, 500_000)),
                files: 10_000,
                width: 20,
                mean_size: 16 << 10,
                append_mean: 16 << 10,
                prealloc_pct: 100,
                flow: "10 x (open, read whole, close), append to a shared log",
            },
            Workload::Webproxy => Spec {
                paper: Some((100, 1_000_000)),
                files: 10_000,
                width: 1_000_000,
                mean_size: 16 << 10,
                append_mean: 16 << 10,
                prealloc_pct: 80,
                flow: "unlink, create, append, close, 5 x (open, read whole, close)",
            },
            Workload::AppendFsync => Spec {
                flow: "append 4 KiB (an fsync after every tenth)",
                ..micro
            },
            Workload::SeqRead => Spec {
                flow: "read 4 KiB, sequential",
                ..micro
            },
            Workload::RandRead => Spec {
                flow: "read 4 KiB, random",
                ..micro
            },
            Workload::SeqWrite => Spec {
                flow: "overwrite 4 KiB in place, sequential",
                ..micro
            },
            Workload::RandWrite => Spec {
                flow: "overwrite 4 KiB in place, random",
                ..micro
            },
            Workload::Scale => Spec {
                flow: "create, 16 x append 4 KiB, fsync, close, unlink (each thread its own file)",
                ..micro
            },
        }
    }
}

/// Where a workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// The winefs library called directly, strict mode, on a new pool.
    LibStrict,
    /// The same in relaxed mode.
    LibRelaxed,
    /// The winefs library, strict, on a pool aged to `util_pct`.
    LibStrictAged,
    /// A FUSE mount of a new pool (as `winefs mount` serves it by default).
    Fuse,
    /// A FUSE mount of an aged pool.
    FuseAged,
    /// A directory on the host's tmpfs.
    Tmpfs,
    /// libfuse's `passthrough_ll` (its defaults) over a tmpfs directory.
    Passthrough,
    /// ext4 on a loop device over an image file on tmpfs (root).
    Ext4,
    /// xfs likewise.
    Xfs,
}

impl Setup {
    /// Every setup, in report order.
    pub const ALL: [Setup; 9] = [
        Setup::LibStrict,
        Setup::LibRelaxed,
        Setup::LibStrictAged,
        Setup::Fuse,
        Setup::FuseAged,
        Setup::Tmpfs,
        Setup::Passthrough,
        Setup::Ext4,
        Setup::Xfs,
    ];

    /// Its name on the command line and in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Setup::LibStrict => "lib-strict",
            Setup::LibRelaxed => "lib-relaxed",
            Setup::LibStrictAged => "lib-strict-aged",
            Setup::Fuse => "fuse",
            Setup::FuseAged => "fuse-aged",
            Setup::Tmpfs => "tmpfs",
            Setup::Passthrough => "passthrough",
            Setup::Ext4 => "ext4",
            Setup::Xfs => "xfs",
        }
    }

    /// The setup called `name`; Err names the choices.
    pub fn parse(name: &str) -> std::result::Result<Setup, String> {
        Setup::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = Setup::ALL.iter().map(|s| s.name()).collect();
                format!("unknown setup {name:?} (choose from {})", all.join(", "))
            })
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Setup::LibStrict => "winefs library, strict",
            Setup::LibRelaxed => "winefs library, relaxed",
            Setup::LibStrictAged => "winefs library, strict, aged",
            Setup::Fuse => "winefs FUSE mount",
            Setup::FuseAged => "winefs FUSE mount, aged",
            Setup::Tmpfs => "tmpfs",
            Setup::Passthrough => "passthrough_ll over tmpfs",
            Setup::Ext4 => "ext4 (loop on tmpfs)",
            Setup::Xfs => "xfs (loop on tmpfs)",
        }
    }

    pub(super) fn aged(self) -> bool {
        matches!(self, Setup::LibStrictAged | Setup::FuseAged)
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct WorkloadBenchConfig {
    /// Directory for the pools, the tmpfs baseline and the loop images (default: /dev/shm).
    pub dir: Option<PathBuf>,
    /// Workloads to run, in this order.
    pub workloads: Vec<Workload>,
    /// Setups each workload runs on, in this order.
    pub setups: Vec<Setup>,
    /// Multiplies the file counts (1.0: about 160 MB of files per personality).
    pub scale: f64,
    /// Timed seconds per Filebench run and per thread count of the scalability run.
    pub seconds: f64,
    /// Threads of the Filebench personalities (None: the paper's, scaled to this machine).
    pub threads: Option<usize>,
    /// Size of the microbenchmarks' file.
    pub micro_size: u64,
    /// Most threads of the scalability run (None: the CPUs here).
    pub max_threads: Option<usize>,
    /// Utilization of the aged pools, percent.
    pub util_pct: f64,
    /// Aging writes, as a multiple of the capacity.
    pub age_writes: f64,
    /// Seed of the file sizes, the random choices and the aging.
    pub seed: u64,
    /// Rounds per workload: every setup runs once per round, the setups in turn, so that the
    /// host's slow and fast phases fall on all of them alike; each run reports the median round.
    pub rounds: usize,
    /// Draw a progress bar on standard error.
    pub progress: bool,
}

impl Default for WorkloadBenchConfig {
    fn default() -> Self {
        WorkloadBenchConfig {
            dir: None,
            workloads: Workload::ALL.to_vec(),
            setups: Setup::ALL.to_vec(),
            scale: 1.0,
            seconds: 5.0,
            threads: None,
            micro_size: 256 << 20,
            max_threads: None,
            util_pct: 75.0,
            age_writes: 1.5,
            seed: 1,
            rounds: 1,
            progress: false,
        }
    }
}

/// Sizes and counts one workload runs with here.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) workload: Workload,
    pub(super) threads: usize,
    pub(super) files: u64,
    pub(super) dirs: u64,
    pub(super) width: u64,
    pub(super) mean_size: u64,
    pub(super) append_mean: u64,
    pub(super) prealloc_pct: u64,
    pub(super) seconds: f64,
    pub(super) micro_size: u64,
    pub(super) seed: u64,
}

impl Plan {
    pub(super) fn new(w: Workload, cfg: &WorkloadBenchConfig, cpus: usize) -> Plan {
        let s = w.spec();
        let files = if w.is_filebench() {
            ((s.files as f64 * cfg.scale).round() as u64).max(16)
        } else {
            1
        };
        let threads = match (w.is_filebench(), s.paper) {
            (true, Some((t, _))) => cfg
                .threads
                .unwrap_or_else(|| (t * cpus).div_ceil(PAPER_CORES).max(cpus))
                .clamp(1, files as usize),
            _ => 1,
        };
        Plan {
            workload: w,
            threads,
            files,
            dirs: files.div_ceil(s.width),
            width: s.width,
            mean_size: s.mean_size,
            append_mean: s.append_mean,
            prealloc_pct: s.prealloc_pct,
            seconds: cfg.seconds,
            micro_size: cfg.micro_size,
            seed: cfg.seed,
        }
    }

    /// Bytes the workload's files may hold at once (with room for growth by appends).
    pub(super) fn data_bytes(&self) -> u64 {
        match self.workload {
            w if w.is_filebench() => {
                self.files * (self.mean_size + self.append_mean * 2) + (64 << 20)
            }
            Workload::Scale => 64 << 20,
            _ => self.micro_size + self.micro_size / 4 + (32 << 20),
        }
    }

    pub(super) fn file(&self, idx: u64) -> FileRef {
        FileRef {
            dir: idx / self.width,
            idx,
        }
    }
}
