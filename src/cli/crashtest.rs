//! `winefs crashtest`: the crash explorer and the FUSE kill harness, run longer than CI runs
//! them, with a summary (each failure printed with what reproduces it).

use crate::fail::{Fail, fail};
use clap::Subcommand;
use winefs::Consistency;
use winefs::crash::kill::{KillConfig, run as kill_run};
use winefs::crash::{ExploreConfig, explore, workloads};

#[derive(Subcommand)]
pub(crate) enum CrashCmd {
    /// Persistence-point crash exploration: every length-1 workload, plus sampled length-2 and
    /// length-3 ones; each crash state is recovered, fsck'd and checked against the oracles.
    Explore {
        /// Longest sequences: 1 (singles only), 2 (plus pairs) or 3 (plus triples).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=3))]
        seqs: u8,
        /// Length-2 workloads (all of them if at least their number).
        #[arg(long, default_value_t = 3000)]
        pairs: usize,
        /// Length-3 workloads.
        #[arg(long, default_value_t = 1000)]
        triples: usize,
        /// Random subsets per crash point beyond the exhaustive bound.
        #[arg(long, default_value_t = 32)]
        states: usize,
        /// Crash points with at most this many pending cache lines get every subset (0-20:
        /// 2^N states each).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=20))]
        exhaustive_lines: u32,
        /// Seed of every sampled choice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run only workload INDEX (as printed with a failure), with the same other options.
        #[arg(long)]
        only: Option<usize>,
        /// Only this mode (default: both strict and relaxed).
        #[arg(long, value_parser = ["strict", "relaxed"])]
        mode: Option<String>,
        /// Worker threads (default: one per CPU).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Self-test: record with the fence after the undo records skipped (must fail).
        #[arg(long)]
        broken_skip_undo_fence: bool,
        /// Self-test: record with the fence before alternate slots' descriptors skipped (must
        /// fail).
        #[arg(long)]
        broken_skip_slot_fence: bool,
        /// Self-test: record with the fence between an append's bytes and its size store
        /// skipped (must fail).
        #[arg(long)]
        broken_skip_append_fence: bool,
        /// List the workloads and exit.
        #[arg(long)]
        list: bool,
    },
    /// Structure-aware corruption: damage a small pool holding every kind of metadata in one
    /// seeded way per trial, then fsck, mount, read every file, write, unmount and mount again;
    /// judge each trial by the trust rules (docs/TESTING.md, "Corruption").
    Corrupt {
        #[arg(long, default_value_t = 2000)]
        trials: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Scratch directory for the pools (default: a temporary directory).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Kill the FUSE daemon with SIGKILL at random moments under a multi-threaded fsync'ing
    /// writer workload; fsck and check every fsync'd file after each remount (needs root and
    /// /dev/fuse). With -v, a line per round.
    Kill {
        #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        rounds: usize,
        /// Writer threads, 1-64.
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
        threads: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Run a crashtest command; `verbose` (the global -v) asks the kill harness for a line per round.
pub(crate) fn run(cmd: CrashCmd, verbose: bool) -> Result<u8, Fail> {
    match cmd {
        CrashCmd::Explore {
            seqs,
            pairs,
            triples,
            states,
            exhaustive_lines,
            seed,
            only,
            mode,
            threads,
            broken_skip_undo_fence,
            broken_skip_slot_fence,
            broken_skip_append_fence,
            list,
        } => {
            let cfg = ExploreConfig {
                all_singles: true,
                pairs: if seqs >= 2 { pairs } else { 0 },
                triples: if seqs >= 3 { triples } else { 0 },
                modes: match mode.as_deref() {
                    Some("strict") => vec![Consistency::Strict],
                    Some(_) => vec![Consistency::Relaxed],
                    None => vec![Consistency::Strict, Consistency::Relaxed],
                },
                exhaustive_lines,
                samples: states,
                seed,
                threads,
                only,
                broken_skip_undo_fence,
                broken_skip_slot_fence,
                broken_skip_append_fence,
                dir: None,
                progress_every: if only.is_some() { 0 } else { 500 },
            };
            if list {
                for (i, w) in workloads(&cfg).iter().enumerate() {
                    println!("#{i} {w}");
                }
                return Ok(0);
            }
            let sum = explore(&cfg).map_err(|e| fail("crashtest explore", e))?;
            for f in &sum.failures {
                println!("FAIL {f}");
                println!(
                    "  reproduce: winefs crashtest explore --seqs {seqs} --pairs {pairs} --triples {triples} --states {states} --exhaustive-lines {exhaustive_lines} --seed {seed}{}{} --only {}",
                    mode.as_deref()
                        .map(|m| format!(" --mode {m}"))
                        .unwrap_or_default(),
                    [
                        (broken_skip_undo_fence, " --broken-skip-undo-fence"),
                        (broken_skip_slot_fence, " --broken-skip-slot-fence"),
                        (broken_skip_append_fence, " --broken-skip-append-fence"),
                    ]
                    .iter()
                    .filter(|b| b.0)
                    .map(|b| b.1)
                    .collect::<String>(),
                    f.index
                );
            }
            println!("{sum}");
            Ok(if sum.failures.is_empty() { 0 } else { 1 })
        }
        CrashCmd::Corrupt { trials, seed, dir } => {
            // Every damaged pool that mounts is reported at warning level; the summary is
            // the output here (-v shows them).
            if !verbose {
                log::set_max_level(log::LevelFilter::Off);
            }
            let tmp;
            let dir = match dir {
                Some(d) => d,
                None => {
                    tmp = tempfile_dir().map_err(|e| fail("crashtest corrupt", e))?;
                    tmp.0.clone()
                }
            };
            let sum = winefs::crash::corrupt::run(&dir, trials, seed)
                .map_err(|e| fail("crashtest corrupt", e))?;
            for f in &sum.failures {
                println!("FAIL {f}");
            }
            print!("{sum}");
            println!("(seed {seed}; reproduce a trial with the same --trials and --seed)");
            Ok(if sum.failures.is_empty() { 0 } else { 1 })
        }
        CrashCmd::Kill {
            rounds,
            threads,
            seed,
        } => {
            let exe = std::env::current_exe().map_err(|e| fail("crashtest kill", e))?;
            let cfg = KillConfig {
                rounds,
                threads,
                seed,
                verbose,
                ..KillConfig::new(exe)
            };
            let sum = kill_run(&cfg).map_err(|e| fail("crashtest kill", e))?;
            for f in &sum.failures {
                println!("FAIL {f}");
            }
            println!("{sum} (seed {seed})");
            Ok(if sum.failures.is_empty() { 0 } else { 1 })
        }
    }
}

/// A scratch directory under the system's temporary directory, removed when dropped.
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> std::io::Result<ScratchDir> {
    let d = std::env::temp_dir().join(format!("winefs-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(ScratchDir(d))
}
