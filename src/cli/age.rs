//! `winefs age`: the ager (Geriatrix-like) on a pool through the library or on any directory
//! through POSIX calls; the aging experiment's winefs side (with `winefs fresh`).

use crate::fail::{Ctx, Fail, fail};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use winefs::age::profile::Profile;
use winefs::age::{AgeConfig, AgeTarget, Ager, CreateMethod, LibraryTarget, PosixTarget};
use winefs::report::FragReport;
use winefs::units::parse_size;
use winefs::{Fs, MkfsOptions, MountOptions};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CreateArg {
    /// One fallocate(2) of the whole size (as Geriatrix).
    Fallocate,
    /// write(2) of the whole size in 1 MiB calls.
    Write,
}

#[derive(Args)]
pub struct AgeArgs {
    /// winefs pool to age through the library (made with --size if it does not exist).
    #[arg(required_unless_present = "dir", conflicts_with = "dir")]
    pool: Option<PathBuf>,
    /// Age this directory through POSIX calls instead (a winefs FUSE mount, ext4, xfs ...).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of a new pool (K/M/G/T suffixes).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Profile: agrawal, wang, meyer, or a profile file (format: profiles/agrawal.txt).
    #[arg(long, default_value = "agrawal")]
    profile: String,
    /// Target utilization, in percent.
    #[arg(long, default_value_t = 75.0)]
    util: f64,
    /// Total writes, as a multiple of capacity (the fill counts).
    #[arg(long, default_value_t = 10.0)]
    writes: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How files get their bytes.
    #[arg(long, value_enum, default_value = "fallocate")]
    create: CreateArg,
    /// Ager state file, for resuming (default: beside the pool or directory, `.age-state`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Forget any saved state and start afresh (the file system is not emptied).
    #[arg(long)]
    restart: bool,
    /// Stop once the age distribution has converged (chi-square, 95%).
    #[arg(long)]
    stop_on_convergence: bool,
    /// Write the final report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Pools only: mount without background work (no hole compaction, no reactive rewrite), to
    /// see what the allocator alone keeps.
    #[arg(long, conflicts_with = "dir")]
    no_background: bool,
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

pub fn age(a: AgeArgs) -> Result<u8, Fail> {
    let profile = Profile::load(&a.profile).ctx(|| "load the profile".into())?;
    let mut cfg = AgeConfig::new(profile);
    cfg.seed = a.seed;
    cfg.utilization = a.util / 100.0;
    cfg.writes = a.writes;
    cfg.stop_on_convergence = a.stop_on_convergence;
    cfg.progress = !a.quiet;
    let method = match a.create {
        CreateArg::Fallocate => CreateMethod::Fallocate,
        CreateArg::Write => CreateMethod::Write,
    };
    let (report, fs) = if let Some(dir) = &a.dir {
        winefs::age::target::check_dir(dir).ctx(|| "age a directory".into())?;
        let dir = dir
            .canonicalize()
            .map_err(|e| fail(format!("resolve {}", dir.display()), e))?;
        let state = a
            .state
            .clone()
            .unwrap_or_else(|| sibling(&dir, ".age-state"));
        prepare_state(&state, a.restart)?;
        cfg.state = Some(state);
        let target = PosixTarget { root: dir, method };
        (run(&cfg, target)?, None)
    } else {
        let pool = a
            .pool
            .clone()
            .ok_or_else(|| fail("age", "give a POOL or --dir"))?;
        if !pool.exists() {
            let size = a.size.ok_or_else(|| {
                fail(
                    format!("age {}", pool.display()),
                    "the pool does not exist; give --size to make it",
                )
            })?;
            Fs::mkfs(
                &pool,
                &MkfsOptions {
                    size: Some(size),
                    ..Default::default()
                },
            )
            .ctx(|| format!("mkfs {}", pool.display()))?;
        } else if a.size.is_some() {
            return Err(fail(
                format!("age {}", pool.display()),
                "the pool exists; --size only makes a new one",
            ));
        }
        let state = a
            .state
            .clone()
            .unwrap_or_else(|| sibling(&pool, ".age-state"));
        prepare_state(&state, a.restart)?;
        cfg.state = Some(state);
        let fs = Fs::mount(
            &pool,
            MountOptions {
                no_background_rewrite: a.no_background,
                ..Default::default()
            },
        )
        .ctx(|| format!("mount {}", pool.display()))?;
        let target = LibraryTarget {
            fs: fs.clone(),
            method,
        };
        (run(&cfg, target)?, Some((fs, pool)))
    };
    if let Some((fs, _)) = &fs {
        // Let background compaction finish what the last frees started, so the report below
        // shows the pool as it settles.
        let _ = fs.settle_rewrites(std::time::Duration::from_secs(600));
    }
    println!("{report}");
    if let Some((fs, pool)) = fs {
        println!("{}", FragReport::new(&fs));
        fs.unmount().ctx(|| format!("unmount {}", pool.display()))?;
    }
    if let Some(j) = &a.json {
        std::fs::write(j, report.to_json() + "\n")
            .map_err(|e| fail(format!("write {}", j.display()), e))?;
    }
    Ok(0)
}

fn prepare_state(state: &Path, restart: bool) -> Result<(), Fail> {
    if restart && state.exists() {
        std::fs::remove_file(state).map_err(|e| fail(format!("remove {}", state.display()), e))?;
    }
    if state.exists() {
        log::info!("resuming from {}", state.display());
    }
    Ok(())
}

fn run<T: AgeTarget>(cfg: &AgeConfig, target: T) -> Result<winefs::age::AgeReport, Fail> {
    let mut ager = Ager::new(cfg, target).ctx(|| "start the ager".into())?;
    ager.run().ctx(|| "age".into())
}
