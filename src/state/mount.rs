//! Mount (superblock validation, journal recovery, DRAM index rebuild, orphan cleanup) and
//! clean unmount (allocator state saved, superblock marked clean).
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::alloc::{Allocator, BlockRun};
use crate::media::journal::{Journals, epoch_of};
use crate::media::recovery;
use crate::media::wear::{self, WearCounters};
use crate::media::zone;
use crate::media::layout::{
    self, BLOCK_SIZE, BLOCKS_PER_HUGE, FileKind, Geometry,
    ROOT_INO, SbState, Superblock, sb,
};
use crate::media::pool::{Category, Pool};
use crate::state::alloc_snapshot;
use crate::state::background::Background;
use crate::state::claims::{self, ClaimKind};
use crate::state::damage;
use crate::state::slots;
use crate::state::zones::Zones;
use crate::state::locks::lock;
use crate::state::inode_bits::InodeBits;
use crate::state::inode_state::{InoMap, InodeCell, InodeState, rlock, wlock};
use crate::state::inode_table::InodeTable;
use crate::state::scan::load_inodes;
use crate::state::validate;
use crate::state::mkfs::write_state;
use crate::state::mount_state::MountState;
use crate::types::MountOptions;
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Read and validate the superblock of the pool at `path` without mounting it (nothing is
/// written).
pub fn read_superblock(path: &Path) -> Result<(Superblock, SbState)> {
    let pool = Pool::open(path, true)?;
    decode_superblock(&pool)
}

/// The wear counters of the pool at `path` (one per pool block) as its last clean unmount saved
/// them, with its geometry (`winefs wear`; nothing is written).
pub fn read_wear(path: &Path) -> Result<(Geometry, Vec<u32>)> {
    let pool = Pool::open(path, true)?;
    let (sbk, _) = decode_superblock(&pool)?;
    let g = sbk.geometry;
    let raw = wear_region(&pool, &g)?;
    Ok((g, wear::decode(&raw)))
}

fn wear_region(pool: &Pool, g: &Geometry) -> Result<Vec<u8>> {
    if g.wear_blocks == 0 {
        return Err(Error::Invalid(
            "the pool keeps no wear counters (it was made without --wear-stats)".into(),
        ));
    }
    let len = usize::try_from(wear::region_len(g))
        .map_err(|_| corrupt!("the wear region does not fit in memory"))?;
    let mut raw = vec![0u8; len];
    pool.read(g.wear_start * BLOCK_SIZE, &mut raw)?;
    Ok(raw)
}

/// Decode and validate the superblock and its state record at the start of `pool`.
fn decode_superblock(pool: &Pool) -> Result<(Superblock, SbState)> {
    let raw: [u8; sb::STATE + sb::STATE_SIZE] = pool
        .read_array(0)
        .map_err(|_| Error::Foreign("shorter than a superblock".into()))?;
    let sbk = Superblock::decode(&raw, pool.len())?;
    Ok((sbk, SbState::decode(&raw[sb::STATE..])))
}

/// Idle file states a mount keeps at most unless told otherwise (`MountOptions::cached_inodes`):
/// about 20 MiB of DRAM.
const DEFAULT_CACHED_INODES: usize = 65_536;

/// Damaged zone records `found` (each with the line that says why): a normal mount refuses the
/// pool, naming the first and counting the rest as `more`; fsck and repair clear them (the
/// note each gets says how).
fn refuse_or_clear<T>(
    found: &[(T, String)],
    inconsistent: Inconsistent,
    more: &str,
    how: &str,
    notes: &mut Vec<String>,
) -> Result<()> {
    let Some((_, first)) = found.first() else {
        return Ok(());
    };
    if inconsistent == Inconsistent::Refuse {
        return Err(corrupt!(
            "{first}{}; the pool was not changed; `winefs fsck --repair` clears it",
            match found.len() {
                1 => String::new(),
                n => format!(" (and {} more {more})", n - 1),
            }
        ));
    }
    for (_, why) in found {
        notes.push(format!("{why}; cleared {how}"));
    }
    Ok(())
}

/// Free runs of the data area given the owned runs (sorted by start; overlaps are allowed).
fn complement(g: &Geometry, owned: &[(BlockRun, u64)]) -> Vec<BlockRun> {
    let mut free = Vec::new();
    let mut cur = g.data_start;
    for (r, _) in owned {
        if r.start > cur {
            free.push(BlockRun {
                start: cur,
                len: r.start - cur,
            });
        }
        cur = cur.max(r.start + r.len);
    }
    let end = g.data_start + g.data_blocks;
    if cur < end {
        free.push(BlockRun {
            start: cur,
            len: end - cur,
        });
    }
    free
}

/// How mount treats a namespace that fails its checks (link counts, entry types, the tree).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inconsistent {
    /// Refuse the pool, leaving it unchanged (every mount that serves files).
    Refuse,
    /// Mount it anyway, privately, so fsck can list every problem.
    Report,
}

