//! ACE-style workloads for the crash explorer: the operations and what each does, and the
//! starting file systems (fresh, pre-populated and fragmented); `catalogue` lists what is
//! drawn from, and `model` draws sequences of it.

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::layout::{BLOCK_SIZE, HUGE_SIZE};
use crate::media::pool::Category;
use crate::state::size_word;
use crate::meta::acl::{self, NO_ID};
use crate::types::{Consistency, RenameFlags, SetAttr, XattrSet};
use std::fmt;

/// One file-system operation of a workload. Paths are absolute in the explored file system.
///
/// Adding an operation takes a variant here, its `apply` and `Display` arms, its precondition in `model::Model::allows`
/// and its effect in `model::Model::apply`, and entries in `catalogue::catalogue`; if it is not atomic as a whole, its
/// documented atomic steps in `steps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create(String),
    Mkdir(String),
    Symlink {
        path: String,
        target: String,
    },
    /// `len` bytes at `off`; byte x of the file becomes `pattern(fill, x)`.
    Write {
        path: String,
        off: u64,
        len: u64,
        fill: u8,
    },
    Append {
        path: String,
        len: u64,
        fill: u8,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Fallocate {
        path: String,
        off: u64,
        len: u64,
        keep_size: bool,
    },
    /// FALLOC_FL_ZERO_RANGE (with `keep_size`, | KEEP_SIZE).
    ZeroRange {
        path: String,
        off: u64,
        len: u64,
        keep_size: bool,
    },
    /// FALLOC_FL_COLLAPSE_RANGE.
    CollapseRange {
        path: String,
        off: u64,
        len: u64,
    },
    /// FALLOC_FL_INSERT_RANGE.
    InsertRange {
        path: String,
        off: u64,
        len: u64,
    },
    Link {
        from: String,
        to: String,
    },
    /// What open(2) with `O_TMPFILE`, a write and `linkat(2)` do (`Fs::create_unnamed`): a
    /// file in no directory, `len` bytes written to it, then named `path`, then released. No
    /// crash shows it half made: before its link it is an orphan the mount frees.
    LinkUnnamed {
        path: String,
        len: u64,
        fill: u8,
    },
    Unlink(String),
    /// An unlink, rmdir or rename (replacing `to`) as the FUSE front end makes them
    /// (`Fs::unlink_held` and its kin): the inode losing its last name is kept while the kernel
    /// holds it, then let go at the kernel's FORGET (`Fs::let_go`), which frees it.
    RemoveHeld {
        path: String,
        how: Removal,
    },
    Rename {
        from: String,
        to: String,
    },
    /// renameat2(2) with `RENAME_WHITEOUT`: the rename, and a whiteout (a character device
    /// 0:0) at `from`, in one transaction.
    RenameWhiteout {
        from: String,
        to: String,
    },
    Rmdir(String),
    SetXattr {
        path: String,
        name: String,
        len: usize,
        fill: u8,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    /// Set (`value`: length and fill) or remove attribute `name` of a file that has
    /// attributes, on a pool with no free block: the block is rewritten in place under the
    /// journal instead of copied (docs/DESIGN.md §2, "Xattr block").
    XattrNoSpace {
        path: String,
        name: String,
        value: Option<(usize, u8)>,
    },
    /// setfacl: give `path` an ACL with a named user (`default`: its default ACL, a
    /// directory's; else its access ACL, which sets the permission bits in the same
    /// transaction).
    SetAcl {
        path: String,
        default: bool,
    },
    /// chmod: the permission bits of `path` become `perm`; an access ACL's owner, mask and
    /// others entries follow in the same transaction.
    Chmod {
        path: String,
        perm: u32,
    },
    /// chmod as [`Op::Chmod`], on a pool with no free block: the access ACL's block is
    /// rewritten in place under the journal, in the chmod's transaction (docs/DESIGN.md §2,
    /// "Xattr block").
    ChmodNoSpace {
        path: String,
        perm: u32,
    },
    /// `chattr`: set the user's inode flags of `path` to `flags` (`Fs::set_inode_flags`). The
    /// catalogue sets only no-dump and no-atime, which change what no later operation may do.
    SetFlags {
        path: String,
        flags: u32,
    },
    Fsync(String),
    /// Hole compaction (`Fs::compact`): data, directory and xattr blocks move; nothing
    /// observable changes, at any crash point.
    Compact,
    /// Map the file, store `len` bytes at `off` through the mapping (clipped to the file's
    /// size: a store past EOF would fault) and msync them. Strict mode uses an atomic mapping
    /// (`File::mmap_atomic`: the msync is one transaction); relaxed mode a plain shared
    /// mapping (stores go to media in place; msync writes their cache lines back).
    Msync {
        path: String,
        off: u64,
        len: u64,
        fill: u8,
    },
    /// What a direct-path client's append does (docs/DESIGN.md §7b): take an append lease of
    /// the end of the file, store `len` bytes into the reserved blocks, grow the size word,
    /// store more bytes past the new end as an append whose swap failed would, then `fsync`
    /// (the daemon pulls the size in) and give the lease back.
    DirectAppend {
        path: String,
        len: u64,
        fill: u8,
    },
    /// What a program mapping the file through the preload library sees the daemon do
    /// (docs/DESIGN.md §7b, "Leases"): lease the whole file, truncate it to `shrink_to`, zero
    /// range `zero` (offset, length; KEEP_SIZE), punch hole `punch`, truncate it back to its
    /// size, give the lease back. Under the lease the blocks stay with the file and bytes are
    /// zeroed in place (each range here lies within one transaction's piece).
    LeasedShrink {
        path: String,
        shrink_to: u64,
        zero: (u64, u64),
        punch: (u64, u64),
    },
    /// Write `len` bytes at `off` three times (fills `fill`, `fill + 1`, `fill + 2`), then
    /// truncate the file to its size, which changes nothing but writes alternate slots back
    /// home: in strict mode the writes alternate (slot, home, slot; docs/DESIGN.md §5), so the
    /// crash points fall between a slot's stores and its descriptor, between stores at home and
    /// the descriptor's clear, and inside the write-back.
    Alternate {
        path: String,
        off: u64,
        len: u64,
        fill: u8,
    },
    /// Write one 64-byte line into each of the first `blocks` blocks of the file (line
    /// `b % 64` of block `b`), then truncate it to its size: in strict mode each write takes a
    /// slot of its own, more than the fixed zone of the explorer's pool keeps free, so the
    /// zone grows into a unit (docs/DESIGN.md §5, "Growth") and the crash points fall inside
    /// the growth and on slots in the unit.
    AlternateMany {
        path: String,
        blocks: u64,
        fill: u8,
    },
}

/// Which removal an [`Op::RemoveHeld`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    Unlink,
    Rmdir,
    /// A rename of this path over the removed one.
    RenameOver(String),
}

