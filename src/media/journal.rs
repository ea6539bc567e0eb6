//! Per-CPU undo journals: fine-grained 64-byte entries, one transaction at a time per journal,
//! space reclaimed as soon as a transaction commits. Recovery (reading the rings, deciding what
//! to roll back, validating all of it before changing a byte) is `media::recovery`.
//!
//! Commit protocol for a transaction of writes W (see docs/DESIGN.md, "Journal"):
//! 1. START + one UNDO entry per write (old bytes inline when <= 32 bytes, else copied to the
//!    journal's staging area with a crc32c of the image, and fenced before the entry pointing at
//!    them is written); flush; fence.
//! 2. Apply W in place; flush; fence.
//! 3. COMMIT entry; flush; fence. The operation is durable when this fence returns.
//!
//! Every entry carries the mount epoch (the superblock's mount count when it was written), so
//! an entry left from an earlier mount is never taken for part of the current one.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::layout::{
    self, Geometry, JOURNAL_ENTRY_BYTES as ENTRY, JOURNAL_ENTRY_SIZE, get_u16,
    ino, put_u16, put_u32, put_u64,
};
use crate::media::pool::{CACHE_LINE, Category, Pool};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entry kind: first entry of a transaction.
pub const KIND_START: u8 = 1;
/// Entry kind: undo record with the old bytes in the payload.
pub const KIND_UNDO_INLINE: u8 = 2;
/// Entry kind: undo record whose old bytes are in the staging area.
pub const KIND_UNDO_STAGED: u8 = 3;
/// Entry kind: the transaction committed.
pub const KIND_COMMIT: u8 = 4;
/// Old bytes carried inside an entry.
pub const INLINE_MAX: usize = 32;

/// Entry field offsets (docs/DESIGN.md §2, "Journal entry").
pub mod entry {
    /// u64: transaction id.
    pub const TXID: usize = 0;
    /// u32: wrap-around generation of the ring, ≥ 1.
    pub const GEN: usize = 8;
    /// u8: entry kind (`KIND_*`).
    pub const KIND: usize = 12;
    /// u8: UNDO_INLINE: number of old bytes in the payload.
    pub const INLINE_LEN: usize = 13;
    /// u16: entries in this transaction.
    pub const COUNT: usize = 14;
    /// u64: UNDO_*: pool byte offset the old bytes are restored to.
    pub const TARGET: usize = 16;
    /// 32 bytes: UNDO_INLINE: the old bytes; UNDO_STAGED: `STAGED_OFF` and `STAGED_LEN`.
    pub const PAYLOAD: usize = 24;
    /// u32: UNDO_STAGED: byte offset of the old image in the journal's staging area.
    pub const STAGED_OFF: usize = 24;
    /// u32: UNDO_STAGED: length of the old image.
    pub const STAGED_LEN: usize = 28;
    /// u32: UNDO_STAGED: crc32c of the old image.
    pub const STAGED_CRC: usize = 32;
    /// u32: the mount epoch: low 32 bits of the mount count of the mount that wrote it.
    pub const EPOCH: usize = 56;
    /// u32: crc32c of bytes `0..CRC`.
    pub const CRC: usize = 60;
}

const _: () = assert!(entry::PAYLOAD + INLINE_MAX <= entry::CRC && entry::CRC + 4 == ENTRY);
const _: () = assert!(entry::STAGED_CRC + 4 <= entry::PAYLOAD + INLINE_MAX);
const _: () = assert!(entry::PAYLOAD + INLINE_MAX <= entry::EPOCH && entry::EPOCH + 4 == entry::CRC);
// The epoch and checksum are the line's check word, which a line stored in several stores
// zeroes first and stores last (`pool_copy::line_store_order`; recovery's `Slot::Unfinished`).
const _: () = assert!(entry::EPOCH == ENTRY - crate::media::pool_copy::CHECK_WORD);
// An inode header chunk (`layout::header_diff`) fits one inline undo record.
const _: () = assert!(ino::CHUNK <= INLINE_MAX);

/// Bytes of a write kept inside the transaction itself rather than on the heap: an inode
/// header chunk, an extent record, a link word (most metadata writes).
const INLINE_WRITE: usize = 64;

/// The bytes of one write of a transaction.
enum TxData<'a> {
    /// Borrowed (file data: no copy until it lands in the pool).
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
    /// Up to [`INLINE_WRITE`] bytes, copied in (no allocation).
    Inline { len: u8, buf: [u8; INLINE_WRITE] },
}

