//! winefs: a hugepage-aware persistent-memory file system in user space, after WineFS (SOSP'21).
//!
//! The crate is built in layers, each using only the ones below it (docs/DESIGN.md §1 draws
//! them; `tests/layers.rs` checks every import against that drawing):
//!
//! | layer | modules | role |
//! |---|---|---|
//! | base | [`error`], [`sys`], [`units`] | the error type; system calls (the only `unsafe` besides the pool) |
//! | media | [`media`]: `pool`, `layout`, `alloc`, `journal` | the mapped pool and persistence, the on-media format, the allocator, the undo journals |
//! | metadata | [`meta`]: `inode`, `dir`, `xattr`; [`types`] | extent maps, directory blocks, xattr blocks; the API's value types |
//! | state | [`state`] | the mount state, mkfs/mount/unmount, transaction helpers, fsck |
//! | data path and namespace | `ops`: `file`, `mmap`, `namespace`, `xattr`, `relocate` | the operations on a mounted pool |
//! | background | `background`: `worker`, `rewrite`, `compact` | reactive rewrite and hole compaction |
//! | facade | [`fs`] | [`Fs`], [`File`], [`Mapping`] |
//! | front ends and tools | [`fuse`], the `winefs` CLI; [`bench`](mod@bench), [`age`], [`crash`], [`report`], [`hugepool`] | what users run |

#![warn(missing_docs)]

pub mod age;
pub(crate) mod background;
pub mod bench;
pub mod crash;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod hugepool;
pub mod media;
pub mod meta;
pub(crate) mod ops;
pub mod report;
pub mod rng;
pub(crate) mod spin;
pub mod state;
pub mod sys;
pub mod types;
pub mod units;

pub use error::{Error, Result};
pub use fs::{File, Fs, Mapping};
pub use media::layout::FileKind;
pub use ops::repair::RepairReport;
pub use types::{
    Attr, CompactStats, Consistency, DirEntry, Maker, MkfsOptions, MountOptions, OverwritePath, RenameFlags,
    RewriteStats, SetAttr, StatFs, TimeSet, XattrSet,
};
