//! The FUSE kill harness: a write-heavy multi-threaded workload on a `winefs mount` of a pool,
//! the daemon killed with SIGKILL at a random moment, then `umount -l`, fsck of the pool, a
//! remount, and every name whose last change was fsync'd (or renamed into place from an
//! fsync'd file) checked against the content it must have — or, for a name whose change was
//! in flight at the kill, against the contents it may have (old or new).

use crate::rng::Rng;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

/// How long a mount may take to appear, and a killed daemon to go away.
const WAIT: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Clone, Debug)]
pub struct KillConfig {
    /// The `winefs` binary (its `mount -f` serves the pool).
    pub winefs: PathBuf,
    /// Kill rounds (each: start the daemon, write, kill, fsck, remount and check).
    pub rounds: usize,
    /// Writer threads.
    pub threads: usize,
    /// Seed of the writers' choices and of the kill moments.
    pub seed: u64,
    /// Kill moments are drawn uniformly from this range of milliseconds after the writers start.
    pub kill_after_ms: (u64, u64),
    /// Size of the pool made for the run, in bytes.
    pub pool_size: u64,
    /// Where the pool and the mountpoint go (default: /dev/shm, else the temporary directory).
    pub dir: Option<PathBuf>,
    /// Print a line per round to stderr.
    pub verbose: bool,
}

impl KillConfig {
    /// The defaults (20 rounds, 4 writers, seed 1, a 128 MiB pool) for the binary `winefs`.
    pub fn new(winefs: PathBuf) -> KillConfig {
        KillConfig {
            winefs,
            rounds: 20,
            threads: 4,
            seed: 1,
            kill_after_ms: (20, 400),
            pool_size: 128 << 20,
            dir: None,
            verbose: false,
        }
    }
}

/// What the harness did.
#[derive(Clone, Debug, Default)]
pub struct KillSummary {
    /// Rounds completed.
    pub rounds: usize,
    /// Completed (fsync'd) writes, renames and appends across all rounds.
    pub synced_ops: u64,
    /// Name checks after remounts (each name checked every round it is tracked).
    pub checks: u64,
    /// Names whose change was in flight at a kill and that came back old or new.
    pub in_flight_checks: u64,
    /// In-flight appends that came back cut inside the appended bytes (one write(2) split by
    /// the kernel into several FUSE requests; each request is atomic, the call is not).
    pub partial_appends: u64,
    /// What went wrong, one line per problem, prefixed with its round.
    pub failures: Vec<String>,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

impl std::fmt::Display for KillSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kill rounds: {}; fsync'd operations: {}; name checks after remount: {} ({} of names in flight at the kill, {} appends cut short); {:.1} s; failures: {}",
            self.rounds,
            self.synced_ops,
            self.checks,
            self.in_flight_checks,
            self.partial_appends,
            self.elapsed.as_secs_f64(),
            self.failures.len()
        )
    }
}

/// Content a name may have: the first `len` bytes of the stream of `seed`, for any `len` in
/// `lo..=hi` (an append in flight at the kill may have reached the pool in part: see `Round`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Content {
    seed: u64,
    lo: usize,
    hi: usize,
}

impl Content {
    fn exact(seed: u64, len: usize) -> Content {
        Content {
            seed,
            lo: len,
            hi: len,
        }
    }

    fn admits(&self, got: &[u8]) -> bool {
        (self.lo..=self.hi).contains(&got.len()) && got == bytes_of(self.seed, got.len())
    }
}

fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The acceptable contents of each tracked name (None in the list: the name may be absent).
type Expect = HashMap<String, Vec<Option<Content>>>;

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

struct Daemon {
    child: Child,
}

fn is_mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split_whitespace().nth(4) == Some(&*want))
    })
}

