//! Per-CPU undo journals: fine-grained 64-byte entries, one transaction at a time per journal,
//! space reclaimed as soon as a transaction commits, and recovery that rolls back every
//! transaction with entries but no COMMIT, across journals, newest transaction id first.
//!
//! Commit protocol for a transaction of writes W (see docs/DESIGN.md, "Journal"):
//! 1. START + one UNDO entry per write (old bytes inline when <= 32 bytes, else copied to the
//!    journal's staging area and fenced before the entry pointing at them is written: the
//!    staged image has no checksum of its own, only the 64-byte entry does); flush; fence.
//! 2. Apply W in place; flush; fence.
//! 3. COMMIT entry; flush; fence. The operation is durable when this fence returns.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::layout::{
    self, Geometry, JOURNAL_ENTRY_BYTES as ENTRY, JOURNAL_ENTRY_SIZE, get_u16, get_u32, get_u64,
    ino, put_u16, put_u32, put_u64,
};
use crate::media::pool::{CACHE_LINE, Category, Pool};
use std::borrow::Cow;
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
    /// u32: crc32c of bytes `0..CRC`.
    pub const CRC: usize = 60;
}

const _: () = assert!(entry::PAYLOAD + INLINE_MAX <= entry::CRC && entry::CRC + 4 == ENTRY);
const _: () = assert!(entry::STAGED_LEN + 4 <= entry::PAYLOAD + INLINE_MAX);
// An inode header chunk (`layout::header_diff`) fits one inline undo record.
const _: () = assert!(ino::CHUNK <= INLINE_MAX);

/// One write of a transaction.
struct TxWrite<'a> {
    off: u64,
    data: Cow<'a, [u8]>,
    cat: Category,
}

/// A set of pool writes that become durable atomically.
#[derive(Default)]
pub struct Tx<'a> {
    writes: Vec<TxWrite<'a>>,
}

impl<'a> Tx<'a> {
    /// An empty transaction.
    pub fn new() -> Self {
        Tx { writes: Vec::new() }
    }
    /// Add a write of owned bytes.
    pub fn write(&mut self, off: u64, data: Vec<u8>, cat: Category) {
        if !data.is_empty() {
            self.writes.push(TxWrite {
                off,
                data: Cow::Owned(data),
                cat,
            });
        }
    }
    /// Add a write of borrowed bytes (file data: no copy until it lands in the pool).
    pub(crate) fn write_ref(&mut self, off: u64, data: &'a [u8], cat: Category) {
        if !data.is_empty() {
            self.writes.push(TxWrite {
                off,
                data: Cow::Borrowed(data),
                cat,
            });
        }
    }
    /// No writes.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
    /// Journal entries this transaction reserves.
    pub(crate) fn entries_needed(&self) -> usize {
        self.writes.len() + 2
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
}

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
    /// Test-only switch: skip the fence between undo logging and in-place writes.
    pub(crate) broken_skip_undo_fence: std::sync::atomic::AtomicBool,
    /// Fault injection: when it counts down to zero, a commit stops after its in-place writes
    /// are durable and before its COMMIT record, as a crash there would.
    pub(crate) crash_countdown: AtomicU64,
}

fn encode_entry(
    txid: u64,
    generation: u32,
    kind: u8,
    count: u16,
    target: u64,
    payload: &[u8],
    inline_len: u8,
) -> [u8; ENTRY] {
    let mut b = [0u8; ENTRY];
    put_u64(&mut b, entry::TXID, txid);
    put_u32(&mut b, entry::GEN, generation);
    b[entry::KIND] = kind;
    b[entry::INLINE_LEN] = inline_len;
    put_u16(&mut b, entry::COUNT, count);
    put_u64(&mut b, entry::TARGET, target);
    b[entry::PAYLOAD..entry::PAYLOAD + payload.len()].copy_from_slice(payload);
    let crc = crc32c::crc32c(&b[..entry::CRC]);
    put_u32(&mut b, entry::CRC, crc);
    b
}

/// A decoded, checksum-valid entry.
#[derive(Clone, Debug)]
struct Entry {
    pos: u32,
    txid: u64,
    generation: u32,
    kind: u8,
    target: u64,
    raw: [u8; ENTRY],
}

fn decode_entry(pos: u32, b: &[u8; ENTRY]) -> Option<Entry> {
    if crc32c::crc32c(&b[..entry::CRC]) != get_u32(b, entry::CRC) {
        return None; // never written, zeroed, or torn: not part of any transaction
    }
    Some(Entry {
        pos,
        txid: get_u64(b, entry::TXID),
        generation: get_u32(b, entry::GEN),
        kind: b[entry::KIND],
        target: get_u64(b, entry::TARGET),
        raw: *b,
    })
}

