//! Mount (superblock validation, journal recovery, DRAM index rebuild, orphan cleanup) and
//! clean unmount (allocator state saved, superblock marked clean).
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::alloc::{Allocator, BlockRun};
use crate::media::journal::{Journals, epoch_of};
use crate::media::recovery;
use crate::media::wear::{self, WearCounters};
use crate::media::zone;
use crate::media::checksum;
use crate::media::layout::{
    self, BLOCK_BYTES, BLOCK_SIZE, BLOCKS_PER_HUGE, Geometry, INODE_BYTES, INODE_SIZE, InodeHeader,
    ROOT_INO, SbState, Superblock, sb,
};
use crate::media::pool::{Category, Pool};
use crate::state::alloc_snapshot;
use crate::state::background::Background;
use crate::state::claims;
use crate::state::damage;
use crate::state::slots;
use crate::state::zones::Zones;
use crate::state::locks::lock;
use crate::state::inode_bits::InodeBits;
use crate::state::inode_load::load_inode;
use crate::state::inode_state::{InoMap, InodeState, wlock};
use crate::state::validate;
use crate::state::mkfs::write_state;
use crate::state::mount_state::MountState;
use crate::types::MountOptions;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

/// What the inode tables hold, as found at mount: the in-use inodes in inode order, a list per
/// range of the tables that a thread scanned (or, while it scans, that range's list). Lists, not
/// a map, because a mount only walks them (a million hash inserts and a map's worth of page
/// faults were a quarter of a mount); kept per range, because joining them would move every
/// state once more.
struct LoadedInodes<I = Vec<Vec<(u64, InodeState)>>> {
    inodes: I,
    /// Free inode numbers per partition.
    free: Vec<InodeBits>,
    /// Pool offsets of dead extent slots, to zero.
    dead_slots: Vec<u64>,
    /// In-use inodes that fail their checksum (not loaded, not free).
    damaged: Vec<u64>,
    /// Why each damaged inode that passes its checksum was not loaded (fsck and repair only:
    /// its header ranges, extent map or directory blocks fail validation).
    unloadable: BTreeMap<u64, String>,
    /// Extent-index blocks and directory block headers that fail their checksum although
    /// everything built from them passed validation: one line each, in the words of fsck.
    bad_checksums: Vec<String>,
    /// Directory blocks loaded with a rebuilt header (directory, block index).
    rebuilt_dir_headers: Vec<(u64, u32)>,
}

/// Load every in-use inode, validating what the DRAM indexes are built from. An inode that
/// fails its checksum is listed as damaged; with `load_damaged` (fsck and repair) it is also
/// loaded when it passes every other check, so its blocks stay claimed and repair can judge it.
///
/// The inode tables are read by one thread per CPU (up to `MAX_SCAN_THREADS`), each taking a
/// contiguous range of table blocks; the ranges' findings are joined in inode order, so the
/// result and the first error are those of a scan in one thread.
fn load_inodes(pool: &Pool, g: &Geometry, load_damaged: bool) -> Result<LoadedInodes> {
    let per_block = BLOCK_SIZE / INODE_SIZE;
    let blocks = g.total_inodes().div_ceil(per_block);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // A thread per 256 table blocks (4,096 inodes) at least: fewer is not worth starting.
    let threads = cpus.min(MAX_SCAN_THREADS).min(blocks / 256).max(1);
    let span = blocks.div_ceil(threads) * per_block;
    let ranges: Vec<(u64, u64)> = (0..threads)
        .map(|t| (1 + t * span, ((t + 1) * span).min(g.total_inodes())))
        .filter(|(first, last)| first <= last)
        .collect();
    let parts: Vec<Result<RangeFound>> = if ranges.len() == 1 {
        ranges.iter().map(|&(a, b)| load_inode_range(pool, g, load_damaged, a, b)).collect()
    } else {
        std::thread::scope(|sc| {
            let jobs: Vec<_> = ranges
                .iter()
                .map(|&(a, b)| sc.spawn(move || load_inode_range(pool, g, load_damaged, a, b)))
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join().unwrap_or_else(|_| {
                        Err(Error::Invalid("a thread scanning the inode tables panicked".into()))
                    })
                })
                .collect()
        })
    };
    let parts: Vec<RangeFound> = parts.into_iter().collect::<Result<_>>()?;
    let mut all = LoadedInodes {
        inodes: Vec::with_capacity(parts.len()),
        free: free_sets(g),
        dead_slots: Vec::new(),
        damaged: Vec::new(),
        unloadable: BTreeMap::new(),
        bad_checksums: Vec::new(),
        rebuilt_dir_headers: Vec::new(),
    };
    for p in parts {
        all.inodes.push(p.inodes);
        for (mine, theirs) in all.free.iter_mut().zip(&p.free) {
            mine.union(theirs);
        }
        all.dead_slots.extend(p.dead_slots);
        all.damaged.extend(p.damaged);
        all.unloadable.extend(p.unloadable);
        all.bad_checksums.extend(p.bad_checksums);
        all.rebuilt_dir_headers.extend(p.rebuilt_dir_headers);
    }
    Ok(all)
}