impl std::ops::Deref for TxData<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            TxData::Borrowed(b) => b,
            TxData::Owned(v) => v,
            TxData::Inline { len, buf } => &buf[..usize::from(*len)],
        }
    }
}

/// One write of a transaction.
struct TxWrite<'a> {
    off: u64,
    data: TxData<'a>,
    cat: Category,
}

/// A set of pool writes that become durable atomically.
#[derive(Default)]
pub struct Tx<'a> {
    writes: Vec<TxWrite<'a>>,
    /// Extent-index blocks whose checksum the commit must recompute (block → pool offset of
    /// the owning inode), each one more write at most.
    index_seals: BTreeMap<u64, u64>,
}

impl<'a> Tx<'a> {
    /// An empty transaction, with room for the writes of a typical metadata change (a create
    /// makes six or seven), so that building it reallocates nothing.
    pub fn new() -> Self {
        Tx { writes: Vec::with_capacity(8), index_seals: BTreeMap::new() }
    }
    /// Have the commit recompute the checksum of extent-index block `block` (owned by the inode
    /// at pool offset `inode_off`) as this transaction leaves it: it changes a slot or the
    /// `next` of the block, or kills one of its records by lowering the owner's `map_end`.
    pub(crate) fn seal_index_block(&mut self, block: u64, inode_off: u64) {
        self.index_seals.insert(block, inode_off);
    }
    /// The extent-index blocks to seal (taken: the seal adds its writes to this transaction).
    pub(crate) fn take_index_seals(&mut self) -> BTreeMap<u64, u64> {
        std::mem::take(&mut self.index_seals)
    }
    /// Add a write of owned bytes.
    pub fn write(&mut self, off: u64, data: Vec<u8>, cat: Category) {
        if !data.is_empty() {
            self.writes.push(TxWrite { off, data: TxData::Owned(data), cat });
        }
    }
    /// Add a write of a copy of `data`, kept inline when short (no allocation).
    pub fn write_copy(&mut self, off: u64, data: &[u8], cat: Category) {
        match u8::try_from(data.len()) {
            Ok(len) if data.len() <= INLINE_WRITE => {
                if len > 0 {
                    let mut buf = [0u8; INLINE_WRITE];
                    buf[..data.len()].copy_from_slice(data);
                    self.writes.push(TxWrite { off, data: TxData::Inline { len, buf }, cat });
                }
            }
            _ => self.write(off, data.to_vec(), cat),
        }
    }
    /// Add a write of borrowed bytes (file data: no copy until it lands in the pool).
    pub(crate) fn write_ref(&mut self, off: u64, data: &'a [u8], cat: Category) {
        if !data.is_empty() {
            self.writes.push(TxWrite { off, data: TxData::Borrowed(data), cat });
        }
    }
    /// The pool ranges this transaction writes: (offset, length), in order.
    pub(crate) fn targets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.writes.iter().map(|w| (w.off, w.data.len() as u64))
    }
    /// Apply this transaction's writes, in order, to `buf`, a copy of the pool bytes at `off`.
    pub(crate) fn overlay(&self, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        for w in &self.writes {
            let (ws, we) = (w.off, w.off + w.data.len() as u64);
            let (a, b) = (ws.max(off), we.min(end));
            // Offsets relative to `buf` and to the write are below their lengths (usize).
            let rel = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
            if a < b
                && let Some(dst) = buf.get_mut(rel(a - off)..rel(b - off))
                && let Some(src) = w.data.get(rel(a - ws)..rel(b - ws))
            {
                dst.copy_from_slice(src);
            }
        }
    }
    /// No writes.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.index_seals.is_empty()
    }
    /// Journal entries this transaction reserves (an index block still to seal counts as the
    /// one write its checksum may need).
    pub(crate) fn entries_needed(&self) -> usize {
        self.writes.len() + self.index_seals.len() + 2
    }
    /// Bytes of undo staging this transaction needs.
    pub(crate) fn staged_bytes(&self) -> u64 {
        self.writes
            .iter()
            .filter(|w| w.data.len() > INLINE_MAX)
            .map(|w| (w.data.len() as u64).next_multiple_of(CACHE_LINE))
            .sum()
    }
}

