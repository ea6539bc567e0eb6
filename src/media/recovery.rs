//! Journal recovery: read every ring, decide per transaction what a crash left unfinished,
//! validate every entry and undo image that decision relies on, and only then roll back.
//!
//! Planning ([`plan`]) reads and never writes, so a mount that refuses the pool leaves it
//! byte-for-byte unchanged. The rules (docs/DESIGN.md, "Recovery"):
//! * Only entries of the mount epoch being recovered count; older entries are stale.
//! * Within a ring, only the newest generation counts (older ones are from before a wrap).
//! * A transaction with a COMMIT entry is finished.
//! * A transaction without one that is followed by a later transaction in the same ring had
//!   committed (a journal runs one transaction at a time): its COMMIT is damaged, and the
//!   mount is refused rather than undoing finished work.
//! * The last transaction of a ring without a COMMIT is rolled back when every entry it logged
//!   is readable and every staged image matches its checksum. A position inside it that fails
//!   its checksum refuses the mount (a crash leaves old or new bytes in a cache line, not
//!   garbage). If entries were never written, the crash cut its logging short before the log
//!   fence, so its writes never began and there is nothing to undo.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Result, corrupt};
use crate::media::journal::{
    INLINE_MAX, KIND_COMMIT, KIND_START, KIND_UNDO_INLINE, KIND_UNDO_STAGED, entry,
};
use crate::media::layout::{
    self, Geometry, JOURNAL_ENTRY_BYTES as ENTRY, JOURNAL_ENTRY_SIZE, get_u16, get_u32, get_u64,
};
use crate::media::pool::{Category, Pool};
use std::collections::BTreeMap;

/// A decoded, checksum-valid entry.
#[derive(Clone, Debug)]
struct Entry {
    pos: u32,
    epoch: u32,
    txid: u64,
    generation: u32,
    kind: u8,
    count: u16,
    target: u64,
    raw: [u8; ENTRY],
}

/// One ring position as read.
enum Slot {
    /// All zero: never written, or cleared.
    Empty,
    /// Epoch and checksum zero over other non-zero bytes: a line a crash caught being written
    /// where the processor stores a line in several stores (`Pool::write_lines_flush`), which
    /// zero them first and store them last. Taken as not written.
    Unfinished,
    /// Non-zero with a checksum that does not match: damaged.
    Garbled,
    Valid(Entry),
}

