//! The mount's scan of the inode tables: every in-use inode is loaded and checked (its
//! checksum, header ranges, extent map, directory blocks), by one thread per CPU over
//! chunks of the tables and then over the directories. What the scan keeps of each inode is its
//! type and link count, and its whole state only where the mount needs it ([`LoadedInodes`]).
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result};
use crate::media::checksum;
use crate::media::layout::{
    BLOCK_BYTES, BLOCK_SIZE, FileKind, Geometry, INODE_BYTES, INODE_SIZE, InodeHeader,
};
use crate::media::pool::Pool;
use crate::state::claims::{self, Claim};
use crate::state::inode_bits::InodeBits;
use crate::state::inode_load::{LoadedInode, load_inode};
use crate::state::inode_state::InodeState;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the inode tables hold, as found at mount.
///
/// Every in-use inode's type and link count, in tables by inode number: the namespace check
/// reads those for every inode, and a table of a few bytes per inode costs far less to build
/// and walk than a record per inode. Whole states are kept only where the mount needs them:
/// directories (the namespace is checked and walked from them), symlinks (their target length
/// is checked), inodes without links (orphans, freed by the mount), and every inode when fsck
/// or repair mounts. Any other file's state is checked, then dropped: a serving mount builds it
/// again on first use, and a million states kept to the end of the scan were most of a mount's
/// time (their memory faulted in, copied and freed).
#[derive(Default)]
pub(crate) struct LoadedInodes<K = Vec<Vec<InodeState>>, C = Vec<Vec<Claim>>> {
    /// By inode number (0 unused): each in-use inode's type; None for a free number and for an
    /// inode not loaded (damaged).
    pub kinds: Vec<Option<FileKind>>,
    /// By inode number: each in-use inode's link count.
    pub nlinks: Vec<u32>,
    /// The states kept, in inode order, a list per chunk of the tables (joining them would move
    /// every state once more).
    pub kept: K,
    /// The block claims of the inodes whose state was dropped; the kept states' claims are
    /// read from them.
    pub claims: C,
    /// Free inode numbers per partition (of the whole scan; derived once it is joined).
    pub free: Vec<InodeBits>,
    /// Pool offsets of dead extent slots, to zero.
    pub dead_slots: Vec<u64>,
    /// In-use inodes that fail their checksum (not loaded, not free).
    pub damaged: Vec<u64>,
    /// Why each damaged inode that passes its checksum was not loaded (fsck and repair only:
    /// its header ranges, extent map or directory blocks fail validation).
    pub unloadable: BTreeMap<u64, String>,
    /// Extent-index blocks and directory block headers that fail their checksum although
    /// everything built from them passed validation: one line each, in the words of fsck.
    pub bad_checksums: Vec<String>,
    /// Directory blocks loaded with a rebuilt header (directory, block index).
    pub rebuilt_dir_headers: Vec<(u64, u32)>,
}

impl LoadedInodes {
    /// Every state kept, in inode order.
    pub fn kept(&self) -> impl Iterator<Item = &InodeState> + Clone {
        self.kept.iter().flatten()
    }

    /// Every block claim of every inode found, sorted by first block (then inode).
    pub fn claims(&self) -> Vec<Claim> {
        let mut v: Vec<Claim> = self.claims.iter().flatten().copied().collect();
        v.extend(claims::claims_of(self.kept()));
        v.sort_by_key(|c| (c.run.start, c.ino));
        v
    }

    /// The kind of in-use inode `ino`, if the scan loaded it.
    pub fn kind_of(&self, ino: u64) -> Option<FileKind> {
        self.kinds
            .get(usize::try_from(ino).ok()?)
            .copied()
            .flatten()
    }
}

/// Whether the scan keeps the state of an inode of kind `kind` with `nlink` links.
fn keeps(kind: Option<FileKind>, nlink: u32, load_damaged: bool) -> bool {
    load_damaged || nlink == 0 || matches!(kind, Some(FileKind::Dir | FileKind::Symlink))
}