/// The writes of [`Op::AlternateMany`]: (offset, length) of line `b % 64` of each block `b`.
fn many_lines(blocks: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..blocks).map(|b| (b * 4096 + b % 64 * 64, 64))
}

/// Byte `x` of data written with `fill`: a function of the file offset, so a write split into
/// pieces writes exactly the bytes the whole write does.
pub fn pattern(fill: u8, x: u64) -> u8 {
    (x as u8).wrapping_mul(7) ^ ((x >> 9) as u8) ^ fill
}

fn pattern_bytes(fill: u8, off: u64, len: u64) -> Vec<u8> {
    (off..off + len).map(|x| pattern(fill, x)).collect()
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create(p) => write!(f, "create {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Symlink { path, target } => write!(f, "symlink {path} -> {target}"),
            Op::Write {
                path,
                off,
                len,
                fill,
            } => write!(f, "write {path} {off}+{len} fill {fill}"),
            Op::Append { path, len, fill } => write!(f, "append {path} +{len} fill {fill}"),
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Fallocate {
                path,
                off,
                len,
                keep_size,
            } => write!(
                f,
                "fallocate {path} {off}+{len}{}",
                if *keep_size { " keep_size" } else { "" }
            ),
            Op::ZeroRange {
                path,
                off,
                len,
                keep_size,
            } => write!(
                f,
                "zero range {path} {off}+{len}{}",
                if *keep_size { " keep_size" } else { "" }
            ),
            Op::CollapseRange { path, off, len } => write!(f, "collapse range {path} {off}+{len}"),
            Op::InsertRange { path, off, len } => write!(f, "insert range {path} {off}+{len}"),
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::LinkUnnamed { path, len, fill } => {
                write!(f, "O_TMPFILE +{len} fill {fill}, link as {path}")
            }
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::RemoveHeld { path, how } => match how {
                Removal::Unlink => write!(f, "unlink {path}, held, then forgotten"),
                Removal::Rmdir => write!(f, "rmdir {path}, held, then forgotten"),
                Removal::RenameOver(from) => {
                    write!(f, "rename {from} {path}, {path} held, then forgotten")
                }
            },
            Op::Rename { from, to } => write!(f, "rename {from} {to}"),
            Op::RenameWhiteout { from, to } => write!(f, "rename-whiteout {from} {to}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::SetXattr {
                path,
                name,
                len,
                fill,
            } => write!(f, "setxattr {path} {name} {len} bytes fill {fill}"),
            Op::RemoveXattr { path, name } => write!(f, "removexattr {path} {name}"),
            Op::XattrNoSpace { path, name, value: Some((len, fill)) } => {
                write!(f, "setxattr {path} {name} {len} bytes fill {fill}, no block free")
            }
            Op::XattrNoSpace { path, name, value: None } => {
                write!(f, "removexattr {path} {name}, no block free")
            }
            Op::SetFlags { path, flags } => write!(f, "chattr {path} flags {flags:#x}"),
            Op::SetAcl { path, default } => {
                write!(f, "setfacl {path} {}", if *default { "default" } else { "access" })
            }
            Op::Chmod { path, perm } => write!(f, "chmod {path} {perm:o}"),
            Op::ChmodNoSpace { path, perm } => write!(f, "chmod {path} {perm:o}, no block free"),
            Op::Fsync(p) => write!(f, "fsync {p}"),
            Op::Compact => write!(f, "compact"),
            Op::Msync {
                path,
                off,
                len,
                fill,
            } => write!(f, "mmap+store+msync {path} {off}+{len} fill {fill}"),
            Op::DirectAppend { path, len, fill } => {
                write!(f, "direct append {path} +{len} fill {fill}")
            }
            Op::LeasedShrink { path, shrink_to, zero, punch } => write!(
                f,
                "leased {path}: truncate {shrink_to}, zero {}+{}, punch {}+{}, truncate back",
                zero.0, zero.1, punch.0, punch.1
            ),
            Op::Alternate {
                path,
                off,
                len,
                fill,
            } => write!(f, "alternate {path} {off}+{len} fill {fill} x3, write back"),
            Op::AlternateMany { path, blocks, fill } => {
                write!(f, "alternate {path} a line in each of {blocks} blocks fill {fill}, write back")
            }
        }
    }
}

