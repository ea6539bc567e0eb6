//! The namespace: lookups, directory listings and every operation that changes names (create,
//! mkdir, mknod, symlink, link, unlink, rmdir; rename is `ops::rename`), files made without a
//! name (`O_TMPFILE`), and the open count that keeps an unlinked or unnamed file alive.
//!
//! A namespace change takes the namespace lock (shared; a rename exclusively), then locks every
//! inode it touches (in inode-number order), plans its directory edits, builds one transaction
//! and commits it; only then do the DRAM directory indexes and headers follow. A create or
//! unlink holds its directory as a [`DirChange`]: no other writer of the directory comes in,
//! but lookups and readdir there go on until the commit is durable, and it takes the
//! directory's lock exclusively only to apply its edit. A new entry's bytes are written
//! into free directory slots before the transaction that sets its `starts` bit, so the bit is
//! the only journaled write of an insert, and clearing it the only journaled write of a remove.
//! Errors come in Linux's order (checked by `tests/errors.rs`).

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::checksum;
use crate::media::journal::Tx;
use crate::media::layout::{
    self, BLOCK_SIZE, FileKind, INODE_IN_USE, INODE_SIZE, InodeHeader, NAME_MAX,
};
use crate::media::pool::{CACHE_LINE, Category};
use crate::meta::dir::{DirEntryLoc, DirIndex};
use crate::meta::inode::{FileMap, MapUpdate};
use crate::meta::inode_flags::{self, Change};
use crate::ops::dir_edit::{
    DirEdit, apply_edit, apply_edit_to, edit_tx, plan_insert, plan_insert_shared, plan_remove,
};
use crate::meta::xattr::Attrs;
use crate::ops::{acl, xattr};
use crate::state::inode_state::{DirChange, InodeCell, InodeRef, InodeState, InodeWriteGuard, rlock, wlock};
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use crate::types::{Attr, DirEntry};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Validate a single path component.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong(name.len()));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!(
            "name {:?} contains '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

pub(crate) fn lock_all<'a>(arcs: &'a [(u64, InodeRef)]) -> BTreeMap<u64, InodeWriteGuard<'a>> {
    arcs.iter().map(|(i, a)| (*i, wlock(a))).collect()
}

pub(crate) fn inode_refs(state: &MountState, inos: &[u64]) -> Result<Vec<(u64, InodeRef)>> {
    let mut v: Vec<u64> = inos.to_vec();
    v.sort_unstable();
    v.dedup();
    v.into_iter().map(|i| Ok((i, state.inode(i)?))).collect()
}

pub(crate) fn dir_lookup(state: &MountState, parent: u64, name: &[u8]) -> Result<DirEntryLoc> {
    let p = state.inode(parent)?;
    let g = rlock(&p);
    g.find_name(&state.pool, name)?.ok_or(Error::NotFound)
}

/// What a new inode is to be.
pub(crate) struct NewInode<'a> {
    pub kind: FileKind,
    /// Permission bits.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number (device special files).
    pub rdev: u32,
    /// Symlinks: the target.
    pub target: Option<&'a [u8]>,
    /// The user's inode flags it starts with (those its directory passes on).
    pub flags: u32,
    /// Made by repair, which (as e2fsck) sets `/lost+found` up in a directory whatever its
    /// flags say.
    pub by_repair: bool,
    /// The creating process's umask: narrows `perm` unless the directory has a default ACL
    /// (`acl::inherit`).
    pub umask: u32,
    /// The directory's default ACL applies (false: only the umask, as on a `noacl` mount).
    pub default_acl: bool,
    /// Extended attributes it is born with (the ACLs it inherits), in its first xattr block,
    /// written before the create's transaction makes the inode exist.
    pub xattrs: Attrs,
}

impl NewInode<'_> {
    /// A regular file, directory, FIFO or socket: no device number, no target.
    pub fn plain(kind: FileKind, perm: u32, uid: u32, gid: u32) -> NewInode<'static> {
        NewInode {
            kind,
            perm,
            uid,
            gid,
            rdev: 0,
            target: None,
            flags: 0,
            by_repair: false,
            umask: 0,
            default_acl: true,
            xattrs: Vec::new(),
        }
    }
}

