//! The structure-aware corruption tester (`winefs crashtest corrupt`, and CI's `tests/corrupt.rs`):
//! a small pool holding every kind of metadata is damaged in one seeded way per trial — a
//! superblock or state-record field, an inode, an extent-index block (including a loop), a
//! directory block and a directory block header, an xattr or symlink block, a journal entry or
//! staged undo image of an interrupted transaction, the allocator snapshot, a zeroed block, a
//! truncated file, a block two files claim — and then
//! put through fsck, mount, a full read of every file, writes, unmount and mount again.
//!
//! Each trial is judged by the trust rules (docs/TESTING.md, "Corruption"): no panic; a refused
//! pool is byte-for-byte unchanged (so are `fsck` and `info`'s pools: they map it privately),
//! and when `fsck --repair` then says it left nothing, the pool mounts and checks clean;
//! a pool mount accepted stays mountable after use (read-only, and refused writable, when a
//! check failed while it was served and flagged it "needs fsck"); and a file whose content is
//! wrong must have been reported (EIO when read, or an fsck problem). Every metadata structure
//! carries a checksum (format version 3), so wrong content nobody reported is a failure for
//! every kind.

use crate::rng::Rng;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::journal::KIND_UNDO_STAGED;
use crate::media::checksum::inode_checksum;
use crate::media::layout::{
    BLOCK_SIZE, EXTENT_BYTES, ExtentRecord, Geometry, INLINE_SLOTS, INODE_SIZE, ino,
};
use crate::types::{Attr, MkfsOptions, MountOptions, XattrSet};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

const POOL_SIZE: u64 = 24 << 20;

/// The kinds of damage, each aimed at one structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Damage {
    /// A byte of the superblock's immutable part.
    Superblock,
    /// A byte of the state record.
    StateRecord,
    /// A byte of an in-use inode (header or extent slot).
    Inode,
    /// A byte of an extent-index block.
    IndexBlock,
    /// An extent-index block's `next` pointed at itself.
    IndexLoop,
    /// A byte of a directory block.
    DirBlock,
    /// A byte of a directory block's header (magic, checksum, `starts`).
    DirHeader,
    /// A byte of an xattr block.
    XattrBlock,
    /// A byte of a symlink's target block.
    SymlinkBlock,
    /// A byte of a journal entry of an interrupted transaction.
    JournalEntry,
    /// A byte of a staged undo image of an interrupted transaction.
    StagedImage,
    /// A bit of the allocator snapshot.
    Bitmap,
    /// A whole metadata block zeroed (inode table, directory, index or xattr block).
    ZeroedBlock,
    /// The pool file cut short.
    Truncated,
    /// One inode's extent record pointed at another inode's data (checksum resealed, as a
    /// buggy writer would leave it): a block two files claim.
    SharedBlock,
}

impl Damage {
    /// Every kind, in order.
    pub const ALL: [Damage; 15] = [
        Damage::Superblock,
        Damage::StateRecord,
        Damage::Inode,
        Damage::IndexBlock,
        Damage::IndexLoop,
        Damage::DirBlock,
        Damage::DirHeader,
        Damage::XattrBlock,
        Damage::SymlinkBlock,
        Damage::JournalEntry,
        Damage::StagedImage,
        Damage::Bitmap,
        Damage::ZeroedBlock,
        Damage::Truncated,
        Damage::SharedBlock,
    ];
}

/// What one trial ended as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Mount refused the pool (unchanged), and `fsck --repair` left problems or could not run.
    Refused,
    /// Mount refused the pool (unchanged); `fsck --repair` left nothing, and the pool then
    /// mounted and checked clean.
    Repaired,
    /// Mounted; every file read back right, or wrongly but reported (EIO or an fsck problem).
    Served,
}

/// The summary of a run.
#[derive(Debug, Default)]
pub struct CorruptSummary {
    /// Trials run.
    pub trials: usize,
    /// Outcomes per damage kind.
    pub outcomes: BTreeMap<(Damage, Outcome), usize>,
    /// Every broken rule, with the trial's seed.
    pub failures: Vec<String>,
}

