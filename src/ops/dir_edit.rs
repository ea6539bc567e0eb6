//! Directory edits: where a namespace operation puts new entries (free slots, or a new block),
//! which entries it removes or repoints, the journaled `starts` words that make those changes,
//! and their application to the DRAM directory indexes once the transaction has committed.

use crate::error::{Error, Result};
use crate::media::alloc::BlockRun;
use crate::media::journal::Tx;
use crate::media::layout::{self, BLOCK_SIZE, FileKind};
use crate::media::pool::Category;
use crate::meta::dir::{self, DirEntryLoc, DirIndex};
use crate::meta::inode::{FileMap, MapUpdate};
use crate::state::inode_state::{InodeState, InodeWriteGuard};
use crate::state::mount_state::MountState;
use crate::state::tx::Reserved;
use std::collections::BTreeMap;

/// Directory changes of one namespace operation, applied to DRAM after commit.
#[derive(Default)]
pub(crate) struct DirEdit {
    /// (directory block header (`dir::header_offset`), (directory, block index, new
    /// `starts`)), sorted by header: one or two blocks per operation, where a vector beats a
    /// map.
    starts: Vec<(u64, (u64, u32, u64))>,
    inserts: Vec<(u64, Vec<u8>, DirEntryLoc)>,
    /// (directory, name, where its entry is).
    removes: Vec<(u64, Vec<u8>, DirEntryLoc)>,
    /// (directory, name, where its entry is, new inode, new type).
    repoints: Vec<(u64, Vec<u8>, DirEntryLoc, u64, FileKind)>,
    new_blocks: Vec<u64>,
    /// (directory, block): blocks with removed entries that proved too full for a new name,
    /// taken off the directory's list of such blocks when the edit is applied.
    full_blocks: Vec<(u64, u32)>,
}

impl DirEdit {
    /// The new `starts` word planned for the block whose header is at `so`, if any.
    fn planned_starts(&self, so: u64) -> Option<u64> {
        self.starts
            .binary_search_by_key(&so, |e| e.0)
            .ok()
            .map(|i| self.starts[i].1.2)
    }

    /// Plan `starts` word `w` for block `block` of directory `dino`, whose header is at `so`.
    fn plan_starts(&mut self, so: u64, dino: u64, block: u32, w: u64) {
        match self.starts.binary_search_by_key(&so, |e| e.0) {
            Ok(i) => self.starts[i].1 = (dino, block, w),
            Err(i) => self.starts.insert(i, (so, (dino, block, w))),
        }
    }
}

