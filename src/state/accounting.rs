//! Write accounting: what each kind of operation wrote to the pool, per category of traffic
//! (`media::pool::Category`), so write amplification is measured, not guessed. The `Fs` facade
//! opens one `OpScope` per call; the scope takes the calling thread's counters
//! (`pool::thread_stats`) at both ends, so concurrent operations never count each other's
//! bytes. A scope opened inside another (one facade call making another) counts nothing: the
//! outer one already covers it.

use crate::media::persist_stats::ThreadSharded;
use crate::media::pool::{CATEGORIES, Category, PersistStats, thread_stats};
use serde::Serialize;
use std::cell::Cell;

/// The kinds of operation counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// create, mknod, symlink.
    Create = 0,
    /// mkdir.
    Mkdir,
    /// unlink and rmdir.
    Unlink,
    /// rename.
    Rename,
    /// link.
    Link,
    /// write at an offset.
    Write,
    /// append at the end of the file.
    Append,
    /// read.
    Read,
    /// truncate and size changes by setattr.
    Truncate,
    /// fallocate and its modes (punch, zero, collapse, insert).
    Fallocate,
    /// setattr other than size.
    Setattr,
    /// fsync.
    Fsync,
    /// xattr changes.
    Xattr,
    /// direct-path leases and their release, mappings.
    Lease,
    /// work of the background thread (rewrites, compaction, slot write-back).
    Background,
    /// open, release and everything else.
    Other,
}

/// Number of [`OpKind`] values.
const KINDS: usize = 16;

impl OpKind {
    const ALL: [OpKind; KINDS] = [
        OpKind::Create,
        OpKind::Mkdir,
        OpKind::Unlink,
        OpKind::Rename,
        OpKind::Link,
        OpKind::Write,
        OpKind::Append,
        OpKind::Read,
        OpKind::Truncate,
        OpKind::Fallocate,
        OpKind::Setattr,
        OpKind::Fsync,
        OpKind::Xattr,
        OpKind::Lease,
        OpKind::Background,
        OpKind::Other,
    ];

    /// Name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Mkdir => "mkdir",
            OpKind::Unlink => "unlink",
            OpKind::Rename => "rename",
            OpKind::Link => "link",
            OpKind::Write => "write",
            OpKind::Append => "append",
            OpKind::Read => "read",
            OpKind::Truncate => "truncate",
            OpKind::Fallocate => "fallocate",
            OpKind::Setattr => "setattr",
            OpKind::Fsync => "fsync",
            OpKind::Xattr => "xattr",
            OpKind::Lease => "lease",
            OpKind::Background => "background",
            OpKind::Other => "other",
        }
    }
}

/// Counters per kind: operations, user bytes, bytes per category, fences.
const PER_KIND: usize = 2 + CATEGORIES + 1;
const OPS: usize = 0;
const USER_BYTES: usize = 1;
const BYTES: usize = 2;
const FENCES: usize = 2 + CATEGORIES;

/// The mount's counters, [`PER_KIND`] per [`OpKind`]. Every operation adds to them, from every
/// thread, so they are sharded by thread (`media::persist_stats::ThreadSharded`): shared
/// atomic adds cost varmail's three threads about 4% of their operations.
#[derive(Default)]
pub(crate) struct Accounting {
    counters: ThreadSharded<{ KINDS * PER_KIND }>,
}

thread_local! {
    /// Whether this thread is inside a scope already.
    static IN_SCOPE: Cell<bool> = const { Cell::new(false) };
}

/// One operation being counted; the counts land when it drops.
pub(crate) struct OpScope<'a> {
    /// The mount's counters and the operation's kind; None for a scope nested in another.
    counters: Option<(&'a Accounting, OpKind)>,
    start: PersistStats,
    user_bytes: u64,
}

impl OpScope<'_> {
    /// The caller asked for `n` bytes of file contents to be written.
    pub fn user_bytes(&mut self, n: u64) {
        self.user_bytes += n;
    }
}

impl Drop for OpScope<'_> {
    fn drop(&mut self) {
        let Some((acc, kind)) = self.counters else { return };
        IN_SCOPE.with(|s| s.set(false));
        acc.add(kind, &thread_stats().since(&self.start), self.user_bytes);
    }
}

impl Accounting {
    /// Start counting one operation of `kind` on this thread.
    pub fn scope(&self, kind: OpKind) -> OpScope<'_> {
        let outer = IN_SCOPE.with(|s| !s.replace(true));
        OpScope {
            counters: outer.then_some((self, kind)),
            start: thread_stats(),
            user_bytes: 0,
        }
    }

    /// Count one operation of `kind` that wrote `d` (measured by the caller, e.g. a background
    /// job that cannot hold the mount across its work).
    pub fn record(&self, kind: OpKind, d: &PersistStats) {
        self.add(kind, d, 0);
    }

    fn add(&self, kind: OpKind, d: &PersistStats, user_bytes: u64) {
        let at = kind as usize * PER_KIND;
        self.counters.add(at + OPS, 1);
        if user_bytes > 0 {
            self.counters.add(at + USER_BYTES, user_bytes);
        }
        for (i, &b) in d.bytes_written.iter().enumerate() {
            if b > 0 {
                self.counters.add(at + BYTES + i, b);
            }
        }
        if d.fences > 0 {
            self.counters.add(at + FENCES, d.fences);
        }
    }

    /// The counts so far, kinds with no operations left out.
    pub fn snapshot(&self) -> Vec<OpStats> {
        OpKind::ALL
            .iter()
            .filter_map(|&k| {
                let at = k as usize * PER_KIND;
                let get = |i: usize| self.counters.sum(at + i);
                let ops = get(OPS);
                (ops > 0).then(|| OpStats {
                    op: k.name().to_string(),
                    ops,
                    user_bytes: get(USER_BYTES),
                    bytes: Category::ALL
                        .iter()
                        .map(|cat| (cat.name().to_string(), get(BYTES + *cat as usize)))
                        .collect(),
                    fences: get(FENCES),
                })
            })
            .collect()
    }
}