/// The generation of a new inode in slot `ino`: one more than the slot's last inode had (a
/// freed slot keeps its header), so a file handle of a file that is gone never names the file
/// that reuses its number (it gets ESTALE), across remounts too.
fn next_generation(state: &MountState, ino: u64) -> Result<u32> {
    let mut last = [0u8; 4];
    state
        .pool
        .read(state.inode_off(ino) + layout::ino::GENERATION as u64, &mut last)?;
    Ok(u32::from_le_bytes(last).wrapping_add(1))
}

/// A new inode, written to its free slot but for its first 32 bytes (the in-use flag), which
/// `tx` writes at the commit that makes it exist.
pub(crate) struct Prepared<'a> {
    pub ino: u64,
    pub hdr: InodeHeader,
    pub map: FileMap,
    pub tx: Tx<'a>,
}

/// Take an inode number (and, for a symlink, its target's block) into `res` and write the new
/// inode's body with `nlink` links and all its times `now`; `parent` is recorded for
/// directories.
pub(crate) fn prepare_inode(
    state: &MountState,
    res: &mut Reserved,
    new: NewInode<'_>,
    parent: u64,
    nlink: u32,
    now: i64,
) -> Result<Prepared<'static>> {
    let NewInode {
        kind,
        perm,
        uid,
        gid,
        rdev,
        target,
        flags,
        by_repair: _,
        umask: _,
        default_acl: _,
        xattrs,
    } = new;
    let ino = state.alloc_inode_number()?;
    res.inodes.push(ino);
    let checked = if state.geo.checked_sizes { layout::INODE_SIZE_CHECKED } else { 0 };
    let mut hdr = InodeHeader {
        flags: INODE_IN_USE | checked | flags,
        mode: kind.mode_bits() | (perm & 0o7777),
        uid,
        gid,
        nlink,
        generation: next_generation(state, ino)?,
        parent: if kind == FileKind::Dir { parent } else { 0 },
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        rdev,
        ..Default::default()
    };
    if !xattrs.is_empty() {
        // A new block for a new inode: nothing reaches it before the commit.
        hdr.xattr_block = xattr::write_new_block(state, res, &xattrs)?;
    }
    let mut map = FileMap::new();
    let ioff = state.inode_off(ino);
    let mut body = [0u8; INODE_SIZE as usize];
    if let Some(t) = target {
        let b = res.alloc_one()?;
        let off = b * BLOCK_SIZE;
        state.pool.write_flush(off, t, Category::Data)?;
        state.pool.zero_flush(
            off + t.len() as u64,
            BLOCK_SIZE - t.len() as u64,
            Category::Data,
        )?;
        let mut upd = MapUpdate::default();
        map.remap(0, 1, &[BlockRun { start: b, len: 1 }], &mut upd);
        for (slot, rec) in &upd.slot_writes {
            let o = (map.slot_offset(ioff, *slot) - ioff) as usize;
            body[o..o + 16].copy_from_slice(&rec.encode());
        }
        hdr.size = t.len() as u64;
        hdr.map_end = 1;
    }
    body[..128].copy_from_slice(&hdr.encode());
    if let Some(t) = target {
        let o = layout::ino::TARGET_CRC;
        body[o..o + 4].copy_from_slice(&crate::media::crc::crc32c(t).to_le_bytes());
    }
    // The checksum goes in with the body, so sealing the transaction finds it current and
    // journals no second write of it.
    let crc = checksum::inode_checksum(&body);
    body[layout::ino::CRC..layout::ino::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    // The inode slot is free, so everything but its first 32 bytes (which hold the in-use
    // flag) can be written without journaling. The rest of their cache line is only stored:
    // the transaction writes the flag's bytes back, line and all, before its COMMIT.
    const _: () = assert!(INODE_SIZE.is_multiple_of(CACHE_LINE) && 32 < CACHE_LINE);
    let line = CACHE_LINE as usize;
    state.pool.write(ioff + 32, &body[32..line], Category::Metadata)?;
    state
        .pool
        .write_flush(ioff + CACHE_LINE, &body[line..], Category::Metadata)?;
    let mut tx = Tx::new();
    tx.write_copy(ioff, &body[..32], Category::Metadata);
    Ok(Prepared { ino, hdr, map, tx })
}