/// A directory removed while open (no links, kept until its last handle goes) takes no new
/// entries: ENOENT, as Linux answers for a deleted directory.
fn refuse_removed(d: &InodeState) -> Result<()> {
    match d.hdr.nlink {
        0 => Err(Error::NotFound),
        _ => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
/// Plan inserting `name → ino` into directory `d`: writes the entry bytes into free slots
/// (or a fresh block) unjournaled and records the journaled `starts` change in `edit`.
pub(crate) fn plan_insert(
    state: &MountState,
    d: &mut InodeState,
    name: &[u8],
    ino: u64,
    kind: FileKind,
    edit: &mut DirEdit,
    tx: &mut Tx<'_>,
    res: &mut Reserved<'_>,
) -> Result<()> {
    let dino = d.ino;
    refuse_removed(d)?;
    // Slots claimed by earlier inserts of this same operation are not visible in the index
    // yet, so a second insert into one directory within one operation uses a fresh search
    // that skips them.
    let dirx = d.dir.as_mut().ok_or(Error::NotDir)?;
    let pending = edit.inserts.iter().any(|i| i.0 == dino);
    let found = if pending { None } else { dirx.find_space(name.len()) };
    let (block, slot, phys) = match found {
        Some((b, s)) => (b, s, block_at(&d.map, dino, b)?),
        None => {
            // Blocks this transaction already added to this directory come after its last one.
            let added = edit.new_blocks.iter().filter(|&&d| d == dino).count() as u32;
            let b = dirx.blocks() + added;
            let phys = res.alloc_one()?;
            dir::init_dir_block(&state.pool, phys, dino, b)?;
            let mut upd = MapUpdate::default();
            state.reserve_slots(res, &mut d.map, 1, &mut upd)?;
            d.map.remap(
                b as u64,
                1,
                &[BlockRun {
                    start: phys,
                    len: 1,
                }],
                &mut upd,
            );
            let mut hdr = d.hdr.clone();
            state.map_tx(tx, &d.map, dino, &upd, &mut hdr)?;
            hdr.size = (b as u64 + 1) * BLOCK_SIZE;
            hdr.map_end = hdr.map_end.max(b as u64 + 1);
            state.header_tx(tx, dino, &d.hdr, &hdr);
            d.hdr = hdr;
            edit.new_blocks.push(dino);
            (b, 1, phys)
        }
    };
    write_entry(state, d, (block, slot, phys), name, ino, kind, edit)
}

/// [`plan_insert`] for a create, which holds its directory shared while it plans and commits
/// (`DirChange`): Ok(false) if the directory has no room for the name, and the caller must
/// upgrade its lock and call [`plan_insert`], which adds a block.
pub(crate) fn plan_insert_shared(
    state: &MountState,
    d: &InodeState,
    name: &[u8],
    ino: u64,
    kind: FileKind,
    edit: &mut DirEdit,
) -> Result<bool> {
    let dirx = d.dir.as_ref().ok_or(Error::NotDir)?;
    refuse_removed(d)?;
    if edit.inserts.iter().any(|i| i.0 == d.ino) {
        return Ok(false); // a second name for this directory: plan_insert skips the first's slots
    }
    let (found, full) = dirx.peek_space(name.len());
    edit.full_blocks.extend(full.into_iter().map(|b| (d.ino, b)));
    let Some((block, slot)) = found else {
        return Ok(false);
    };
    let phys = block_at(&d.map, d.ino, block)?;
    write_entry(state, d, (block, slot, phys), name, ino, kind, edit)?;
    Ok(true)
}

/// Write the entry `name -> ino` into free slots at `(block, slot, phys)` of directory `d`
/// (unjournaled: nothing names them yet) and plan its block's `starts` word.
fn write_entry(
    state: &MountState,
    d: &InodeState,
    (block, slot, phys): (u32, u32, u64),
    name: &[u8],
    ino: u64,
    kind: FileKind,
    edit: &mut DirEdit,
) -> Result<()> {
    let dino = d.ino;
    let n = layout::dentry_slots(name.len());
    let dirx = d.dir.as_ref().ok_or(Error::NotDir)?;
    let bytes = layout::encode_dentry(ino, kind, name);
    let off = dir::slot_offset(phys, slot);
    state.pool.write_flush(off, &bytes, Category::Metadata)?;
    let so = dir::header_offset(phys);
    let cur = match edit.planned_starts(so) {
        Some(w) => w,
        None if (block as usize) < dirx.starts.len() => dirx.starts[block as usize],
        None => 0,
    };
    edit.plan_starts(so, dino, block, cur | (1u64 << slot));
    edit.inserts.push((
        dino,
        name.to_vec(),
        DirEntryLoc {
            ino,
            kind,
            block,
            slot,
            nslots: n,
        },
    ));
    Ok(())
}

/// Pool block of block `b` of directory `dino`, whose extent map is `map`.
fn block_at(map: &FileMap, dino: u64, b: u32) -> Result<u64> {
    map.lookup(u64::from(b))
        .map(|(phys, _)| phys)
        .ok_or_else(|| Error::Corrupted(format!("directory {dino} block {b} unmapped")))
}

pub(crate) fn plan_remove(
    state: &MountState,
    d: &InodeState,
    name: &[u8],
    edit: &mut DirEdit,
) -> Result<()> {
    let dirx = d.dir.as_ref().ok_or(Error::NotDir)?;
    let loc = d.find_name(&state.pool, name)?.ok_or(Error::NotFound)?;
    let phys = block_at(&d.map, d.ino, loc.block)?;
    let so = dir::header_offset(phys);
    let cur = edit
        .planned_starts(so)
        .unwrap_or(dirx.starts[loc.block as usize]);
    edit.plan_starts(so, d.ino, loc.block, cur & !(1u64 << loc.slot));
    edit.removes.push((d.ino, name.to_vec(), loc));
    Ok(())
}

pub(crate) fn plan_repoint(
    state: &MountState,
    d: &InodeState,
    name: &[u8],
    ino: u64,
    kind: FileKind,
    tx: &mut Tx<'_>,
    edit: &mut DirEdit,
) -> Result<()> {
    let loc = d.find_name(&state.pool, name)?.ok_or(Error::NotFound)?;
    let phys = block_at(&d.map, d.ino, loc.block)?;
    let bytes = layout::encode_dentry(ino, kind, name);
    tx.write_copy(
        dir::slot_offset(phys, loc.slot),
        &bytes[..layout::DENTRY_HEADER],
        Category::Metadata,
    );
    edit.repoints.push((d.ino, name.to_vec(), loc, ino, kind));
    Ok(())
}

/// The journaled writes of `edit`: each changed directory block header's checksum and `starts`
/// word, one 12-byte write per block.
pub(crate) fn edit_tx(edit: &DirEdit, tx: &mut Tx<'_>) {
    for &(off, (dino, block, w)) in &edit.starts {
        tx.write_copy(off, &dir::header_bytes(dino, block, w), Category::Metadata);
    }
}

pub(crate) fn apply_edit(edit: DirEdit, guards: &mut BTreeMap<u64, InodeWriteGuard<'_>>) {
    let mut dirs: Vec<(u64, &mut InodeState)> =
        guards.iter_mut().map(|(&d, g)| (d, &mut **g)).collect();
    apply_edit_to(edit, &mut dirs);
}

/// [`apply_edit`] to the locked directories `dirs` (inode number, state).
pub(crate) fn apply_edit_to(edit: DirEdit, dirs: &mut [(u64, &mut InodeState)]) {
    fn index<'a>(dirs: &'a mut [(u64, &mut InodeState)], d: u64) -> Option<&'a mut DirIndex> {
        dirs.iter_mut().find(|e| e.0 == d).and_then(|e| e.1.dir.as_deref_mut())
    }
    for &d in &edit.new_blocks {
        if let Some(dx) = index(dirs, d) {
            dx.push_block();
        }
    }
    for &(d, b) in &edit.full_blocks {
        if let Some(dx) = index(dirs, d) {
            dx.forget_roomy(b);
        }
    }
    for (d, name, loc) in &edit.removes {
        if let Some(dx) = index(dirs, *d) {
            dx.remove(name, loc);
        }
    }
    for (d, name, loc) in &edit.inserts {
        if let Some(dx) = index(dirs, *d) {
            dx.insert(name, *loc);
        }
    }
    for (d, name, loc, ino, kind) in &edit.repoints {
        if let Some(dx) = index(dirs, *d) {
            dx.repoint(name, loc, *ino, *kind);
        }
    }
}

