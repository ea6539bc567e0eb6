//! The crash explorer's name model and its generator of short operation sequences (exhaustive
//! at lengths 1 and 2, sampled beyond): only operations whose preconditions hold are drawn.

use crate::crash::catalogue::catalogue;
use crate::crash::workload::{Op, Removal, Start};
use crate::error::{Error, Result};
use crate::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};

/// Which names exist (and their types), to draw only operations whose preconditions hold, as
/// ACE does: a workload that only fails teaches nothing about crashes.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// path -> is a directory; symlinks count as files.
    paths: BTreeMap<String, bool>,
    xattrs: BTreeMap<String, Vec<String>>,
    /// Names a whiteout holds (in `paths` as files, but no file operation is drawn on them).
    whiteouts: BTreeSet<String>,
}

fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &p[..i],
    }
}

impl Model {
    pub fn of(start: Start) -> Model {
        let mut m = Model::default();
        m.paths.insert("/".into(), true);
        for op in start.setup() {
            m.apply(&op);
        }
        m
    }

    fn is_file(&self, p: &str) -> bool {
        self.paths.get(p) == Some(&false) && !self.whiteouts.contains(p)
    }

    fn is_dir(&self, p: &str) -> bool {
        self.paths.get(p) == Some(&true)
    }

    fn absent_in_dir(&self, p: &str) -> bool {
        !self.paths.contains_key(p) && self.is_dir(parent(p))
    }

    fn empty_dir(&self, p: &str) -> bool {
        self.is_dir(p) && !self.paths.keys().any(|k| k != p && parent(k) == p)
    }

    /// Does `op` succeed here (as far as names go)?
    pub fn allows(&self, op: &Op) -> bool {
        match op {
            Op::Create(p) | Op::Mkdir(p) | Op::Symlink { path: p, .. } => self.absent_in_dir(p),
            Op::LinkUnnamed { path, .. } => self.absent_in_dir(path),
            Op::Write { path, .. }
            | Op::Append { path, .. }
            | Op::Truncate { path, .. }
            | Op::Fallocate { path, .. }
            | Op::ZeroRange { path, .. }
            | Op::CollapseRange { path, .. }
            | Op::InsertRange { path, .. } => self.is_file(path) && path != "/S",
            Op::Msync { path, .. }
            | Op::DirectAppend { path, .. }
            | Op::LeasedShrink { path, .. }
            | Op::Alternate { path, .. }
            | Op::AlternateMany { path, .. } => self.is_file(path) && path != "/S",
            Op::Compact => true,
            Op::Fsync(p) | Op::Unlink(p) => self.is_file(p),
            Op::RemoveHeld { path, how } => match how {
                Removal::Unlink => self.is_file(path),
                Removal::Rmdir => path != "/" && self.empty_dir(path),
                Removal::RenameOver(from) => self.is_file(from) && self.is_file(path),
            },
            Op::Link { from, to } => self.is_file(from) && self.absent_in_dir(to),
            Op::Rmdir(p) => p != "/" && self.empty_dir(p),
            Op::Rename { from, to } | Op::RenameWhiteout { from, to } => {
                if self.is_file(from) {
                    self.is_file(to) || self.absent_in_dir(to)
                } else if self.is_dir(from) {
                    !to.starts_with(&format!("{from}/"))
                        && (self.empty_dir(to) || self.absent_in_dir(to))
                } else {
                    false
                }
            }
            Op::SetXattr { path, .. }
            | Op::SetFlags { path, .. }
            | Op::Chmod { path, .. }
            | Op::ChmodNoSpace { path, .. } => {
                self.paths.contains_key(path) && path != "/S"
            }
            Op::SetAcl { path, default } => {
                (self.is_file(path) || self.is_dir(path))
                    && path != "/S"
                    && (!default || self.is_dir(path))
            }
            Op::RemoveXattr { path, name } | Op::XattrNoSpace { path, name, value: None } => self
                .xattrs
                .get(path)
                .is_some_and(|v| v.iter().any(|n| n == name)),
            // The file must have a block to rewrite.
            Op::XattrNoSpace { path, value: Some(_), .. } => {
                self.xattrs.get(path).is_some_and(|v| !v.is_empty()) && path != "/S"
            }
        }
    }