/// Load every in-use inode, validating what the DRAM indexes are built from. An inode that
/// fails its checksum is listed as damaged; with `load_damaged` (fsck and repair) it is also
/// loaded when it passes every other check, so its blocks stay claimed and repair can judge it;
/// and every state is kept (`LoadedInodes::kept`).
///
/// Two parallel passes, each over one thread per CPU (up to `MAX_SCAN_THREADS`) that take work
/// from a shared counter until none is left:
/// 1. the inode tables, in chunks of `CHUNK_BLOCKS` table blocks; a directory whose inode
///    passes its checksum is set aside;
/// 2. those directories, one at a time (their blocks are most of a mount's work, and the
///    directories often sit together in one chunk, so loading them in the first pass left one
///    thread with most of it).
///
/// The findings are joined in inode order. The error returned is the first in inode order of
/// the first pass, else the first of the second: the same for every thread count.
pub(crate) fn load_inodes(pool: &Pool, g: &Geometry, load_damaged: bool) -> Result<LoadedInodes> {
    let per_block = BLOCK_SIZE / INODE_SIZE;
    let chunk_inodes = CHUNK_BLOCKS * per_block;
    let chunks = g.total_inodes().div_ceil(chunk_inodes);
    // The first chunk that failed: chunks after it are skipped, every chunk before it is
    // scanned, so the first error in chunk order is found.
    let failed = AtomicU64::new(u64::MAX);
    let mut parts = in_parallel(chunks, |c| {
        if c > failed.load(Ordering::Relaxed) {
            return None;
        }
        let first = 1 + c * chunk_inodes;
        let last = ((c + 1) * chunk_inodes).min(g.total_inodes());
        let found = load_inode_range(pool, g, load_damaged, first, last);
        if found.is_err() {
            failed.fetch_min(c, Ordering::Relaxed);
        }
        Some(found)
    })?
    .into_iter()
    .collect::<Result<Vec<RangeFound>>>()?;
    let pending: Vec<(usize, &PendingDir)> = parts
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.dirs.iter().map(move |d| (i, d)))
        .collect();
    let loaded_dirs = in_parallel(pending.len() as u64, |k| {
        let d = pending[usize::try_from(k).unwrap_or(usize::MAX)].1;
        Some(load_inode(
            pool,
            g,
            d.ino,
            &d.raw,
            InodeHeader::decode(&d.raw),
        ))
    })?;
    let dirs: Vec<(usize, u64)> = pending.iter().map(|(i, d)| (*i, d.ino)).collect();
    for ((i, ino), result) in dirs.into_iter().zip(loaded_dirs) {
        parts[i].record(g, ino, result, load_damaged)?;
    }
    let total = usize::try_from(g.total_inodes()).unwrap_or(usize::MAX);
    let mut all = LoadedInodes {
        kinds: Vec::with_capacity(total + 1),
        nlinks: Vec::with_capacity(total + 1),
        kept: Vec::with_capacity(parts.len()),
        claims: Vec::with_capacity(parts.len()),
        ..Default::default()
    };
    // Inode 0 does not exist.
    all.kinds.push(None);
    all.nlinks.push(0);
    for p in parts {
        let mut f = p.found;
        all.kinds.extend_from_slice(&f.kinds);
        all.nlinks.extend_from_slice(&f.nlinks);
        if !f.kept.is_empty() {
            // The chunk's directories were recorded after its other inodes.
            if !p.dirs.is_empty() {
                f.kept.sort_by_key(|n| n.ino);
            }
            all.kept.push(f.kept);
        }
        all.claims.push(f.claims);
        all.dead_slots.append(&mut f.dead_slots);
        all.damaged.append(&mut f.damaged);
        all.unloadable.append(&mut f.unloadable);
        all.bad_checksums.append(&mut f.bad_checksums);
        all.rebuilt_dir_headers.append(&mut f.rebuilt_dir_headers);
    }
    // Damaged directories (fsck) were listed after the chunk's other damaged inodes.
    all.damaged.sort_unstable();
    all.free = free_sets(g, &all.kinds, &all.damaged);
    Ok(all)
}

/// Run `job(0..n)` on one thread per CPU (up to `MAX_SCAN_THREADS`), each taking the next
/// index until none is left; the results in index order, up to the first job that returned
/// `None` (a job may skip the rest that way). A thread that panics (a bug) makes the whole run
/// an error.
fn in_parallel<T: Send>(n: u64, job: impl Fn(u64) -> Option<T> + Sync) -> Result<Vec<T>> {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get()) as u64;
    let threads = cpus.min(MAX_SCAN_THREADS).min(n);
    let next = AtomicU64::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= n {
                break done;
            }
            if let Some(x) = job(k) {
                done.push((k, x));
            }
        }
    };
    let mut done: Vec<(u64, T)> = if threads <= 1 {
        work()
    } else {
        std::thread::scope(|sc| {
            let jobs: Vec<_> = (0..threads).map(|_| sc.spawn(work)).collect();
            let mut all = Vec::new();
            for j in jobs {
                all.extend(j.join().map_err(|_| {
                    Error::Invalid("a thread scanning the inode tables panicked".into())
                })?);
            }
            Ok::<_, Error>(all)
        })?
    };
    done.sort_unstable_by_key(|x| x.0);
    let mut out: Vec<T> = Vec::with_capacity(done.len());
    for (k, x) in done {
        if k != out.len() as u64 {
            break;
        }
        out.push(x);
    }
    Ok(out)
}

