//! What the crash explorer draws from: the operations that build each starting file system and
//! the catalogue of operations over their names (split from `workload`, which defines them).

use crate::crash::workload::{Op, Removal, Start};
use crate::media::layout::{HUGE_SIZE, INODE_NOATIME, INODE_NODUMP};

impl Start {
    /// Operations that build this start from a fresh file system.
    pub fn setup(self) -> Vec<Op> {
        match self {
            Start::Fresh => Vec::new(),
            Start::Fragmented => {
                let mut v = Vec::new();
                for g in ["g", "h"] {
                    for i in 0..40 {
                        let path = format!("/{g}{i}");
                        v.push(Op::Create(path.clone()));
                        v.push(Op::Write {
                            path,
                            off: 0,
                            len: 48 << 10,
                            fill: i as u8,
                        });
                    }
                }
                v.push(Op::SetXattr {
                    path: "/g10".into(),
                    name: "user.k".into(),
                    len: 100,
                    fill: 9,
                });
                v.push(Op::Mkdir("/M".into()));
                v.push(Op::Create("/M/f".into()));
                v.push(Op::Write {
                    path: "/M/f".into(),
                    off: 0,
                    len: 5000,
                    fill: 8,
                });
                for i in (0..40).filter(|i| ![0, 10, 20].contains(i)) {
                    v.push(Op::Unlink(format!("/g{i}")));
                }
                for i in 0..20 {
                    v.push(Op::Unlink(format!("/h{i}")));
                }
                v
            }
            Start::Populated => vec![
                Op::Create("/A".into()),
                Op::Write {
                    path: "/A".into(),
                    off: 0,
                    len: 5000,
                    fill: 1,
                },
                Op::SetXattr {
                    path: "/A".into(),
                    name: "user.a".into(),
                    len: 40,
                    fill: 2,
                },
                Op::Create("/B".into()),
                Op::Write {
                    path: "/B".into(),
                    off: 0,
                    len: HUGE_SIZE + 12288,
                    fill: 3,
                },
                // A deleted file's bytes in free aligned units: a fresh unit a write takes is
                // not zeroed past the write, and they must never show.
                Op::Create("/J".into()),
                Op::Write {
                    path: "/J".into(),
                    off: 0,
                    len: 4 * HUGE_SIZE,
                    fill: 0x77,
                },
                Op::Unlink("/J".into()),
                Op::Mkdir("/D".into()),
                Op::Create("/D/C".into()),
                Op::Write {
                    path: "/D/C".into(),
                    off: 0,
                    len: 100,
                    fill: 4,
                },
                // An access ACL for the chmod on a full pool to rewrite.
                Op::SetAcl {
                    path: "/D/C".into(),
                    default: false,
                },
                Op::Mkdir("/D/K".into()),
                // What is made in /D/K inherits this ACL in its create's transaction.
                Op::SetAcl {
                    path: "/D/K".into(),
                    default: true,
                },
                Op::Mkdir("/E".into()),
                Op::Symlink {
                    path: "/S".into(),
                    target: "A".into(),
                },
                Op::Link {
                    from: "/A".into(),
                    to: "/D/H".into(),
                },
            ],
        }
    }
}