/// What recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Transaction ids rolled back, in the order they were undone.
    pub rolled_back: Vec<u64>,
    /// Undo records applied.
    pub undo_records: usize,
}

impl Journals {
    /// Journals for a pool whose rings have been recovered and cleared.
    pub fn new(g: &Geometry) -> Journals {
        Journals {
            journals: (0..g.partitions)
                .map(|p| Journal {
                    entries_off: g.journal_offset(p),
                    staging_off: g.staging_offset(p),
                    state: Mutex::new(JournalState {
                        head: 0,
                        generation: 1,
                    }),
                })
                .collect(),
            capacity: g.journal_entries,
            staging_len: u64::from(g.staging_blocks) * layout::BLOCK_SIZE,
            next_txid: AtomicU64::new(1),
            broken_skip_undo_fence: std::sync::atomic::AtomicBool::new(false),
            crash_countdown: AtomicU64::new(0),
        }
    }

    /// Largest undo image one transaction may stage.
    pub(crate) fn staging_capacity(&self) -> u64 {
        self.staging_len
    }

    /// Most entries one transaction may reserve.
    pub(crate) fn entry_capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Make `tx` durable atomically, using the journal of `cpu`.
    pub fn commit(&self, pool: &Pool, tx: Tx<'_>, cpu: usize) -> Result<()> {
        if tx.is_empty() {
            return Ok(());
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
        // Undo images first: staged ones are copied and fenced before any entry that refers to
        // them is written, so a valid entry always points at a complete image (cheaper here
        // than checksumming the image, which would read the old bytes a second time; the
        // image has no checksum, only the entry pointing at it does).
        let mut entries = Vec::with_capacity(need - 1);
        entries.push(encode_entry(txid, generation, KIND_START, count, 0, &[], 0));
        let mut staged = 0u64;
        for w in &tx.writes {
            let len = w.data.len();
            if let Ok(inline_len) = u8::try_from(len)
                && len <= INLINE_MAX
            {
                let mut old = [0u8; INLINE_MAX];
                pool.read(w.off, &mut old[..len])?;
                entries.push(encode_entry(
                    txid,
                    generation,
                    KIND_UNDO_INLINE,
                    count,
                    w.off,
                    &old[..len],
                    inline_len,
                ));
            } else {
                let len = len as u64;
                let dst = j.staging_off + staged;
                pool.copy_flush(w.off, dst, len, Category::Journal)?;
                let mut p = [0u8; STAGED_PAYLOAD];
                put_u32(
                    &mut p,
                    entry::STAGED_OFF - entry::PAYLOAD,
                    staged_field(staged)?,
                );
                put_u32(
                    &mut p,
                    entry::STAGED_LEN - entry::PAYLOAD,
                    staged_field(len)?,
                );
                staged += len.next_multiple_of(CACHE_LINE);
                entries.push(encode_entry(
                    txid,
                    generation,
                    KIND_UNDO_STAGED,
                    count,
                    w.off,
                    &p,
                    0,
                ));
            }
        }
        if staged > 0 {
            pool.fence();
        }
        let mut all = Vec::with_capacity(entries.len() * ENTRY);
        for e in &entries {
            all.extend_from_slice(e);
        }
        pool.write(base, &all, Category::Journal)?;
        pool.flush(base, all.len() as u64, Category::Journal);
        if !self.broken_skip_undo_fence.load(Ordering::Relaxed) {
            pool.fence();
        }
        for w in &tx.writes {
            pool.write_flush(w.off, &w.data, w.cat)?;
        }
        pool.fence();
        if self.crash_countdown.load(Ordering::Relaxed) > 0
            && self.crash_countdown.fetch_sub(1, Ordering::Relaxed) == 1
        {
            st.head += u32::from(count);
            return Err(Error::Corrupted(format!(
                "injected crash before COMMIT of transaction {txid}"
            )));
        }
        let commit_off = base + (u64::from(count) - 1) * JOURNAL_ENTRY_SIZE;
        pool.write_flush(
            commit_off,
            &encode_entry(txid, generation, KIND_COMMIT, count, 0, &[], 0),
            Category::Journal,
        )?;
        pool.fence();
        st.head += u32::from(count);
        Ok(())
    }

    /// Roll back every uncommitted transaction in every journal, then clear the rings (entries
    /// first, COMMIT records last, so a crash while clearing never exposes a committed
    /// transaction's undo records without its COMMIT).
    pub(crate) fn recover(pool: &Pool, g: &Geometry) -> Result<RecoveryReport> {
        let journal_end = g.inode_table_start * layout::BLOCK_SIZE;
        let mut uncommitted: Vec<(u64, u32, Vec<Entry>)> = Vec::new(); // (txid, journal, undo entries)
        let mut any_valid = false;
        for p in 0..g.partitions {
            let off = g.journal_offset(p);
            let mut valid = Vec::new();
            for pos in 0..g.journal_entries {
                let raw: [u8; ENTRY] =
                    pool.read_array(off + u64::from(pos) * JOURNAL_ENTRY_SIZE)?;
                if let Some(e) = decode_entry(pos, &raw) {
                    valid.push(e);
                }
            }
            any_valid |= !valid.is_empty();
            let Some(cur_gen) = valid.iter().map(|e| e.generation).max() else {
                continue;
            };
            let mut txs: BTreeMap<u64, (bool, Vec<Entry>)> = BTreeMap::new();
            for e in valid.into_iter().filter(|e| e.generation == cur_gen) {
                let t = txs.entry(e.txid).or_default();
                match e.kind {
                    KIND_COMMIT => t.0 = true,
                    KIND_UNDO_INLINE | KIND_UNDO_STAGED => t.1.push(e),
                    KIND_START => {}
                    k => return Err(corrupt!("journal {p} entry {} has unknown kind {k}", e.pos)),
                }
            }
            for (txid, (committed, undo)) in txs {
                if !committed {
                    uncommitted.push((txid, p, undo));
                }
            }
        }
        // Verify every undo record before applying any.
        for (txid, p, undo) in &uncommitted {
            for e in undo {
                let len = if e.kind == KIND_UNDO_INLINE {
                    let l = e.raw[entry::INLINE_LEN];
                    if usize::from(l) > INLINE_MAX {
                        return Err(corrupt!(
                            "journal {p} tx {txid}: inline undo length {l} > {INLINE_MAX}"
                        ));
                    }
                    u64::from(l)
                } else {
                    let (soff, slen) = staged_image(&e.raw);
                    if soff + slen > u64::from(g.staging_blocks) * layout::BLOCK_SIZE {
                        return Err(corrupt!(
                            "journal {p} tx {txid}: staged undo {soff}+{slen} outside staging"
                        ));
                    }
                    slen
                };
                if e.target < journal_end
                    || e.target.checked_add(len).is_none_or(|end| end > pool.len())
                {
                    return Err(corrupt!(
                        "journal {p} tx {txid}: undo target {}+{len} is not in the pool's metadata or data",
                        e.target
                    ));
                }
            }
        }
        let mut report = RecoveryReport::default();
        uncommitted.sort_by_key(|u| std::cmp::Reverse(u.0));
        for (txid, p, mut undo) in uncommitted {
            undo.sort_by_key(|e| std::cmp::Reverse(e.pos));
            for e in &undo {
                if e.kind == KIND_UNDO_INLINE {
                    let l = usize::from(e.raw[entry::INLINE_LEN]);
                    pool.write_flush(
                        e.target,
                        &e.raw[entry::PAYLOAD..entry::PAYLOAD + l],
                        Category::Metadata,
                    )?;
                } else {
                    let (soff, slen) = staged_image(&e.raw);
                    pool.copy_flush(
                        g.staging_offset(p) + soff,
                        e.target,
                        slen,
                        Category::Metadata,
                    )?;
                }
                report.undo_records += 1;
            }
            report.rolled_back.push(txid);
        }
        pool.fence();
        if any_valid {
            for phase_commit in [false, true] {
                for p in 0..g.partitions {
                    let off = g.journal_offset(p);
                    for pos in 0..g.journal_entries {
                        let eo = off + u64::from(pos) * JOURNAL_ENTRY_SIZE;
                        let raw: [u8; ENTRY] = pool.read_array(eo)?;
                        let is_commit = raw[entry::KIND] == KIND_COMMIT;
                        if raw != [0u8; ENTRY] && is_commit == phase_commit {
                            pool.write_flush(eo, &[0u8; ENTRY], Category::Journal)?;
                        }
                    }
                }
                pool.fence();
            }
        }
        Ok(report)
    }
}

/// Read the count field (for tests and tools).
pub fn entry_count(raw: &[u8; ENTRY]) -> u16 {
    get_u16(raw, entry::COUNT)
}

/// Bytes of an UNDO_STAGED payload: the staged image's offset and length.
const STAGED_PAYLOAD: usize = entry::STAGED_LEN + 4 - entry::PAYLOAD;

/// A staged image's offset or length as its u32 entry field. Both are below the staging area's
/// size (checked when the transaction was reserved), which is 4 MiB for every valid geometry.
fn staged_field(v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Invalid(format!(
            "undo staging position {v} does not fit a journal entry's u32 field"
        ))
    })
}

