//! `winefs fsck --repair`, in the spirit of e2fsck's passes, on a pool that mount validated down
//! to its namespace (`state::mount::Inconsistent::Report`). Each fix is one journaled transaction
//! and one line of the report; what cannot be fixed without guessing is left and reported:
//! 0. inodes that fail their checksum (mount did not load them) are freed; xattr blocks that
//!    fail their checks are dropped and symlinks whose target fails its checksum are freed
//!    (`repair_leaf`);
//! 1. entries naming a free inode are removed; entries whose type disagrees with their inode's
//!    are rewritten with the inode's type;
//! 2. a directory listed in more than one place is left (which listing is right cannot be known);
//! 3. inodes that nothing names (neither reachable nor orphans) are linked into `/lost+found`
//!    as `#INO` (a directory also gets `/lost+found` as its parent);
//! 4. every directory's parent field is set to the directory that lists it, and every link
//!    count to what the entries say.
//!
//! Blocks need no pass of their own: mount rebuilds free space from what inodes own and refuses
//! a block owned twice before repair runs.

use crate::error::{Error, Result};
use crate::media::journal::Tx;
use crate::media::layout::{FileKind, ROOT_INO};
use crate::meta::dir::DirEntryLoc;
use crate::ops::namespace::{
    self, DirEdit, NewInode, apply_edit, edit_tx, inode_refs, lock_all, plan_insert,
    plan_remove, plan_repoint,
};
use crate::state::inode_state::rlock;
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What a repair did and what it left.
#[derive(Clone, Debug, Default)]
pub struct RepairReport {
    /// Each change made, one line each.
    pub changes: Vec<String>,
    /// Problems left as they were, one line each.
    pub left: Vec<String>,
}

/// Every directory entry: (directory, name, location).
fn entries(state: &MountState) -> Vec<(u64, Vec<u8>, DirEntryLoc)> {
    let arcs = state.all_inodes();
    let mut v = Vec::new();
    for a in arcs {
        let g = rlock(&a);
        if let Some(d) = &g.dir {
            v.extend(d.names.iter().map(|(n, l)| (g.ino, n.to_vec(), *l)));
        }
    }
    v.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    v
}

/// In-use inodes: ino → (kind, nlink, parent).
fn inodes(state: &MountState) -> BTreeMap<u64, (FileKind, u32, u64)> {
    let arcs = state.all_inodes();
    arcs.iter()
        .map(|a| {
            let g = rlock(a);
            (g.ino, (g.kind(), g.hdr.nlink, g.hdr.parent))
        })
        .collect()
}

/// One transaction on directory `dino`'s entries (and optionally a changed header of inode
/// `other`, locked with it).
fn dir_tx(
    state: &MountState,
    dino: u64,
    other: Option<u64>,
    plan: impl FnOnce(
        &mut std::collections::HashMap<u64, std::sync::RwLockWriteGuard<'_, crate::state::inode_state::InodeState>>,
        &mut DirEdit,
        &mut Tx<'_>,
        &mut Reserved<'_>,
    ) -> Result<Vec<(u64, crate::media::layout::InodeHeader)>>,
) -> Result<()> {
    let mut inos = vec![dino];
    inos.extend(other);
    let arcs = inode_refs(state, &inos)?;
    let mut g = lock_all(&arcs);
    let mut edit = DirEdit::default();
    let mut tx = Tx::new();
    let mut res = Reserved::new(state);
    let headers = plan(&mut g, &mut edit, &mut tx, &mut res)?;
    for (ino, h) in &headers {
        state.header_tx(&mut tx, *ino, &g[ino].hdr, h);
    }
    edit_tx(&edit, &mut tx);
    state.commit(tx)?;
    res.keep();
    for (ino, h) in headers {
        if let Some(n) = g.get_mut(&ino) {
            n.hdr = h;
        }
    }
    apply_edit(edit, &mut g);
    Ok(())
}

/// Change inode `ino`'s header with `f`, in one transaction.
fn header_fix(
    state: &MountState,
    ino: u64,
    f: impl FnOnce(&mut crate::media::layout::InodeHeader),
) -> Result<()> {
    dir_tx(state, ino, None, |g, _, _, _| {
        let mut h = g[&ino].hdr.clone();
        f(&mut h);
        Ok(vec![(ino, h)])
    })
}