struct JournalState {
    head: u32,
    generation: u32,
    /// Where the next transaction's undo images start in the staging area, when staging
    /// rotates (wear-aware: each transaction stages after the last one's images, wrapping).
    stage_next: u64,
    /// Bounce buffer for staging undo images ([`STAGE_CHUNK`] bytes), kept so a commit does
    /// not zero a fresh one every time.
    scratch: Vec<u8>,
    /// The encoded entries of the transaction being committed, kept so a commit does not
    /// allocate them every time.
    entries: Vec<u8>,
}

/// One CPU's journal. Aligned to 128 bytes so that journals do not share cache lines: each
/// commit locks its CPU's journal and moves its head (false sharing with a neighbour would
/// cost both a cache miss per commit).
#[repr(align(128))]
struct Journal {
    entries_off: u64,
    staging_off: u64,
    state: Mutex<JournalState>,
}

/// All per-CPU journals of a mounted pool.
pub struct Journals {
    journals: Vec<Journal>,
    capacity: u32,
    staging_len: u64,
    next_txid: AtomicU64,
    /// The mount epoch stamped on every entry.
    epoch: u32,
    /// Set when an injected crash fired: like a dead process, the mount commits nothing more.
    dead: std::sync::atomic::AtomicBool,
    /// Test-only switch: skip the fence between undo logging and in-place writes.
    pub(crate) broken_skip_undo_fence: std::sync::atomic::AtomicBool,
    /// Wear-aware: transactions stage their undo images one after another around the staging
    /// area instead of all from its start (only one transaction per journal is ever in flight,
    /// and its images are needed only until its COMMIT).
    rotate_staging: std::sync::atomic::AtomicBool,
    /// Fault injection: when it counts down to zero, a commit stops after its in-place writes
    /// are durable and before its COMMIT record, as a crash there would.
    pub(crate) crash_countdown: AtomicU64,
}

/// The fields of one entry (the checksum is computed by `encode`).
pub(crate) struct EntryFields<'p> {
    pub(crate) epoch: u32,
    pub(crate) txid: u64,
    pub(crate) generation: u32,
    pub(crate) kind: u8,
    pub(crate) count: u16,
    pub(crate) target: u64,
    pub(crate) payload: &'p [u8],
    pub(crate) inline_len: u8,
}

impl EntryFields<'_> {
    /// The 64 bytes of the entry.
    pub(crate) fn encode(&self) -> [u8; ENTRY] {
        let mut b = [0u8; ENTRY];
        put_u64(&mut b, entry::TXID, self.txid);
        put_u32(&mut b, entry::GEN, self.generation);
        b[entry::KIND] = self.kind;
        b[entry::INLINE_LEN] = self.inline_len;
        put_u16(&mut b, entry::COUNT, self.count);
        put_u64(&mut b, entry::TARGET, self.target);
        b[entry::PAYLOAD..entry::PAYLOAD + self.payload.len()].copy_from_slice(self.payload);
        put_u32(&mut b, entry::EPOCH, self.epoch);
        let crc = crate::media::crc::crc32c(&b[..entry::CRC]);
        put_u32(&mut b, entry::CRC, crc);
        b
    }
}

impl Journals {
    /// Journals for a pool whose rings have been recovered, writing entries of mount `epoch`.
    pub fn new(g: &Geometry, epoch: u32) -> Journals {
        Journals {
            journals: (0..g.partitions)
                .map(|p| Journal {
                    entries_off: g.journal_offset(p),
                    staging_off: g.staging_offset(p),
                    state: Mutex::new(JournalState {
                        head: 0,
                        generation: 1,
                        stage_next: 0,
                        scratch: vec![0; STAGE_CHUNK],
                        entries: Vec::new(),
                    }),
                })
                .collect(),
            capacity: g.journal_entries,
            staging_len: u64::from(g.staging_blocks) * layout::BLOCK_SIZE,
            next_txid: AtomicU64::new(1),
            epoch,
            dead: std::sync::atomic::AtomicBool::new(false),
            broken_skip_undo_fence: std::sync::atomic::AtomicBool::new(false),
            rotate_staging: std::sync::atomic::AtomicBool::new(false),
            crash_countdown: AtomicU64::new(0),
        }
    }

    /// Wear-aware staging on or off (`MountOptions::wear_aware`).
    pub(crate) fn set_wear_aware(&self, on: bool) {
        self.rotate_staging.store(on, Ordering::Relaxed);
    }