/// What `new` takes from directory `dir`: its default ACL (if `default_acl`), else the umask
/// (`acl::inherit`); repair's `/lost+found` takes neither.
fn inherit_acl(state: &MountState, dir: &InodeState, new: &mut NewInode<'_>) -> Result<()> {
    if !new.by_repair {
        new.xattrs = acl::inherit(state, dir, new.kind, &mut new.perm, new.umask, new.default_acl)?;
    }
    Ok(())
}

/// Create an inode named `name` in `parent`.
pub(crate) fn make_inode(
    state: &MountState,
    parent: u64,
    name: &[u8],
    mut new: NewInode<'_>,
) -> Result<Attr> {
    let kind = new.kind;
    state.check_alive()?;
    check_name(name)?;
    if is_dot(name) {
        return Err(Error::Exists);
    }
    // Shared: names change under their directory's lock; the namespace lock keeps renames out.
    let _ns = state.namespace.read();
    let p = state.inode(parent)?;
    // The directory is held shared until the commit: its lookups and readdir go on meanwhile.
    let mut pg = DirChange::begin(&p);
    if pg.find_name(&state.pool, name)?.is_some() {
        return Err(Error::Exists);
    }
    if pg.hdr.nlink == 0 {
        return Err(Error::NotFound); // parent was removed while we waited
    }
    if !new.by_repair {
        inode_flags::allow(pg.hdr.flags, Change::EntryAdded)?;
    }
    new.flags = inode_flags::inherited(pg.hdr.flags);
    inherit_acl(state, &pg, &mut new)?;
    if kind == FileKind::Dir && pg.hdr.nlink >= MAX_LINKS {
        return Err(Error::TooManyLinks);
    }
    let mut res = Reserved::new(state);
    let now = state.change_time(&[&*pg]);
    let nlink = if kind == FileKind::Dir { 2 } else { 1 };
    let Prepared { ino, hdr, map, mut tx } = prepare_inode(state, &mut res, new, parent, nlink, now)?;
    let mut edit = DirEdit::default();
    if !plan_insert_shared(state, &pg, name, ino, kind, &mut edit)? {
        // A new directory block changes the directory's map and header before the commit.
        let mut w = pg.upgrade();
        plan_insert(state, &mut w, name, ino, kind, &mut edit, &mut tx, &mut res)?;
        pg = DirChange::Exclusive(w);
    }
    let mut ph = pg.hdr.clone();
    ph.mtime = now;
    ph.ctime = now;
    if kind == FileKind::Dir {
        inc_links(&mut ph);
    }
    state.header_tx(&mut tx, parent, &pg.hdr, &ph);
    edit_tx(&edit, &mut tx);
    state.commit(tx)?;
    res.keep();
    let mut pg = pg.upgrade();
    let before = apply_dir_header(state, &mut pg, ph);
    let dir = (kind == FileKind::Dir).then(DirIndex::default);
    let mut node = InodeState::new(ino, hdr, map, dir);
    // Files created directly in a directory with the alignment hint inherit it (its own
    // transaction: the hint is advice, a crash may drop it without harm).
    if kind == FileKind::File && xattr::hinted(state, &mut pg)? {
        xattr::add_hint(state, &mut node)?;
    }
    let attr = state.attr(&node);
    let mut map = state.inodes.write(ino);
    state.insert_loaded(&mut map, ino, InodeCell::new_ref(node));
    drop(map);
    // One directory is locked: the edit finds it without a map of guards.
    apply_edit_to(edit, &mut [(parent, &mut *pg)]);
    show_change_seen_meanwhile(state, &mut pg, before)?;
    Ok(attr)
}

