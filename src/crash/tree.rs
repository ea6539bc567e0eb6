//! The crash explorer's oracle: a snapshot of everything a user can observe through the `Fs`
//! API (names, types, permissions, owners, link counts, sizes, contents, symlink targets,
//! extended attributes, inode flags, which names share an inode), and its comparison with the states an
//! operation may leave after a crash.
//!
//! Not compared, by design: timestamps (written in place without journaling, DESIGN.md §5),
//! inode numbers and generations (only which names share an inode), block counts (physical
//! layout; fsck checks the blocks), and the `user.winefs.hugepage` hint (advice set in its own
//! transaction; a crash may drop it, DESIGN.md §7a).

use crate::error::Result;
use crate::fs::Fs;
use crate::media::layout::{FileKind, ROOT_INO};
use crate::types::Consistency;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// What is observable of one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    /// The first path (in sorted order) naming the same inode.
    pub same_as: String,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The user's inode flags (`chattr`).
    pub flags: u32,
    /// File content or symlink target; empty for directories.
    pub content: Vec<u8>,
}

/// Everything observable, by absolute path (the root is "/").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree(pub BTreeMap<String, Obj>);

fn join(dir: &str, name: &[u8]) -> String {
    let n = String::from_utf8_lossy(name);
    if dir == "/" {
        format!("/{n}")
    } else {
        format!("{dir}/{n}")
    }
}

impl Tree {
    /// Snapshot a mounted file system.
    pub fn of(fs: &Fs) -> Result<Tree> {
        let mut inos: Vec<(String, u64)> = Vec::new();
        let mut stack = vec![("/".to_string(), ROOT_INO)];
        while let Some((path, ino)) = stack.pop() {
            inos.push((path.clone(), ino));
            if fs.getattr(ino)?.kind == FileKind::Dir {
                for e in fs.readdir(ino, 2)? {
                    stack.push((join(&path, &e.name), e.ino));
                }
            }
        }
        inos.sort();
        let mut first: HashMap<u64, String> = HashMap::new();
        let mut out = BTreeMap::new();
        for (path, ino) in inos {
            let a = fs.getattr(ino)?;
            let same_as = first.entry(ino).or_insert_with(|| path.clone()).clone();
            let content = match a.kind {
                FileKind::File => {
                    let mut buf = vec![0u8; a.size as usize];
                    let n = fs.read(ino, 0, &mut buf)?;
                    buf.truncate(n);
                    buf
                }
                FileKind::Symlink => fs.readlink(ino)?,
                _ => Vec::new(),
            };
            let mut xattrs = Vec::new();
            for name in fs.listxattr(ino)? {
                if name != crate::meta::xattr::HUGEPAGE_HINT {
                    let v = fs.getxattr(ino, &name)?;
                    xattrs.push((name, v));
                }
            }
            xattrs.sort();
            out.insert(
                path,
                Obj {
                    kind: a.kind,
                    perm: a.perm,
                    uid: a.uid,
                    gid: a.gid,
                    nlink: a.nlink,
                    size: a.size,
                    rdev: a.rdev,
                    same_as,
                    xattrs,
                    flags: fs.inode_flags(ino)?,
                    content,
                },
            );
        }
        Ok(Tree(out))
    }