/// Mount the pool at `path`: validate the superblock, roll back unfinished transactions,
/// rebuild the DRAM indexes, free orphans.
pub(crate) fn mount(path: &Path, opts: &MountOptions) -> Result<Arc<MountState>> {
    mount_pool(Pool::open(path, opts.private || opts.read_only)?, opts)
}

/// Mount an already mapped pool (the crash explorer patches a private mapping of a crash image
/// before recovery runs on it).
pub(crate) fn mount_pool(pool: Pool, opts: &MountOptions) -> Result<Arc<MountState>> {
    mount_checked(pool, opts, Inconsistent::Refuse)
}

/// Mount, validating everything the mount will trust before its first write to the pool: the
/// superblock, every journal (entries and staged images), the inode tables and extent maps on
/// the image recovery will leave (on a private view of the pool), block ownership and the
/// namespace. A pool refused at any of these steps is byte-for-byte unchanged.
pub(crate) fn mount_checked(
    pool: Pool,
    opts: &MountOptions,
    inconsistent: Inconsistent,
) -> Result<Arc<MountState>> {
    let started = std::time::Instant::now();
    let (sbk, sb_state) = decode_superblock(&pool)?;
    if sb_state.needs_fsck != 0 && !opts.read_only && inconsistent == Inconsistent::Refuse {
        return Err(damage::refusal(pool.path(), sb_state.needs_fsck));
    }
    let g = sbk.geometry.clone();
    let epoch = (!sb_state.damaged).then(|| epoch_of(sb_state.mount_count));
    let plan = recovery::plan(&pool, &g, epoch)?;
    let mut notes = plan.report.notes.clone();
    if sb_state.needs_fsck != 0 && opts.read_only {
        let why = damage::describe(sb_state.needs_fsck);
        notes.push(format!("the pool needs fsck ({why} at run time); serving it read-only"));
    }
    if sb_state.damaged {
        notes.push(
            "the superblock's state record fails its checksum; the pool is treated as not cleanly unmounted".into(),
        );
    }
    // What the inode tables will say once recovery has run, read without writing the pool.
    let mut loaded = if plan.is_empty() || pool.is_private() {
        plan.apply(&pool)?; // nothing, or stores that stay in this process
        load_inodes(&pool, &g, inconsistent == Inconsistent::Report)?
    } else {
        let view = pool.private_view()?;
        plan.apply(&view)?;
        load_inodes(&view, &g, inconsistent == Inconsistent::Report)?
    };
    let scanned = started.elapsed();
    match loaded.kind_of(ROOT_INO) {
        Some(FileKind::Dir) => {}
        Some(_) => return Err(corrupt!("inode 1 (the root) is not a directory")),
        None => return Err(corrupt!("inode 1 (the root) is not in use")),
    }
    if inconsistent == Inconsistent::Refuse
        && let Some(first) = loaded.damaged.first()
    {
        return Err(corrupt!(
            "inode {first} fails its checksum{}; the pool was not changed; `winefs fsck --repair` frees damaged inodes",
            match loaded.damaged.len() {
                1 => String::new(),
                n => format!(" (and {} more inodes)", n - 1),
            }
        ));
    }
    if inconsistent == Inconsistent::Refuse
        && let Some(first) = loaded.bad_checksums.first()
    {
        let more = match loaded.bad_checksums.len() {
            1 => String::new(),
            n => format!(" (and {} more blocks)", n - 1),
        };
        return Err(corrupt!(
            "{first}{more}; the pool was not changed; `winefs fsck` lists every problem"
        ));
    }
    // After the checksum refusals: a damaged block's records may claim blocks others own, and
    // the checksum is the precise cause.
    // Every block owned by an inode, sorted, and every run two claims share (corruption: a
    // serving mount refuses it, fsck lists it, repair clones it).
    let claims = loaded.claims();
    let (owned, shared) = (claims::owned(&claims), claims::shared(&claims));
    if inconsistent == Inconsistent::Refuse
        && let Some(first) = shared.first()
    {
        return Err(corrupt!(
            "{first}{}; the pool was not changed; `winefs fsck --repair` gives each file its own copy",
            match shared.len() {
                1 => String::new(),
                n => format!(" (and {} more shared runs)", n - 1),
            }
        ));
    }
    if inconsistent == Inconsistent::Refuse {
        let mut problems = Vec::new();
        let inodes = validate::NsInodes {
            kinds: &loaded.kinds,
            nlinks: &loaded.nlinks,
            states: loaded.kept().collect(),
        };
        validate::namespace(&pool, &inodes, true, &mut problems);
        if let Some(first) = problems.first() {
            let more = match problems.len() {
                1 => String::new(),
                n => format!(" (and {} more problems)", n - 1),
            };
            return Err(corrupt!(
                "{first}{more}; the pool was not changed; `winefs fsck` lists every problem"
            ));
        }
    }
    let checked = started.elapsed();
    // Units the zones grew into (a crash left their table words): free space lent to the
    // zones, so no file may hold a block of one.
    let (units, mut stray) = zone::read_units(&pool, &g)?;
    let units: Vec<_> = units
        .into_iter()
        .filter(|u| {
            let end = u.start + BLOCKS_PER_HUGE;
            match owned.iter().find(|(r, _)| r.start < end && u.start < r.start + r.len) {
                Some((_, ino)) => {
                    stray.push((*u, format!(
                        "slot zone {} extension word {} names unit {}, which holds blocks of inode {ino}",
                        u.part, u.k, u.start
                    )));
                    false
                }
                None => true,
            }
        })
        .collect();
    refuse_or_clear(&stray, inconsistent, "extension words", "with its slots not written back", &mut notes)?;
    // Alternate slots a crash left live: each must name a block of a regular file's data.
    let (live, mut bad) = zone::scan(&pool, &g, &units)?;
    let file_data = claims.iter().filter(|c| {
        matches!(c.kind, ClaimKind::Data { .. }) && loaded.kind_of(c.ino) == Some(FileKind::File)
    });
    let homeless: Vec<_> = slots::homeless(&live, file_data.map(|c| c.run))
        .into_iter()
        .map(|(s, why)| (*s, why))
        .collect();
    let live: Vec<_> = live
        .into_iter()
        .filter(|s| !homeless.iter().any(|(h, _)| h == s))
        .collect();
    bad.extend(homeless);
    refuse_or_clear(&bad, inconsistent, "slots", "without writing it back", &mut notes)?;
    let free = complement(&g, &owned);
    let stale_snapshot = match sb_state.clean {
        true => alloc_snapshot::bitmap_disagreement(&pool, &g, sb_state.bitmap_crc, &free)?,
        false => None,
    };
    if let Some(why) = &stale_snapshot {
        notes.push(format!("{why}; free space was rebuilt from the inode tables"));
    }
    let alloc = Allocator::from_free_runs(&g.partition_ranges(), free)
        .map_err(|e| corrupt!("free space rebuilt from the inode tables: {e}"))?;
    alloc.set_wear_aware(opts.wear_aware);

    // Everything the mount trusts is validated: from here on the pool is written.
    pool.settle_backing()?;
    if !plan.is_empty() && !pool.is_private() {
        plan.apply(&pool)?;
    }
    // Slots go home before anything reads the files (a private or read-only mount does this in
    // its own view of the pool).
    let bad: Vec<_> = bad.into_iter().map(|(s, _)| s).collect();
    let stray: Vec<_> = stray.into_iter().map(|(u, _)| u).collect();
    slots::fold_at_mount(&pool, &g, &units, &stray, &live, &bad)?;
    if !live.is_empty() {
        notes.push(format!("wrote {} alternate slots back to their files", live.len()));
    }
    let mount_count = sb_state
        .mount_count
        .max(plan.epoch.map_or(0, u64::from))
        + 1;
    // The new epoch makes every entry in the rings stale at once; clearing them is tidiness.
    let record = SbState {
        mount_count,
        needs_fsck: sb_state.needs_fsck,
        ..SbState::default()
    };
    write_state(&pool, record)?;
    if plan.rings_dirty {
        recovery::clear_rings(&pool, &g)?;
    }
    for note in &notes {
        log::warn!("{}: {note}", pool.path().display());
    }
    if pool.syncs_to_disk() {
        log::info!(
            "{}: a file on a disk file system without DAX: every commit waits for the disk \
             (fdatasync); a DAX file system, device DAX or a tmpfs avoids that",
            pool.path().display()
        );
    }
    let mut report = plan.report;
    report.notes = notes;
    for &off in &loaded.dead_slots {
        pool.zero(off, layout::EXTENT_SIZE, Category::Metadata)?;
        pool.flush(off, layout::EXTENT_SIZE, Category::Metadata);
    }
    pool.fence();
    // Orphans: no links and named by no entry (a named inode without links is damage that
    // the namespace check refused, or that fsck reports; it is never freed here).
    // Only inodes without links can be orphans, and there are few: the entries are searched
    // for those alone.
    let unlinked: HashSet<u64> = loaded.kept().filter(|n| n.hdr.nlink == 0).map(|n| n.ino).collect();
    let named: HashSet<u64> = match unlinked.is_empty() {
        true => HashSet::new(),
        false => loaded
            .kept()
            .filter_map(|n| n.dir.as_ref())
            .flat_map(|d| d.values().map(|l| l.ino))
            .filter(|i| unlinked.contains(i))
            .collect(),
    };
    // Damaged ones and ones sharing blocks (fsck and repair only) are left for repair to judge:
    // freeing one here would give blocks another inode claims to the allocator.
    let suspect: HashSet<u64> = shared
        .iter()
        .flat_map(|s| [s.a.ino, s.b.ino])
        .chain(loaded.damaged.iter().copied())
        .collect();
    let mut orphans: Vec<u64> = unlinked
        .into_iter()
        .filter(|i| !named.contains(i) && !suspect.contains(i))
        .collect();
    orphans.sort_unstable();
    // A serving mount keeps in DRAM the directories (the namespace is walked from them) and the
    // orphans (freed below); every other inode's state is built when it is first used, from
    // the table slot this scan checked (`MountState::inode`). fsck and repair judge every
    // inode, so they keep all of them.
    let orphan_set: HashSet<u64> = orphans.iter().copied().collect();
    let keep = |n: &InodeState| {
        inconsistent == Inconsistent::Report || n.is_dir() || orphan_set.contains(&n.ino)
    };
    let mut in_dram =
        InoMap::with_capacity_and_hasher(loaded.kept().filter(|n| keep(n)).count(), Default::default());
    for n in std::mem::take(&mut loaded.kept).into_iter().flatten() {
        if keep(&n) {
            in_dram.insert(n.ino, InodeCell::new_ref(n));
        }
    }
    let mut on_media = InodeBits::new(1, g.total_inodes());
    for (ino, kind) in (0u64..).zip(&loaded.kinds) {
        if kind.is_some() {
            on_media.insert(ino);
        }
    }
    for ino in in_dram.keys() {
        on_media.remove(*ino);
    }
    let rewrite = !opts.no_background_rewrite && !opts.read_only;
    let background = Background::new(rewrite, rewrite && !pool.is_private());
    if g.wear_blocks > 0 {
        let counters = WearCounters::from_bytes(&wear_region(&pool, &g)?);
        pool.set_wear(Arc::new(counters));
    }
    let journals = Journals::new(&g, epoch_of(mount_count));
    journals.set_wear_aware(opts.wear_aware);
    let mut state = MountState {
        journals,
        alloc,
        inode_free: loaded.free.into_iter().map(Mutex::new).collect(),
        inode_cursor: match opts.wear_aware {
            true => (0..g.partitions).map(|_| Default::default()).collect(),
            false => Vec::new(),
        },
        loaded_files: std::sync::atomic::AtomicUsize::new(
            in_dram.values().filter(|n| !rlock(n).is_dir()).count(),
        ),
        inodes: InodeTable::new(in_dram),
        on_media: Mutex::new(on_media),
        loaded_order: Mutex::new(std::collections::VecDeque::new()),
        cached_inodes: match opts.cached_inodes {
            0 => DEFAULT_CACHED_INODES,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        namespace: crate::state::locks::ShardedRwLock::per_cpu(),
        consistency: opts.consistency,
        overwrite_path: opts.overwrite_path,
        poisoned: AtomicBool::new(false),
        unmounted: AtomicBool::new(false),
        prefaulted: std::sync::atomic::AtomicU64::new(0),
        prefault_stop: AtomicBool::new(false),
        broken_skip_append_fence: AtomicBool::new(false),
        prefault_thread: std::sync::Mutex::new(None),
        record: Mutex::new(record),
        read_only: AtomicBool::new(false),
        opened_read_only: opts.read_only,
        noatime: opts.noatime,
        fine_floor: std::sync::atomic::AtomicI64::new(0),
        recovery: report,
        damaged_inodes: loaded.damaged,
        unloadable_inodes: loaded.unloadable,
        rebuilt_dir_headers: loaded.rebuilt_dir_headers,
        stale_snapshot,
        faults: Mutex::new(None),
        background: Arc::new(background),
        leases: Default::default(),
        removed_held: Default::default(),
        accounting: Default::default(),
        zones: Zones::new(&g),
        pool,
        geo: g,
        sb: sbk,
    };
    // Inodes whose last link went away while open (or mid-removal) are freed now, the way the
    // last release of an unlinked file frees it.
    for ino in orphans {
        let n = state.inode(ino)?;
        state.free_inode(&mut wlock(&n))?;
    }
    // Set once mount's own changes (in memory, for a read-only mount) are done.
    *state.read_only.get_mut() = opts.read_only;
    log::debug!(
        "{}: mount scanned the inode tables in {:.3} s, checked the namespace by {:.3} s, built the mount state by {:.3} s",
        state.pool.path().display(),
        scanned.as_secs_f64(),
        checked.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(Arc::new(state))
}

/// Clean unmount: clear the journals, save the allocator state and mark the superblock clean
/// (not for a poisoned mount, nor one whose write to the disk failed: the next mount recovers).
/// Runs once; later calls do nothing.
pub(crate) fn unmount(state: &MountState) -> Result<()> {
    if state.unmounted.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    // The pool takes no stores after a failed sync; the disk holds what a crash there leaves.
    if let Some(e) = state.pool.disk_failure() {
        return Err(Error::io(
            format!(
                "not marking {} clean: a write of it to the disk failed; the next mount recovers",
                state.pool.path().display()
            ),
            e,
        ));
    }
    if state.poisoned.load(Ordering::SeqCst) {
        return Err(corrupt!(
            "not marking the pool clean: an internal failure poisoned this mount; the next mount recovers"
        ));
    }
    if state.pool.is_private() {
        return Ok(());
    }
    let g = &state.geo;
    // A clean pool has no live slot: every file's blocks hold its bytes.
    let nodes: Vec<_> = match state.zones.live() {
        0 => Vec::new(),
        _ => state.inodes.values(),
    };
    for n in &nodes {
        slots::fold_all(state, &mut wlock(n))?;
    }
    // The units the zones grew into go back to free space (their slots are all home now).
    slots::shrink(state, u64::MAX, true)?;
    // Wear counters, before the pool is marked clean (their own stores are not counted).
    if let Some(w) = state.pool.wear() {
        let raw = w.to_bytes();
        state.pool.write_flush_uncounted(g.wear_start * BLOCK_SIZE, &raw, Category::Metadata)?;
        state.pool.fence();
    }
    // Every transaction has committed: the rings only describe finished work. Cleared before
    // the pool is marked clean, so no old entry can ever be taken for an unfinished one.
    recovery::clear_rings(&state.pool, g)?;
    let bitmap_crc = alloc_snapshot::save(&state.pool, g, &state.alloc.free_runs())?;
    // Under the record's lock, so a "needs fsck" flag raised meanwhile is kept.
    let mut rec = lock(&state.record);
    rec.clean = true;
    rec.bitmap_crc = bitmap_crc;
    write_state(&state.pool, *rec)
}

/// How long switching to read-only waits for a background job that is running to finish.
const READ_ONLY_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

impl MountState {
    /// Switch a serving mount between read-only and read-write (`mount -o remount,ro|rw`).
    /// Read-only: every call that would change the pool is refused from now on (one that began
    /// before finishes, or is refused at its next commit, which `commit` checks), and so are
    /// the mount's own stores: access times, background
    /// rewrites and compaction (a running job is waited for), freeing files whose last link
    /// went while they were open (left for read-write or the next mount). Read-write again: those files are freed. A mount made
    /// read-only from the start maps the pool privately and is never made read-write.
    pub fn set_read_only(&self, read_only: bool) -> Result<()> {
        if !read_only && self.opened_read_only {
            return Err(Error::ReadOnly);
        }
        self.check_alive()?;
        let was = self.read_only.swap(read_only, Ordering::AcqRel);
        if read_only {
            if self.background.settle(READ_ONLY_SETTLE).is_none() {
                log::warn!("a background job is still running after the switch to read-only");
            }
            return Ok(());
        }
        if was {
            // Released while read-only: no links and no handles, still in use.
            for n in self.inodes.values() {
                let mut g = wlock(&n);
                if g.unreachable_in_use() {
                    self.free_inode(&mut g)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for MountState {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Relaxed) {
            let _ = unmount(self);
        }
    }
}