impl fmt::Display for CorruptSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} trials, {} failures; per damage kind (refused / of which repaired / served):",
            self.trials,
            self.failures.len()
        )?;
        for d in Damage::ALL {
            let n = |o| self.outcomes.get(&(d, o)).copied().unwrap_or(0);
            writeln!(
                f,
                "  {:<13} {:>5} {:>5} {:>5}",
                format!("{d:?}"),
                n(Outcome::Refused) + n(Outcome::Repaired),
                n(Outcome::Repaired),
                n(Outcome::Served)
            )?;
        }
        Ok(())
    }
}

/// What the base pool holds: every file's path and content.
struct Base {
    image: Vec<u8>,
    /// Image with an interrupted transaction (its journal holds an unfinished overwrite).
    crashed: Vec<u8>,
    files: BTreeMap<String, Vec<u8>>,
    geo: Geometry,
    /// Block numbers of structures to aim at.
    dir_blocks: Vec<u64>,
    index_blocks: Vec<u64>,
    xattr_blocks: Vec<u64>,
    symlink_blocks: Vec<u64>,
    inodes: Vec<u64>,
}

fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| (r.next_u64() >> 24) as u8).collect()
}

/// Build the base pool in `dir`: directories, small and large files, a fragmented file with an
/// extent-index block, hard links, a symlink with a block, xattrs; then a copy with an
/// interrupted strict overwrite.
fn build_base(dir: &Path) -> Result<Base> {
    let path = dir.join("base");
    Fs::mkfs(
        &path,
        &MkfsOptions {
            size: Some(POOL_SIZE),
            partitions: Some(1),
            inodes: Some(256),
            ..Default::default()
        },
    )?;
    let fs = Fs::mount(&path, MountOptions::default())?;
    let mut files = BTreeMap::new();
    fs.mkdir_path("/d")?;
    fs.mkdir_path("/d/e")?;
    for (i, len) in [100usize, 4096, 10_000, 70_000].into_iter().enumerate() {
        let p = format!("/d/f{i}");
        let c = content(len, i as u64 + 1);
        fs.create_file(&p)?.write_at(0, &c)?;
        files.insert(p, c);
    }
    let big = content(2 << 20, 99);
    let f = fs.create_file("/big")?;
    f.write_at(0, &big)?;
    drop(f);
    files.insert("/big".into(), big);
    // Twelve separate extents: more than the eight inline slots, so an index block exists.
    let frag = fs.create_file("/d/e/frag")?;
    let mut fc = Vec::new();
    for k in 0..12u64 {
        let piece = content(4096, 200 + k);
        frag.write_at(k * 8192, &piece)?;
        fc.resize(usize::try_from(k * 8192).unwrap_or(0), 0);
        fc.extend_from_slice(&piece);
        // A filler file between pieces keeps them from merging.
        fs.create_file(&format!("/d/e/gap{k}"))?.write_at(0, b"x")?;
        files.insert(format!("/d/e/gap{k}"), b"x".to_vec());
    }
    drop(frag);
    files.insert("/d/e/frag".into(), fc);
    let f0 = fs.resolve("/d/f0", true)?;
    fs.link(f0, fs.resolve("/d/e", true)?, b"hard")?;
    files.insert("/d/e/hard".into(), files["/d/f0"].clone());
    let target = vec![b't'; 300];
    fs.symlink(fs.root(), b"sym", &target, 0, 0)?;
    fs.setxattr(f0, b"user.a", &content(200, 7), XattrSet::Any)?;
    fs.setxattr(fs.resolve("/d", true)?, b"user.b", b"dir-attr", XattrSet::Any)?;
    let geo = fs.geometry();
    let mut base = Base {
        image: Vec::new(),
        crashed: Vec::new(),
        files,
        geo: geo.clone(),
        dir_blocks: Vec::new(),
        index_blocks: Vec::new(),
        xattr_blocks: Vec::new(),
        symlink_blocks: Vec::new(),
        inodes: Vec::new(),
    };
    let mut stack = vec![fs.root()];
    while let Some(d) = stack.pop() {
        base.inodes.push(d);
        base.dir_blocks
            .extend(fs.extents(d)?.iter().flat_map(|e| e.1..e.1 + e.2));
        for e in fs.readdir(d, 0)? {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let a: Attr = fs.getattr(e.ino)?;
            if a.kind == crate::media::layout::FileKind::Dir {
                stack.push(e.ino);
            } else {
                base.inodes.push(e.ino);
                if a.kind == crate::media::layout::FileKind::Symlink {
                    base.symlink_blocks
                        .extend(fs.extents(e.ino)?.iter().map(|x| x.1));
                }
            }
        }
    }
    base.inodes.sort_unstable();
    base.inodes.dedup();
    fs.unmount()?;
    base.image = std::fs::read(&path).map_err(|e| Error::io("read the base pool", e))?;
    for &ino in &base.inodes {
        let off = usize::try_from(geo.inode_offset(ino)?).unwrap_or(0);
        let field = |o: usize| {
            u64::from_le_bytes(base.image[off + o..off + o + 8].try_into().unwrap_or([0; 8]))
        };
        if field(40) != 0 {
            base.xattr_blocks.push(field(40));
        }
        if field(48) != 0 {
            base.index_blocks.push(field(48));
        }
    }
    // The crashed variant: an 8 KiB strict overwrite of /big interrupted before its COMMIT.
    let fs = Fs::mount(&path, MountOptions::default())?;
    let f = fs.open_file("/big")?;
    fs.inject_crash_before_commit(1);
    let _ = f.write_at(64 << 10, &[0xee; 8192]);
    drop(f);
    drop(fs);
    base.crashed = std::fs::read(&path).map_err(|e| Error::io("read the crashed pool", e))?;
    Ok(base)
}