/// Every operation the generator draws from.
pub fn catalogue() -> Vec<Op> {
    let s = |p: &str| p.to_string();
    let mut ops = vec![
        Op::Create(s("/X")),
        Op::Create(s("/D/Y")),
        Op::Create(s("/D/K/N")),
        Op::Mkdir(s("/F")),
        Op::Mkdir(s("/D/G")),
        Op::Mkdir(s("/D/K/M")),
        Op::Symlink {
            path: s("/S2"),
            target: s("D/C"),
        },
    ];
    let w = |p: &str, off: u64, len: u64, fill: u8| Op::Write {
        path: s(p),
        off,
        len,
        fill,
    };
    for (i, p) in ["/A", "/B", "/X", "/D/C"].iter().enumerate() {
        let f = 10 + i as u8 * 4;
        ops.push(w(p, 0, 4096, f)); // aligned, small
        ops.push(w(p, 1000, 100, f + 1)); // unaligned, small
        ops.push(Op::Append {
            path: s(p),
            len: 3000,
            fill: f + 2,
        });
        ops.push(Op::Fsync(s(p)));
    }
    ops.extend([
        // Several units in one transaction (strict): a partial head, two whole units (fresh
        // extents swapped in) and a partial tail; and one whole aligned unit of /B plus a block.
        w("/A", 100, 3 * HUGE_SIZE, 45),
        w("/B", 0, HUGE_SIZE + 4096, 46),
        w("/A", 12305, 9000, 40),            // unaligned, several blocks, past EOF
        w("/B", 4096, 8192, 41),             // in place in an aligned extent (strict: data journal)
        w("/B", HUGE_SIZE - 4096, 8192, 42), // across the 2 MiB unit boundary: two pieces
        w("/X", HUGE_SIZE / 2, HUGE_SIZE + 4096, 43), // large, two pieces, into holes
        w("/B", 3 * HUGE_SIZE, 5000, 47), // past a gap, into a fresh unit of a large file
        Op::Append {
            path: s("/D/C"),
            len: HUGE_SIZE + 1000,
            fill: 44,
        },
        Op::Truncate {
            path: s("/A"),
            size: 0,
        },
        Op::Truncate {
            path: s("/A"),
            size: 1234,
        },
        Op::Truncate {
            path: s("/A"),
            size: 100_000,
        },
        Op::Truncate {
            path: s("/B"),
            size: 4096,
        },
        Op::Fallocate {
            path: s("/A"),
            off: 0,
            len: HUGE_SIZE + (HUGE_SIZE >> 1),
            keep_size: false,
        },
        Op::Fallocate {
            path: s("/A"),
            off: 16384,
            len: 8192,
            keep_size: true,
        },
        Op::Fallocate {
            path: s("/X"),
            off: 0,
            len: 4096,
            keep_size: false,
        },
    ]);
    // The range-rewriting fallocate modes, each one transaction: zero range in a small file
    // (partial blocks, growing), in place in /B's aligned unit, over /B's whole aligned unit
    // (a fresh aligned extent) and past the end of /D/C; collapse and insert by blocks (extents
    // split and shifted) and by a whole unit (aligned extents moved as they are).
    let zero = |p: &str, off: u64, len: u64, keep_size: bool| Op::ZeroRange {
        path: s(p),
        off,
        len,
        keep_size,
    };
    let collapse = |p: &str, off: u64, len: u64| Op::CollapseRange {
        path: s(p),
        off,
        len,
    };
    let insert = |p: &str, off: u64, len: u64| Op::InsertRange {
        path: s(p),
        off,
        len,
    };
    ops.extend([
        zero("/A", 1000, 5000, false),
        zero("/B", 4096 + 100, 8000, true),
        zero("/B", 0, HUGE_SIZE, true),
        zero("/D/C", 50, HUGE_SIZE, false),
        collapse("/B", 4096, 8192),
        collapse("/B", 0, HUGE_SIZE),
        insert("/B", 4096, 4096),
        insert("/B", HUGE_SIZE, HUGE_SIZE),
        insert("/A", 0, 8192),
        Op::Link {
            from: s("/A"),
            to: s("/D/L"),
        },
        Op::Link {
            from: s("/X"),
            to: s("/D/L"),
        },
        Op::LinkUnnamed {
            path: s("/T"),
            len: 5000,
            fill: 24,
        },
        Op::LinkUnnamed {
            path: s("/D/T"),
            len: HUGE_SIZE + 4096,
            fill: 25,
        },
        Op::Unlink(s("/A")),
        Op::Unlink(s("/D/C")),
        Op::Unlink(s("/X")),
        Op::Unlink(s("/S")),
        // As the FUSE front end removes: kept for the kernel, then released.
        Op::RemoveHeld { path: s("/B"), how: Removal::Unlink },
        Op::RemoveHeld { path: s("/D/C"), how: Removal::RenameOver(s("/A")) },
        Op::RemoveHeld { path: s("/E"), how: Removal::Rmdir },
        Op::Rename {
            from: s("/A"),
            to: s("/Z"),
        },
        Op::Rename {
            from: s("/D"),
            to: s("/F"),
        },
        Op::Rename {
            from: s("/A"),
            to: s("/D/C"),
        },
        Op::Rename {
            from: s("/D/C"),
            to: s("/B"),
        },
        Op::Rename {
            from: s("/E"),
            to: s("/D/K"),
        },
        Op::Rename {
            from: s("/X"),
            to: s("/D/Y"),
        },
        // A whiteout left at a file's name, at a replaced file's, and at a directory's.
        Op::RenameWhiteout {
            from: s("/A"),
            to: s("/Z"),
        },
        Op::RenameWhiteout {
            from: s("/D/C"),
            to: s("/B"),
        },
        Op::RenameWhiteout {
            from: s("/E"),
            to: s("/D/K"),
        },
        Op::Rmdir(s("/E")),
        Op::Rmdir(s("/F")),
        Op::Rmdir(s("/D/K")),
        Op::SetXattr {
            path: s("/A"),
            name: s("user.k"),
            len: 16,
            fill: 50,
        },
        Op::SetXattr {
            path: s("/A"),
            name: s("user.a"),
            len: 2000,
            fill: 51,
        },
        Op::SetXattr {
            path: s("/D"),
            name: s("user.k"),
            len: 100,
            fill: 52,
        },
        Op::SetXattr {
            path: s("/X"),
            name: s("user.k"),
            len: 30,
            fill: 53,
        },
        Op::RemoveXattr {
            path: s("/A"),
            name: s("user.a"),
        },
        // With no block free: a new attribute, and one removed (privilege dropping after a
        // write removes `security.capability` so), each rewriting /A's block in place.
        Op::XattrNoSpace { path: s("/A"), name: s("user.k"), value: Some((300, 54)) },
        Op::XattrNoSpace { path: s("/A"), name: s("user.a"), value: None },
        // No-dump and no-atime on a file, no-dump on a directory (chattr +dA, +d).
        Op::SetFlags {
            path: s("/A"),
            flags: INODE_NODUMP | INODE_NOATIME,
        },
        Op::SetFlags {
            path: s("/D"),
            flags: INODE_NODUMP,
        },
        // An access ACL on a file (the mode follows), a default ACL on a directory (what is
        // made in it next inherits it in its create), and a chmod of a file (its ACL follows).
        Op::SetAcl { path: s("/A"), default: false },
        Op::SetAcl { path: s("/D"), default: true },
        Op::Chmod { path: s("/A"), perm: 0o751 },
        // A chmod with no block free of a file whose access ACL (from the start) follows: its
        // attribute block is rewritten in place.
        Op::ChmodNoSpace { path: s("/D/C"), perm: 0o751 },
    ]);
    ops.push(Op::Compact);
    let msync = |p: &str, off: u64, len: u64, fill: u8| Op::Msync {
        path: s(p),
        off,
        len,
        fill,
    };
    ops.extend([
        msync("/A", 3000, 1500, 60),             // two pages of a small file
        msync("/B", HUGE_SIZE - 4096, 8192, 61), // across the aligned unit's boundary
        msync("/X", 0, 6000, 62),                // a file written (or not) earlier in the workload
    ]);
    ops.extend([
        Op::DirectAppend { path: s("/A"), len: 5000, fill: 63 },
        Op::DirectAppend { path: s("/X"), len: 700, fill: 64 },
        // A small file, and /B's aligned unit kept past the shrunk end and grown back over.
        Op::LeasedShrink { path: s("/A"), shrink_to: 3000, zero: (100, 200), punch: (1500, 700) },
        Op::LeasedShrink {
            path: s("/B"),
            shrink_to: (1 << 20) + 100,
            zero: (300_000, 200_000),
            punch: (600_000, 100_000),
        },
    ]);
    // Alternate writing: partial lines of a small file's block, a whole block and one line in
    // /B's aligned unit.
    let alternate = |p: &str, off: u64, len: u64, fill: u8| Op::Alternate {
        path: s(p),
        off,
        len,
        fill,
    };
    ops.extend([
        alternate("/A", 1000, 100, 65),
        alternate("/B", 4096, 4096, 68),
        alternate("/B", 8192 + 640, 64, 71),
        // More slots than the explorer's fixed zone (64) keeps free: the zone grows.
        Op::AlternateMany { path: s("/B"), blocks: 56, fill: 74 },
    ]);
    ops
}