impl Op {
    /// Run the operation. An error (the operation refused) is an outcome, not a failure.
    pub fn apply(&self, fs: &Fs) -> Result<()> {
        match self {
            Op::Create(p) => {
                let (parent, name) = fs.parent_of(p)?;
                fs.create(parent, &name, 0o644, 0, 0).map(drop)
            }
            Op::Mkdir(p) => fs.mkdir_path(p).map(drop),
            Op::Symlink { path, target } => {
                let (parent, name) = fs.parent_of(path)?;
                fs.symlink(parent, &name, target.as_bytes(), 0, 0).map(drop)
            }
            Op::Write {
                path,
                off,
                len,
                fill,
            } => {
                let ino = fs.resolve(path, false)?;
                let data = pattern_bytes(*fill, *off, *len);
                fs.write(ino, *off, &data).map(drop)
            }
            Op::Append { path, len, fill } => {
                let ino = fs.resolve(path, false)?;
                let off = fs.getattr(ino)?.size;
                fs.write(ino, off, &pattern_bytes(*fill, off, *len))
                    .map(drop)
            }
            Op::Truncate { path, size } => fs.truncate(fs.resolve(path, false)?, *size),
            Op::Fallocate {
                path,
                off,
                len,
                keep_size,
            } => fs.fallocate(fs.resolve(path, false)?, *off, *len, *keep_size),
            Op::ZeroRange {
                path,
                off,
                len,
                keep_size,
            } => fs.zero_range(fs.resolve(path, false)?, *off, *len, *keep_size),
            Op::CollapseRange { path, off, len } => {
                fs.collapse_range(fs.resolve(path, false)?, *off, *len)
            }
            Op::InsertRange { path, off, len } => {
                fs.insert_range(fs.resolve(path, false)?, *off, *len)
            }
            Op::Link { from, to } => {
                let ino = fs.resolve(from, false)?;
                let (parent, name) = fs.parent_of(to)?;
                fs.link(ino, parent, &name).map(drop)
            }
            Op::LinkUnnamed { path, len, fill } => {
                let (parent, name) = fs.parent_of(path)?;
                let ino = fs.create_unnamed(parent, 0o600, 0, 0, true)?.ino;
                let named = fs
                    .write(ino, 0, &pattern_bytes(*fill, 0, *len))
                    .and_then(|_| fs.link(ino, parent, &name));
                fs.release(ino)?;
                named.map(drop)
            }
            Op::Unlink(p) => fs.unlink_path(p),
            Op::RemoveHeld { path, how } => {
                let (parent, name) = fs.parent_of(path)?;
                let kept = match how {
                    Removal::Unlink => fs.unlink_held(parent, &name, true)?,
                    Removal::Rmdir => fs.rmdir_held(parent, &name, true)?,
                    Removal::RenameOver(from) => {
                        let (p1, n1) = fs.parent_of(from)?;
                        fs.rename_held((p1, &n1), (parent, &name), RenameFlags::default(), true)?
                    }
                };
                kept.map_or(Ok(()), |ino| fs.let_go(ino))
            }
            Op::Rename { from, to } => fs.rename_path(from, to),
            Op::RenameWhiteout { from, to } => {
                let (p1, n1) = fs.parent_of(from)?;
                let (p2, n2) = fs.parent_of(to)?;
                let flags = RenameFlags { whiteout: Some((0, 0)), ..Default::default() };
                fs.rename(p1, &n1, p2, &n2, flags)
            }
            Op::Rmdir(p) => fs.rmdir_path(p),
            Op::SetXattr {
                path,
                name,
                len,
                fill,
            } => {
                let value = pattern_bytes(*fill, 0, *len as u64);
                fs.setxattr(
                    fs.resolve(path, false)?,
                    name.as_bytes(),
                    &value,
                    XattrSet::Any,
                )
            }
            Op::RemoveXattr { path, name } => {
                fs.removexattr(fs.resolve(path, false)?, name.as_bytes())
            }
            Op::XattrNoSpace { path, name, value } => {
                let ino = fs.resolve(path, false)?;
                let full = fs.take_all_free_blocks();
                let r = match value {
                    Some((len, fill)) => {
                        let v = pattern_bytes(*fill, 0, *len as u64);
                        fs.setxattr(ino, name.as_bytes(), &v, XattrSet::Any)
                    }
                    None => fs.removexattr(ino, name.as_bytes()),
                };
                drop(full);
                r
            }
            Op::SetFlags { path, flags } => {
                fs.set_inode_flags(fs.resolve(path, false)?, *flags).map(drop)
            }
            Op::SetAcl { path, default } => {
                let (name, value) = match default {
                    // default:user::rwx,user:1000:rwx,group::r-x,mask::rwx,other::r-x
                    true => (acl::DEFAULT, acl::value(&[(1, 7, NO_ID), (2, 7, 1000), (4, 5, NO_ID), (0x10, 7, NO_ID), (0x20, 5, NO_ID)])),
                    // user::rw-,user:1000:r--,group::r--,mask::r--,other::---
                    false => (acl::ACCESS, acl::value(&[(1, 6, NO_ID), (2, 4, 1000), (4, 4, NO_ID), (0x10, 4, NO_ID), (0x20, 0, NO_ID)])),
                };
                fs.set_acl(fs.resolve(path, false)?, name, Some(&value), true)
            }
            Op::Chmod { path, perm } => {
                let set = SetAttr { mode: Some(*perm), ..Default::default() };
                fs.setattr(fs.resolve(path, false)?, &set).map(drop)
            }
            Op::ChmodNoSpace { path, perm } => {
                let ino = fs.resolve(path, false)?;
                let full = fs.take_all_free_blocks();
                let set = SetAttr { mode: Some(*perm), ..Default::default() };
                let r = fs.setattr(ino, &set).map(drop);
                drop(full);
                r
            }
            Op::Fsync(p) => fs.fsync(fs.resolve(p, false)?),
            Op::Compact => fs.compact().map(drop),
            Op::Msync {
                path,
                off,
                len,
                fill,
            } => {
                let ino = fs.resolve(path, false)?;
                let size = fs.getattr(ino)?.size;
                let end = (off + len).min(size);
                if end <= *off {
                    return Ok(()); // nothing of the range is inside the file
                }
                let first = off - off % BLOCK_SIZE;
                let map_len = (end - first).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
                let file = fs.open_inode(ino)?;
                let atomic = fs.consistency() == Consistency::Strict;
                let m = if atomic {
                    file.mmap_atomic(first, map_len as usize)?
                } else {
                    file.mmap(first, map_len as usize)?
                };
                m.write(
                    (off - first) as usize,
                    &pattern_bytes(*fill, *off, end - off),
                )?;
                m.msync(0, map_len as usize).map(drop)
            }
            Op::DirectAppend { path, len, fill } => direct_append(fs, path, *len, *fill),
            Op::LeasedShrink { path, shrink_to, zero, punch } => {
                let ino = fs.resolve(path, false)?;
                let size = fs.getattr(ino)?.size;
                fs.lease(ino, 0, size.max(1), true)?;
                let r = (|| {
                    fs.truncate(ino, *shrink_to)?;
                    fs.zero_range(ino, zero.0, zero.1, true)?;
                    fs.punch_hole(ino, punch.0, punch.1)?;
                    fs.truncate(ino, size)
                })();
                fs.unlease(ino)?;
                r
            }
            Op::Alternate {
                path,
                off,
                len,
                fill,
            } => {
                let ino = fs.resolve(path, false)?;
                for k in 0..3 {
                    let f = fill.wrapping_add(k);
                    fs.write(ino, *off, &pattern_bytes(f, *off, *len))?;
                }
                fs.truncate(ino, fs.getattr(ino)?.size)
            }
            Op::AlternateMany { path, blocks, fill } => {
                let ino = fs.resolve(path, false)?;
                for (off, len) in many_lines(*blocks) {
                    fs.write(ino, off, &pattern_bytes(*fill, off, len))?;
                }
                fs.truncate(ino, fs.getattr(ino)?.size)
            }
        }
    }