fn pick<T: Copy>(r: &mut Rng, v: &[T]) -> Option<T> {
    (!v.is_empty()).then(|| v[r.pick(v.len())])
}

/// Damage a copy of the base image; returns the bytes (or None when the base has no such
/// structure).
fn damage(base: &Base, kind: Damage, r: &mut Rng) -> Option<Vec<u8>> {
    let g = &base.geo;
    let bs = BLOCK_SIZE as usize;
    let mut img = match kind {
        Damage::JournalEntry | Damage::StagedImage => base.crashed.clone(),
        _ => base.image.clone(),
    };
    let flip = |img: &mut Vec<u8>, at: usize, r: &mut Rng| {
        let bit = 1u8 << r.below(8);
        if let Some(b) = img.get_mut(at) {
            *b ^= bit;
        }
    };
    let in_block = |b: u64, r: &mut Rng| b as usize * bs + r.below(BLOCK_SIZE) as usize;
    match kind {
        Damage::Superblock => flip(&mut img, r.below(128) as usize, r),
        Damage::StateRecord => flip(&mut img, 192 + r.below(28) as usize, r),
        Damage::Inode => {
            let ino = pick(r, &base.inodes)?;
            let off = g.inode_offset(ino).ok()? as usize + r.below(INODE_SIZE) as usize;
            flip(&mut img, off, r);
        }
        Damage::IndexBlock => {
            // Half the flips land in the header and the first slots, where the live records
            // are; the rest anywhere in the block.
            let b = pick(r, &base.index_blocks)?;
            let at = if r.below(2) == 0 {
                b as usize * bs + r.below(16 + 8 * 16) as usize
            } else {
                in_block(b, r)
            };
            flip(&mut img, at, r);
        }
        Damage::IndexLoop => {
            let b = pick(r, &base.index_blocks)?;
            let at = b as usize * bs + 8;
            img[at..at + 8].copy_from_slice(&b.to_le_bytes());
        }
        Damage::DirBlock => {
            let b = pick(r, &base.dir_blocks)?;
            flip(&mut img, in_block(b, r), r);
        }
        Damage::DirHeader => {
            let b = pick(r, &base.dir_blocks)?;
            flip(&mut img, b as usize * bs + r.below(16) as usize, r);
        }
        Damage::XattrBlock => {
            let b = pick(r, &base.xattr_blocks)?;
            flip(&mut img, in_block(b, r), r);
        }
        Damage::SymlinkBlock => {
            let b = pick(r, &base.symlink_blocks)?;
            flip(&mut img, b as usize * bs + r.below(300) as usize, r);
        }
        Damage::JournalEntry => {
            let ring = g.journal_offset(0) as usize;
            let used = img[ring..ring + g.journal_entries as usize * 64]
                .chunks_exact(64)
                .take_while(|e| e.iter().any(|&x| x != 0))
                .count()
                .max(1);
            flip(&mut img, ring + r.below(used as u64 * 64) as usize, r);
        }
        Damage::StagedImage => {
            let ring = g.journal_offset(0) as usize;
            let staged: u64 = img[ring..ring + g.journal_entries as usize * 64]
                .chunks_exact(64)
                .filter(|e| e[12] == KIND_UNDO_STAGED)
                .map(|e| u64::from(u32::from_le_bytes([e[28], e[29], e[30], e[31]])))
                .sum();
            let at = g.staging_offset(0) + r.below(staged.max(1));
            flip(&mut img, at as usize, r);
        }
        Damage::Bitmap => {
            let bit = r.below(g.data_blocks);
            let at = (g.bitmap_start * BLOCK_SIZE + bit / 8) as usize;
            img[at] ^= 1 << (bit % 8);
        }
        Damage::ZeroedBlock => {
            let mut blocks: Vec<u64> = base
                .inodes
                .iter()
                .filter_map(|&i| g.inode_offset(i).ok().map(|o| o / BLOCK_SIZE))
                .collect();
            blocks.extend(&base.dir_blocks);
            blocks.extend(&base.index_blocks);
            blocks.extend(&base.xattr_blocks);
            let b = pick(r, &blocks)? as usize;
            img[b * bs..(b + 1) * bs].fill(0);
        }
        Damage::Truncated => {
            let len = r.pick(img.len());
            img.truncate(len);
        }
        Damage::SharedBlock => share_a_block(&mut img, base, r)?,
    }
    Some(img)
}

