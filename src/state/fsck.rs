//! Consistency checking: every invariant of a mounted file system, and of its media against its
//! DRAM indexes. `fsck POOL` mounts the pool privately (recovery runs in this process only,
//! nothing is written) and runs the same checks.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::alloc::BlockRun;
use crate::media::checksum;
use crate::media::layout::{BLOCK_BYTES, BLOCK_SIZE, BLOCKS_PER_HUGE, INODE_BYTES, InodeHeader};
use crate::meta::dir::DirIndex;
use crate::meta::inode::FileMap;
use crate::state::claims;
use crate::state::inode_state::{InodeState, rlock};
use crate::state::locks::lock;
use crate::state::inode_load;
use crate::state::mount;
use crate::state::mount_state::MountState;
use crate::state::validate;
use crate::types::MountOptions;
use std::collections::HashMap;
use std::path::Path;

/// What fsck found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Each problem, precisely. Empty means clean.
    pub problems: Vec<String>,
    /// Inodes in use.
    pub inodes: u64,
    /// Directories among them.
    pub directories: u64,
    /// Blocks owned by inodes.
    pub used_blocks: u64,
    /// Blocks the allocator holds free.
    pub free_blocks: u64,
}

impl Report {
    /// No problem found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Check a pool offline. The pool is mapped copy-on-write, so recovery happens in memory only.
pub fn check_pool(path: &Path) -> Result<Report> {
    let opts = MountOptions {
        private: true,
        ..Default::default()
    };
    let pool = crate::media::pool::Pool::open(path, true)?;
    let state = mount::mount_checked(pool, &opts, mount::Inconsistent::Report)?;
    let mut r = check(&state);
    // A live mount has rebuilt free space already and rewrites the snapshot when it unmounts;
    // offline, a stale one is a problem to report (repair rewrites it).
    if let Some(why) = &state.stale_snapshot {
        r.problems.push(format!("{why}; free space is rebuilt from the inode tables at every mount, and repair rewrites it"));
    }
    if let code @ 1.. = state.needs_fsck() {
        let why = crate::state::damage::describe(code);
        r.problems.push(format!(
            "the pool is flagged \"needs fsck\": {why} at run time"
        ));
    }
    Ok(r)
}

/// The owner name of free blocks in fsck's sweep of the data area.
const FREE: &str = "the free lists";

/// Check every invariant of a mounted file system, holding the namespace lock exclusively.
pub(crate) fn check(state: &MountState) -> Report {
    let mut r = Report::default();
    let _ns = state.namespace.write();
    // An inode the mount left on media that fails to load now is damage since the mount: it
    // is listed, and the rest are checked.
    let arcs = state.all_inodes().unwrap_or_else(|e| {
        r.problems.push(e.to_string());
        state.loaded_inodes()
    });
    let guards: Vec<_> = arcs.iter().map(rlock).collect();
    let nodes: HashMap<u64, &InodeState> = guards.iter().map(|g| (g.ino, &**g)).collect();
    let g = &state.geo;
    r.inodes = nodes.len() as u64;
    let mut p = |s: String| r.problems.push(s);

    // 1. Media agrees with DRAM: headers, extent maps, directory contents.
    for n in nodes.values() {
        let off = match g.inode_offset(n.ino) {
            Ok(o) => o,
            Err(e) => {
                p(format!("inode {}: {e}", n.ino));
                continue;
            }
        };
        let mut raw = vec![0u8; INODE_BYTES];
        if let Err(e) = state.pool.read(off, &mut raw) {
            p(format!("inode {}: {e}", n.ino));
            continue;
        }
        let media = InodeHeader::decode(&raw);
        if media != n.hdr {
            p(format!(
                "inode {}: header on media {media:?} differs from memory {:?}",
                n.ino, n.hdr
            ));
            continue;
        }
        match FileMap::load(
            &state.pool,
            g,
            n.ino,
            &raw,
            media.index_block,
            media.map_end,
        ) {
            Ok(loaded) => {
                let (m, dead) = (loaded.map, loaded.dead);
                for b in loaded.bad_checksum {
                    p(format!(
                        "{}; repair reseals it if its records pass every check, else frees the file",
                        inode_load::bad_index_block(n.ino, b)
                    ));
                }
                if m.extents != n.map.extents {
                    p(format!(
                        "inode {}: extent map on media differs from memory",
                        n.ino
                    ));
                }
                if !dead.is_empty() {
                    p(format!(
                        "inode {}: {} dead extent slots were not cleared",
                        n.ino,
                        dead.len()
                    ));
                }
            }
            Err(e) => p(format!("inode {}: {e}", n.ino)),
        }
        if let Ok((d, media)) = n.dir_with_media(&state.pool) {
            let mut fresh = DirIndex::default();
            let mut b = vec![0u8; BLOCK_BYTES];
            for k in 0..n.hdr.size / BLOCK_SIZE {
                match n.map.lookup(k) {
                    Some((phys, _)) => {
                        match state.pool.read(phys * BLOCK_SIZE, &mut b).and_then(|_| {
                            let block = u32::try_from(k).map_err(|_| {
                                corrupt!("directory {}: block {k} beyond 2^32 blocks", n.ino)
                            })?;
                            fresh.load_block(&media, block, &b).map(|ok| (ok, block))
                        }) {
                            Ok((true, _)) => {}
                            Ok((false, block)) => p(inode_load::bad_dir_header(n.ino, block)),
                            Err(e) => p(format!("directory {}: {e}", n.ino)),
                        }
                    }
                    None => p(format!("directory {}: block {k} not mapped", n.ino)),
                }
            }
            // Memory against media: the same entries at the same places, pointing at the same
            // inodes (the index keeps no names; the media blocks were just parsed).
            let at = |x: &DirIndex| {
                let mut v: Vec<_> = x.values().map(|l| (l.block, l.slot, l.ino, l.kind)).collect();
                v.sort_unstable_by_key(|e| (e.0, e.1));
                v
            };
            if at(&fresh) != at(d) || fresh.starts != d.starts {
                p(format!(
                    "directory {}: entries on media differ from memory",
                    n.ino
                ));
            }
        }
    }

    // 2. Every data block is owned exactly once or free exactly once.
    let claimed = claims::claims_of(nodes.values().copied());
    let owned: Vec<(BlockRun, u64)> = claims::owned(&claimed);
    let free = state.alloc.free_runs();
    r.free_blocks = free.iter().map(|x| x.len).sum();
    r.used_blocks = owned.iter().map(|x| x.0.len).sum();
    let mut all: Vec<(u64, u64, String)> = owned
        .iter()
        .map(|(x, i)| (x.start, x.len, format!("inode {i}")))
        .collect();
    all.extend(
        free.iter()
            .map(|x| (x.start, x.len, FREE.to_string())),
    );
    // Units the slot zones grew into: free space lent to them, each named by its table word.
    for u in state.zones.space.units() {
        let who = format!("slot zone {} unit {}", u.part, u.k);
        match state.zones.space.word_on_media(&state.pool, &u) {
            Ok(true) => {}
            Ok(false) => p(format!("{who} at block {}: its table word on media does not name it", u.start)),
            Err(e) => p(format!("{who}: {e}")),
        }
        all.push((u.start, BLOCKS_PER_HUGE, who));
    }
    all.sort_by_key(|x| x.0);
    let mut cur = g.data_start;
    let mut last_owner = String::from("the start of the data area");
    for (s, l, who) in &all {
        if *s < g.data_start || s + l > g.data_start + g.data_blocks {
            p(format!(
                "blocks {s}..{} of {who} are outside the data area",
                s + l
            ));
        }
        // Blocks two inodes claim are listed below, with what each holds there.
        let lent = |w: &str| w == FREE || w.starts_with("slot zone");
        if *s < cur && (lent(who) || lent(&last_owner)) {
            p(format!(
                "block {s} is claimed by both {last_owner} and {who}"
            ));
        } else if *s > cur {
            p(format!(
                "blocks {cur}..{s} are leaked: neither free nor owned"
            ));
        }
        if s + l > cur {
            cur = s + l;
            last_owner = who.clone();
        }
    }
    if cur < g.data_start + g.data_blocks {
        p(format!(
            "blocks {cur}..{} are leaked: neither free nor owned",
            g.data_start + g.data_blocks
        ));
    }
    for sh in claims::shared(&claimed) {
        p(sh.to_string());
    }
    if let Err(e) = state.alloc.check_consistency() {
        p(format!("allocator: {e}"));
    }

    // As the inode is on media now: repair reseals or frees them in this same mount.
    for &ino in &state.damaged_inodes {
        let mut raw = [0u8; INODE_BYTES];
        let read = state.pool.read(state.inode_off(ino), &mut raw).is_ok();
        let in_use = InodeHeader::decode(&raw).in_use();
        if let Some(why) = state.unloadable_inodes.get(&ino) {
            // Unless repair freed it (and perhaps gave its number to a new inode, now loaded).
            if !read || (in_use && state.inode(ino).is_err()) {
                r.problems.push(why.clone());
            }
        } else if !read || (in_use && !checksum::inode_checksum_ok(&raw)) {
            r.problems.push(format!("inode {ino} fails its checksum"));
        }
    }
    // 3. Link counts, entry types and the directory tree; xattr blocks and symlink targets.
    let (kinds, nlinks) = validate::tables_of(nodes.values().copied());
    let inodes = validate::NsInodes {
        kinds: &kinds,
        nlinks: &nlinks,
        states: nodes.values().copied().collect(),
    };
    validate::namespace(&state.pool, &inodes, false, &mut r.problems);
    validate::xattr_blocks(&state.pool, g, nodes.values().copied(), &mut r.problems);
    validate::symlink_targets(state, nodes.values().copied(), &mut r.problems);
    r.directories = nodes.values().filter(|n| n.is_dir()).count() as u64;

    // 4. Inode free lists agree with the table.
    let mut p = |s: String| r.problems.push(s);
    let mut free_inodes = 0u64;
    for (part, f) in state.inode_free.iter().enumerate() {
        let f = lock(f);
        free_inodes += f.len() as u64;
        for i in f.iter() {
            if nodes.contains_key(&i) {
                p(format!(
                    "inode {i} is in use but also on partition {part}'s free list"
                ));
            }
        }
    }
    if free_inodes + nodes.len() as u64 != g.total_inodes() {
        p(format!(
            "{} inodes in use + {free_inodes} free != {} total",
            nodes.len(),
            g.total_inodes()
        ));
    }
    r
}