    /// The effect of `op` (assumed allowed) on names.
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Create(p) | Op::Symlink { path: p, .. } | Op::LinkUnnamed { path: p, .. } => {
                self.paths.insert(p.clone(), false);
            }
            Op::Mkdir(p) => {
                self.paths.insert(p.clone(), true);
            }
            Op::Link { to, .. } => {
                self.paths.insert(to.clone(), false);
            }
            Op::Unlink(p)
            | Op::Rmdir(p)
            | Op::RemoveHeld { path: p, how: Removal::Unlink | Removal::Rmdir } => {
                self.paths.remove(p);
                self.xattrs.remove(p);
            }
            Op::RemoveHeld { path, how: Removal::RenameOver(from) } => {
                self.apply(&Op::Rename { from: from.clone(), to: path.clone() });
            }
            Op::Rename { from, to } | Op::RenameWhiteout { from, to } => {
                let moved: Vec<(String, bool)> = self
                    .paths
                    .iter()
                    .filter(|(k, _)| *k == from || k.starts_with(&format!("{from}/")))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                self.paths.remove(to);
                self.xattrs.remove(to);
                for (k, v) in moved {
                    self.paths.remove(&k);
                    let nk = format!("{to}{}", &k[from.len()..]);
                    if let Some(x) = self.xattrs.remove(&k) {
                        self.xattrs.insert(nk.clone(), x);
                    }
                    if self.whiteouts.remove(&k) {
                        self.whiteouts.insert(nk.clone());
                    }
                    self.paths.insert(nk, v);
                }
                if matches!(op, Op::RenameWhiteout { .. }) {
                    self.paths.insert(from.clone(), false);
                    self.whiteouts.insert(from.clone());
                }
            }
            Op::SetXattr { path, name, .. } | Op::XattrNoSpace { path, name, value: Some(_) } => {
                let v = self.xattrs.entry(path.clone()).or_default();
                if !v.contains(name) {
                    v.push(name.clone());
                }
            }
            Op::RemoveXattr { path, name } | Op::XattrNoSpace { path, name, value: None } => {
                if let Some(v) = self.xattrs.get_mut(path) {
                    v.retain(|n| n != name);
                }
            }
            Op::Write { .. }
            | Op::Append { .. }
            | Op::Truncate { .. }
            | Op::Fallocate { .. }
            | Op::ZeroRange { .. }
            | Op::CollapseRange { .. }
            | Op::InsertRange { .. }
            | Op::SetFlags { .. }
            | Op::SetAcl { .. }
            | Op::Chmod { .. }
            | Op::ChmodNoSpace { .. }
            | Op::Fsync(_)
            | Op::Compact
            | Op::Msync { .. }
            | Op::DirectAppend { .. }
            | Op::LeasedShrink { .. }
            | Op::Alternate { .. }
            | Op::AlternateMany { .. } => {}
        }
    }
}

/// Every sequence of length 1 and 2 whose operations' preconditions hold, for both starts;
/// grouped by length.
pub fn enumerate(len: usize) -> Vec<(Start, Vec<Op>)> {
    let cat = catalogue();
    let mut out = Vec::new();
    for start in Start::ALL {
        let mut frontier = vec![(Model::of(start), Vec::new())];
        for _ in 0..len {
            let mut next = Vec::new();
            for (m, seq) in &frontier {
                for op in cat.iter().filter(|op| m.allows(op)) {
                    let mut m2 = m.clone();
                    m2.apply(op);
                    let mut s2: Vec<Op> = seq.clone();
                    s2.push(op.clone());
                    next.push((m2, s2));
                }
            }
            frontier = next;
        }
        out.extend(frontier.into_iter().map(|(_, s)| (start, s)));
    }
    out
}

/// A random sequence of `len` operations whose preconditions hold, from `start`.
pub fn sample(start: Start, len: usize, rng: &mut Rng) -> Result<Vec<Op>> {
    let cat = catalogue();
    let mut m = Model::of(start);
    let mut seq = Vec::new();
    for _ in 0..len {
        let ok: Vec<&Op> = cat.iter().filter(|op| m.allows(op)).collect();
        if ok.is_empty() {
            return Err(Error::Invalid(format!(
                "no operation applies after {seq:?}"
            )));
        }
        let op = ok[rng.pick(ok.len())].clone();
        m.apply(&op);
        seq.push(op);
    }
    Ok(seq)
}