/// Point a live inline extent record of one inode at the data of another's (checksum resealed).
fn share_a_block(img: &mut [u8], base: &Base, r: &mut Rng) -> Option<()> {
    let g = &base.geo;
    // (inode offset, record offset within it, record) of every live inline record.
    let mut recs = Vec::new();
    for &ino in &base.inodes {
        let off = usize::try_from(g.inode_offset(ino).ok()?).ok()?;
        for s in 0..INLINE_SLOTS {
            let o = ino::SLOTS + s * EXTENT_BYTES;
            let rec = ExtentRecord::decode(img.get(off + o..off + o + EXTENT_BYTES)?);
            if rec.len > 0 {
                recs.push((ino, off, o, rec));
            }
        }
    }
    let (ino, off, o, mut rec) = recs[r.pick(recs.len())];
    let others: Vec<_> = recs.iter().filter(|x| x.0 != ino).collect();
    let (_, _, _, other) = others.get(r.pick(others.len()))?;
    rec.phys = other.phys + r.below(u64::from(other.len));
    img.get_mut(off + o..off + o + EXTENT_BYTES)?
        .copy_from_slice(&rec.encode());
    let crc = inode_checksum(img.get(off..off + INODE_SIZE as usize)?);
    img.get_mut(off + ino::CRC..off + ino::CRC + 4)?
        .copy_from_slice(&crc.to_le_bytes());
    Some(())
}

/// Run `trials` trials from `seed` in a scratch directory under `dir`.
pub fn run(dir: &Path, trials: usize, seed: u64) -> Result<CorruptSummary> {
    let base = build_base(dir)?;
    let pool: PathBuf = dir.join("trial");
    let mut sum = CorruptSummary::default();
    let mut r = Rng::new(seed);
    for t in 0..trials {
        let kind = Damage::ALL[t % Damage::ALL.len()];
        let trial_seed = r.next_u64();
        let mut tr = Rng::new(trial_seed);
        let Some(img) = damage(&base, kind, &mut tr) else {
            continue;
        };
        std::fs::write(&pool, &img).map_err(|e| Error::io("write the trial pool", e))?;
        sum.trials += 1;
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            trial(&base, &pool, &img)
        }));
        let what = format!("trial {t} ({kind:?}, seed {trial_seed})");
        match res {
            Ok(Ok(o)) => *sum.outcomes.entry((kind, o)).or_default() += 1,
            Ok(Err(why)) => sum.failures.push(format!("{what}: {why}")),
            Err(_) => sum.failures.push(format!("{what}: panicked")),
        }
    }
    Ok(sum)
}