fn decode_slot(pos: u32, b: &[u8; ENTRY]) -> Slot {
    if *b == [0u8; ENTRY] {
        return Slot::Empty;
    }
    // A valid entry's epoch and checksum are both zero only once in 2^32 mounts (the epoch is
    // the mount count's low half, and mounts count from 1) and then once in 2^32 entries.
    if b[entry::EPOCH..] == [0u8; ENTRY - entry::EPOCH] {
        return Slot::Unfinished;
    }
    if crate::media::crc::crc32c(&b[..entry::CRC]) != get_u32(b, entry::CRC) {
        return Slot::Garbled;
    }
    Slot::Valid(Entry {
        pos,
        epoch: get_u32(b, entry::EPOCH),
        txid: get_u64(b, entry::TXID),
        generation: get_u32(b, entry::GEN),
        kind: b[entry::KIND],
        count: get_u16(b, entry::COUNT),
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
    /// What recovery noticed and handled, one line each (logging cut short by the crash, a
    /// COMMIT entry that could not be read).
    pub notes: Vec<String>,
}

/// Where an undo record's old bytes are.
#[derive(Clone, Debug)]
enum Source {
    Inline { bytes: [u8; INLINE_MAX], len: usize },
    /// Pool byte offset and length of a staged image (checksum verified).
    Staged { off: u64, len: u64 },
}

#[derive(Clone, Debug)]
struct Undo {
    target: u64,
    source: Source,
}

/// What recovery will do, decided and validated without writing anything.
#[derive(Debug, Default)]
pub struct RecoveryPlan {
    /// Undo records in the order they are applied (newest transaction first, each
    /// transaction's records last to first).
    undo: Vec<Undo>,
    /// The epoch whose entries were considered (`None`: the rings hold no valid entry).
    pub epoch: Option<u32>,
    /// Whether any ring holds any non-zero entry (so clearing has work to do).
    pub rings_dirty: bool,
    /// The report recovery gives once the plan is applied.
    pub report: RecoveryReport,
}

impl RecoveryPlan {
    /// Nothing to roll back.
    pub fn is_empty(&self) -> bool {
        self.undo.is_empty()
    }

    /// Restore every old image, then fence. Applying a plan twice gives the same bytes, so a
    /// crash while applying is recovered by planning again from the untouched rings.
    pub fn apply(&self, pool: &Pool) -> Result<()> {
        for u in &self.undo {
            match &u.source {
                Source::Inline { bytes, len } => {
                    pool.write_flush(u.target, &bytes[..*len], Category::Metadata)?;
                }
                Source::Staged { off, len } => {
                    pool.copy_flush(*off, u.target, *len, Category::Metadata)?;
                }
            }
        }
        pool.fence();
        Ok(())
    }
}

/// Read every ring and decide what to roll back for mount epoch `epoch` (`None` when the
/// superblock's state record is unreadable: the newest epoch found in the rings is used).
/// Writes nothing; any entry or image recovery would need but cannot trust is an error naming
/// the journal, the entry and the defect.
pub fn plan(pool: &Pool, g: &Geometry, epoch: Option<u32>) -> Result<RecoveryPlan> {
    let mut rings = Vec::with_capacity(g.partitions as usize);
    let mut buf = vec![0u8; g.journal_entries as usize * ENTRY];
    let mut plan = RecoveryPlan::default();
    for p in 0..g.partitions {
        pool.read(g.journal_offset(p), &mut buf)?;
        let slots: Vec<Slot> = (0u32..)
            .zip(buf.chunks_exact(ENTRY))
            .map(|(pos, c)| {
                let raw: &[u8; ENTRY] = c.try_into().unwrap_or(&[0u8; ENTRY]);
                decode_slot(pos, raw)
            })
            .collect();
        plan.rings_dirty |= slots.iter().any(|s| !matches!(s, Slot::Empty));
        rings.push(slots);
    }
    let newest = rings
        .iter()
        .flatten()
        .filter_map(|s| match s {
            Slot::Valid(e) => Some(e.epoch),
            _ => None,
        })
        .max();
    plan.epoch = epoch.or(newest);
    let Some(epoch) = plan.epoch else {
        return Ok(plan);
    };
    let mut unfinished: Vec<(u64, Vec<Undo>)> = Vec::new();
    for (p, slots) in (0u32..).zip(&rings) {
        if let Some(u) = plan_ring(pool, g, p, slots, epoch, &mut plan.report.notes)? {
            unfinished.push(u);
        }
    }
    unfinished.sort_by_key(|u| std::cmp::Reverse(u.0));
    for (txid, undo) in unfinished {
        plan.report.undo_records += undo.len();
        plan.report.rolled_back.push(txid);
        plan.undo.extend(undo);
    }
    Ok(plan)
}

/// The unfinished transaction of ring `p` to roll back, if any: (txid, undo records in the
/// order they are applied).
fn plan_ring(
    pool: &Pool,
    g: &Geometry,
    p: u32,
    slots: &[Slot],
    epoch: u32,
    notes: &mut Vec<String>,
) -> Result<Option<(u64, Vec<Undo>)>> {
    let current: Vec<&Entry> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::Valid(e) if e.epoch == epoch => Some(e),
            _ => None,
        })
        .collect();
    let Some(generation) = current.iter().map(|e| e.generation).max() else {
        return Ok(None);
    };
    let mut txs: BTreeMap<u64, Vec<&Entry>> = BTreeMap::new();
    for e in current.into_iter().filter(|e| e.generation == generation) {
        if !matches!(
            e.kind,
            KIND_START | KIND_UNDO_INLINE | KIND_UNDO_STAGED | KIND_COMMIT
        ) {
            return Err(corrupt!(
                "journal {p} entry {}: unknown kind {}",
                e.pos,
                e.kind
            ));
        }
        txs.entry(e.txid).or_default().push(e);
    }
    let Some(&last) = txs.keys().next_back() else {
        return Ok(None);
    };
    for (&txid, es) in &txs {
        let count = es[0].count;
        if let Some(e) = es.iter().find(|e| e.count != count) {
            return Err(corrupt!(
                "journal {p} entry {}: transaction {txid} has entries of {} and of {count} entries",
                e.pos,
                e.count
            ));
        }
        let start = es.iter().find(|e| e.kind == KIND_START).map(|e| e.pos);
        if es.iter().any(|e| e.kind == KIND_COMMIT) {
            continue;
        }
        if txid != last {
            let at = start
                .map(|s| format!(" at entry {}", u64::from(s) + u64::from(count) - 1))
                .unwrap_or_default();
            let next = txs.range(txid + 1..).next().map_or(0, |(t, _)| *t);
            return Err(corrupt!(
                "journal {p}: transaction {txid} has no readable COMMIT{at} although transaction {next} was logged after it: the journal is damaged"
            ));
        }
        return plan_unfinished(pool, g, p, slots, txid, count, start, es, notes);
    }
    Ok(None)
}