/// Create a regular file in no directory, open once (open(2) with `O_TMPFILE` in `parent`): it
/// has no links, and goes at its last release (or at the next mount, after a crash, as every
/// inode without links) unless [`link`] names it first, which only a `linkable` one allows.
/// `parent` only has to be a directory that still exists; its times do not change.
pub(crate) fn make_unnamed(
    state: &MountState,
    parent: u64,
    mut new: NewInode<'_>,
    linkable: bool,
) -> Result<Attr> {
    state.check_alive()?;
    if new.kind != FileKind::File {
        return Err(Error::Invalid("only regular files can be made without a name".into()));
    }
    // The directory is only looked at, not held through the commit: nothing in it changes.
    let hinted = {
        let p = state.inode(parent)?;
        let mut pg = wlock(&p);
        if !pg.is_dir() {
            return Err(Error::NotDir);
        }
        if pg.hdr.nlink == 0 {
            return Err(Error::NotFound);
        }
        inode_flags::allow(pg.hdr.flags, Change::EntryAdded)?;
        new.flags = inode_flags::inherited(pg.hdr.flags);
        inherit_acl(state, &pg, &mut new)?;
        xattr::hinted(state, &mut pg)?
    };
    let mut res = Reserved::new(state);
    let now = state.change_time(&[]);
    let Prepared { ino, hdr, map, tx } = prepare_inode(state, &mut res, new, 0, 0, now)?;
    state.commit(tx)?;
    res.keep();
    let mut node = InodeState::new(ino, hdr, map, None);
    node.open = 1;
    node.linkable = linkable;
    // A file made for the directory inherits its alignment hint, as a named one would.
    if hinted {
        xattr::add_hint(state, &mut node)?;
    }
    let attr = state.attr(&node);
    let mut map = state.inodes.write(ino);
    state.insert_loaded(&mut map, ino, InodeCell::new_ref(node));
    Ok(attr)
}

/// Directory `d`'s times as a name change found them when it applied its new header.
struct TimesBefore {
    /// mtime, ctime.
    old: (i64, i64),
    /// Whether a look at the times had been made since they were last chosen
    /// (`times_queried`).
    looked: bool,
}

/// Give directory `d` the header `new` its name change committed, returning the times it had.
fn apply_dir_header(state: &MountState, d: &mut InodeState, new: InodeHeader) -> TimesBefore {
    let before = TimesBefore {
        old: (d.hdr.mtime, d.hdr.ctime),
        looked: d.times_queried.load(std::sync::atomic::Ordering::Relaxed),
    };
    d.hdr = new;
    state.times_changed(d);
    before
}

/// A name change chose directory `d`'s new times while it held `d` shared; a look at its times
/// after that (`before.looked`) saw the old ones (`before.old`). If a new time equals an old
/// one (the same clock tick), the change would not show to whoever looked: store fine-grained
/// times now, in a transaction of their own (as a look just before the change would have made
/// it choose).
fn show_change_seen_meanwhile(
    state: &MountState,
    d: &mut InodeState,
    before: TimesBefore,
) -> Result<()> {
    let TimesBefore { old, looked } = before;
    if !looked || (d.hdr.mtime != old.0 && d.hdr.ctime != old.1) {
        return Ok(());
    }
    d.times_queried.store(true, std::sync::atomic::Ordering::Relaxed);
    let t = state.change_time(&[&*d]);
    let mut h = d.hdr.clone();
    (h.mtime, h.ctime) = (t, t);
    let mut tx = Tx::new();
    state.header_tx(&mut tx, d.ino, &d.hdr, &h);
    state.commit(tx)?;
    d.hdr = h;
    state.times_changed(d);
    Ok(())
}

/// Remove `name` from directory `parent` (a directory's only if `want_dir`, an empty one). The
/// inode that loses its last name is freed unless open, or unless `hold`: then it is kept as if
/// opened once more for a caller that still refers to it by number (a FUSE mount's kernel), and
/// its number returned, for `Fs::let_go` to give up.
pub(crate) fn unlink(
    state: &MountState,
    parent: u64,
    name: &[u8],
    want_dir: bool,
    hold: bool,
) -> Result<Option<u64>> {
    state.check_alive()?;
    check_name(name)?;
    if name == b"." {
        return Err(if want_dir {
            Error::Invalid("cannot remove '.'".into())
        } else {
            Error::IsDir
        });
    }
    if name == b".." {
        return Err(if want_dir {
            Error::NotEmpty
        } else {
            Error::IsDir
        });
    }
    // Shared: another unlink, create or link may change this directory until its lock is
    // held, so the entry found first is checked again under the lock (a rename cannot run).
    let _ns = state.namespace.read();
    loop {
        let loc = dir_lookup(state, parent, name)?;
        if loc.ino == parent {
            return Err(Error::Corrupted(format!(
                "directory {parent} names itself as {}",
                String::from_utf8_lossy(name)
            )));
        }
        let (pa, ca) = match state.inode(parent).and_then(|p| Ok((p, state.inode(loc.ino)?))) {
            Ok(nodes) => nodes,
            Err(Error::Stale(_)) => continue, // freed since the lookup: look again
            Err(e) => return Err(e),
        };
        // In inode-number order; the directory shared until the commit (`DirChange`).
        let (pg, cg) = if parent < loc.ino {
            let pg = DirChange::begin(&pa);
            (pg, wlock(&ca))
        } else {
            let cg = wlock(&ca);
            (DirChange::begin(&pa), cg)
        };
        let found = pg.find_name(&state.pool, name)?;
        let Some(loc) = found.filter(|l| l.ino == loc.ino) else {
            continue; // removed or replaced since the lookup
        };
        // The same number is not enough: the inode may have been freed, and its number given
        // to a new one under the same name, since its state was fetched.
        if !state.still_live(loc.ino, &ca) {
            continue;
        }
        return unlink_locked(state, parent, name, (want_dir, hold), loc, pg, cg);
    }
}