    /// Largest undo image one transaction may stage.
    pub(crate) fn staging_capacity(&self) -> u64 {
        self.staging_len
    }

    /// Most entries one transaction may reserve.
    pub(crate) fn entry_capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Fault injection (`Fs::inject_crash_before_commit`): whether the commit point reached
    /// now — a transaction's COMMIT, or an append's size store — is the one the countdown
    /// names. If so the journals go dead (nothing more is committed) and the caller stops as a
    /// crash there would.
    pub(crate) fn crash_injected(&self) -> bool {
        if self.crash_countdown.load(Ordering::Relaxed) > 0
            && self.crash_countdown.fetch_sub(1, Ordering::Relaxed) == 1
        {
            self.dead.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Make `tx` durable atomically, using the journal of `cpu`.
    pub fn commit(&self, pool: &Pool, tx: Tx<'_>, cpu: usize) -> Result<()> {
        if tx.is_empty() {
            return Ok(());
        }
        if self.dead.load(Ordering::Relaxed) {
            return Err(Error::Corrupted(
                "an injected crash ended this mount's commits".into(),
            ));
        }
        if !tx.index_seals.is_empty() {
            return Err(Error::Invalid(
                "a transaction reached the journal with extent-index blocks left unsealed".into(),
            ));
        }
        let need = tx.entries_needed();
        // `count` (the entry's u16 field) equals `need` from here on.
        let count = u16::try_from(need)
            .ok()
            .filter(|_| need <= self.capacity as usize)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "transaction needs {need} journal entries; the limit is {}",
                    self.capacity
                ))
            })?;
        if tx.staged_bytes() > self.staging_len {
            return Err(Error::Invalid(format!(
                "transaction needs {} bytes of undo staging; the limit is {}",
                tx.staged_bytes(),
                self.staging_len
            )));
        }
        for w in &tx.writes {
            if w.off
                .checked_add(w.data.len() as u64)
                .is_none_or(|e| e > pool.len())
            {
                return Err(corrupt!(
                    "transaction write at {}+{} is outside the pool",
                    w.off,
                    w.data.len()
                ));
            }
        }
        let j = &self.journals[cpu % self.journals.len()];
        let mut st = j.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.head as usize + need > self.capacity as usize {
            st.head = 0;
            st.generation = st.generation.wrapping_add(1).max(1);
        }
        let txid = self.next_txid.fetch_add(1, Ordering::Relaxed);
        let generation = st.generation;
        let base = j.entries_off + u64::from(st.head) * JOURNAL_ENTRY_SIZE;
        let entry_of = |kind: u8, target: u64, payload: &[u8], inline_len: u8| {
            EntryFields {
                epoch: self.epoch,
                txid,
                generation,
                kind,
                count,
                target,
                payload,
                inline_len,
            }
            .encode()
        };
        // Undo images first: staged ones are copied (with their checksum) and fenced before any
        // entry that refers to them is written, so a valid entry points at a complete image
        // and recovery can tell a damaged image from a good one.
        // The entries but COMMIT, encoded into the journal's reused buffer.
        let mut all = std::mem::take(&mut st.entries);
        all.clear();
        all.extend_from_slice(&entry_of(KIND_START, 0, &[], 0));
        let stage_from = match self.rotate_staging.load(Ordering::Relaxed) {
            true if st.stage_next + tx.staged_bytes() <= self.staging_len => st.stage_next,
            _ => 0,
        };
        let mut staged = stage_from;
        for w in &tx.writes {
            let len = w.data.len();
            if let Ok(inline_len) = u8::try_from(len)
                && len <= INLINE_MAX
            {
                let mut old = [0u8; INLINE_MAX];
                pool.read(w.off, &mut old[..len])?;
                all.extend_from_slice(&entry_of(KIND_UNDO_INLINE, w.off, &old[..len], inline_len));
            } else {
                let len = len as u64;
                let crc = stage_image(pool, w.off, j.staging_off + staged, len, &mut st.scratch)?;
                let mut p = [0u8; STAGED_PAYLOAD];
                put_u32(&mut p, entry::STAGED_OFF - entry::PAYLOAD, staged_field(staged)?);
                put_u32(&mut p, entry::STAGED_LEN - entry::PAYLOAD, staged_field(len)?);
                put_u32(&mut p, entry::STAGED_CRC - entry::PAYLOAD, crc);
                staged += len.next_multiple_of(CACHE_LINE);
                all.extend_from_slice(&entry_of(KIND_UNDO_STAGED, w.off, &p, 0));
            }
        }
        if staged > stage_from {
            pool.fence();
        }
        st.stage_next = staged;
        pool.write_lines_flush(base, &all, Category::Journal)?;
        st.entries = all;
        if !self.broken_skip_undo_fence.load(Ordering::Relaxed) {
            pool.fence();
        }
        for w in &tx.writes {
            pool.write_flush(w.off, &w.data, w.cat)?;
        }
        pool.fence();
        if self.crash_injected() {
            st.head += u32::from(count);
            return Err(Error::Corrupted(format!(
                "injected crash before COMMIT of transaction {txid}"
            )));
        }
        let commit_off = base + (u64::from(count) - 1) * JOURNAL_ENTRY_SIZE;
        pool.write_lines_flush(commit_off, &entry_of(KIND_COMMIT, 0, &[], 0), Category::Journal)?;
        pool.fence();
        st.head += u32::from(count);
        pool.check_durable()
    }
}

