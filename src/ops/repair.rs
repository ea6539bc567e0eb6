//! `winefs fsck --repair`, in the spirit of e2fsck's passes, on a pool that mount validated down
//! to its namespace (`state::mount::Inconsistent::Report`). Each fix is one journaled transaction
//! and one line of the report; what cannot be fixed without guessing is left and reported:
//! 0. an inode that fails its checksum but passes every other check (header ranges, extent map,
//!    directory blocks, xattr block, symlink target, no size or blocks for a FIFO, socket or
//!    device, no block shared with another inode, named by an entry of its type) is kept and
//!    its checksum rewritten (e2fsck's "passes checks, but checksum does not match"); any other
//!    is freed, with whatever blocks no other inode claims; an orphan that shares blocks is
//!    freed the same way;
//!    an extent-index block that fails its checksum is resealed when the map read through it
//!    passes every check and shares no block, else the inode is freed the same way;
//! 1. blocks two inodes claim (e2fsck's passes 1B-1D): every claimant but one gets a copy of
//!    its own (fresh blocks, the shared content copied, the extent remapped in one
//!    transaction); the keeper is the extent-index block if one side is one, else the lower
//!    inode number (the lower logical block within one inode). Two extent-index blocks are
//!    left (whose map is right cannot be known), and so is a copy the pool has no space for;
//!    then xattr blocks that fail their checks are dropped and symlinks whose target fails its
//!    checksum are freed (`repair_leaf`);
//! 2. entries naming a free inode are removed; entries whose type disagrees with their inode's
//!    are rewritten with the inode's type;
//! 3. a directory listed in more than one place is left (which listing is right cannot be known);
//! 4. inodes that nothing names (neither reachable nor orphans) are linked into `/lost+found`
//!    as `#INO` (a directory also gets `/lost+found` as its parent);
//! 5. every directory's parent field is set to the directory that lists it, and every link
//!    count to what the entries say.
//!
//! Free space needs no pass of its own: mount rebuilds it from what the inodes claim (a shared
//! block is never free), and the clean unmount that ends a repair rewrites the allocator
//! snapshot (reported when the old one was stale).

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::checksum;
use crate::media::journal::Tx;
use crate::media::layout::{
    BLOCK_SIZE, FileKind, INODE_BYTES, INODE_SIZE_CHECKED, InodeHeader, ROOT_INO, ino, put_u64,
};
use crate::media::pool::Category;
use crate::meta::dir::DirEntryLoc;
use crate::ops::dir_edit::{DirEdit, apply_edit, edit_tx, plan_insert, plan_remove, plan_repoint};
use crate::ops::namespace::{self, NewInode, inode_refs, lock_all};
use crate::ops::relocate;
use crate::state::claims::{self, Claim, ClaimKind};
use crate::state::inode_state::{InodeRef, rlock, wlock};
use crate::state::validate;
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
fn entries(state: &MountState) -> Result<Vec<(u64, Vec<u8>, DirEntryLoc)>> {
    let arcs = state.all_inodes()?;
    let mut v = Vec::new();
    for a in arcs {
        let g = rlock(&a);
        if g.dir.is_some() {
            let (d, media) = g.dir_with_media(&state.pool)?;
            v.extend(d.entries(media)?.into_iter().map(|(n, l)| (g.ino, n, l)));
        }
    }
    v.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    Ok(v)
}

/// In-use inodes: ino → (kind, nlink, parent).
fn inodes(state: &MountState) -> Result<BTreeMap<u64, (FileKind, u32, u64)>> {
    let arcs = state.all_inodes()?;
    Ok(arcs.iter()
        .map(|a| {
            let g = rlock(a);
            (g.ino, (g.kind(), g.hdr.nlink, g.hdr.parent))
        })
        .collect())
}