/// [`unlink`] with the directory (`pg`) and the inode its entry `name` names (`loc`, `cg`)
/// locked.
fn unlink_locked(
    state: &MountState,
    parent: u64,
    name: &[u8],
    (want_dir, hold): (bool, bool),
    loc: DirEntryLoc,
    pg: DirChange<'_>,
    mut cg: InodeWriteGuard<'_>,
) -> Result<Option<u64>> {
    inode_flags::allow(pg.hdr.flags, Change::EntryRemoved)?;
    inode_flags::allow(cg.hdr.flags, Change::Name)?;
    match (want_dir, loc.kind == FileKind::Dir) {
        (false, true) => return Err(Error::IsDir),
        (true, false) => return Err(Error::NotDir),
        _ => {}
    }
    let now = state.change_time(&[&*pg, &*cg]);
    let mut tx = Tx::new();
    let mut edit = DirEdit::default();
    plan_remove(state, &pg, name, &mut edit)?;
    if want_dir && !cg.dir.as_ref().is_some_and(|d| d.is_empty()) {
        return Err(Error::NotEmpty);
    }
    let mut ph = pg.hdr.clone();
    ph.mtime = now;
    ph.ctime = now;
    if want_dir {
        dec_links(&mut ph);
    }
    state.header_tx(&mut tx, parent, &pg.hdr, &ph);
    let mut ch = cg.hdr.clone();
    ch.nlink = if want_dir {
        0
    } else {
        ch.nlink.saturating_sub(1)
    };
    ch.ctime = now;
    // An open directory, like an open file, outlives its last name until its last handle
    // goes (fstat on it then shows no links, as on ext4); so does one the caller holds.
    let kept = (ch.nlink == 0 && hold).then_some(loc.ino);
    let free_now = ch.nlink == 0 && cg.open == 0 && kept.is_none();
    if free_now {
        state.free_inode_tx(&cg, &mut tx)?;
    } else {
        state.header_tx(&mut tx, loc.ino, &cg.hdr, &ch);
    }
    edit_tx(&edit, &mut tx);
    state.commit(tx)?;
    let mut pg = pg.upgrade();
    let before = apply_dir_header(state, &mut pg, ph);
    cg.hdr = ch;
    state.times_changed(&cg);
    apply_edit_to(edit, &mut [(parent, &mut *pg)]);
    let shown = show_change_seen_meanwhile(state, &mut pg, before);
    if free_now {
        // The name is gone from the directory, on media and in DRAM: the directory is let go
        // before the inode's blocks and number go back (under its own lock still), so lookups
        // and creates there do not wait for the allocator.
        drop(pg);
        state.forget_inode(&mut cg);
    }
    shown?;
    if kept.is_some() {
        state.removed_held.hold(&mut cg);
    }
    Ok(kept)
}