fn start(cfg: &KillConfig, pool: &Path, mnt: &Path, log: &Path) -> Result<Daemon> {
    let logf = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("open {}", log.display())))?;
    let mut child = Command::new(&cfg.winefs)
        .arg("mount")
        .arg(pool)
        .arg(mnt)
        .args(["-f", "--threads", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(logf)
        .spawn()
        .map_err(io(format!("start {} mount", cfg.winefs.display())))?;
    let stdout = child.stdout.take();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                let _ = tx.send(line);
            }
        }
    });
    let mut d = Daemon { child };
    let deadline = Instant::now() + WAIT;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.starts_with("winefs: mounted") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = d.child.kill();
                let _ = d.child.wait();
                return Err(Error::Invalid(format!(
                    "winefs mount did not mount (see {})",
                    log.display()
                )));
            }
        }
    }
    while !is_mounted(mnt) {
        if Instant::now() > deadline {
            d.kill_and_unmount(mnt)?;
            return Err(Error::Invalid(format!("{} never appeared", mnt.display())));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(d)
}

impl Daemon {
    /// SIGKILL, reap, and clear the dead mount.
    fn kill_and_unmount(&mut self, mnt: &Path) -> Result<()> {
        self.child
            .kill()
            .map_err(io("kill the winefs daemon".into()))?;
        self.child
            .wait()
            .map_err(io("wait for the winefs daemon".into()))?;
        let deadline = Instant::now() + WAIT;
        while is_mounted(mnt) {
            let _ = crate::sys::lazy_unmount(mnt);
            if Instant::now() > deadline {
                return Err(Error::Invalid(format!(
                    "{} still mounted after umount -l",
                    mnt.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// Shared state of one round's writers.
struct Round {
    dir: PathBuf,
    expect: Mutex<Expect>,
    stop: AtomicBool,
    killing: AtomicBool,
    early: Mutex<Vec<String>>,
    synced: AtomicU64,
}

impl Round {
    fn set(&self, name: &str, v: Vec<Option<Content>>) {
        self.expect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), v);
    }

    fn get(&self, name: &str) -> Option<Vec<Option<Content>>> {
        self.expect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Record a failed step: a failure unless the daemon is being killed.
    fn failed(&self, what: String) {
        if !self.killing.load(Ordering::SeqCst) {
            self.early
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(what);
        }
    }
}

fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for c in data.chunks(64 << 10) {
        f.write_all(c)?;
    }
    f.sync_all()
}

/// One writer: rewrites in place, atomic replaces via rename and appends over its own names,
/// fsync'ing each, until stopped or the mount dies.
fn writer(round: &Round, t: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    while !round.stop.load(Ordering::Relaxed) {
        let name = format!("t{t}-{}", rng.below(12));
        let path = round.dir.join(&name);
        let new = Content::exact(rng.next_u64(), 1 + rng.below(192 << 10) as usize);
        let old = round.get(&name).unwrap_or_else(|| vec![None]);
        let res = match (rng.below(3), old.as_slice()) {
            // Append one write(2) to a name with one known content. Meanwhile: the old
            // content plus any prefix of the appended bytes, because the kernel may split one
            // write(2) into several FUSE requests (it ends a request at a partly written page
            // that is not in its page cache), each atomic on its own.
            (0, [Some(c)]) if c.lo == c.hi => {
                let len = c.hi + new.hi.min(64 << 10);
                let all = bytes_of(c.seed, len);
                round.set(
                    &name,
                    vec![Some(Content {
                        seed: c.seed,
                        lo: c.hi,
                        hi: len,
                    })],
                );
                std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| {
                        f.write_all(&all[c.hi..])?;
                        f.sync_all()
                    })
                    .map(|()| Content::exact(c.seed, len))
            }
            // Write a temporary file, fsync, rename over the name: old or new meanwhile.
            (1, _) => {
                let tmp = round.dir.join(format!("{name}.tmp"));
                write_synced(&tmp, &bytes_of(new.seed, new.hi)).and_then(|()| {
                    round.set(&name, [old, vec![Some(new)]].concat());
                    std::fs::rename(&tmp, &path).map(|()| new)
                })
            }
            // Rewrite in place: while in flight, the name's content is unknown.
            _ => {
                round
                    .expect
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                write_synced(&path, &bytes_of(new.seed, new.hi)).map(|()| new)
            }
        };
        match res {
            Ok(c) => {
                round.set(&name, vec![Some(c)]);
                round.synced.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                round.failed(format!("{name}: {e}"));
                return;
            }
        }
    }
}

/// A name whose change was in flight at the kill: more than one content allowed.
fn in_flight_entry(allowed: &[Option<Content>]) -> bool {
    allowed.len() > 1 || allowed.iter().flatten().any(|c| c.lo < c.hi)
}

fn admits(a: &Option<Content>, got: Option<&[u8]>) -> bool {
    match (a, got) {
        (None, None) => true,
        (Some(c), Some(b)) => c.admits(b),
        _ => false,
    }
}

/// Check every tracked name under `dir`; counts checks, in-flight names and cut appends.
fn verify(dir: &Path, expect: &Expect, sum: &mut KillSummary, round: usize) {
    let failures = &mut sum.failures;
    for (name, allowed) in expect {
        sum.checks += 1;
        if in_flight_entry(allowed) {
            sum.in_flight_checks += 1;
        }
        let got = match std::fs::read(dir.join(name)) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                failures.push(format!("round {round}: read {name}: {e}"));
                continue;
            }
        };
        let ok = allowed.iter().any(|a| admits(a, got.as_deref()));
        if let (true, Some(b)) = (ok, &got)
            && allowed
                .iter()
                .flatten()
                .any(|c| c.lo < b.len() && b.len() < c.hi && c.admits(b))
        {
            sum.partial_appends += 1;
        }
        if !ok {
            failures.push(format!(
                "round {round}: {name} has {} bytes, none of the allowed contents {allowed:?}",
                got.map_or(-1, |b| b.len() as i64)
            ));
        }
    }
}

/// A directory removed (after unmounting whatever is left on its mountpoint) when dropped.
struct Work {
    root: PathBuf,
    mnt: PathBuf,
    daemon: Option<Daemon>,
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill_and_unmount(&self.mnt);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Run the harness.
pub fn run(cfg: &KillConfig) -> Result<KillSummary> {
    let t0 = Instant::now();
    let base = match &cfg.dir {
        Some(d) => d.clone(),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    };
    let root = base.join(format!("winefs-kill-{}", std::process::id()));
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(io(format!("create {}", mnt.display())))?;
    let mut work = Work {
        root: root.clone(),
        mnt: mnt.clone(),
        daemon: None,
    };
    let pool = root.join("pool");
    let log = root.join("daemon.log");
    crate::Fs::mkfs(
        &pool,
        &crate::MkfsOptions {
            size: Some(cfg.pool_size),
            ..Default::default()
        },
    )?;
    let mut rng = Rng::new(cfg.seed);
    let mut sum = KillSummary::default();
    let mut expect: Expect = HashMap::new();
    for r in 0..cfg.rounds {
        work.daemon = Some(start(cfg, &pool, &mnt, &log)?);
        let dir = mnt.join("data");
        if r == 0 {
            std::fs::create_dir(&dir).map_err(io(format!("mkdir {}", dir.display())))?;
        }
        // Everything synced so far must have survived the previous kill.
        verify(&dir, &expect, &mut sum, r);
        // In-flight names were resolved by the check: from now on a name must keep the
        // content it came back with (names that failed the check are no longer tracked).
        expect.retain(|name, allowed| {
            if !in_flight_entry(allowed) {
                return true;
            }
            let got = std::fs::read(dir.join(name)).ok();
            match allowed.iter().find(|a| admits(a, got.as_deref())) {
                Some(Some(c)) => {
                    *allowed = vec![Some(Content::exact(c.seed, got.map_or(0, |b| b.len())))];
                    true
                }
                Some(None) => {
                    *allowed = vec![None];
                    true
                }
                None => false,
            }
        });
        let round = Round {
            dir: dir.clone(),
            expect: Mutex::new(std::mem::take(&mut expect)),
            stop: AtomicBool::new(false),
            killing: AtomicBool::new(false),
            early: Mutex::new(Vec::new()),
            synced: AtomicU64::new(0),
        };
        let (lo, hi) = cfg.kill_after_ms;
        let wait = Duration::from_millis(lo + rng.below(hi.saturating_sub(lo).max(1)));
        let seeds: Vec<u64> = (0..cfg.threads).map(|_| rng.next_u64()).collect();
        let killed = std::thread::scope(|s| {
            for (t, seed) in seeds.iter().enumerate() {
                let round = &round;
                s.spawn(move || writer(round, t, *seed));
            }
            std::thread::sleep(wait);
            round.killing.store(true, Ordering::SeqCst);
            let k = match work.daemon.take() {
                Some(mut d) => d.kill_and_unmount(&mnt),
                None => Ok(()),
            };
            round.stop.store(true, Ordering::SeqCst);
            k
        });
        killed?;
        let early = round.early.into_inner().unwrap_or_else(|e| e.into_inner());
        for e in early {
            sum.failures
                .push(format!("round {r}: failed before the kill: {e}"));
        }
        sum.synced_ops += round.synced.load(Ordering::Relaxed);
        expect = round.expect.into_inner().unwrap_or_else(|e| e.into_inner());
        let report = crate::state::fsck::check_pool(&pool)?;
        if !report.is_clean() {
            sum.failures.push(format!(
                "round {r}: fsck after the kill: {:?}",
                report.problems
            ));
        }
        sum.rounds += 1;
        if cfg.verbose {
            eprintln!(
                "  round {r}: killed after {} ms, {} fsync'd operations, {} names tracked, {} failures so far",
                wait.as_millis(),
                round.synced.load(Ordering::Relaxed),
                expect.len(),
                sum.failures.len()
            );
        }
    }
    // A last remount: the final kill's survivors.
    work.daemon = Some(start(cfg, &pool, &mnt, &log)?);
    verify(&mnt.join("data"), &expect, &mut sum, cfg.rounds);
    if let Some(mut d) = work.daemon.take() {
        d.kill_and_unmount(&mnt)?;
    }
    sum.elapsed = t0.elapsed();
    Ok(sum)
}