    /// The documented atomic steps of this operation on `fs` (its state just before the
    /// operation): a crash leaves the result of a prefix of them. One step (the operation
    /// itself) for every operation except data writes in relaxed mode, which are atomic per
    /// 2 MiB logical piece, and [`Op::Alternate`]'s three writes (docs/DESIGN.md §5, "Strict
    /// and relaxed data paths").
    pub fn steps(&self, fs: &Fs) -> Result<Vec<Op>> {
        let (path, off, len, fill) = match self {
            Op::Write {
                path,
                off,
                len,
                fill,
            } => (path, *off, *len, *fill),
            Op::Append { path, len, fill } => {
                let off = fs.getattr(fs.resolve(path, false)?)?.size;
                (path, off, *len, *fill)
            }
            Op::Alternate {
                path,
                off,
                len,
                fill,
            } => {
                let write = |k: u8| Op::Write {
                    path: path.clone(),
                    off: *off,
                    len: *len,
                    fill: fill.wrapping_add(k),
                };
                return Ok(vec![write(0), write(1), write(2)]);
            }
            Op::AlternateMany { path, blocks, fill } => {
                let write = |(off, len)| Op::Write { path: path.clone(), off, len, fill: *fill };
                return Ok(many_lines(*blocks).map(write).collect());
            }
            // Each change is one step; a punch inside the file reads as a zeroed range (the
            // steps run on a copy nobody leases, where the blocks go).
            Op::LeasedShrink { path, shrink_to, zero, punch } => {
                let size = fs.getattr(fs.resolve(path, false)?)?.size;
                let (p, keep_size) = (path.clone(), true);
                return Ok(vec![
                    Op::Truncate { path: p.clone(), size: *shrink_to },
                    Op::ZeroRange { path: p.clone(), off: zero.0, len: zero.1, keep_size },
                    Op::ZeroRange { path: p.clone(), off: punch.0, len: punch.1, keep_size },
                    Op::Truncate { path: p, size },
                ]);
            }
            _ => return Ok(vec![self.clone()]),
        };
        if fs.consistency() == Consistency::Strict {
            return Ok(vec![Op::Write { path: path.clone(), off, len, fill }]);
        }
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let piece_end = end.min((pos / HUGE_SIZE + 1) * HUGE_SIZE);
            out.push(Op::Write {
                path: path.clone(),
                off: pos,
                len: piece_end - pos,
                fill,
            });
            pos = piece_end;
        }
        Ok(out)
    }
}