pub(crate) fn link(state: &MountState, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
    state.check_alive()?;
    check_name(name)?;
    if is_dot(name) {
        return Err(Error::Exists);
    }
    // Shared, as for create: both inodes' locks order this link against their other changes.
    let _ns = state.namespace.read();
    let arcs = inode_refs(state, &[ino, parent])?;
    let mut g = lock_all(&arcs);
    if g[&parent].hdr.nlink == 0 {
        return Err(Error::NotFound); // the directory was removed while we waited
    }
    // Linux checks the new name before the source's type.
    if g[&parent].find_name(&state.pool, name)?.is_some() {
        return Err(Error::Exists);
    }
    inode_flags::allow(g[&parent].hdr.flags, Change::EntryAdded)?;
    inode_flags::allow(g[&ino].hdr.flags, Change::Name)?;
    if g[&ino].is_dir() {
        return Err(Error::NotPermitted(
            "hard links to directories are not allowed".into(),
        ));
    }
    // No links left: open but unlinked (Linux refuses it too), or freed while we waited; only a
    // file made without a name for linking ([`make_unnamed`]) may get its first one here.
    if g[&ino].hdr.nlink == 0 && !(g[&ino].linkable && g[&ino].hdr.in_use()) {
        return Err(Error::NotFound);
    }
    if g[&ino].hdr.nlink >= MAX_LINKS {
        return Err(Error::TooManyLinks);
    }
    let now = state.change_time(&[&*g[&parent], &*g[&ino]]);
    let mut tx = Tx::new();
    let mut edit = DirEdit::default();
    let mut res = Reserved::new(state);
    let kind = g[&ino].kind();
    plan_insert(
        state,
        g.get_mut(&parent).expect("locked"),
        name,
        ino,
        kind,
        &mut edit,
        &mut tx,
        &mut res,
    )?;
    let mut ph = g[&parent].hdr.clone();
    ph.mtime = now;
    ph.ctime = now;
    // If plan_insert added a directory block it has journaled the parent's size and map
    // change and updated its DRAM header, so `ph` (cloned after it) only adds the times.
    let mut ih = g[&ino].hdr.clone();
    inc_links(&mut ih);
    ih.ctime = now;
    state.header_tx(&mut tx, ino, &g[&ino].hdr, &ih);
    state.header_tx(&mut tx, parent, &g[&parent].hdr, &ph);
    edit_tx(&edit, &mut tx);
    state.commit(tx)?;
    res.keep();
    g.get_mut(&parent).expect("locked").hdr = ph;
    let node = g.get_mut(&ino).expect("locked");
    node.hdr = ih;
    // Named now: should it lose its names again, it goes as any unlinked file.
    node.linkable = false;
    state.times_changed(&g[&parent]);
    state.times_changed(&g[&ino]);
    apply_edit(edit, &mut g);
    Ok(state.attr(&g[&ino]))
}

/// Look `name` up in directory `parent` ("." and ".." included).
pub(crate) fn lookup(state: &MountState, parent: u64, name: &[u8]) -> Result<Attr> {
    state.check_alive()?;
    check_name(name)?;
    let _ns = state.namespace.read();
    let p = state.inode(parent)?;
    // The entry's inode is fetched while the directory is locked, so an unlink cannot free it
    // (and a create reuse its number) in between.
    let n = {
        let g = rlock(&p);
        let ino = match name {
            b"." if g.is_dir() => parent,
            b".." if g.is_dir() => g.hdr.parent,
            _ => g.find_name(&state.pool, name)?.ok_or(Error::NotFound)?.ino,
        };
        if ino == parent { Arc::clone(&p) } else { state.inode(ino)? }
    };
    let g = rlock(&n);
    // Unlinked and freed since the directory's lock was let go.
    if !g.hdr.in_use() {
        return Err(Error::NotFound);
    }
    Ok(state.attr(&g))
}

/// At most `max` entries of directory `ino` after position `offset` (0 starts at ".").
pub(crate) fn readdir_page(
    state: &MountState,
    ino: u64,
    offset: u64,
    max: usize,
) -> Result<Vec<DirEntry>> {
    state.check_alive()?;
    let _ns = state.namespace.read();
    let n = state.inode(ino)?;
    let g = rlock(&n);
    let (d, media) = g.dir_with_media(&state.pool)?;
    let mut out = Vec::new();
    if offset < 1 {
        out.push(DirEntry {
            ino,
            kind: FileKind::Dir,
            name: b".".to_vec(),
            offset: 1,
        });
    }
    if offset < 2 {
        out.push(DirEntry {
            ino: g.hdr.parent,
            kind: FileKind::Dir,
            name: b"..".to_vec(),
            offset: 2,
        });
    }
    for found in d.entries_after(media, offset.max(2)) {
        if out.len() >= max {
            break;
        }
        let (pos, name, loc) = found?;
        out.push(DirEntry {
            ino: loc.ino,
            kind: loc.kind,
            name,
            offset: pos,
        });
    }
    out.truncate(max);
    let due = crate::ops::file::atime_due(state, &g.hdr);
    drop(g);
    if due {
        crate::ops::file::touch_atime(state, &n);
    }
    Ok(out)
}

