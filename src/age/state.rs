//! The ager's state: its seeded generator, the directory tree the profile describes, the live
//! files, the counters, and the checkpoint that makes a run resumable (a JSON object written
//! atomically beside the target).

use crate::age::config::AgeConfig;
use crate::age::profile::{Profile, Weighted};
use crate::error::{Error, Result};
use crate::rng::Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::Path;

/// Directories per depth at most (the profiles' products of subdirectory counts reach
/// millions; a few hundred directories per level spread files as widely as small pools need).
pub(crate) const MAX_DIRS_PER_DEPTH: u64 = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LiveFile {
    pub(super) id: u64,
    pub(super) size: u64,
    pub(super) depth: u32,
    pub(super) dir: u64,
}

/// The directory tree the profile describes.
#[derive(Clone, Debug)]
pub(super) struct Tree {
    /// (depth, directories at that depth) of every depth files may go to.
    pub(super) depths: Vec<(u32, u64)>,
    /// Directories at each depth 0..=max.
    pub(super) counts: Vec<u64>,
    /// Subdirectories per directory at each depth 0..=max.
    pub(super) fanout: Vec<u64>,
    pub(super) pick: Weighted,
}

impl Tree {
    pub(super) fn new(p: &Profile) -> Tree {
        let max = p.dirs.iter().map(|d| d.depth).max().unwrap_or(0);
        let mut counts = vec![1u64];
        let mut fanout = Vec::new();
        for d in 0..=max {
            // A depth the profile does not list passes one subdirectory down, so deeper
            // levels stay reachable.
            let sub = p
                .dirs
                .iter()
                .find(|e| e.depth == d)
                .map_or(1, |e| e.subdirs);
            fanout.push(sub.max(1));
            if d < max {
                let next = (counts[d as usize] * sub.max(1)).min(MAX_DIRS_PER_DEPTH);
                counts.push(next);
            }
        }
        let depths: Vec<(u32, u64)> = p
            .dirs
            .iter()
            .map(|e| (e.depth, counts[e.depth as usize]))
            .collect();
        Tree {
            depths,
            counts,
            fanout,
            pick: Weighted::new(p.dirs.iter().map(|e| e.weight)),
        }
    }

    /// The parent (at depth d-1) of directory `j` at depth d.
    pub(super) fn parent(&self, depth: u32, j: u64) -> u64 {
        let d = depth as usize;
        (j / self.fanout[d - 1]) % self.counts[d - 1]
    }

    /// Path of directory `j` at `depth` ("" for the root).
    pub(super) fn path(&self, depth: u32, j: u64) -> String {
        if depth == 0 {
            return String::new();
        }
        let up = self.path(depth - 1, self.parent(depth, j));
        if up.is_empty() {
            format!("d{j}")
        } else {
            format!("{up}/d{j}")
        }
    }
}

/// Everything the ager knows, checkpointed for resuming.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct State {
    pub(super) profile: String,
    pub(super) seed: u64,
    pub(super) rng: Rng,
    pub(super) clock: u64,
    pub(super) next_id: u64,
    pub(super) written: u64,
    pub(super) creates: u64,
    pub(super) deletes: u64,
    pub(super) full: u64,
    pub(super) filled: bool,
    /// Live files by birth tick, births ascending (appends are always the youngest).
    pub(super) births: Vec<u64>,
    pub(super) files: HashMap<u64, LiveFile>,
    pub(super) made: BTreeSet<(u32, u64)>,
    /// Files created per size class and per depth entry (sampling checks).
    pub(super) size_counts: Vec<u64>,
    pub(super) depth_counts: Vec<u64>,
}

/// The format of the state file: a JSON object (see [`Checkpoint`]) whose `format` field is
/// this string. Version 1 was a line format.
const STATE_MAGIC: &str = "winefs-age-state 2";

/// The ager's state as its file holds it.
#[derive(Serialize, Deserialize)]
struct Checkpoint {
    /// [`STATE_MAGIC`].
    format: String,
    profile: String,
    seed: u64,
    rng: u64,
    clock: u64,
    next_id: u64,
    written: u64,
    creates: u64,
    deletes: u64,
    full: u64,
    filled: bool,
    /// Files created per size class and per depth entry.
    sizes: Vec<u64>,
    depths: Vec<u64>,
    /// Directories made: (depth, index at that depth).
    dirs: Vec<(u32, u64)>,
    /// Live files, births ascending: (birth, id, size, depth, directory).
    files: Vec<(u64, u64, u64, u32, u64)>,
}

impl State {
    pub(super) fn new(cfg: &AgeConfig) -> State {
        State {
            profile: cfg.profile.name.clone(),
            seed: cfg.seed,
            rng: Rng(cfg.seed),
            clock: 0,
            next_id: 0,
            written: 0,
            creates: 0,
            deletes: 0,
            full: 0,
            filled: false,
            births: Vec::new(),
            files: HashMap::new(),
            made: BTreeSet::new(),
            size_counts: vec![0; cfg.profile.sizes.len()],
            depth_counts: vec![0; cfg.profile.dirs.len()],
        }
    }