    /// The oracle of bytes past the end (DESIGN.md §2, `INODE_TAIL_UNSETTLED`): each regular
    /// file of this snapshot of `fs` whose flags allow it grows by truncate to the end of the
    /// blocks it maps (or of its last block) and must read zeros from its old end on — whatever
    /// a crash left there (a cut append, a fresh unit not zeroed past a write) never shows.
    /// Changes `fs`. Err: what showed.
    pub fn check_nothing_past_the_end_shows(&self, fs: &Fs) -> std::result::Result<(), String> {
        const KEEP: u32 = crate::media::layout::INODE_IMMUTABLE | crate::media::layout::INODE_APPEND_ONLY;
        let block = crate::media::layout::BLOCK_SIZE;
        for (path, o) in &self.0 {
            if o.kind != FileKind::File || o.same_as != *path || o.flags & KEEP != 0 {
                continue;
            }
            let err = |what: &str, e: crate::error::Error| format!("{path}: {what}: {e}");
            let ino = fs.resolve(path, false).map_err(|e| err("resolve", e))?;
            let mapped = fs.extents(ino).map_err(|e| err("extents", e))?;
            let to = mapped.iter().map(|&(l, _, n)| (l + n) * block).max().unwrap_or(0);
            let to = to.max(o.size.next_multiple_of(block));
            if to <= o.size {
                continue;
            }
            fs.truncate(ino, to).map_err(|e| err("grow", e))?;
            let mut buf = vec![0u8; (to - o.size) as usize];
            let n = fs.read(ino, o.size, &mut buf).map_err(|e| err("read", e))?;
            if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
                return Err(format!(
                    "{path}: grown from {} to {to} bytes, byte {} is {:#04x}, not zero",
                    o.size,
                    o.size + i as u64,
                    buf[i]
                ));
            }
        }
        Ok(())
    }

    /// Differences from `other`, one line per path (at most `max` lines).
    pub fn diff(&self, other: &Tree, max: usize) -> String {
        let mut out = String::new();
        let mut n = 0;
        let keys: std::collections::BTreeSet<&String> =
            self.0.keys().chain(other.0.keys()).collect();
        for k in keys {
            let line = match (self.0.get(k), other.0.get(k)) {
                (Some(a), Some(b)) if a == b => continue,
                (Some(a), Some(b)) => describe_change(a, b),
                (Some(_), None) => "missing in the recovered state".to_string(),
                (None, Some(_)) => "present only in the recovered state".to_string(),
                (None, None) => continue,
            };
            if n < max {
                let _ = writeln!(out, "    {k}: {line}");
            }
            n += 1;
        }
        if n > max {
            let _ = writeln!(out, "    ... {} more", n - max);
        }
        out
    }
}

fn describe_change(want: &Obj, got: &Obj) -> String {
    let mut parts = Vec::new();
    if want.kind != got.kind {
        parts.push(format!("kind {:?} vs {:?}", want.kind, got.kind));
    }
    if (want.perm, want.uid, want.gid, want.rdev) != (got.perm, got.uid, got.gid, got.rdev) {
        parts.push("mode/owner/rdev differ".to_string());
    }
    if want.nlink != got.nlink {
        parts.push(format!("nlink {} vs {}", want.nlink, got.nlink));
    }
    if want.size != got.size {
        parts.push(format!("size {} vs {}", want.size, got.size));
    }
    if want.same_as != got.same_as {
        parts.push(format!("inode of {} vs of {}", want.same_as, got.same_as));
    }
    if want.xattrs != got.xattrs {
        parts.push("xattrs differ".to_string());
    }
    if want.flags != got.flags {
        parts.push(format!("flags {:#x} vs {:#x}", want.flags, got.flags));
    }
    if want.content != got.content {
        let at = want
            .content
            .iter()
            .zip(&got.content)
            .position(|(a, b)| a != b)
            .unwrap_or(want.content.len().min(got.content.len()));
        parts.push(format!("content differs from byte {at}"));
    }
    parts.join(", ")
}

/// Does the recovered tree `got` match one of the `allowed` states? Strict mode: exactly one of
/// them. Relaxed mode (data written in place, not atomic): everything but file contents must
/// equal one allowed state, and each byte of each file must equal that byte in some allowed
/// state (zero past that state's end) — old or new data, never anything else.
pub fn matches(got: &Tree, allowed: &[Tree], mode: Consistency) -> bool {
    match mode {
        Consistency::Strict => allowed.iter().any(|t| t == got),
        Consistency::Relaxed => allowed.iter().any(|t| relaxed_match(got, t, allowed)),
    }
}

fn relaxed_match(got: &Tree, meta: &Tree, allowed: &[Tree]) -> bool {
    if got.0.len() != meta.0.len() {
        return false;
    }
    for ((gp, g), (mp, m)) in got.0.iter().zip(&meta.0) {
        if gp != mp {
            return false;
        }
        let same_meta = g.kind == m.kind
            && (g.perm, g.uid, g.gid, g.rdev, g.nlink, g.size)
                == (m.perm, m.uid, m.gid, m.rdev, m.nlink, m.size)
            && g.same_as == m.same_as
            && g.xattrs == m.xattrs
            && g.flags == m.flags;
        if !same_meta {
            return false;
        }
        if g.kind != FileKind::File {
            if g.content != m.content {
                return false;
            }
            continue;
        }
        if g.content == m.content {
            continue;
        }
        // The same file (by inode) in every allowed state: the path it had there.
        let versions: Vec<&[u8]> = allowed
            .iter()
            .filter_map(|t| t.0.get(gp).map(|o| o.content.as_slice()))
            .collect();
        let byte_ok =
            |i: usize, b: u8| versions.iter().any(|v| v.get(i).copied().unwrap_or(0) == b);
        if !g.content.iter().enumerate().all(|(i, &b)| byte_ok(i, b)) {
            return false;
        }
    }
    true
}