/// (offset, length) of the old image an UNDO_STAGED entry points at, in its journal's staging
/// area (not yet validated).
fn staged_image(raw: &[u8; ENTRY]) -> (u64, u64) {
    (
        u64::from(get_u32(raw, entry::STAGED_OFF)),
        u64::from(get_u32(raw, entry::STAGED_LEN)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Pool, Geometry) {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry::compute(32 << 20, 2, 64).unwrap();
        let pool = Pool::create(&dir.path().join("p"), 32 << 20).unwrap();
        (dir, pool, g)
    }

    #[test]
    fn committed_transactions_survive_recovery() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g);
        let target = g.data_start * 4096;
        let mut tx = Tx::new();
        tx.write(target, vec![1u8; 8], Category::Metadata);
        tx.write(target + 4096, vec![2u8; 5000], Category::Data);
        j.commit(&pool, tx, 0).unwrap();
        let r = Journals::recover(&pool, &g).unwrap();
        assert!(r.rolled_back.is_empty());
        assert_eq!(pool.read_array::<8>(target).unwrap(), [1u8; 8]);
        assert_eq!(
            pool.read_array::<4>(target + 4096 + 4996).unwrap(),
            [2u8; 4]
        );
    }

    /// Simulate a crash after step 2 (in-place writes done) but before COMMIT by writing the
    /// undo log and the new values by hand, then recovering.
    #[test]
    fn uncommitted_transactions_roll_back_newest_first() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[9u8; 40], Category::Data).unwrap();
        // Two uncommitted transactions in two journals touching the same bytes: tx 5 saw the
        // original 9s, tx 7 (later) saw tx 5's 5s. Undo must restore 9s.
        let e5 = encode_entry(5, 1, KIND_UNDO_INLINE, 3, target, &[9u8; 16], 16);
        let e7 = encode_entry(7, 1, KIND_UNDO_INLINE, 3, target, &[5u8; 16], 16);
        pool.write(g.journal_offset(0) + 64, &e5, Category::Journal)
            .unwrap();
        pool.write(g.journal_offset(1) + 64, &e7, Category::Journal)
            .unwrap();
        pool.write(target, &[7u8; 16], Category::Data).unwrap();
        let r = Journals::recover(&pool, &g).unwrap();
        assert_eq!(r.rolled_back, vec![7, 5]);
        assert_eq!(pool.read_array::<16>(target).unwrap(), [9u8; 16]);
        // The rings are cleared: a second recovery does nothing.
        pool.write(target, &[3u8; 16], Category::Data).unwrap();
        assert!(Journals::recover(&pool, &g).unwrap().rolled_back.is_empty());
        assert_eq!(pool.read_array::<16>(target).unwrap(), [3u8; 16]);
    }

    #[test]
    fn stale_generation_entries_are_ignored_after_wrap() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g);
        let target = g.data_start * 4096;
        // Fill the ring past one lap.
        for i in 0..(g.journal_entries as usize) {
            let mut tx = Tx::new();
            tx.write(
                target,
                vec![u8::try_from(i % 250).unwrap(); 8],
                Category::Metadata,
            );
            j.commit(&pool, tx, 0).unwrap();
        }
        let before = pool.read_array::<8>(target).unwrap();
        let r = Journals::recover(&pool, &g).unwrap();
        assert!(r.rolled_back.is_empty(), "{r:?}");
        assert_eq!(pool.read_array::<8>(target).unwrap(), before);
    }

    #[test]
    fn staged_image_outside_staging_is_refused_before_any_undo() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[4u8; 8], Category::Data).unwrap();
        let inline = encode_entry(3, 1, KIND_UNDO_INLINE, 4, target, &[9u8; 8], 8);
        let mut p = [0u8; STAGED_PAYLOAD];
        put_u32(
            &mut p,
            entry::STAGED_OFF - entry::PAYLOAD,
            g.staging_blocks * 4096 - 10,
        );
        put_u32(&mut p, entry::STAGED_LEN - entry::PAYLOAD, 100);
        let staged = encode_entry(3, 1, KIND_UNDO_STAGED, 4, target, &p, 0);
        pool.write(g.journal_offset(0) + 64, &inline, Category::Journal)
            .unwrap();
        pool.write(g.journal_offset(0) + 128, &staged, Category::Journal)
            .unwrap();
        assert!(
            matches!(Journals::recover(&pool, &g), Err(Error::Corrupted(m)) if m.contains("outside staging"))
        );
        assert_eq!(
            pool.read_array::<8>(target).unwrap(),
            [4u8; 8],
            "nothing undone"
        );
    }

    #[test]
    fn oversized_transactions_are_refused() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g);
        let mut tx = Tx::new();
        for i in 0..2000u64 {
            tx.write(g.data_start * 4096 + i * 8, vec![0; 8], Category::Metadata);
        }
        assert!(matches!(j.commit(&pool, tx, 0), Err(Error::Invalid(_))));
    }
}