/// The last transaction of ring `p` has no COMMIT: validate it and plan its rollback.
#[allow(clippy::too_many_arguments)]
fn plan_unfinished(
    pool: &Pool,
    g: &Geometry,
    p: u32,
    slots: &[Slot],
    txid: u64,
    count: u16,
    start: Option<u32>,
    es: &[&Entry],
    notes: &mut Vec<String>,
) -> Result<Option<(u64, Vec<Undo>)>> {
    let mut undo_entries: Vec<&Entry> = es
        .iter()
        .copied()
        .filter(|e| matches!(e.kind, KIND_UNDO_INLINE | KIND_UNDO_STAGED))
        .collect();
    undo_entries.sort_by_key(|e| std::cmp::Reverse(e.pos));
    let mut undo = Vec::with_capacity(undo_entries.len());
    for e in &undo_entries {
        undo.push(validate_undo(pool, g, p, txid, e)?);
    }
    // The ring positions this transaction occupies: START, its undo entries, its COMMIT.
    let first = start.or_else(|| undo_entries.last().map(|e| e.pos.saturating_sub(1)));
    let span_end = match start {
        Some(s) => u64::from(s) + u64::from(count),
        None => undo_entries.first().map_or(0, |e| u64::from(e.pos) + 1),
    };
    // In a crash a ring position holds either what was written or what was there before
    // (zero, or a checksum-valid older entry); a position that fails its checksum inside the
    // transaction was damaged (or torn inside a cache line), and what it held is unknown.
    if let Some(f) = first {
        for pos in u64::from(f)..span_end {
            match usize::try_from(pos).ok().and_then(|i| slots.get(i)) {
                Some(Slot::Garbled) => {
                    return Err(corrupt!(
                        "journal {p} entry {pos}: unreadable (checksum mismatch) inside unfinished transaction {txid}; what it held cannot be known"
                    ));
                }
                Some(Slot::Unfinished) => notes.push(format!(
                    "journal {p} entry {pos}: the crash caught it being written (transaction {txid}); taken as not written"
                )),
                _ => {}
            }
        }
    }
    // Complete: START, then `count - 2` undo entries right after it.
    let expected = usize::from(count).saturating_sub(2);
    let missing: Vec<u64> = match start {
        Some(s) => (1..=expected as u64)
            .map(|k| u64::from(s) + k)
            .filter(|pos| !undo_entries.iter().any(|e| u64::from(e.pos) == *pos))
            .collect(),
        None => Vec::new(),
    };
    if start.is_some() && missing.is_empty() && undo_entries.len() == expected {
        return Ok(Some((txid, undo)));
    }
    // The crash cut the logging short: some entries were never written (their positions hold
    // zero or older valid entries), so the log fence never completed and no in-place write
    // of this transaction began. (Comparing the present images with their targets proves
    // nothing: a write made just before the commit, unjournaled and not yet fenced, such as a
    // new inode's body, may itself be missing from media.)
    let what = match start {
        None => "its START entry".to_string(),
        Some(_) => format!(
            "undo entr{} {}",
            if missing.len() == 1 { "y" } else { "ies" },
            missing
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    notes.push(format!(
        "journal {p}: transaction {txid} was cut off while being logged (it lacks {what}); its writes had not begun, nothing to undo"
    ));
    Ok(None)
}

/// Check an undo entry's fields and its staged image's checksum.
fn validate_undo(pool: &Pool, g: &Geometry, p: u32, txid: u64, e: &Entry) -> Result<Undo> {
    let journal_end = g.inode_table_start * layout::BLOCK_SIZE;
    let pos = e.pos;
    let (source, len) = if e.kind == KIND_UNDO_INLINE {
        let len = usize::from(e.raw[entry::INLINE_LEN]);
        if len == 0 || len > INLINE_MAX {
            return Err(corrupt!(
                "journal {p} entry {pos} (transaction {txid}): inline undo length {len} is not 1..={INLINE_MAX}"
            ));
        }
        let mut bytes = [0u8; INLINE_MAX];
        bytes[..len].copy_from_slice(&e.raw[entry::PAYLOAD..entry::PAYLOAD + len]);
        (Source::Inline { bytes, len }, len as u64)
    } else {
        let soff = u64::from(get_u32(&e.raw, entry::STAGED_OFF));
        let slen = u64::from(get_u32(&e.raw, entry::STAGED_LEN));
        let staging = u64::from(g.staging_blocks) * layout::BLOCK_SIZE;
        if slen == 0 || soff.checked_add(slen).is_none_or(|end| end > staging) {
            return Err(corrupt!(
                "journal {p} entry {pos} (transaction {txid}): staged undo image {soff}+{slen} lies outside the staging area"
            ));
        }
        let off = g.staging_offset(p) + soff;
        let want = get_u32(&e.raw, entry::STAGED_CRC);
        let got = pool_crc(pool, off, slen)?;
        if got != want {
            return Err(corrupt!(
                "journal {p} entry {pos} (transaction {txid}): the staged undo image ({slen} bytes at staging offset {soff}) fails its checksum"
            ));
        }
        (Source::Staged { off, len: slen }, slen)
    };
    if e.target < journal_end || e.target.checked_add(len).is_none_or(|end| end > pool.len()) {
        return Err(corrupt!(
            "journal {p} entry {pos} (transaction {txid}): undo target {}+{len} is not in the pool's metadata or data",
            e.target
        ));
    }
    Ok(Undo {
        target: e.target,
        source,
    })
}

/// crc32c of `len` pool bytes at `off`.
fn pool_crc(pool: &Pool, off: u64, len: u64) -> Result<u32> {
    let mut buf = [0u8; 4096];
    let mut crc = 0u32;
    let mut done = 0u64;
    while done < len {
        let k = usize::try_from((len - done).min(4096)).unwrap_or(4096);
        pool.read(off + done, &mut buf[..k])?;
        crc = crate::media::crc::crc32c_append(crc, &buf[..k]);
        done += k as u64;
    }
    Ok(crc)
}

/// Zero every ring: entries other than COMMIT first, then (after a fence) the COMMIT entries,
/// so a crash while clearing never leaves a finished transaction's undo entries without its
/// COMMIT. Only non-zero entries are written.
pub fn clear_rings(pool: &Pool, g: &Geometry) -> Result<()> {
    let mut buf = vec![0u8; g.journal_entries as usize * ENTRY];
    for phase_commit in [false, true] {
        for p in 0..g.partitions {
            let off = g.journal_offset(p);
            pool.read(off, &mut buf)?;
            for (pos, raw) in (0u64..).zip(buf.chunks_exact(ENTRY)) {
                let is_commit = raw[entry::KIND] == KIND_COMMIT;
                if raw.iter().any(|&b| b != 0) && is_commit == phase_commit {
                    pool.write_flush(
                        off + pos * JOURNAL_ENTRY_SIZE,
                        &[0u8; ENTRY],
                        Category::Journal,
                    )?;
                }
            }
        }
        pool.fence();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::media::journal::{EntryFields, Journals, STAGED_PAYLOAD, Tx};
    use crate::media::layout::put_u32;

    const EPOCH: u32 = 7;

    fn setup() -> (tempfile::TempDir, Pool, Geometry) {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry::compute(32 << 20, 2, 64).unwrap();
        let pool = Pool::create(&dir.path().join("p"), 32 << 20).unwrap();
        (dir, pool, g)
    }

    fn entry(txid: u64, kind: u8, count: u16, target: u64, payload: &[u8]) -> [u8; ENTRY] {
        entry_of_gen(1, txid, kind, count, target, payload)
    }

    /// An entry of mount `EPOCH` and ring generation `generation`.
    fn entry_of_gen(generation: u32, txid: u64, kind: u8, count: u16, target: u64, payload: &[u8]) -> [u8; ENTRY] {
        let inline_len = match kind == KIND_UNDO_INLINE {
            true => u8::try_from(payload.len()).unwrap(),
            false => 0,
        };
        EntryFields { epoch: EPOCH, txid, generation, kind, count, target, payload, inline_len }.encode()
    }

    fn put(pool: &Pool, g: &Geometry, p: u32, pos: u64, e: &[u8; ENTRY]) {
        pool.write(g.journal_offset(p) + pos * 64, e, Category::Journal)
            .unwrap();
    }

    fn recover(pool: &Pool, g: &Geometry) -> Result<RecoveryReport> {
        let plan = plan(pool, g, Some(EPOCH))?;
        plan.apply(pool)?;
        Ok(plan.report)
    }

    /// The whole pool, to show that a refused recovery wrote nothing.
    fn image(pool: &Pool) -> Vec<u8> {
        let mut v = vec![0u8; usize::try_from(pool.len()).unwrap()];
        pool.read(0, &mut v).unwrap();
        v
    }

    #[test]
    fn committed_transactions_are_left_alone() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let target = g.data_start * 4096;
        let mut tx = Tx::new();
        tx.write(target, vec![1u8; 8], Category::Metadata);
        tx.write(target + 4096, vec![2u8; 5000], Category::Data);
        j.commit(&pool, tx, 0).unwrap();
        let r = recover(&pool, &g).unwrap();
        assert!(r.rolled_back.is_empty(), "{r:?}");
        assert_eq!(pool.read_array::<8>(target).unwrap(), [1u8; 8]);
    }

    /// Two unfinished transactions in two journals touching the same bytes: tx 5 saw the
    /// original 9s, tx 7 (later) saw tx 5's 5s. Undo newest first restores the 9s.
    #[test]
    fn unfinished_transactions_roll_back_newest_first() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[7u8; 16], Category::Data).unwrap();
        for (p, txid, old) in [(0, 5, 9u8), (1, 7, 5u8)] {
            put(&pool, &g, p, 0, &entry(txid, KIND_START, 3, 0, &[]));
            put(&pool, &g, p, 1, &entry(txid, KIND_UNDO_INLINE, 3, target, &[old; 16]));
        }
        let r = recover(&pool, &g).unwrap();
        assert_eq!(r.rolled_back, vec![7, 5]);
        assert_eq!(pool.read_array::<16>(target).unwrap(), [9u8; 16]);
    }

    #[test]
    fn entries_of_another_epoch_are_stale() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[7u8; 16], Category::Data).unwrap();
        put(&pool, &g, 0, 0, &entry(5, KIND_START, 3, 0, &[]));
        put(&pool, &g, 0, 1, &entry(5, KIND_UNDO_INLINE, 3, target, &[9; 16]));
        let p = plan(&pool, &g, Some(EPOCH + 1)).unwrap();
        assert!(p.is_empty() && p.rings_dirty);
        assert_eq!(pool.read_array::<16>(target).unwrap(), [7u8; 16]);
        // With the state record unreadable, the newest epoch in the rings is recovered.
        let p = plan(&pool, &g, None).unwrap();
        assert_eq!((p.epoch, p.report.rolled_back.clone()), (Some(EPOCH), vec![5]));
    }

    #[test]
    fn a_missing_commit_before_a_later_transaction_refuses() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let target = g.data_start * 4096;
        for v in [1u8, 2] {
            let mut tx = Tx::new();
            tx.write(target, vec![v; 8], Category::Metadata);
            j.commit(&pool, tx, 0).unwrap();
        }
        // Damage the first transaction's COMMIT (position 2): it would look unfinished.
        let off = g.journal_offset(0) + 2 * 64 + 20;
        pool.write(off, &[0xee], Category::Journal).unwrap();
        let before = image(&pool);
        let e = plan(&pool, &g, Some(EPOCH)).unwrap_err();
        assert!(
            matches!(&e, Error::Corrupted(m) if m.contains("journal 0: transaction 1 has no readable COMMIT at entry 2")),
            "{e}"
        );
        assert!(image(&pool) == before, "planning wrote nothing");
    }

    #[test]
    fn a_damaged_staged_image_refuses_before_any_undo() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[4u8; 8], Category::Data).unwrap();
        pool.write(target + 4096, &[6u8; 100], Category::Data)
            .unwrap();
        pool.write(g.staging_offset(0), &[3u8; 100], Category::Journal)
            .unwrap();
        let mut p = [0u8; STAGED_PAYLOAD];
        put_u32(&mut p, 4, 100);
        put_u32(&mut p, 8, crate::media::crc::crc32c(&[3u8; 100]));
        put(&pool, &g, 0, 0, &entry(3, KIND_START, 4, 0, &[]));
        put(&pool, &g, 0, 1, &entry(3, KIND_UNDO_INLINE, 4, target, &[9u8; 8]));
        put(&pool, &g, 0, 2, &entry(3, KIND_UNDO_STAGED, 4, target + 4096, &p));
        // Intact, it rolls back both records.
        assert_eq!(plan(&pool, &g, Some(EPOCH)).unwrap().report.undo_records, 2);
        // One changed byte in the image: refused, naming the entry, nothing written.
        pool.write(g.staging_offset(0) + 50, &[0], Category::Journal)
            .unwrap();
        let before = image(&pool);
        let e = recover(&pool, &g).unwrap_err();
        assert!(
            matches!(&e, Error::Corrupted(m) if m.contains("journal 0 entry 2 (transaction 3)") && m.contains("fails its checksum")),
            "{e}"
        );
        assert!(image(&pool) == before);
    }

    #[test]
    fn staged_image_outside_staging_refuses() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        let mut p = [0u8; STAGED_PAYLOAD];
        put_u32(&mut p, 0, g.staging_blocks * 4096 - 10);
        put_u32(&mut p, 4, 100);
        put(&pool, &g, 0, 0, &entry(3, KIND_START, 3, 0, &[]));
        put(&pool, &g, 0, 1, &entry(3, KIND_UNDO_STAGED, 3, target, &p));
        assert!(
            matches!(plan(&pool, &g, Some(EPOCH)), Err(Error::Corrupted(m)) if m.contains("outside the staging area"))
        );
    }

    /// An unfinished transaction whose logging the crash cut short (an undo entry never
    /// written): its writes cannot have begun, so nothing is undone.
    #[test]
    fn an_incomplete_unfinished_transaction_is_not_rolled_back() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        pool.write(target, &[5u8; 8], Category::Data).unwrap();
        put(&pool, &g, 0, 0, &entry(4, KIND_START, 4, 0, &[]));
        put(&pool, &g, 0, 1, &entry(4, KIND_UNDO_INLINE, 4, target, &[1u8; 8]));
        let p = plan(&pool, &g, Some(EPOCH)).unwrap();
        assert!(p.is_empty(), "writes never began: nothing to undo");
        assert!(p.report.notes[0].contains("lacks undo entry 2"), "{:?}", p.report.notes);
        p.apply(&pool).unwrap();
        assert_eq!(pool.read_array::<8>(target).unwrap(), [5u8; 8]);
    }

    /// A position that fails its checksum inside the last unfinished transaction (an undo entry
    /// or where its COMMIT belongs) refuses: what it held cannot be known. Inside a finished
    /// transaction it is harmless.
    #[test]
    fn an_unreadable_entry_inside_an_unfinished_transaction_refuses() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        let mut garbled = entry(4, KIND_UNDO_INLINE, 3, target, &[0u8; 8]);
        garbled[30] ^= 1;
        for at in [1u64, 2] {
            put(&pool, &g, 0, 0, &entry(4, KIND_START, 3, 0, &[]));
            if at == 2 {
                put(&pool, &g, 0, 1, &entry(4, KIND_UNDO_INLINE, 3, target, &[1u8; 8]));
            }
            put(&pool, &g, 0, at, &garbled);
            let e = plan(&pool, &g, Some(EPOCH)).unwrap_err();
            assert!(
                matches!(&e, Error::Corrupted(m) if m.contains(&format!("journal 0 entry {at}: unreadable"))),
                "{e}"
            );
        }
        // The same damage inside a committed transaction changes nothing.
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let mut tx = Tx::new();
        tx.write(target, vec![3u8; 8], Category::Metadata);
        j.commit(&pool, tx, 0).unwrap();
        put(&pool, &g, 0, 1, &garbled);
        let p = plan(&pool, &g, Some(EPOCH)).unwrap();
        assert!(p.is_empty());
        assert_eq!(pool.read_array::<8>(target).unwrap(), [3u8; 8]);
    }

    #[test]
    fn unknown_kind_refuses() {
        let (_d, pool, g) = setup();
        put(&pool, &g, 1, 0, &entry(3, 9, 3, 0, &[]));
        assert!(
            matches!(plan(&pool, &g, Some(EPOCH)), Err(Error::Corrupted(m)) if m.contains("journal 1 entry 0: unknown kind 9"))
        );
    }

    #[test]
    fn stale_generation_entries_are_ignored_after_wrap() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let target = g.data_start * 4096;
        for i in 0..(g.journal_entries as usize) {
            let mut tx = Tx::new();
            tx.write(target, vec![u8::try_from(i % 250).unwrap(); 8], Category::Metadata);
            j.commit(&pool, tx, 0).unwrap();
        }
        let before = pool.read_array::<8>(target).unwrap();
        assert!(recover(&pool, &g).unwrap().rolled_back.is_empty());
        assert_eq!(pool.read_array::<8>(target).unwrap(), before);
    }

    #[test]
    fn cleared_rings_are_empty() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let mut tx = Tx::new();
        tx.write(g.data_start * 4096, vec![1u8; 8], Category::Metadata);
        j.commit(&pool, tx, 1).unwrap();
        assert!(plan(&pool, &g, Some(EPOCH)).unwrap().rings_dirty);
        clear_rings(&pool, &g).unwrap();
        assert!(!plan(&pool, &g, Some(EPOCH)).unwrap().rings_dirty);
    }

    #[test]
    fn oversized_transactions_are_refused() {
        let (_d, pool, g) = setup();
        let j = Journals::new(&g, EPOCH);
        let mut tx = Tx::new();
        for i in 0..2000u64 {
            tx.write(g.data_start * 4096 + i * 8, vec![0; 8], Category::Metadata);
        }
        assert!(matches!(j.commit(&pool, tx, 0), Err(Error::Invalid(_))));
    }

    /// Store the first `k` of the ordered stores of `lines` (`pool_copy::line_store_order`,
    /// line after line) at ring position `pos` of journal 0: what a kill after the k-th store
    /// leaves where a line takes several stores.
    fn store_prefix(pool: &Pool, g: &Geometry, pos: u64, lines: &[[u8; ENTRY]], k: usize) {
        let stores = lines.iter().enumerate().flat_map(|(i, l)| {
            crate::media::pool_copy::line_store_order(l)
                .into_iter()
                .map(move |(at, w)| (i, at, w))
        });
        for (i, at, w) in stores.take(k) {
            let off = g.journal_offset(0) + (pos + i as u64) * 64 + at as u64;
            pool.write(off, &w, Category::Journal).unwrap();
        }
    }

    /// A transaction (START, two undo records, COMMIT) over a ring position that held an older
    /// lap's finished transaction, cut by a crash after every one of the stores of its lines,
    /// and before and after each of its in-place writes: every state mounts, and the targets
    /// hold the old bytes until the COMMIT line is whole, the new ones after.
    #[test]
    fn a_crash_after_any_store_of_a_line_leaves_a_recoverable_ring() {
        let stores_per_line = crate::media::pool_copy::line_store_order(&[0; 64]).len();
        let (_d, pool, g) = setup();
        let (a, b) = (g.data_start * 4096, g.data_start * 4096 + 4096);
        let old_lap = [
            entry_of_gen(1, 1, KIND_START, 4, 0, &[]),
            entry_of_gen(1, 1, KIND_UNDO_INLINE, 4, a, &[5; 8]),
            entry_of_gen(1, 1, KIND_UNDO_INLINE, 4, b, &[6; 8]),
            entry_of_gen(1, 1, KIND_COMMIT, 4, 0, &[]),
        ];
        let logged = [
            entry_of_gen(2, 9, KIND_START, 4, 0, &[]),
            entry_of_gen(2, 9, KIND_UNDO_INLINE, 4, a, &[1; 8]),
            entry_of_gen(2, 9, KIND_UNDO_INLINE, 4, b, &[3; 8]),
        ];
        let commit = [entry_of_gen(2, 9, KIND_COMMIT, 4, 0, &[])];
        let check = |logged_stores: usize, in_place: usize, commit_stores: usize| {
            for (i, e) in old_lap.iter().enumerate() {
                put(&pool, &g, 0, i as u64, e);
            }
            pool.write(a, &[1; 8], Category::Data).unwrap();
            pool.write(b, &[3; 8], Category::Data).unwrap();
            store_prefix(&pool, &g, 0, &logged, logged_stores);
            if in_place >= 1 {
                pool.write(a, &[2; 8], Category::Data).unwrap();
            }
            if in_place >= 2 {
                pool.write(b, &[4; 8], Category::Data).unwrap();
            }
            store_prefix(&pool, &g, 3, &commit, commit_stores);
            let what = format!("{logged_stores} stores logged, {in_place} written in place, {commit_stores} of COMMIT");
            let report = recover(&pool, &g).unwrap_or_else(|e| panic!("{what}: refused: {e}"));
            let done = commit_stores == stores_per_line;
            let want: ([u8; 8], [u8; 8]) = if done { ([2; 8], [4; 8]) } else { ([1; 8], [3; 8]) };
            let got = (pool.read_array::<8>(a).unwrap(), pool.read_array::<8>(b).unwrap());
            assert_eq!(got, want, "{what}: {report:?}");
        };
        for k in 0..=logged.len() * stores_per_line {
            check(k, 0, 0);
        }
        for w in 0..=2 {
            check(logged.len() * stores_per_line, w, 0);
        }
        for k in 0..=stores_per_line {
            check(logged.len() * stores_per_line, 2, k);
        }
    }

    /// A line whose check word is not zero but whose checksum fails is damage, not a crash:
    /// inside an unfinished transaction it still refuses the mount.
    #[test]
    fn a_damaged_line_inside_an_unfinished_transaction_still_refuses() {
        let (_d, pool, g) = setup();
        let target = g.data_start * 4096;
        put(&pool, &g, 0, 0, &entry(4, KIND_START, 4, 0, &[]));
        put(&pool, &g, 0, 1, &entry(4, KIND_UNDO_INLINE, 4, target, &[9; 8]));
        let mut bad = entry(4, KIND_UNDO_INLINE, 4, target + 8, &[9; 8]);
        bad[30] ^= 0x40;
        put(&pool, &g, 0, 2, &bad);
        let e = plan(&pool, &g, Some(EPOCH)).unwrap_err();
        assert!(matches!(&e, Error::Corrupted(m) if m.contains("journal 0 entry 2: unreadable")), "{e}");
    }
}