/// The file system a workload starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Start {
    /// Freshly made: an empty root.
    Fresh,
    /// A few files (one with an aligned 2 MiB extent), directories, a symlink, a hard link
    /// and extended attributes.
    Populated,
    /// Two 2 MiB units broken up by small files, one nearly empty (three files, one with an
    /// xattr block, and a directory's block) and one half empty: what hole compaction empties.
    Fragmented,
}

impl Start {
    pub const ALL: [Start; 3] = [Start::Fresh, Start::Populated, Start::Fragmented];
}

impl fmt::Display for Start {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Start::Fresh => "fresh",
            Start::Populated => "populated",
            Start::Fragmented => "fragmented",
        })
    }
}

/// A workload: a start, a mount consistency (strict or relaxed) and a short sequence of
/// operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub(crate) start: Start,
    pub(crate) consistency: Consistency,
    pub(crate) ops: Vec<Op>,
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.consistency {
            Consistency::Strict => "strict",
            Consistency::Relaxed => "relaxed",
        };
        write!(f, "[{} {mode}]", self.start)?;
        for (i, op) in self.ops.iter().enumerate() {
            write!(f, "{} {op}", if i == 0 { "" } else { ";" })?;
        }
        Ok(())
    }
}

/// [`Op::DirectAppend`]: the client's side written with the pool's recorded writes and left
/// unflushed, as the preload library leaves appended bytes: the explorer crashes with any of
/// them on media or not, and the size must never cover one that is not.
fn direct_append(fs: &Fs, path: &str, len: u64, fill: u8) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let ino = fs.resolve(path, false)?;
    let (board_fd, _) = fs.size_board()?;
    let board = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{board_fd}"))
        .map_err(|e| Error::io("open the size board", e))?;
    let off = fs.getattr(ino)?.size;
    let stray = 300;
    let lease = fs.lease_append(ino, off, len + stray)?;
    let client = || -> Result<()> {
        let store = |at: u64, bytes: &[u8]| -> Result<()> {
            let end = at + bytes.len() as u64;
            for &(fb, pb, n) in &lease.extents {
                let (a, b) = ((fb * BLOCK_SIZE).max(at), ((fb + n) * BLOCK_SIZE).min(end));
                if a < b {
                    let chunk = &bytes[(a - at) as usize..(b - at) as usize];
                    // Not written back: the daemon does that when it takes the size in.
                    fs.pool().write(pb * BLOCK_SIZE + (a - fb * BLOCK_SIZE), chunk, Category::Data)?;
                }
            }
            Ok(())
        };
        store(off, &pattern_bytes(fill, off, len))?;
        let at = ino * 16;
        let mut w = [0u8; 8];
        board.read_exact_at(&mut w, at).map_err(|e| Error::io("read the size board", e))?;
        let grown = size_word::grown(u64::from_le_bytes(w), off + len)
            .ok_or_else(|| Error::Invalid("the size word is frozen".into()))?;
        board
            .write_all_at(&grown.to_le_bytes(), at)
            .map_err(|e| Error::io("write the size board", e))?;
        store(off + len, &[0xEE; 300])?;
        fs.fsync(ino)
    };
    let r = client();
    fs.unlease_append(ino)?;
    r
}