/// Bytes of the bounce buffer that undo images are staged through.
const STAGE_CHUNK: usize = 4096;

/// Copy the `len` old bytes at `src` to the staging area at `dst` (written back, not fenced) and
/// return their crc32c, computed on the way through `buf` (the journal's scratch buffer).
fn stage_image(pool: &Pool, src: u64, dst: u64, len: u64, buf: &mut [u8]) -> Result<u32> {
    let chunk = buf.len().max(1);
    let mut crc = 0u32;
    let mut done = 0u64;
    while done < len {
        // At most `chunk` bytes, so the narrowing is exact.
        let k = usize::try_from((len - done).min(chunk as u64)).unwrap_or(chunk);
        pool.read(src + done, &mut buf[..k])?;
        crc = crate::media::crc::crc32c_append(crc, &buf[..k]);
        pool.write_flush(dst + done, &buf[..k], Category::Journal)?;
        done += k as u64;
    }
    Ok(crc)
}

/// Read the count field (for tests and tools).
pub fn entry_count(raw: &[u8; ENTRY]) -> u16 {
    get_u16(raw, entry::COUNT)
}

/// Bytes of an UNDO_STAGED payload: the staged image's offset, length and checksum.
pub(crate) const STAGED_PAYLOAD: usize = entry::STAGED_CRC + 4 - entry::PAYLOAD;

/// A staged image's offset or length as its u32 entry field. Both are below the staging area's
/// size (checked when the transaction was reserved), which is 4 MiB for every valid geometry.
pub(crate) fn staged_field(v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Invalid(format!(
            "undo staging position {v} does not fit a journal entry's u32 field"
        ))
    })
}


/// The epoch stamped on the entries of the mount with this mount count (its low 32 bits).
pub fn epoch_of(mount_count: u64) -> u32 {
    u32::try_from(mount_count & u64::from(u32::MAX)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_copies_are_kept_inline_and_read_back_like_any_write() {
        let long = vec![7u8; INLINE_WRITE + 1];
        let mut tx = Tx::new();
        tx.write_copy(0, &[1, 2, 3], Category::Metadata);
        tx.write_copy(10, &[], Category::Metadata); // nothing to write: left out
        tx.write_copy(100, &[9u8; INLINE_WRITE], Category::Metadata);
        tx.write_copy(200, &long, Category::Metadata);
        assert!(matches!(tx.writes[0].data, TxData::Inline { len: 3, .. }));
        assert!(matches!(tx.writes[1].data, TxData::Inline { .. }));
        assert!(matches!(tx.writes[2].data, TxData::Owned(_)));
        let targets: Vec<(u64, u64)> = tx.targets().collect();
        assert_eq!(targets, vec![(0, 3), (100, 64), (200, 65)]);
        let mut buf = vec![0u8; 300];
        tx.overlay(0, &mut buf);
        assert_eq!(&buf[..4], &[1, 2, 3, 0]);
        assert!(buf[100..164].iter().all(|&b| b == 9) && buf[164..200].iter().all(|&b| b == 0));
        assert!(buf[200..265].iter().all(|&b| b == 7) && buf[265] == 0);
    }
}
