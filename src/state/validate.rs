//! Checks of the namespace and of per-inode metadata blocks that both mount and fsck make: mount
//! refuses a pool that fails them before it writes a byte, fsck lists every failure.

use crate::media::layout::{FileKind, Geometry, ROOT_INO};
use crate::media::pool::Pool;
use crate::meta::xattr;
use crate::state::inode_state::InodeState;
use std::collections::VecDeque;

/// Link counts, entry types and the directory tree: every entry names an in-use inode of the
/// type it says, link counts equal the entries (and subdirectories) that name an inode, every
/// directory is listed once under its parent, nothing is unreachable and there is no cycle.
/// An inode with no links is an orphan (unlinked while open): at mount (`at_mount`) every one
/// is, and is freed next; in a live mount only while it is still open.
pub(crate) fn namespace(
    pool: &Pool,
    nodes: &[&InodeState],
    at_mount: bool,
    problems: &mut Vec<String>,
) {
    let mut p = |s: String| problems.push(s);
    // Tables indexed by inode number (numbers are dense, from 1 to the table's size): a mount
    // runs this over every inode, and hashed lookups were most of its time. A number beyond the
    // table (damage) finds nothing.
    let len = nodes.iter().map(|n| n.ino).max().map_or(0, |m| m as usize + 1);
    let mut by_ino: Vec<Option<&InodeState>> = vec![None; len];
    // Each inode's type in a byte, read for every entry: a table of a megabyte per million
    // inodes stays in cache where the states (hundreds of bytes each) would not.
    let mut kinds: Vec<Option<FileKind>> = vec![None; len];
    for &n in nodes {
        by_ino[n.ino as usize] = Some(n);
        kinds[n.ino as usize] = Some(n.kind());
    }
    let node = |ino: u64| by_ino.get(ino as usize).copied().flatten();
    let kind_of = |ino: u64| kinds.get(ino as usize).copied().flatten();
    let mut refs = vec![0u32; len];
    let mut subdirs = vec![0u32; len];
    for &n in nodes {
        let Ok((d, media)) = n.dir_with_media(pool) else { continue };
        for loc in d.values() {
            // The index keeps no names: one is read from media only for a line that reports it.
            let nm = || media.name_for_report(&loc);
            match kind_of(loc.ino) {
                None => p(format!(
                    "directory {}: entry {:?} points at free inode {}",
                    n.ino,
                    nm(),
                    loc.ino
                )),
                Some(kind) => {
                    refs[loc.ino as usize] += 1;
                    if kind != loc.kind {
                        p(format!(
                            "directory {}: entry {:?} says {:?} but inode {} is {kind:?}",
                            n.ino,
                            nm(),
                            loc.kind,
                            loc.ino,
                        ));
                    }
                    if kind == FileKind::Dir {
                        subdirs[n.ino as usize] += 1;
                        let parent = node(loc.ino).map_or(0, |c| c.hdr.parent);
                        if parent != n.ino {
                            p(format!(
                                "directory {}: parent field is {parent} but it is listed in {}",
                                loc.ino, n.ino
                            ));
                        }
                    }
                }
            }
        }
        if n.hdr.size != d.blocks() as u64 * crate::media::layout::BLOCK_SIZE {
            p(format!(
                "directory {}: size {} but {} blocks",
                n.ino,
                n.hdr.size,
                d.blocks()
            ));
        }
    }
    // An orphan has no links and no entry names it; a named inode with no links is damage
    // (freeing it as an orphan would leave its entries dangling).
    let orphan = |n: &InodeState| {
        n.hdr.nlink == 0 && refs[n.ino as usize] == 0 && (at_mount || n.open > 0)
    };
    for &n in nodes {
        let rc = refs[n.ino as usize];
        if n.is_dir() {
            let want = 2 + subdirs[n.ino as usize];
            if n.hdr.nlink != want {
                p(format!(
                    "directory {}: link count {} but {} expected",
                    n.ino, n.hdr.nlink, want
                ));
            }
            let want_refs = if n.ino == ROOT_INO { 0 } else { 1 };
            if rc != want_refs {
                p(format!(
                    "directory {}: listed {rc} times (expected {want_refs})",
                    n.ino
                ));
            }
        } else if n.hdr.nlink != rc && !orphan(n) {
            p(format!(
                "inode {}: link count {} but {rc} directory entries",
                n.ino, n.hdr.nlink
            ));
        }
        if n.kind() == FileKind::Symlink && (n.hdr.size == 0 || n.hdr.size > 4095) {
            p(format!("symlink {}: target length {}", n.ino, n.hdr.size));
        }
    }
    let mut seen = vec![false; len];
    let mut q = VecDeque::from([ROOT_INO]);
    while let Some(d) = q.pop_front() {
        let Some(dn) = node(d) else { continue };
        if std::mem::replace(&mut seen[d as usize], true) {
            p(format!("directory {d} is reachable twice (a cycle)"));
            continue;
        }
        if let Some(dx) = dn.dir.as_ref() {
            for loc in dx.values() {
                match kind_of(loc.ino) {
                    Some(FileKind::Dir) => q.push_back(loc.ino),
                    Some(_) => seen[loc.ino as usize] = true,
                    None => {}
                }
            }
        }
    }
    for &n in nodes {
        if !seen[n.ino as usize] && !orphan(n) {
            p(format!(
                "inode {} ({:?}) is not reachable from the root",
                n.ino,
                n.kind()
            ));
        }
    }
}

/// Every xattr block decodes (magic, checksum, entries within bounds).
pub(crate) fn xattr_blocks<'a>(
    pool: &Pool,
    g: &Geometry,
    nodes: impl IntoIterator<Item = &'a InodeState>,
    problems: &mut Vec<String>,
) {
    for n in nodes {
        let block = n.hdr.xattr_block;
        if block == 0 {
            continue;
        }
        if let Err(e) = xattr::load(pool, g, n.ino, block) {
            problems.push(format!("inode {}: xattr block {block}: {e}", n.ino));
        }
    }
}

/// Every symlink's target matches the checksum its inode keeps.
pub(crate) fn symlink_targets<'a>(
    state: &crate::state::mount_state::MountState,
    nodes: impl IntoIterator<Item = &'a InodeState>,
    problems: &mut Vec<String>,
) {
    for n in nodes {
        if n.kind() != FileKind::Symlink {
            continue;
        }
        let Some((phys, _)) = n.map.lookup(0) else {
            problems.push(format!("symlink {}: its target block is not mapped", n.ino));
            continue;
        };
        let len = usize::try_from(n.hdr.size).unwrap_or(usize::MAX).min(4095);
        let mut buf = vec![0u8; len];
        let want = state
            .pool
            .read(phys * crate::media::layout::BLOCK_SIZE, &mut buf)
            .and_then(|()| {
                state.pool.read_array::<4>(
                    state.inode_off(n.ino) + crate::media::layout::ino::TARGET_CRC as u64,
                )
            });
        match want {
            Ok(w) if crc32c::crc32c(&buf) == u32::from_le_bytes(w) => {}
            Ok(_) => problems.push(format!("symlink {}: its target fails its checksum", n.ino)),
            Err(e) => problems.push(format!("symlink {}: {e}", n.ino)),
        }
    }
}
