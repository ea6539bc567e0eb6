//! rename(2) and renameat2(2): move a name, replace the one it lands on (RENAME_NOREPLACE
//! refuses to), swap two names (RENAME_EXCHANGE), or leave a whiteout where the name was
//! (RENAME_WHITEOUT, which overlayfs asks of its upper layer's file system). One transaction
//! under the namespace lock held exclusively, every inode it touches locked in number order;
//! errors in Linux's order (`tests/errors.rs`).

use crate::error::{Error, Result};
use crate::media::journal::Tx;
use crate::media::layout::{FileKind, InodeHeader, ROOT_INO};
use crate::meta::inode_flags::{self, Change};
use crate::ops::dir_edit::{DirEdit, apply_edit, edit_tx, plan_insert, plan_remove, plan_repoint};
use crate::ops::namespace::{
    MAX_LINKS, NewInode, Prepared, check_name, dec_links, dir_lookup, inc_links, inode_refs,
    is_dot, lock_all, prepare_inode,
};
use crate::state::inode_state::{InodeCell, InodeState, rlock};
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use crate::types::RenameFlags;
use std::collections::HashMap;

/// Rename `p1/n1` to `p2/n2` as `flags` ask. The inode replaced, if that takes its last name,
/// is freed unless open, or unless `hold`: then it is kept and returned as
/// [`crate::ops::namespace::unlink`] keeps one.
pub(crate) fn rename(
    state: &MountState,
    (p1, n1): (u64, &[u8]),
    (p2, n2): (u64, &[u8]),
    flags: RenameFlags,
    hold: bool,
) -> Result<Option<u64>> {
    state.check_alive()?;
    check_name(n1)?;
    check_name(n2)?;
    if flags.exchange && (flags.noreplace || flags.whiteout.is_some()) {
        return Err(Error::Invalid(
            "RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into(),
        ));
    }
    if is_dot(n1) || is_dot(n2) {
        return Err(Error::Busy("cannot rename '.' or '..'".into()));
    }
    let _ns = state.namespace.write();
    let src = dir_lookup(state, p1, n1)?;
    let dst = match dir_lookup(state, p2, n2) {
        Ok(l) => Some(l),
        Err(Error::NotFound) => None,
        Err(e) => return Err(e),
    };
    if flags.exchange && dst.is_none() {
        return Err(Error::NotFound);
    }
    if flags.noreplace && dst.is_some() {
        return Err(Error::Exists);
    }
    // Checks in Linux's order: the source may not be an ancestor of the target's directory
    // (EINVAL), the target may not be an ancestor of the source's directory (ENOTEMPTY, or
    // EINVAL for an exchange), then same-file, then the type rules.
    if p1 != p2 {
        if src.kind == FileKind::Dir && is_ancestor(state, src.ino, p2)? {
            return Err(Error::Invalid("cannot move a directory into itself".into()));
        }
        if let Some(d) = dst
            && d.kind == FileKind::Dir
            && is_ancestor(state, d.ino, p1)?
        {
            return Err(if flags.exchange {
                Error::Invalid("cannot exchange a directory with its own descendant".into())
            } else {
                Error::NotEmpty
            });
        }
    }
    if let Some(d) = dst {
        if d.ino == src.ino {
            return Ok(None); // same file under both names: POSIX says do nothing
        }
        if !flags.exchange {
            match (src.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                _ => {}
            }
        }
    }
    let mut inos = vec![p1, p2, src.ino];
    if let Some(d) = dst {
        inos.push(d.ino);
    }
    let arcs = inode_refs(state, &inos)?;
    let mut g = lock_all(&arcs);
    // Immutable or append-only inodes and directories (EPERM): a replaced name is removed.
    let p2_change = if dst.is_some() { Change::EntryRemoved } else { Change::EntryAdded };
    inode_flags::allow(g[&p1].hdr.flags, Change::EntryRemoved)?;
    inode_flags::allow(g[&p2].hdr.flags, p2_change)?;
    for i in std::iter::once(src.ino).chain(dst.map(|d| d.ino)) {
        inode_flags::allow(g[&i].hdr.flags, Change::Name)?;
    }
    if let Some(d) = dst
        && !flags.exchange
        && d.kind == FileKind::Dir
        && !g[&d.ino].dir.as_ref().is_some_and(|x| x.is_empty())
    {
        return Err(Error::NotEmpty);
    }
    // A directory moving to a new parent adds a ".." link there, unless it replaces one.
    let dst_is_dir = dst.is_some_and(|d| d.kind == FileKind::Dir);
    if src.kind == FileKind::Dir && p1 != p2 && !dst_is_dir && g[&p2].hdr.nlink >= MAX_LINKS {
        return Err(Error::TooManyLinks);
    }
    if flags.exchange
        && dst_is_dir
        && src.kind != FileKind::Dir
        && p1 != p2
        && g[&p1].hdr.nlink >= MAX_LINKS
    {
        return Err(Error::TooManyLinks);
    }
    let now = state.change_time(&inos.iter().map(|i| &*g[i]).collect::<Vec<_>>());
    let mut res = Reserved::new(state);
    // The whiteout is written to its free slot first; the rename's transaction makes it exist.
    let (mut tx, whiteout) = match flags.whiteout {
        None => (Tx::new(), None),
        Some((uid, gid)) => {
            let new = NewInode {
                flags: inode_flags::inherited(g[&p1].hdr.flags),
                ..NewInode::plain(FileKind::CharDev, 0, uid, gid)
            };
            let Prepared { ino, hdr, map, tx } = prepare_inode(state, &mut res, new, 0, 1, now)?;
            (tx, Some(InodeState::new(ino, hdr, map, None)))
        }
    };
    let mut edit = DirEdit::default();
    let mut new_hdr: HashMap<u64, InodeHeader> =
        inos.iter().map(|&i| (i, g[&i].hdr.clone())).collect();
    let (mut victim_freed, mut victim_kept) = (None, None);
    let src_dir = src.kind == FileKind::Dir;
    if flags.exchange {
        let d = dst.expect("checked");
        plan_repoint(state, &g[&p1], n1, d.ino, d.kind, &mut tx, &mut edit)?;
        plan_repoint(state, &g[&p2], n2, src.ino, src.kind, &mut tx, &mut edit)?;
        if p1 != p2 {
            let dst_dir = d.kind == FileKind::Dir;
            if src_dir {
                new_hdr.get_mut(&src.ino).expect("in set").parent = p2;
            }
            if dst_dir {
                new_hdr.get_mut(&d.ino).expect("in set").parent = p1;
            }
            if src_dir != dst_dir {
                let (from, to) = if src_dir { (p1, p2) } else { (p2, p1) };
                dec_links(new_hdr.get_mut(&from).expect("in set"));
                inc_links(new_hdr.get_mut(&to).expect("in set"));
            }
        }
        new_hdr.get_mut(&d.ino).expect("in set").ctime = now;
    } else {
        match dst {
            Some(d) => {
                plan_repoint(state, &g[&p2], n2, src.ino, src.kind, &mut tx, &mut edit)?;
                let v = new_hdr.get_mut(&d.ino).expect("in set");
                v.ctime = now;
                if d.kind == FileKind::Dir {
                    v.nlink = 0;
                    dec_links(new_hdr.get_mut(&p2).expect("in set"));
                } else {
                    dec_links(v);
                }
                if new_hdr[&d.ino].nlink == 0 && hold {
                    victim_kept = Some(d.ino);
                } else if new_hdr[&d.ino].nlink == 0 && g[&d.ino].open == 0 {
                    victim_freed = Some(d.ino);
                }
            }
            None => {
                let pg2 = g.get_mut(&p2).expect("locked");
                // The insert may add a directory block, which updates p2's header itself.
                plan_insert(
                    state, pg2, n2, src.ino, src.kind, &mut edit, &mut tx, &mut res,
                )?;
                new_hdr.insert(p2, {
                    let mut h = pg2.hdr.clone();
                    h.nlink = new_hdr[&p2].nlink;
                    h
                });
            }
        }
        match &whiteout {
            None => plan_remove(state, &g[&p1], n1, &mut edit)?,
            Some(w) => plan_repoint(state, &g[&p1], n1, w.ino, FileKind::CharDev, &mut tx, &mut edit)?,
        }
        if src_dir && p1 != p2 {
            new_hdr.get_mut(&src.ino).expect("in set").parent = p2;
            dec_links(new_hdr.get_mut(&p1).expect("in set"));
            inc_links(new_hdr.get_mut(&p2).expect("in set"));
        }
    }
    new_hdr.get_mut(&src.ino).expect("in set").ctime = now;
    for p in [p1, p2] {
        let h = new_hdr.get_mut(&p).expect("in set");
        h.mtime = now;
        h.ctime = now;
    }
    for (&i, h) in &new_hdr {
        if Some(i) == victim_freed {
            continue;
        }
        state.header_tx(&mut tx, i, &g[&i].hdr, h);
    }
    if let Some(v) = victim_freed {
        state.free_inode_tx(&g[&v], &mut tx)?;
    }
    edit_tx(&edit, &mut tx);
    state.commit(tx)?;
    res.keep();
    for (i, h) in new_hdr {
        let n = g.get_mut(&i).expect("locked");
        n.hdr = h;
        state.times_changed(n);
    }
    if let Some(v) = victim_freed {
        state.forget_inode(g.get_mut(&v).expect("locked"));
    }
    if let Some(v) = victim_kept {
        state.removed_held.hold(g.get_mut(&v).expect("locked"));
    }
    if let Some(w) = whiteout {
        let ino = w.ino;
        let mut map = state.inodes.write(ino);
        state.insert_loaded(&mut map, ino, InodeCell::new_ref(w));
    }
    apply_edit(edit, &mut g);
    Ok(victim_kept)
}


/// True if `anc` is `d` or one of its ancestors (walks `parent` fields; caller holds `ns`).
fn is_ancestor(state: &MountState, anc: u64, mut d: u64) -> Result<bool> {
    for _ in 0..=state.geo.total_inodes() {
        if d == anc {
            return Ok(true);
        }
        if d == ROOT_INO {
            return Ok(false);
        }
        d = rlock(&state.inode(d)?).hdr.parent;
    }
    Err(Error::Corrupted("directory parent chain has a loop".into()))
}