/// Link-count ceiling (`EMLINK` beyond it), kept well below `u32::MAX` so a count read from
/// media can never overflow.
pub(crate) const MAX_LINKS: u32 = 65000;

/// Drop one link; saturating, so a damaged count from media cannot underflow into a panic.
pub(crate) fn dec_links(h: &mut InodeHeader) {
    h.nlink = h.nlink.saturating_sub(1);
}

/// Add one link; callers check `MAX_LINKS` first, this only keeps a damaged count from wrapping.
pub(crate) fn inc_links(h: &mut InodeHeader) {
    h.nlink = h.nlink.saturating_add(1);
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::fs::Fs;
    use crate::media::pool::{PersistObserver, Pool};
    use crate::types::{MkfsOptions, MountOptions, RenameFlags};
    use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;
    use std::time::Duration;

    /// Long enough for any lookup on a loaded machine; a lookup that waits for the paused name
    /// change never returns within it.
    const ANSWER: Duration = Duration::from_secs(10);

    /// Stops the one thread it is armed for at that thread's next fence (inside a name change,
    /// with its directory locked) until `go` is sent.
    struct Gate {
        armed: Mutex<Option<ThreadId>>,
        paused: SyncSender<()>,
        go: Mutex<Receiver<()>>,
    }

    impl PersistObserver for Gate {
        fn stored(&self, _: &Pool, _: u64, _: u64) {}
        fn flushed(&self, _: &Pool, _: u64, _: u64) {}
        fn fenced(&self, _: &Pool) {
            let mut armed = self.armed.lock().unwrap();
            if *armed == Some(std::thread::current().id()) {
                *armed = None;
                drop(armed);
                self.paused.send(()).unwrap();
                let _ = self.go.lock().unwrap().recv();
            }
        }
    }

    /// What a look at a directory answered: the inode of the name looked up, the names listed,
    /// the directory's mtime.
    type Answer = (u64, Vec<Vec<u8>>, i64);

    /// Run `change` on a thread of its own, paused at its first fence; meanwhile look `seen` up
    /// in `dir`, list `dir` and get its attributes from another thread, and return what they
    /// answered (None if they did not answer while the change was paused). The change then
    /// goes on.
    fn look_while_paused(
        fs: &Fs,
        dir: u64,
        seen: &'static [u8],
        change: impl FnOnce(&Fs) + Send + 'static,
    ) -> Option<Answer> {
        let (paused_tx, paused) = sync_channel(1);
        let (go, go_rx) = sync_channel(1);
        let gate = Arc::new(Gate { armed: Mutex::new(None), paused: paused_tx, go: Mutex::new(go_rx) });
        fs.pool().set_observer(Some(gate.clone()));
        let changer = {
            let fs = fs.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                *gate.armed.lock().unwrap() = Some(std::thread::current().id());
                change(&fs);
            })
        };
        paused.recv_timeout(ANSWER).expect("the name change reached a fence");
        let (answer_tx, answer) = sync_channel(1);
        let looker = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let ino = fs.lookup(dir, seen).unwrap().ino;
                let names = fs.readdir(dir, 0).unwrap().into_iter().map(|e| e.name).collect();
                let _ = answer_tx.send((ino, names, fs.getattr(dir).unwrap().mtime));
            })
        };
        let got = answer.recv_timeout(ANSWER).ok();
        go.send(()).unwrap();
        changer.join().unwrap();
        looker.join().unwrap();
        fs.pool().set_observer(None);
        got
    }

    #[test]
    fn lookups_and_readdir_answer_while_a_name_change_in_the_directory_commits() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        let mkfs = MkfsOptions { size: Some(48 << 20), ..Default::default() };
        Fs::mkfs(&p, &mkfs).unwrap();
        let opts = MountOptions { no_background_rewrite: true, ..Default::default() };
        let fs = Fs::mount(&p, opts).unwrap();
        let dir = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
        let kept = fs.create(dir, b"kept", 0o644, 0, 0).unwrap().ino;
        fs.create(dir, b"gone", 0o644, 0, 0).unwrap();

        // A create, paused inside its commit: the directory answers as it was before it, and
        // its times change after it even when the create took them from the same clock tick
        // as the create before it (`show_change_seen_meanwhile`).
        let (ino, names, mtime) = look_while_paused(&fs, dir, b"kept", move |fs| {
            fs.create(dir, b"new", 0o644, 0, 0).unwrap();
        })
        .expect("a lookup and a readdir answered while a create in the directory committed");
        assert_eq!(ino, kept);
        assert!(names.iter().any(|n| n == b"gone") && !names.iter().any(|n| n == b"new"));
        assert!(fs.lookup(dir, b"new").is_ok(), "the create went on after the lookups");
        assert_ne!(fs.getattr(dir).unwrap().mtime, mtime, "the create shows in the times");

        // An unlink, paused the same way.
        // (The look above made the first create store fine-grained times; the second stores
        // the clock tick's, as the unlink will.)
        fs.create(dir, b"tick", 0o644, 0, 0).unwrap();
        fs.create(dir, b"tock", 0o644, 0, 0).unwrap();
        let (ino, names, mtime) = look_while_paused(&fs, dir, b"kept", move |fs| {
            fs.unlink(dir, b"gone").unwrap();
        })
        .expect("a lookup and a readdir answered while an unlink in the directory committed");
        assert_eq!(ino, kept);
        assert!(names.iter().any(|n| n == b"gone"), "{names:?}");
        assert!(matches!(fs.lookup(dir, b"gone"), Err(Error::NotFound)));
        assert_ne!(fs.getattr(dir).unwrap().mtime, mtime, "the unlink shows in the times");
        let report = fs.check();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }

    #[test]
    fn a_removal_held_for_the_caller_keeps_the_inode_until_its_release() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        Fs::mkfs(&p, &MkfsOptions { size: Some(48 << 20), ..Default::default() }).unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        let root = fs.root();
        let file = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(file, 0, &[7u8; 100_000]).unwrap();
        let victim = fs.create(root, b"v", 0o644, 0, 0).unwrap().ino;
        fs.create(root, b"src", 0o644, 0, 0).unwrap();
        let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        fs.link(file, root, b"f2").unwrap();
        let free_before = fs.statfs();

        assert_eq!(fs.unlink_held(root, b"f", true).unwrap(), None, "a name is left");
        assert_eq!(fs.unlink_held(root, b"f2", true).unwrap(), Some(file));
        let from = (root, &b"src"[..]);
        let over = fs.rename_held(from, (root, b"v"), RenameFlags::default(), true).unwrap();
        assert_eq!(over, Some(victim));
        assert_eq!(fs.rmdir_held(root, b"d", true).unwrap(), Some(dir));
        // Kept: no names, no links, still read and written by number; a consistent mount.
        let a = fs.getattr(file).unwrap();
        assert_eq!((a.nlink, a.size), (0, 100_000));
        let mut buf = [0u8; 10];
        assert_eq!(fs.read(file, 99_990, &mut buf).unwrap(), 10);
        assert_eq!(buf, [7u8; 10]);
        fs.write(file, 0, b"still here").unwrap();
        assert_eq!(fs.getattr(dir).unwrap().nlink, 0);
        assert!(matches!(fs.create(dir, b"x", 0o644, 0, 0), Err(Error::NotFound)));
        assert_eq!(fs.statfs().free_inodes, free_before.free_inodes, "nothing freed yet");
        let report = fs.check();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        // An open handle and the hold: the inode goes with the last of them.
        fs.open(file).unwrap();
        for ino in [file, victim, dir] {
            fs.let_go(ino).unwrap();
        }
        fs.let_go(file).unwrap(); // the hold is gone: nothing more to let go
        assert_eq!(fs.getattr(file).unwrap().nlink, 0, "still open");
        assert!(matches!(fs.getattr(victim), Err(Error::Stale(_))));
        assert!(matches!(fs.getattr(dir), Err(Error::Stale(_))));
        fs.release(file).unwrap();
        assert!(matches!(fs.getattr(file), Err(Error::Stale(_))));
        assert_eq!(fs.statfs().free_inodes, free_before.free_inodes + 3);
        assert!(fs.statfs().free_blocks >= free_before.free_blocks + 24, "the file's blocks");
        // Without a hold the library's removals free at once, as before.
        let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
        assert_eq!(fs.unlink_held(root, b"g", false).unwrap(), None);
        assert!(matches!(fs.getattr(g), Err(Error::Stale(_))));
        let report = fs.check();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}

#[cfg(test)]
#[path = "namespace_space_tests.rs"]
mod space_tests;
