//! Block claims: every run of data blocks an inode owns, with what it holds there (file data at
//! a logical block, an extent-index block, the xattr block), and the runs two claims share.
//! Mount refuses a pool with a shared run, fsck lists each one with both owners, and
//! `fsck --repair` gives each file its own copy (`ops::repair`).

use crate::media::alloc::BlockRun;
use crate::state::inode_state::InodeState;
use std::fmt;

/// What a claimed run holds for its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimKind {
    /// File (or directory, or symlink) data; the run starts at this logical block.
    Data { logical: u64 },
    /// A block of the inode's extent-index chain.
    Index,
    /// The inode's xattr block.
    Xattr,
}

/// One run of blocks one inode claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub run: BlockRun,
    pub ino: u64,
    pub kind: ClaimKind,
}

impl Claim {
    /// The logical block at pool block `phys` of a data claim.
    pub fn logical_at(&self, phys: u64) -> Option<u64> {
        match self.kind {
            ClaimKind::Data { logical } => Some(logical + (phys - self.run.start)),
            _ => None,
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ClaimKind::Data { logical } => write!(f, "inode {} (data, logical {logical})", self.ino),
            ClaimKind::Index => write!(f, "inode {} (extent-index block)", self.ino),
            ClaimKind::Xattr => write!(f, "inode {} (xattr block)", self.ino),
        }
    }
}

/// A run of blocks claimed by two claims (of two inodes, or of one inode twice); each claim
/// is as the inode has it, so the part shared is `run`, not necessarily all of either.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared {
    pub run: BlockRun,
    pub a: Claim,
    pub b: Claim,
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, e) = (self.run.start, self.run.start + self.run.len - 1);
        // Each owner is named at the first shared block.
        let at = |c: &Claim| Claim {
            kind: match c.kind {
                ClaimKind::Data { .. } => ClaimKind::Data {
                    logical: c.logical_at(s).unwrap_or(0),
                },
                k => k,
            },
            ..*c
        };
        if s == e {
            write!(f, "block {s} claimed by {} and {}", at(&self.a), at(&self.b))
        } else {
            write!(f, "blocks {s}..{e} claimed by {} and {}", at(&self.a), at(&self.b))
        }
    }
}

/// Every claim of every inode in `nodes`, sorted by first block.
pub(crate) fn claims_of<'a>(nodes: impl IntoIterator<Item = &'a InodeState>) -> Vec<Claim> {
    let mut v = Vec::new();
    for n in nodes {
        push_claims(n, &mut v);
    }
    v.sort_by_key(|c| (c.run.start, c.ino));
    v
}

/// Append the claims of inode `n` to `v` (its data extents, extent-index blocks and xattr
/// block: every block it owns), unsorted.
pub(crate) fn push_claims(n: &InodeState, v: &mut Vec<Claim>) {
    let c = |run, kind| Claim {
        run,
        ino: n.ino,
        kind,
    };
    v.extend(n.map.extents.iter().map(|(&l, e)| {
        c(
            BlockRun {
                start: e.phys,
                len: e.len,
            },
            ClaimKind::Data { logical: l },
        )
    }));
    v.extend(
        n.map
            .index_blocks()
            .iter()
            .map(|&b| c(BlockRun { start: b, len: 1 }, ClaimKind::Index)),
    );
    if n.hdr.xattr_block != 0 {
        v.push(c(
            BlockRun {
                start: n.hdr.xattr_block,
                len: 1,
            },
            ClaimKind::Xattr,
        ));
    }
}

/// Every block the claims hold: (run, owner), in the claims' order (by first block when they
/// are sorted, as [`claims_of`] gives them).
pub(crate) fn owned(claims: &[Claim]) -> Vec<(BlockRun, u64)> {
    claims.iter().map(|c| (c.run, c.ino)).collect()
}

/// Every pair of `claims` (sorted by first block) that overlap, with the blocks they share.
pub(crate) fn shared(claims: &[Claim]) -> Vec<Shared> {
    let mut out = Vec::new();
    // Claims that may still overlap what comes next.
    let mut open: Vec<Claim> = Vec::new();
    for c in claims {
        open.retain(|o| o.run.start + o.run.len > c.run.start);
        for o in &open {
            let end = (o.run.start + o.run.len).min(c.run.start + c.run.len);
            out.push(Shared {
                run: BlockRun {
                    start: c.run.start,
                    len: end - c.run.start,
                },
                a: *o,
                b: *c,
            });
        }
        open.push(*c);
    }
    out
}

/// `runs` sorted by start, with overlapping runs joined (touching ones are kept apart: each
/// run an inode owns lies in one allocator partition, and a join could cross two).
pub(crate) fn merged(mut runs: Vec<BlockRun>) -> Vec<BlockRun> {
    runs.sort_by_key(|r| r.start);
    let mut out: Vec<BlockRun> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if last.start + last.len > r.start => {
                last.len = last.len.max(r.start + r.len - last.start);
            }
            _ => out.push(r),
        }
    }
    out
}

/// `runs` less every block of `taken` (sorted by start; may overlap each other).
pub(crate) fn subtract(runs: &[BlockRun], taken: &[BlockRun]) -> Vec<BlockRun> {
    let mut out = Vec::new();
    for r in runs {
        let mut cur = r.start;
        let end = r.start + r.len;
        for t in taken {
            if t.start >= end {
                break;
            }
            let t_end = t.start + t.len;
            if t_end <= cur {
                continue;
            }
            if t.start > cur {
                out.push(BlockRun {
                    start: cur,
                    len: t.start - cur,
                });
            }
            cur = cur.max(t_end);
        }
        if cur < end {
            out.push(BlockRun {
                start: cur,
                len: end - cur,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(start: u64, len: u64, ino: u64, kind: ClaimKind) -> Claim {
        Claim {
            run: BlockRun { start, len },
            ino,
            kind,
        }
    }

    #[test]
    fn shared_runs_name_both_owners_at_the_first_shared_block() {
        let mut v = vec![
            claim(100, 10, 17, ClaimKind::Data { logical: 0 }),
            claim(105, 1, 42, ClaimKind::Index),
            claim(108, 4, 42, ClaimKind::Data { logical: 7 }),
            claim(200, 1, 3, ClaimKind::Xattr),
        ];
        v.sort_by_key(|c| (c.run.start, c.ino));
        let s = shared(&v);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0].to_string(),
            "block 105 claimed by inode 17 (data, logical 5) and inode 42 (extent-index block)"
        );
        assert_eq!(
            s[1].to_string(),
            "blocks 108..109 claimed by inode 17 (data, logical 8) and inode 42 (data, logical 7)"
        );
    }

    #[test]
    fn subtract_cuts_around_taken_runs() {
        let r = |start, len| BlockRun { start, len };
        assert_eq!(
            subtract(&[r(10, 10), r(30, 2)], &[r(5, 7), r(14, 2), r(15, 2), r(31, 5)]),
            vec![r(12, 2), r(17, 3), r(30, 1)]
        );
        assert_eq!(subtract(&[r(10, 4)], &[]), vec![r(10, 4)]);
        assert_eq!(
            merged(vec![r(20, 5), r(10, 4), r(12, 1), r(14, 2), r(22, 1)]),
            vec![r(10, 4), r(14, 2), r(20, 5)]
        );
    }
}