/// The free inode numbers of each partition's range of the inode table: every number the scan
/// neither loaded (`kinds`) nor found damaged (`damaged`, sorted). Each in-use inode is one or
/// the other, or the scan failed.
fn free_sets(g: &Geometry, kinds: &[Option<FileKind>], damaged: &[u64]) -> Vec<InodeBits> {
    let per = u64::from(g.inodes_per_partition);
    let free = |ino: u64| {
        usize::try_from(ino).is_ok_and(|i| kinds.get(i).is_some_and(Option::is_none))
            && damaged.binary_search(&ino).is_err()
    };
    (0..u64::from(g.partitions))
        .map(|p| InodeBits::from_fn(1 + p * per, per, free))
        .collect()
}

/// One chunk's findings (its inode numbers start at `first`), and the directories set aside
/// for the second pass.
#[derive(Default)]
struct RangeFound {
    first: u64,
    found: LoadedInodes<Vec<InodeState>, Vec<Claim>>,
    dirs: Vec<PendingDir>,
}

/// A directory whose inode passed its checksum, set aside by the first pass of the scan.
struct PendingDir {
    ino: u64,
    raw: [u8; INODE_BYTES],
}

impl RangeFound {
    /// Keep what loading inode `cur` of this chunk gave (`load_inode`'s result).
    fn record(
        &mut self,
        g: &Geometry,
        cur: u64,
        loaded: Result<(InodeState, LoadedInode)>,
        load_damaged: bool,
    ) -> Result<()> {
        let found = &mut self.found;
        let (n, l) = match loaded {
            Ok(x) => x,
            // A serving mount refuses the pool with this line; fsck reports it and repair
            // frees the inode (nothing it claims can be trusted).
            Err(e @ Error::Corrupted(_)) if load_damaged => {
                found.damaged.push(cur);
                found.unloadable.insert(cur, e.to_string());
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let ioff = g.inode_offset(cur)?;
        found
            .dead_slots
            .extend(l.dead.iter().map(|&s| n.map.slot_offset(ioff, s)));
        found.bad_checksums.extend(l.bad_checksums);
        found.rebuilt_dir_headers.extend(l.rebuilt_dir_headers);
        let at = usize::try_from(cur - self.first).unwrap_or(usize::MAX);
        found.kinds[at] = Some(n.kind());
        found.nlinks[at] = n.hdr.nlink;
        if keeps(Some(n.kind()), n.hdr.nlink, load_damaged) {
            found.kept.push(n);
        } else {
            claims::push_claims(&n, &mut found.claims);
        }
        Ok(())
    }
}

/// Most threads one mount scans its inode tables with.
const MAX_SCAN_THREADS: u64 = 16;

/// Inode-table blocks a scan thread takes at a time (4,096 inodes): enough to make taking one
/// cheap, few enough to share a table of a million inodes out evenly.
const CHUNK_BLOCKS: u64 = 256;

/// [`load_inodes`]' first pass for inodes `first..=last` (`first` starts a table block): one
/// chunk.
fn load_inode_range(
    pool: &Pool,
    g: &Geometry,
    load_damaged: bool,
    first: u64,
    last: u64,
) -> Result<RangeFound> {
    let n = usize::try_from(last + 1 - first).unwrap_or(0);
    let mut range = RangeFound {
        first,
        ..Default::default()
    };
    range.found.kinds = vec![None; n];
    range.found.nlinks = vec![0; n];
    let mut blk = vec![0u8; BLOCK_BYTES];
    let per_block = BLOCK_SIZE / INODE_SIZE;
    let mut ino = first;
    while ino <= last {
        pool.read(g.inode_offset(ino)?, &mut blk)?;
        for (cur, raw) in (ino..=last).zip(blk.chunks_exact(INODE_BYTES)) {
            let hdr = InodeHeader::decode(raw);
            if !hdr.in_use() {
                continue;
            }
            let loaded = if checksum::inode_checksum_ok(raw) {
                if hdr.kind() == Some(FileKind::Dir) {
                    let mut copy = [0u8; INODE_BYTES];
                    copy.copy_from_slice(raw);
                    range.dirs.push(PendingDir {
                        ino: cur,
                        raw: copy,
                    });
                    continue;
                }
                load_inode(pool, g, cur, raw, hdr)
            } else {
                // Nothing a serving mount builds comes from an inode that may be wrong: mount
                // refuses the pool. fsck reports it; repair reseals or frees it.
                range.found.damaged.push(cur);
                match load_damaged.then(|| load_inode(pool, g, cur, raw, hdr)) {
                    Some(Ok(x)) => Ok(x),
                    _ => continue,
                }
            };
            range.record(g, cur, loaded, load_damaged)?;
        }
        ino += per_block;
    }
    Ok(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Fs;
    use crate::types::{MkfsOptions, MountOptions};

    #[test]
    fn jobs_run_in_parallel_come_back_in_order_up_to_the_first_skipped() {
        let all = in_parallel(1000, Some).unwrap();
        assert_eq!(all, (0..1000).collect::<Vec<u64>>());
        let some = in_parallel(1000, |k| (k <= 5 || k > 700).then_some(k)).unwrap();
        assert_eq!(some, (0..=5).collect::<Vec<u64>>());
        assert!(in_parallel(0, Some).unwrap().is_empty());
    }

    #[test]
    fn the_scan_finds_every_inode_and_keeps_the_states_the_mount_needs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        let small = MkfsOptions {
            size: Some(64 << 20),
            partitions: Some(1),
            inodes: Some(3 * 4096),
            ..Default::default()
        };
        Fs::mkfs(&p, &small).unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        // Files, directories and symlinks interleaved over more than one chunk of the tables
        // (the directories are loaded in the second pass, then put back in inode order).
        let mut made = Vec::new();
        let mut parent = fs.root();
        for i in 0..6000u32 {
            let name = format!("n{i}");
            let (ino, kind) = match i % 7 {
                0 => (fs.mkdir(parent, name.as_bytes(), 0o755, 0, 0).unwrap().ino, FileKind::Dir),
                1 => (
                    fs.symlink(parent, name.as_bytes(), b"target", 0, 0).unwrap().ino,
                    FileKind::Symlink,
                ),
                _ => (fs.create(parent, name.as_bytes(), 0o644, 0, 0).unwrap().ino, FileKind::File),
            };
            if kind == FileKind::File && i % 5 == 0 {
                fs.write(ino, 0, &[7; 5000]).unwrap();
            }
            if kind == FileKind::Dir && i % 3 == 0 {
                parent = ino;
            }
            made.push((ino, kind));
        }
        let g = fs.geometry();
        let found = load_inodes(&fs.state.pool, &g, false).unwrap();
        for &(ino, kind) in &made {
            assert_eq!(found.kind_of(ino), Some(kind), "inode {ino}");
            let nlink = if kind == FileKind::Dir { 2 } else { 1 };
            assert!(found.nlinks[usize::try_from(ino).unwrap()] >= nlink, "inode {ino}");
        }
        let in_use = found.kinds.iter().filter(|k| k.is_some()).count();
        assert_eq!(in_use, made.len() + 1, "every inode and the root");
        // Every other number is free, in its partition's set.
        let free: usize = found.free.iter().map(|f| f.len()).sum();
        assert_eq!(free as u64, g.total_inodes() - in_use as u64);
        assert!(found.free.iter().all(|f| made.iter().all(|&(ino, _)| !f.contains(ino))));
        // Kept: the directories and symlinks alone, in inode order.
        let kept: Vec<u64> = found.kept().map(|n| n.ino).collect();
        let mut want: Vec<u64> = made
            .iter()
            .filter(|(_, k)| *k != FileKind::File)
            .map(|(i, _)| *i)
            .chain([crate::media::layout::ROOT_INO])
            .collect();
        want.sort_unstable();
        assert_eq!(kept, want);
        // The dropped files' blocks are still claimed.
        let claimed: std::collections::HashSet<u64> = found.claims().iter().map(|c| c.ino).collect();
        for &(ino, kind) in &made {
            if kind == FileKind::File && fs.getattr(ino).unwrap().size > 0 {
                assert!(claimed.contains(&ino), "inode {ino}'s data is claimed");
            }
        }
        // fsck's scan keeps every state.
        let all = load_inodes(&fs.state.pool, &g, true).unwrap();
        assert_eq!(all.kept().count(), made.len() + 1);
    }
}