/// One trial on the damaged pool at `pool` (whose bytes are `img`).
fn trial(base: &Base, pool: &Path, img: &[u8]) -> std::result::Result<Outcome, String> {
    let unchanged = |step: &str| -> std::result::Result<(), String> {
        let now = std::fs::read(pool).map_err(|e| e.to_string())?;
        if now != img {
            return Err(format!("{step} wrote to the pool"));
        }
        Ok(())
    };
    let fsck = crate::state::fsck::check_pool(pool);
    unchanged("fsck")?;
    let _ = crate::state::mount::read_superblock(pool);
    unchanged("info")?;
    let reported = match &fsck {
        Ok(rep) => !rep.is_clean(),
        Err(_) => true,
    };
    let fs = match Fs::mount(pool, MountOptions::default()) {
        Ok(fs) => fs,
        Err(_) => {
            unchanged("a refused mount")?;
            // fsck --repair: whenever it says it repaired everything, the pool mounts and
            // checks clean.
            if let Ok(rep) = Fs::repair_pool(pool)
                && rep.left.is_empty()
            {
                let fs = Fs::mount(pool, MountOptions::default())
                    .map_err(|e| format!("repair left nothing, but mount refuses: {e}"))?;
                let c = fs.check();
                if !c.is_clean() {
                    return Err(format!("repair left nothing, but: {:?}", c.problems));
                }
                fs.unmount()
                    .map_err(|e| format!("repaired, then unmount failed: {e}"))?;
                match crate::state::fsck::check_pool(pool) {
                    Ok(c) if c.is_clean() => {}
                    Ok(c) => return Err(format!("repaired, then offline fsck: {:?}", c.problems)),
                    Err(e) => return Err(format!("repaired, then offline fsck: {e}")),
                }
                return Ok(Outcome::Repaired);
            }
            return Ok(Outcome::Refused);
        }
    };
    // Read every file: wrong content must be an error or have been reported by fsck.
    let mut wrong = Vec::new();
    for (path, want) in &base.files {
        let got = fs.open_file(path).and_then(|f| f.read_all());
        if let Ok(got) = got
            && &got != want
        {
            wrong.push(path.clone());
        }
    }
    if let Ok(t) = fs.resolve("/sym", false).and_then(|i| fs.readlink(i))
        && t != vec![b't'; 300]
    {
        wrong.push("/sym".into());
    }
    // Use it: writes, a new file, removals.
    let _ = fs
        .create_file("/new")
        .and_then(|f| f.write_at(0, &content(50_000, 5)));
    let _ = fs.open_file("/big").and_then(|f| f.write_at(4096, b"overwrite"));
    let _ = fs.unlink_path("/d/f3");
    let check = fs.check();
    // A check that failed while served flags the pool "needs fsck": then it mounts read-only.
    let read_only = fs.needs_fsck() != 0;
    fs.unmount()
        .map_err(|e| format!("accepted, then unmount failed: {e}"))?;
    if read_only
        && !matches!(
            Fs::mount(pool, MountOptions::default()),
            Err(Error::NeedsFsck(_))
        )
    {
        return Err("flagged \"needs fsck\", yet a writable mount was not refused".into());
    }
    let opts = MountOptions {
        read_only,
        ..Default::default()
    };
    let fs = Fs::mount(pool, opts)
        .map_err(|e| format!("accepted, then unmountable after use: {e}"))?;
    let after = fs.check();
    if check.is_clean() && !after.is_clean() {
        return Err(format!("clean before unmount, not after: {:?}", after.problems));
    }
    drop(fs);
    if !wrong.is_empty() && !reported {
        return Err(format!("served wrong content of {wrong:?} with fsck clean"));
    }
    Ok(Outcome::Served)
}