/// An empty set of free inode numbers for each partition's range of the inode table.
fn free_sets(g: &Geometry) -> Vec<InodeBits> {
    let per = u64::from(g.inodes_per_partition);
    (0..u64::from(g.partitions)).map(|p| InodeBits::new(1 + p * per, per)).collect()
}

/// Idle file states a mount keeps at most unless told otherwise (`MountOptions::cached_inodes`):
/// about 20 MiB of DRAM.
const DEFAULT_CACHED_INODES: usize = 65_536;

/// One range's findings: its in-use inodes in a list.
type RangeFound = LoadedInodes<Vec<(u64, InodeState)>>;

/// Most threads one mount scans its inode tables with.
const MAX_SCAN_THREADS: u64 = 16;

/// [`load_inodes`] for inodes `first..=last` (`first` starts a table block).
fn load_inode_range(
    pool: &Pool,
    g: &Geometry,
    load_damaged: bool,
    first: u64,
    last: u64,
) -> Result<RangeFound> {
    // Room for every inode of the range: address space only, until a state is stored (growing
    // the list would move every state again per doubling).
    let mut nodes = Vec::with_capacity(usize::try_from(last + 1 - first).unwrap_or(0));
    let mut free = free_sets(g);
    let mut dead_offs = Vec::new();
    let mut damaged = Vec::new();
    let mut unloadable = BTreeMap::new();
    let mut bad_checksums = Vec::new();
    let mut rebuilt_dir_headers = Vec::new();
    let mut blk = vec![0u8; BLOCK_BYTES];
    let per_block = BLOCK_SIZE / INODE_SIZE;
    let mut ino = first;
    while ino <= last {
        pool.read(g.inode_offset(ino)?, &mut blk)?;
        for (cur, raw) in (ino..=last).zip(blk.chunks_exact(INODE_BYTES)) {
            let hdr = InodeHeader::decode(raw);
            if !hdr.in_use() {
                free[g.inode_partition(cur) as usize].insert(cur);
                continue;
            }
            let (n, l) = if checksum::inode_checksum_ok(raw) {
                match load_inode(pool, g, cur, raw, hdr) {
                    Ok(x) => x,
                    // A serving mount refuses the pool with this line; fsck reports it and
                    // repair frees the inode (nothing it claims can be trusted).
                    Err(e @ Error::Corrupted(_)) if load_damaged => {
                        damaged.push(cur);
                        unloadable.insert(cur, e.to_string());
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                // Nothing a serving mount builds comes from an inode that may be wrong: mount
                // refuses the pool. fsck reports it; repair reseals or frees it.
                damaged.push(cur);
                match load_damaged.then(|| load_inode(pool, g, cur, raw, hdr)) {
                    Some(Ok(x)) => x,
                    _ => continue,
                }
            };
            let ioff = g.inode_offset(cur)?;
            dead_offs.extend(l.dead.iter().map(|&s| n.map.slot_offset(ioff, s)));
            bad_checksums.extend(l.bad_checksums);
            rebuilt_dir_headers.extend(l.rebuilt_dir_headers);
            nodes.push((cur, n));
        }
        ino += per_block;
    }
    Ok(LoadedInodes {
        inodes: nodes,
        free,
        dead_slots: dead_offs,
        damaged,
        unloadable,
        bad_checksums,
        rebuilt_dir_headers,
    })
}

/// Every block owned by an inode: (run, owner), sorted; and every run two claims share
/// (corruption: a serving mount refuses it, fsck lists it, repair clones it).
fn owned_runs<'a>(
    nodes: impl Iterator<Item = &'a InodeState> + Clone,
) -> (Vec<(BlockRun, u64)>, Vec<claims::Shared>) {
    let shared = claims::shared(&claims::claims_of(nodes.clone()));
    (InodeState::owned_runs_of(nodes), shared)
}

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
    let loaded = if plan.is_empty() || pool.is_private() {
        plan.apply(&pool)?; // nothing, or stores that stay in this process
        load_inodes(&pool, &g, inconsistent == Inconsistent::Report)?
    } else {
        let view = pool.private_view()?;
        plan.apply(&view)?;
        load_inodes(&view, &g, inconsistent == Inconsistent::Report)?
    };
    match loaded.inodes.iter().flatten().next().filter(|x| x.0 == ROOT_INO).map(|x| &x.1) {
        Some(n) if n.is_dir() => {}
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
    let (owned, shared) = owned_runs(loaded.inodes.iter().flatten().map(|x| &x.1));
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
        let nodes: Vec<&InodeState> = loaded.inodes.iter().flatten().map(|x| &x.1).collect();
        validate::namespace(&pool, &nodes, true, &mut problems);
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
    let homeless: Vec<_> = slots::homeless(&live, loaded.inodes.iter().flatten().map(|x| &x.1))
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
    let mut report = plan.report;
    report.notes = notes;
    for off in loaded.dead_slots {
        pool.zero(off, layout::EXTENT_SIZE, Category::Metadata)?;
        pool.flush(off, layout::EXTENT_SIZE, Category::Metadata);
    }
    pool.fence();
    // Orphans: no links and named by no entry (a named inode without links is damage that
    // the namespace check refused, or that fsck reports; it is never freed here).
    // Only inodes without links can be orphans, and there are few: the entries are searched
    // for those alone.
    let unlinked: HashSet<u64> = loaded
        .inodes
        .iter()
        .flatten()
        .filter(|x| x.1.hdr.nlink == 0)
        .map(|x| x.0)
        .collect();
    let named: HashSet<u64> = match unlinked.is_empty() {
        true => HashSet::new(),
        false => loaded
            .inodes
            .iter()
            .flatten()
            .filter_map(|x| x.1.dir.as_ref())
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
    let mut on_media = InodeBits::new(1, g.total_inodes());
    let orphan_set: HashSet<u64> = orphans.iter().copied().collect();
    let keep = |n: &InodeState| {
        inconsistent == Inconsistent::Report || n.is_dir() || orphan_set.contains(&n.ino)
    };
    let mut in_dram = InoMap::with_capacity_and_hasher(
        loaded.inodes.iter().flatten().filter(|x| keep(&x.1)).count(),
        Default::default(),
    );
    for (ino, n) in loaded.inodes.into_iter().flatten() {
        if keep(&n) {
            in_dram.insert(ino, Arc::new(RwLock::new(n)));
        } else {
            on_media.insert(ino);
        }
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
        inodes: RwLock::new(in_dram),
        on_media: Mutex::new(on_media),
        loaded_order: Mutex::new(std::collections::VecDeque::new()),
        cached_inodes: match opts.cached_inodes {
            0 => DEFAULT_CACHED_INODES,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        namespace: RwLock::new(()),
        consistency: opts.consistency,
        overwrite_path: opts.overwrite_path,
        poisoned: AtomicBool::new(false),
        unmounted: AtomicBool::new(false),
        prefaulted: std::sync::atomic::AtomicU64::new(0),
        prefault_stop: AtomicBool::new(false),
        broken_skip_append_fence: AtomicBool::new(false),
        prefault_thread: std::sync::Mutex::new(None),
        record: Mutex::new(record),
        read_only: false,
        recovery: report,
        damaged_inodes: loaded.damaged,
        unloadable_inodes: loaded.unloadable,
        rebuilt_dir_headers: loaded.rebuilt_dir_headers,
        stale_snapshot,
        faults: Mutex::new(None),
        background: Arc::new(background),
        leases: Default::default(),
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
    state.read_only = opts.read_only;
    Ok(Arc::new(state))
}

/// Clean unmount: clear the journals, save the allocator state and mark the superblock clean
/// (not for a poisoned mount, which the next mount recovers). Runs once; later calls do
/// nothing.
pub(crate) fn unmount(state: &MountState) -> Result<()> {
    if state.unmounted.swap(true, Ordering::SeqCst) {
        return Ok(());
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
        _ => state.inodes.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect(),
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

impl Drop for MountState {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Relaxed) {
            let _ = unmount(self);
        }
    }
}
