//! Checks of the namespace and of per-inode metadata blocks that both mount and fsck make: mount
//! refuses a pool that fails them before it writes a byte, fsck lists every failure.

use crate::media::layout::{FileKind, Geometry, ROOT_INO};
use crate::media::pool::Pool;
use crate::meta::xattr;
use crate::state::inode_state::InodeState;
use std::collections::VecDeque;

/// What the namespace check reads: every in-use inode's type and link count by number, and
/// the states at hand (at mount, what the scan kept: every directory's and symlink's; in fsck,
/// every inode's).
pub(crate) struct NsInodes<'a> {
    /// By inode number (0 unused): each in-use inode's type, None for a free number.
    pub kinds: &'a [Option<FileKind>],
    /// By inode number: each in-use inode's link count.
    pub nlinks: &'a [u32],
    /// The states at hand, in any order.
    pub states: Vec<&'a InodeState>,
}

/// The type and link-count tables of [`NsInodes`] for `states` (fsck: every inode loaded).
pub(crate) fn tables_of<'a>(
    states: impl IntoIterator<Item = &'a InodeState> + Clone,
) -> (Vec<Option<FileKind>>, Vec<u32>) {
    let len = states.clone().into_iter().map(|n| n.ino).max().map_or(0, |m| m as usize + 1);
    let (mut kinds, mut nlinks) = (vec![None; len], vec![0; len]);
    for n in states {
        kinds[n.ino as usize] = Some(n.kind());
        nlinks[n.ino as usize] = n.hdr.nlink;
    }
    (kinds, nlinks)
}

