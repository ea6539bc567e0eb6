//! winefs: a hugepage-aware persistent-memory file system in user space, after WineFS (SOSP'21).
//!
//! Module map (one concept each; see docs/DESIGN.md):
//! - [`pool`]: the mapped pool and persistence primitives (with `vm`, `sys` and `fs::current_cpu`, the only `unsafe`).
//! - [`layout`]: the on-media format.
//! - [`alloc`]: the alignment-aware allocator.
//! - [`journal`]: per-CPU undo journals and their recovery.
//! - [`inode`]: inode tables and extent maps.
//! - [`dir`]: directory blocks and DRAM directory indexes.
//! - [`file`]: the data path and the `File` handle.
//! - [`mmap`]: memory mappings of files (hugepage-mapped extents, fault-time allocation).
//! - [`vm`]: the virtual-memory system calls behind mappings (userfaultfd, `MAP_FIXED`, `mremap`).
//! - [`xattr`]: extended attributes.
//! - [`fs`]: namespace operations, locking and the `Fs` API.
//! - [`report`]: layout reports (free-space fragmentation, a file's hugepage-mappable share).
//! - [`rewrite`]: reactive rewrite of fragmented files onto aligned extents.
//! - [`recovery`]: mkfs, mount, unmount.
//! - [`fsck`]: invariant checks.
//! - [`bench`]: the system-call benchmark (a tool beside the core).
//! - [`crash`]: crash-consistency testing: the persistence-point crash explorer and the FUSE kill harness (a tool beside the core).
//! - [`hugepool`]: finding or mounting a hugepage tmpfs for pools (the embedded default).
//! - [`fuse`]: the FUSE front end (outside the core; the `winefs mount` command drives it).
//! - [`sys`]: process-level system calls for the front ends (fork, signals, lazy unmount).

pub mod age;
pub mod alloc;
pub mod bench;
pub mod compact;
pub mod crash;
pub mod dir;
pub mod error;
pub mod file;
pub mod fs;
pub mod fsck;
pub mod fuse;
pub mod hugepool;
pub mod inode;
pub mod journal;
pub mod layout;
pub mod mmap;
pub mod pool;
pub mod recovery;
pub mod report;
pub mod rewrite;
pub mod sys;
pub(crate) mod vm;
pub mod xattr;

pub use error::{Error, Result};
pub use file::File;
pub use fs::{
    Attr, DirEntry, Fs, MkfsOptions, Mode, MountOptions, RenameFlags, SetAttr, StatFs, TimeSet,
    XattrSet,
};
pub use layout::FileKind;
pub use mmap::Mapping;