/// A mount's write accounting: per kind of operation, and the pool's totals (which also hold
/// what no counted operation wrote: mount, recovery, unmount). `winefs stat` prints it; a FUSE
/// mount answers it as JSON in the virtual xattr `user.winefs.stats` of its root.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct WriteStats {
    /// Per kind of operation, kinds with no operations left out.
    pub ops: Vec<OpStats>,
    /// Bytes stored per category since the pool was opened.
    pub pool_bytes: Vec<(String, u64)>,
    /// Fences since the pool was opened.
    pub pool_fences: u64,
}

impl WriteStats {
    /// The accounting of `acc` with the pool totals `pool`.
    pub(crate) fn new(acc: &Accounting, pool: &PersistStats) -> WriteStats {
        WriteStats {
            ops: acc.snapshot(),
            pool_bytes: Category::ALL
                .iter()
                .map(|c| (c.name().to_string(), pool.bytes_written[*c as usize]))
                .collect(),
            pool_fences: pool.fences,
        }
    }
}

impl std::fmt::Display for WriteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "| operation  |       ops |   user bytes |")?;
        for c in Category::ALL {
            write!(f, " {:>11} |", c.name())?;
        }
        writeln!(f, "  total bytes | x user | bytes/op | fences/op |")?;
        write!(f, "|------------|----------:|-------------:|")?;
        for _ in Category::ALL {
            write!(f, "------------:|")?;
        }
        writeln!(f, "-------------:|-------:|---------:|----------:|")?;
        for o in &self.ops {
            write!(f, "| {:<10} | {:>9} | {:>12} |", o.op, o.ops, o.user_bytes)?;
            for (_, b) in &o.bytes {
                write!(f, " {b:>11} |")?;
            }
            let total = o.total_bytes();
            let amp = if o.user_bytes > 0 {
                format!("{:.2}", total as f64 / o.user_bytes as f64)
            } else {
                "-".into()
            };
            let n = o.ops.max(1) as f64;
            writeln!(
                f,
                " {total:>12} | {amp:>6} | {:>8.0} | {:>9.2} |",
                total as f64 / n,
                o.fences as f64 / n
            )?;
        }
        write!(f, "| pool total |           |              |")?;
        for (_, b) in &self.pool_bytes {
            write!(f, " {b:>11} |")?;
        }
        let total: u64 = self.pool_bytes.iter().map(|b| b.1).sum();
        writeln!(f, " {total:>12} |        |          |           |")?;
        write!(f, "\n{} fences in all", self.pool_fences)
    }
}

/// What the operations of one kind wrote.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct OpStats {
    /// The kind (`create`, `write`, ...).
    pub op: String,
    /// Operations counted.
    pub ops: u64,
    /// File bytes the callers asked to write.
    pub user_bytes: u64,
    /// Bytes stored per category (`data`, `metadata`, `journal`, `cow`, `slot`, `writeback`).
    pub bytes: Vec<(String, u64)>,
    /// Store fences issued.
    pub fences: u64,
}

impl OpStats {
    /// Bytes stored in every category.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().map(|b| b.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::pool::Pool;

    #[test]
    fn scopes_count_their_own_thread_and_nest_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let pool = Pool::open(&path, false).unwrap();
        let acc = Accounting::default();
        {
            let mut s = acc.scope(OpKind::Write);
            s.user_bytes(100);
            pool.write_flush(0, &[1u8; 100], Category::Data).unwrap();
            {
                let _inner = acc.scope(OpKind::Create);
                pool.write_flush(4096, &[2u8; 64], Category::Journal).unwrap();
            }
            pool.fence();
        }
        // Another thread's traffic is not this operation's.
        std::thread::scope(|t| {
            t.spawn(|| pool.write_flush(8192, &[3u8; 50], Category::Data).unwrap());
        });
        let snap = acc.snapshot();
        assert_eq!(snap.len(), 1, "{snap:?}");
        let w = &snap[0];
        assert_eq!((w.op.as_str(), w.ops, w.user_bytes, w.fences), ("write", 1, 100, 1));
        assert_eq!(w.bytes[0], ("data".to_string(), 100));
        assert_eq!(w.bytes[2], ("journal".to_string(), 64));
        assert_eq!(w.total_bytes(), 164);
    }

    #[test]
    fn operations_of_many_threads_add_up_per_kind() {
        let acc = Accounting::default();
        let d = PersistStats { fences: 2, ..Default::default() };
        // More threads than owned shards, so some share one.
        std::thread::scope(|t| {
            for i in 0..40u64 {
                let acc = &acc;
                t.spawn(move || {
                    for _ in 0..100 {
                        acc.record(OpKind::Unlink, &d);
                        acc.scope(OpKind::Read).user_bytes(i);
                    }
                });
            }
        });
        let snap = acc.snapshot();
        let get = |op: &str| snap.iter().find(|o| o.op == op).unwrap();
        assert_eq!((get("unlink").ops, get("unlink").fences), (4000, 8000));
        assert_eq!((get("read").ops, get("read").user_bytes), (4000, 100 * (0..40).sum::<u64>()));
        assert_eq!(snap.len(), 2, "{snap:?}");
    }
}