/// Link counts, entry types and the directory tree: every entry names an in-use inode of the
/// type it says, link counts equal the entries (and subdirectories) that name an inode, every
/// directory is listed once under its parent, nothing is unreachable and there is no cycle.
/// An inode with no links is an orphan (unlinked while open): at mount (`at_mount`) every one
/// is, and is freed next; in a live mount only while it is still open.
pub(crate) fn namespace(
    pool: &Pool,
    inodes: &NsInodes<'_>,
    at_mount: bool,
    problems: &mut Vec<String>,
) {
    let mut p = |s: String| problems.push(s);
    // Tables indexed by inode number (numbers are dense, from 1 to the table's size): a mount
    // runs this over every inode, and hashed lookups were most of its time. A number beyond the
    // table (damage) finds nothing.
    // Each inode's type in a byte, read for every entry: a table of a megabyte per million
    // inodes stays in cache where the states (hundreds of bytes each) would not.
    let (kinds, nlinks) = (inodes.kinds, inodes.nlinks);
    let len = kinds.len().min(nlinks.len());
    // The states by number (a zeroed table: only the pages of the states at hand are touched),
    // and the directories' in inode order.
    let mut states: Vec<Option<&InodeState>> = vec![None; len];
    let mut dirs: Vec<&InodeState> = Vec::new();
    for &n in inodes.states.iter().filter(|n| (n.ino as usize) < len) {
        states[n.ino as usize] = Some(n);
        if n.is_dir() {
            dirs.push(n);
        }
    }
    dirs.sort_unstable_by_key(|n| n.ino);
    let dir = |ino: u64| {
        let n = states.get(ino as usize).copied().flatten()?;
        n.is_dir().then_some(n)
    };
    let kind_of = |ino: u64| kinds.get(ino as usize).copied().flatten();
    let mut refs = vec![0u32; len];
    let mut subdirs = vec![0u32; len];
    // (parent, subdirectory) for every entry naming a directory: the tree is walked over these
    // alone, not over every entry again.
    let mut edges: Vec<(u64, u64)> = Vec::new();
    for n in &dirs {
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
                        edges.push((n.ino, loc.ino));
                        let parent = dir(loc.ino).map_or(0, |c| c.hdr.parent);
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
    // The tree, walked from the root over the subdirectory edges (a directory met twice is a
    // cycle). Its lines follow the link-count lines below.
    edges.sort_by_key(|e| e.0); // stable: each directory's subdirectories keep their order
    let mut tree_lines = Vec::new();
    let mut seen = vec![false; len];
    let mut q = VecDeque::from([ROOT_INO]);
    while let Some(d) = q.pop_front() {
        if dir(d).is_none() {
            continue;
        }
        if std::mem::replace(&mut seen[d as usize], true) {
            tree_lines.push(format!("directory {d} is reachable twice (a cycle)"));
            continue;
        }
        let from = edges.partition_point(|e| e.0 < d);
        q.extend(edges[from..].iter().take_while(|e| e.0 == d).map(|e| e.1));
    }
    // Every entry was counted from some directory: when every directory is reached, a file is
    // reached exactly when an entry names it. Otherwise mark the files reached directories name.
    let all_dirs_reached = dirs.iter().all(|n| seen[n.ino as usize]);
    if !all_dirs_reached {
        let walked: Vec<&InodeState> =
            dirs.iter().copied().filter(|n| seen[n.ino as usize]).collect();
        for n in walked {
            for loc in n.dir.iter().flat_map(|d| d.values()) {
                if kind_of(loc.ino).is_some_and(|k| k != FileKind::Dir) {
                    seen[loc.ino as usize] = true;
                }
            }
        }
    }
    let mut unreached = Vec::new();
    for (i, (&kind, &nlink)) in kinds.iter().zip(nlinks).enumerate() {
        let Some(kind) = kind else { continue };
        let ino = i as u64;
        let state = states[i];
        let rc = refs[i];
        // An orphan has no links and no entry names it; a named inode with no links is damage
        // (freeing it as an orphan would leave its entries dangling).
        let open = state.map_or(0, |n| n.open);
        let orphan = nlink == 0 && rc == 0 && (at_mount || open > 0);
        let reached = match kind == FileKind::Dir || !all_dirs_reached {
            true => seen[i],
            false => rc > 0,
        };
        if kind == FileKind::Dir && !orphan {
            let want = 2 + subdirs[ino as usize];
            if nlink != want {
                p(format!(
                    "directory {ino}: link count {nlink} but {want} expected"
                ));
            }
            let want_refs = if ino == ROOT_INO { 0 } else { 1 };
            if rc != want_refs {
                p(format!("directory {ino}: listed {rc} times (expected {want_refs})"));
            }
        } else if nlink != rc && !orphan {
            p(format!("inode {ino}: link count {nlink} but {rc} directory entries"));
        }
        // Every symlink's state is at hand (the scan keeps them).
        if kind == FileKind::Symlink
            && let Some(size) = state.map(|n| n.hdr.size)
            && (size == 0 || size > 4095)
        {
            p(format!("symlink {ino}: target length {size}"));
        }
        if !reached && !orphan {
            unreached.push(format!("inode {ino} ({kind:?}) is not reachable from the root"));
        }
    }
    problems.extend(tree_lines);
    problems.extend(unreached);
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
            Ok(w) if crate::media::crc::crc32c(&buf) == u32::from_le_bytes(w) => {}
            Ok(_) => problems.push(format!("symlink {}: its target fails its checksum", n.ino)),
            Err(e) => problems.push(format!("symlink {}: {e}", n.ino)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Fs;
    use crate::state::inode_state::rlock;
    use crate::types::{MkfsOptions, MountOptions};

    /// A pool holding /a/b/f, /a/g and /h; the numbers of a, b, f, g, h.
    fn tree() -> (tempfile::TempDir, Fs, [u64; 5]) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        let small = MkfsOptions {
            size: Some(48 << 20),
            partitions: Some(1),
            ..Default::default()
        };
        Fs::mkfs(&p, &small).unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        let a = fs.mkdir(fs.root(), b"a", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
        let f = fs.create(b, b"f", 0o644, 0, 0).unwrap().ino;
        let g = fs.create(a, b"g", 0o644, 0, 0).unwrap().ino;
        let h = fs.create(fs.root(), b"h", 0o644, 0, 0).unwrap().ino;
        (d, fs, [a, b, f, g, h])
    }

    /// The namespace check's lines for the tree's inodes, after `edit` changes the tables
    /// (type, link count by number) and the list of states at hand.
    fn problems(
        fs: &Fs,
        at_mount: bool,
        edit: impl FnOnce(&mut Vec<Option<FileKind>>, &mut Vec<u32>, &mut Vec<&InodeState>),
    ) -> Vec<String> {
        let all = fs.state.all_inodes().unwrap();
        let guards: Vec<_> = all.iter().map(rlock).collect();
        let mut states: Vec<&InodeState> = guards.iter().map(|g| &**g).collect();
        let (mut kinds, mut nlinks) = tables_of(states.iter().copied());
        // Room for a number no inode uses.
        kinds.resize(kinds.len() + 8, None);
        nlinks.resize(kinds.len(), 0);
        edit(&mut kinds, &mut nlinks, &mut states);
        let inodes = NsInodes {
            kinds: &kinds,
            nlinks: &nlinks,
            states,
        };
        let mut out = Vec::new();
        namespace(&fs.state.pool, &inodes, at_mount, &mut out);
        out
    }

    #[test]
    fn a_sound_tree_has_no_problems() {
        let (_d, fs, _) = tree();
        assert_eq!(problems(&fs, false, |_, _, _| {}), Vec::<String>::new());
    }

    #[test]
    fn an_inode_no_entry_names_is_reported_unless_it_is_an_orphan_at_mount() {
        let (_d, fs, _) = tree();
        let stray = |nlink| {
            move |k: &mut Vec<Option<FileKind>>, n: &mut Vec<u32>, _: &mut Vec<&InodeState>| {
                let at = k.len() - 1;
                k[at] = Some(FileKind::File);
                n[at] = nlink;
            }
        };
        let lines = problems(&fs, true, stray(1));
        let ino = lines.first().and_then(|l| l.split(':').next()).unwrap_or("").to_string();
        assert_eq!(
            lines,
            vec![
                format!("{ino}: link count 1 but 0 directory entries"),
                format!("{ino} (File) is not reachable from the root"),
            ]
        );
        // No links and no entry: an orphan, freed by the mount; a live mount reports it unless
        // it is open.
        assert_eq!(problems(&fs, true, stray(0)), Vec::<String>::new());
        assert_eq!(problems(&fs, false, stray(0)).len(), 1);
    }

    #[test]
    fn what_only_an_unreachable_directory_names_is_unreachable() {
        let (_d, fs, [a, b, f, g, h]) = tree();
        // Directory a gone from the tables: b, and the files under it, hang from nothing.
        let lines = problems(&fs, false, |k, _, s| {
            k[a as usize] = None;
            s.retain(|n| n.ino != a);
        });
        let unreachable = |ino: u64, kind: &str| {
            format!("inode {ino} ({kind}) is not reachable from the root")
        };
        assert!(lines.contains(&format!("directory 1: entry \"a\" points at free inode {a}")));
        assert!(lines.contains(&format!("directory {b}: listed 0 times (expected 1)")));
        for (ino, kind) in [(b, "Dir"), (f, "File"), (g, "File")] {
            assert!(lines.contains(&unreachable(ino, kind)), "{ino} in {lines:#?}");
        }
        // Files a reachable directory names stay reachable.
        assert!(!lines.contains(&unreachable(h, "File")), "{lines:#?}");
        assert!(lines.contains(&format!("inode {g}: link count 1 but 0 directory entries")));
    }
}