    /// Write the state to `path` atomically (a temporary file renamed into place).
    pub(super) fn save(&self, path: &Path) -> Result<()> {
        let cp = Checkpoint {
            format: STATE_MAGIC.into(),
            profile: self.profile.clone(),
            seed: self.seed,
            rng: self.rng.0,
            clock: self.clock,
            next_id: self.next_id,
            written: self.written,
            creates: self.creates,
            deletes: self.deletes,
            full: self.full,
            filled: self.filled,
            sizes: self.size_counts.clone(),
            depths: self.depth_counts.clone(),
            dirs: self.made.iter().copied().collect(),
            files: self
                .births
                .iter()
                .map(|b| {
                    let f = &self.files[b];
                    (*b, f.id, f.size, f.depth, f.dir)
                })
                .collect(),
        };
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            serde_json::to_writer(&mut w, &cp)?;
            w.write_all(b"\n")?;
            w.into_inner().map_err(|e| e.into_error())?;
            Ok(())
        };
        write().map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::io(format!("rename {} into place", tmp.display()), e))
    }

    pub(super) fn load(path: &Path, cfg: &AgeConfig) -> Result<State> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let bad = |what: &str| {
            Error::Invalid(format!(
                "{} is not a usable ager state: {what}",
                path.display()
            ))
        };
        if text.starts_with("winefs-age-state 1\n") {
            return Err(bad(
                "it is in the line format of an earlier winefs; start afresh (--restart)",
            ));
        }
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
        if cp.format != STATE_MAGIC {
            return Err(bad("wrong header"));
        }
        if cp.profile != cfg.profile.name {
            return Err(Error::Invalid(format!(
                "{} was made with profile {}, not {}; start afresh on a new file system or use \
                 that profile",
                path.display(),
                cp.profile,
                cfg.profile.name
            )));
        }
        let mut st = State::new(cfg);
        if cp.sizes.len() != st.size_counts.len() || cp.depths.len() != st.depth_counts.len() {
            return Err(bad("the profile's classes changed"));
        }
        st.seed = cp.seed;
        st.rng = Rng(cp.rng);
        st.clock = cp.clock;
        st.next_id = cp.next_id;
        st.written = cp.written;
        st.creates = cp.creates;
        st.deletes = cp.deletes;
        st.full = cp.full;
        st.filled = cp.filled;
        st.size_counts = cp.sizes;
        st.depth_counts = cp.depths;
        st.made = cp.dirs.into_iter().collect();
        for (birth, id, size, depth, dir) in cp.files {
            if st.births.last().is_some_and(|&b| b >= birth) {
                return Err(bad("births out of order"));
            }
            st.births.push(birth);
            st.files.insert(
                birth,
                LiveFile {
                    id,
                    size,
                    depth,
                    dir,
                },
            );
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::age::profile;

    /// What JSON must escape or carry as UTF-8: a quote, a backslash, control characters, and
    /// non-ASCII (which Rust's `{:?}` writes as `\u{..}`, not JSON).
    const AWKWARD: &str = "dir \"q\" \\ tab\t nl\n \u{1} \u{7f} é ✓ \u{1F600}";

    fn config(profile_name: &str) -> AgeConfig {
        let mut p = Profile::parse(profile_name, profile::BUILTIN[0].1).unwrap();
        p.name = profile_name.into();
        AgeConfig::new(p)
    }

    #[test]
    fn checkpoint_round_trips_and_refuses_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let cfg = config(AWKWARD);
        let mut st = State::new(&cfg);
        st.rng.next_u64();
        (st.clock, st.next_id, st.written, st.creates) = (7, 9, 1 << 40, 5);
        (st.deletes, st.full, st.filled) = (2, 1, true);
        st.size_counts[0] = 4;
        st.depth_counts[1] = 3;
        st.made.extend([(1, 0), (2, 5)]);
        for (birth, id) in [(2u64, 1u64), (5, 4), (7, 8)] {
            st.births.push(birth);
            let f = LiveFile {
                id,
                size: id << 12,
                depth: 2,
                dir: 5,
            };
            st.files.insert(birth, f);
        }
        st.save(&path).unwrap();
        assert_eq!(State::load(&path, &cfg).unwrap(), st);
        // Another profile is refused, naming the one the state was made with.
        let e = State::load(&path, &config("wang")).unwrap_err().to_string();
        assert!(e.contains(&format!("profile {AWKWARD}")), "{e}");
        // So are the line format of version 1 and a damaged file.
        std::fs::write(&path, "winefs-age-state 1\nprofile agrawal\n").unwrap();
        let e = State::load(&path, &cfg).unwrap_err().to_string();
        assert!(e.contains("earlier winefs"), "{e}");
        std::fs::write(&path, "{\"format\": \"winefs-age-state 2\", \"profile\"").unwrap();
        let e = State::load(&path, &cfg).unwrap_err().to_string();
        assert!(e.contains("not a usable ager state"), "{e}");
    }
}