/// One transaction on directory `dino`'s entries (and optionally a changed header of inode
/// `other`, locked with it).
fn dir_tx(
    state: &MountState,
    dino: u64,
    other: Option<u64>,
    plan: impl FnOnce(
        &mut std::collections::BTreeMap<u64, crate::state::inode_state::InodeWriteGuard<'_>>,
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
    // 0. Inodes that fail their checksum: resealed or freed; orphans sharing blocks freed.
    damaged_inodes(state, &mut rep)?;
    // 0b. Extent-index blocks that fail their checksum: resealed or the file freed.
    bad_index_blocks(state, &mut rep)?;
    // 1. Blocks two inodes claim: a copy each.
    shared_blocks(state, &mut rep)?;
    if let Some(why) = &state.stale_snapshot {
        rep.changes.push(format!(
            "allocator snapshot: {why}; rewritten from the inode tables"
        ));
    }
    // Then xattr blocks and symlink targets that fail their checks (`repair_leaf`).
    rep.changes.extend(crate::ops::repair_leaf::repair(state)?);
    // 2. Entries naming free inodes, or with the wrong type.
    let live = inodes(state)?;
    for (dino, name, loc) in entries(state)? {
        let nm = String::from_utf8_lossy(&name).into_owned();
        match live.get(&loc.ino) {
            None => {
                dir_tx(state, dino, None, |g, edit, _, _| {
                    plan_remove(state, &g[&dino], &name, edit)?;
                    Ok(Vec::new())
                })?;
                rep.changes.push(format!(
                    "directory {dino}: removed entry {nm:?}, which named free inode {}",
                    loc.ino
                ));
            }
            Some(&(kind, _, _)) if kind != loc.kind => {
                dir_tx(state, dino, None, |g, edit, tx, _| {
                    plan_repoint(state, &g[&dino], &name, loc.ino, kind, tx, edit)?;
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
    // 3. Directories listed in more than one place.
    let listed = |state: &MountState| -> Result<BTreeMap<u64, Vec<u64>>> {
        let mut m: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (d, _, loc) in entries(state)? {
            m.entry(loc.ino).or_default().push(d);
        }
        Ok(m)
    };
    let live = inodes(state)?;
    let left_before = rep.left.len();
    for (ino, dirs) in listed(state)? {
        if live.get(&ino).is_some_and(|x| x.0 == FileKind::Dir) && dirs.len() > 1 {
            rep.left.push(format!(
                "directory {ino} is listed in {} directories ({dirs:?}); not repaired: which listing is right cannot be known",
                dirs.len()
            ));
        }
    }
    if rep.left.len() > left_before {
        return Ok(rep);
    }
    // 4. Inodes nothing names go to /lost+found.
    let named = listed(state)?;
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
    let by_dir: BTreeMap<u64, Vec<u64>> = entries(state)?.into_iter().fold(
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
    for (ino, x) in inodes(state)? {
        if !seen.contains(&ino) && x.1 > 0 {
            rep.left.push(format!(
                "inode {ino} ({:?}) is unreachable from the root (a detached cycle of directories); not repaired",
                x.0
            ));
        }
    }
    // 5. Parent fields and link counts.
    let named = listed(state)?;
    let live = inodes(state)?;
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
    rep.left.extend(after.problems);
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
                NewInode { by_repair: true, ..NewInode::plain(FileKind::Dir, 0o700, 0, 0) },
            )?;
            rep.changes.push(format!("made /lost+found (inode {})", a.ino));
            Ok(a.ino)
        }
        Err(e) => Err(e),
    }
}

/// Every claim of every in-use inode, sorted by first block.
fn all_claims(state: &MountState) -> Result<Vec<Claim>> {
    let arcs = state.all_inodes()?;
    let guards: Vec<_> = arcs.iter().map(rlock).collect();
    Ok(claims::claims_of(guards.iter().map(|g| &**g)))
}

/// The first run inode `ino` shares with another claim, as its report line (None: none).
fn sharing(state: &MountState, ino: u64) -> Result<Option<String>> {
    Ok(claims::shared(&all_claims(state)?)
        .iter()
        .find(|s| s.a.ino == ino || s.b.ino == ino)
        .map(|s| s.to_string()))
}

/// Pass 0: each inode that failed its checksum at mount is resealed when it passes every other
/// check, else freed; an orphan that shares blocks is freed too (mount left both for here).
fn damaged_inodes(state: &MountState, rep: &mut RepairReport) -> Result<()> {
    let names = entries(state)?;
    // Asked again each time: an inode freed before may have shared the blocks.
    let sharing = |ino: u64| sharing(state, ino);
    for &ino in &state.damaged_inodes {
        let Ok(node) = state.inode(ino) else {
            // Not loaded (it fails other checks too): free its slot; whatever it owned is free
            // already, and the entries naming it dangle and go below.
            let mut tx = Tx::new();
            tx.write(
                state.inode_off(ino) + crate::media::layout::ino::FLAGS as u64,
                0u32.to_le_bytes().to_vec(),
                Category::Metadata,
            );
            state.commit(tx)?;
            state.release_inode_number(ino);
            rep.changes.push(match state.unloadable_inodes.get(&ino) {
                Some(why) => format!("{why}; inode {ino} freed (its content is lost)"),
                None => format!("inode {ino} failed its checksum; freed (its content is lost)"),
            });
            continue;
        };
        match reseal_refusal(state, ino, &node, &names, sharing(ino)?) {
            None => {
                let off = state.inode_off(ino);
                let mut raw = [0u8; INODE_BYTES];
                state.pool.read(off, &mut raw)?;
                let mut tx = Tx::new();
                // A checked size word is resealed too, for the size it holds (which passed
                // the checks above); the checksum does not cover it.
                let hdr = InodeHeader::decode(&raw);
                if hdr.flags & INODE_SIZE_CHECKED != 0 {
                    let word = hdr.size_field();
                    put_u64(&mut raw, ino::SIZE, word);
                    tx.write(off + ino::SIZE as u64, word.to_le_bytes().to_vec(), Category::Metadata);
                }
                tx.write(
                    off + ino::CRC as u64,
                    checksum::inode_checksum(&raw).to_le_bytes().to_vec(),
                    Category::Metadata,
                );
                state.commit(tx)?;
                rep.changes.push(format!(
                    "inode {ino}: checksum rewritten; its fields pass every check, but its content cannot be verified"
                ));
            }
            Some(why) => {
                free_keeping_shared(state, ino, &node)?;
                rep.changes.push(format!(
                    "inode {ino} failed its checksum; freed (its content is lost): {why}"
                ));
            }
        }
    }
    // Orphans (no links, named nowhere) that share blocks: freed, the shared blocks left.
    let named: BTreeSet<u64> = names.iter().map(|x| x.2.ino).collect();
    for (ino, (_, nlink, _)) in inodes(state)? {
        if nlink == 0
            && !named.contains(&ino)
            && let Some(s) = sharing(ino)?
        {
            free_keeping_shared(state, ino, &state.inode(ino)?)?;
            rep.changes.push(format!(
                "inode {ino}: an orphan (no links) sharing blocks ({s}); freed, the shared blocks left to their other owner"
            ));
        }
    }
    Ok(())
}

/// Why inode `ino`, which fails its checksum but loaded, cannot be resealed (None: it can).
fn reseal_refusal(
    state: &MountState,
    ino: u64,
    node: &InodeRef,
    names: &[(u64, Vec<u8>, DirEntryLoc)],
    sharing: Option<String>,
) -> Option<String> {
    if let Some(s) = sharing {
        return Some(format!("it shares blocks ({s})"));
    }
    if index_checksum_fails(state, ino) {
        return Some("its extent-index chain fails its checksum too".into());
    }
    let g = rlock(node);
    let kind = g.kind();
    let naming: Vec<&DirEntryLoc> = names.iter().map(|x| &x.2).filter(|l| l.ino == ino).collect();
    if ino != ROOT_INO && naming.is_empty() {
        return Some("no directory entry names it".into());
    }
    if let Some(l) = naming.iter().find(|l| l.kind != kind) {
        return Some(format!("an entry names it as {:?}, but it says {kind:?}", l.kind));
    }
    let mut problems = Vec::new();
    if kind == FileKind::Symlink && (g.hdr.size == 0 || g.hdr.size > 4095) {
        problems.push(format!("symlink target length {}", g.hdr.size));
    }
    let special = !matches!(kind, FileKind::File | FileKind::Dir | FileKind::Symlink);
    if special && (g.hdr.size != 0 || !g.map.extents.is_empty() || g.hdr.index_block != 0) {
        problems.push(format!("a {kind:?} with size {} or blocks mapped", g.hdr.size));
    }
    validate::symlink_targets(state, [&*g], &mut problems);
    validate::xattr_blocks(&state.pool, &state.geo, [&*g], &mut problems);
    problems.into_iter().next()
}

/// Free inode `ino` in one transaction, giving back only the blocks no other inode claims.
fn free_keeping_shared(state: &MountState, ino: u64, node: &InodeRef) -> Result<()> {
    let others: Vec<BlockRun> = all_claims(state)?
        .into_iter()
        .filter(|c| c.ino != ino)
        .map(|c| c.run)
        .collect();
    let mut g = wlock(node);
    let mut tx = Tx::new();
    state.free_inode_tx(&g, &mut tx)?;
    state.commit(tx)?;
    state.forget_inode_keeping(&mut g, &others);
    Ok(())
}

/// Pass 0b: an inode whose extent-index chain has blocks that fail their checksum (its own
/// checksum passes, or pass 0 freed it) keeps its map and gets those blocks resealed when the
/// map loaded (every live record in the data area, none overlapping) and shares no block; else
/// it is freed, with whatever blocks no other inode claims. Leaving the block would leave a pool
/// that no mount, not even a read-only one, accepts.
fn bad_index_blocks(state: &MountState, rep: &mut RepairReport) -> Result<()> {
    for node in state.all_inodes()? {
        let (ino, map_end, bad) = {
            let g = rlock(&node);
            let mut bad = Vec::new();
            let mut blk = vec![0u8; crate::media::layout::BLOCK_BYTES];
            for &b in g.map.index_blocks() {
                state.pool.read(b * BLOCK_SIZE, &mut blk)?;
                let crc = checksum::index_block_checksum(b, &blk, g.hdr.map_end);
                if crate::media::layout::get_u32(&blk, crate::media::layout::index_block::CRC) != crc {
                    bad.push((b, crc, dead_records(&blk, g.hdr.map_end)));
                }
            }
            (g.ino, g.hdr.map_end, bad)
        };
        if bad.is_empty() {
            continue;
        }
        let blocks: Vec<u64> = bad.iter().map(|x| x.0).collect();
        if let Some(s) = sharing(state, ino)? {
            free_keeping_shared(state, ino, &node)?;
            rep.changes.push(format!(
                "inode {ino}: extent-index blocks {blocks:?} fail their checksum and it shares blocks ({s}); freed (its content is lost), the shared blocks left to their other owner"
            ));
            continue;
        }
        let dropped: usize = bad.iter().map(|x| x.2.len()).sum();
        let mut tx = Tx::new();
        for (b, crc, dead) in bad {
            // The records that read as dead are zeroed as mount zeroes dead slots; the checksum
            // counts them as zero already.
            for o in dead {
                tx.write(
                    b * BLOCK_SIZE + o as u64,
                    vec![0u8; crate::media::layout::EXTENT_BYTES],
                    Category::Metadata,
                );
            }
            tx.write(
                b * BLOCK_SIZE + crate::media::layout::index_block::CRC as u64,
                crc.to_le_bytes().to_vec(),
                Category::Metadata,
            );
        }
        state.commit(tx)?;
        let dropped = if dropped == 0 {
            String::new()
        } else {
            format!(
                "; {dropped} records there read as beyond the map end and are dropped (the file has holes there, their blocks are free)"
            )
        };
        rep.changes.push(format!(
            "inode {ino}: extent-index blocks {blocks:?} failed their checksum; resealed (map end {map_end}): its records pass every check, but its content cannot be verified{dropped}"
        ));
    }
    Ok(())
}

/// Offsets in extent-index block `blk` of the records that are not empty but lie at or beyond
/// `map_end`.
fn dead_records(blk: &[u8], map_end: u64) -> Vec<usize> {
    use crate::media::layout::{EXTENT_BYTES, ExtentRecord, INDEX_SLOTS, index_block};
    (0..INDEX_SLOTS)
        .map(|s| index_block::SLOTS + s * EXTENT_BYTES)
        .filter(|&o| {
            let r = ExtentRecord::decode(&blk[o..o + EXTENT_BYTES]);
            r.len != 0 && u64::from(r.logical) >= map_end
        })
        .collect()
}

/// Whether a block of inode `ino`'s extent-index chain fails its checksum (or the map no longer
/// loads): mount loads such a map for fsck and repair when what it builds passes validation.
fn index_checksum_fails(state: &MountState, ino: u64) -> bool {
    let mut raw = [0u8; INODE_BYTES];
    if state.pool.read(state.inode_off(ino), &mut raw).is_err() {
        return true;
    }
    let h = crate::media::layout::InodeHeader::decode(&raw);
    crate::meta::inode::FileMap::load(&state.pool, &state.geo, ino, &raw, h.index_block, h.map_end)
        .map_or(true, |l| !l.bad_checksum.is_empty())
}

/// The claim of a shared run that gets a copy of its own (None: neither can, both being
/// extent-index blocks). The other keeps the blocks.
fn copier(a: &Claim, b: &Claim) -> Option<Claim> {
    let rank = |c: &Claim| (c.ino, c.logical_at(c.run.start).unwrap_or(u64::MAX));
    match (a.kind, b.kind) {
        (ClaimKind::Index, ClaimKind::Index) => None,
        (ClaimKind::Index, _) => Some(*b),
        (_, ClaimKind::Index) => Some(*a),
        _ => Some(if rank(a) > rank(b) { *a } else { *b }),
    }
}

/// Pass 1 (e2fsck's 1B-1D): every run two inodes (or one inode twice) claim is copied for
/// every claimant but one, one transaction and one report line per copy.
fn shared_blocks(state: &MountState, rep: &mut RepairReport) -> Result<()> {
    // Per inode: the logical ranges to copy, and whether its xattr block.
    let mut data: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let mut xattr = BTreeSet::new();
    let shared = claims::shared(&all_claims(state)?);
    // Inodes whose extent maps share an index block: a copy for either would rewrite records
    // in the block both read, so nothing of theirs is copied.
    let mut stuck = BTreeSet::new();
    for s in &shared {
        if copier(&s.a, &s.b).is_none() {
            rep.left.push(format!(
                "{s}; not repaired: two extent maps cannot share an index block, and which one is right cannot be known"
            ));
            stuck.extend([s.a.ino, s.b.ino]);
        }
    }
    // A copy for a map read through an index block that fails its checksum would give it
    // content its damaged records merely point at: left.
    for s in &shared {
        if let Some(c) = copier(&s.a, &s.b)
            && !stuck.contains(&c.ino)
            && index_checksum_fails(state, c.ino)
        {
            rep.left.push(format!(
                "{s}; not repaired: inode {}'s extent-index chain fails its checksum, so its claim cannot be trusted",
                c.ino
            ));
            stuck.insert(c.ino);
        }
    }
    for s in shared {
        match copier(&s.a, &s.b) {
            None => {}
            Some(c) if stuck.contains(&c.ino) => {}
            Some(c) => match c.logical_at(s.run.start) {
                Some(l) => data.entry(c.ino).or_default().push((l, s.run.len)),
                None => {
                    xattr.insert(c.ino);
                }
            },
        }
    }
    for (ino, mut ranges) in data {
        ranges.sort_unstable();
        let mut joined: Vec<(u64, u64)> = Vec::new();
        for (l, n) in ranges {
            match joined.last_mut() {
                Some((jl, jn)) if *jl + *jn >= l => *jn = (*jn).max(l + n - *jl),
                _ => joined.push((l, n)),
            }
        }
        for (l, n) in joined {
            clone_range(state, ino, l, n, rep)?;
        }
    }
    for ino in xattr {
        clone_xattr(state, ino, rep)?;
    }
    Ok(())
}

/// A copy is left undone when the pool has no space for it (reported, never guessed around).
fn no_space(rep: &mut RepairReport, what: String, e: Error) -> Result<()> {
    match e {
        Error::NoSpace(why) => {
            rep.left.push(format!("{what} not copied: no space ({why}); not repaired"));
            Ok(())
        }
        e => Err(e),
    }
}

/// Give logical blocks [l, l+n) of inode `ino` fresh blocks holding a copy of their content.
fn clone_range(state: &MountState, ino: u64, l: u64, n: u64, rep: &mut RepairReport) -> Result<()> {
    let node = state.inode(ino)?;
    let mut g = wlock(&node);
    let what = format!("inode {ino}: {n} shared blocks (logical {l}..{})", l + n - 1);
    let from = g.map.lookup(l).map_or(0, |x| x.0);
    let mut res = Reserved::new(state);
    let runs = match res.alloc(n) {
        Ok(r) => r,
        Err(e) => return no_space(rep, what, e),
    };
    if let Err(e) = relocate::copy_runs(state, &mut g, l, &runs, false) {
        return no_space(rep, what, e);
    }
    res.keep();
    let pieces = match runs.len() {
        1 => String::new(),
        k => format!(" (in {k} pieces)"),
    };
    let to = runs.first().map_or(0, |r| r.start);
    rep.changes.push(format!(
        "inode {ino}: cloned {n} shared blocks (logical {l}..{}) from {from} to {to}{pieces}",
        l + n - 1
    ));
    Ok(())
}

/// Give inode `ino` a copy of its shared xattr block.
fn clone_xattr(state: &MountState, ino: u64, rep: &mut RepairReport) -> Result<()> {
    let node = state.inode(ino)?;
    let mut g = wlock(&node);
    let old = g.hdr.xattr_block;
    let mut res = Reserved::new(state);
    let b = match res.alloc_one() {
        Ok(b) => b,
        Err(e) => return no_space(rep, format!("inode {ino}: shared xattr block {old}"), e),
    };
    state
        .pool
        .copy_flush(old * BLOCK_SIZE, b * BLOCK_SIZE, BLOCK_SIZE, Category::Metadata)?;
    let mut h = g.hdr.clone();
    h.xattr_block = b;
    let mut tx = Tx::new();
    state.header_tx(&mut tx, ino, &g.hdr, &h);
    state.commit(tx)?;
    g.hdr = h;
    res.keep();
    rep.changes.push(format!(
        "inode {ino}: cloned its shared xattr block from {old} to {b}"
    ));
    Ok(())
}