/// Repair the mounted `state` (nothing else may use it meanwhile).
pub(crate) fn repair(state: &MountState) -> Result<RepairReport> {
    let mut rep = RepairReport::default();
    crate::ops::repair_dirs::rewrite_headers(state, &mut rep.changes)?;
    // 0. Inodes that fail their checksum were not loaded: free their slots (whatever they
    //    owned is free already); the entries naming them dangle and go next.
    for &ino in &state.damaged_inodes {
        let mut tx = Tx::new();
        tx.write(
            state.inode_off(ino) + crate::media::layout::ino::FLAGS as u64,
            0u32.to_le_bytes().to_vec(),
            crate::media::pool::Category::Metadata,
        );
        state.commit(tx)?;
        state.release_inode_number(ino);
        rep.changes.push(format!(
            "inode {ino} failed its checksum; freed (its content is lost)"
        ));
    }
    // 0b. Xattr blocks and symlink targets that fail their checks (`repair_leaf`).
    rep.changes.extend(crate::ops::repair_leaf::repair(state)?);
    // 1. Entries naming free inodes, or with the wrong type.
    let live = inodes(state);
    for (dino, name, loc) in entries(state) {
        let nm = String::from_utf8_lossy(&name).into_owned();
        match live.get(&loc.ino) {
            None => {
                dir_tx(state, dino, None, |g, edit, _, _| {
                    plan_remove(&g[&dino], &name, edit)?;
                    Ok(Vec::new())
                })?;
                rep.changes.push(format!(
                    "directory {dino}: removed entry {nm:?}, which named free inode {}",
                    loc.ino
                ));
            }
            Some(&(kind, _, _)) if kind != loc.kind => {
                dir_tx(state, dino, None, |g, edit, tx, _| {
                    plan_repoint(&g[&dino], &name, loc.ino, kind, tx, edit)?;
                    Ok(Vec::new())
                })?;
                rep.changes.push(format!(
                    "directory {dino}: entry {nm:?} said {:?}; inode {} is {kind:?}, and the entry now says so",
                    loc.kind, loc.ino
                ));
            }
            Some(_) => {}
        }
    }
    // 2. Directories listed in more than one place.
    let listed = |state: &MountState| {
        let mut m: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (d, _, loc) in entries(state) {
            m.entry(loc.ino).or_default().push(d);
        }
        m
    };
    let live = inodes(state);
    for (ino, dirs) in listed(state) {
        if live.get(&ino).is_some_and(|x| x.0 == FileKind::Dir) && dirs.len() > 1 {
            rep.left.push(format!(
                "directory {ino} is listed in {} directories ({dirs:?}); not repaired: which listing is right cannot be known",
                dirs.len()
            ));
        }
    }
    if !rep.left.is_empty() {
        return Ok(rep);
    }
    // 3. Inodes nothing names go to /lost+found.
    let named = listed(state);
    let nameless: Vec<u64> = live
        .iter()
        .filter(|(ino, x)| **ino != ROOT_INO && x.1 > 0 && !named.contains_key(ino))
        .map(|(ino, _)| *ino)
        .collect();
    if !nameless.is_empty() {
        let lf = lost_and_found(state, &mut rep)?;
        for ino in nameless {
            let kind = live[&ino].0;
            let name = format!("#{ino}").into_bytes();
            dir_tx(state, lf, Some(ino), |g, edit, tx, res| {
                let d = g.get_mut(&lf).ok_or(Error::Stale(lf))?;
                plan_insert(state, d, &name, ino, kind, edit, tx, res)?;
                let mut lh = g[&lf].hdr.clone();
                let mut ch = g[&ino].hdr.clone();
                if kind == FileKind::Dir {
                    namespace::inc_links(&mut lh);
                    ch.parent = lf;
                }
                Ok(vec![(lf, lh), (ino, ch)])
            })?;
            rep.changes.push(format!(
                "inode {ino} ({kind:?}) was named nowhere; linked as /lost+found/#{ino}"
            ));
        }
    }
    // Still unreachable (a cycle of directories detached from the tree): left.
    let mut seen = BTreeSet::from([ROOT_INO]);
    let mut q = VecDeque::from([ROOT_INO]);
    let by_dir: BTreeMap<u64, Vec<u64>> = entries(state).into_iter().fold(
        BTreeMap::new(),
        |mut m, (d, _, l)| {
            m.entry(d).or_default().push(l.ino);
            m
        },
    );
    while let Some(d) = q.pop_front() {
        for &c in by_dir.get(&d).into_iter().flatten() {
            if seen.insert(c) {
                q.push_back(c);
            }
        }
    }
    for (ino, x) in inodes(state) {
        if !seen.contains(&ino) && x.1 > 0 {
            rep.left.push(format!(
                "inode {ino} ({:?}) is unreachable from the root (a detached cycle of directories); not repaired",
                x.0
            ));
        }
    }
    // 4. Parent fields and link counts.
    let named = listed(state);
    let live = inodes(state);
    let mut subdirs: BTreeMap<u64, u32> = BTreeMap::new();
    for (ino, dirs) in &named {
        if live.get(ino).is_some_and(|x| x.0 == FileKind::Dir) {
            for d in dirs {
                *subdirs.entry(*d).or_default() += 1;
            }
        }
    }
    for (&ino, &(kind, nlink, parent)) in &live {
        let refs = named.get(&ino).map_or(0, |d| d.len() as u32);
        let want = if kind == FileKind::Dir {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            refs
        };
        if kind == FileKind::Dir
            && ino != ROOT_INO
            && let Some(&listed_in) = named.get(&ino).and_then(|d| d.first())
            && listed_in != parent
        {
            header_fix(state, ino, |h| h.parent = listed_in)?;
            rep.changes.push(format!(
                "directory {ino}: parent field was {parent}; set to {listed_in}, which lists it"
            ));
        }
        if nlink != want {
            header_fix(state, ino, |h| h.nlink = want)?;
            rep.changes.push(format!(
                "inode {ino}: link count was {nlink}; set to {want}"
            ));
        }
    }
    // Whatever the checks still find is left.
    let after = crate::state::fsck::check(state);
    // The damaged inodes freed above are still listed in this mount's state.
    rep.left.extend(
        after
            .problems
            .into_iter()
            .filter(|p| !p.ends_with("fails its checksum") || !p.starts_with("inode ")),
    );
    Ok(rep)
}

/// The `/lost+found` directory, made if missing.
fn lost_and_found(state: &MountState, rep: &mut RepairReport) -> Result<u64> {
    match namespace::lookup(state, ROOT_INO, b"lost+found") {
        Ok(a) if a.kind == FileKind::Dir => Ok(a.ino),
        Ok(_) => Err(Error::Exists),
        Err(Error::NotFound) => {
            let a = namespace::make_inode(
                state,
                ROOT_INO,
                b"lost+found",
                NewInode {
                    kind: FileKind::Dir,
                    perm: 0o700,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    target: None,
                },
            )?;
            rep.changes.push(format!("made /lost+found (inode {})", a.ino));
            Ok(a.ino)
        }
        Err(e) => Err(e),
    }
}
