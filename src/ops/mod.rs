//! Operations on a mounted pool: the data path (with the range-rewriting fallocate modes),
//! memory mappings, the namespace and its directory edits, extended attributes and POSIX ACLs, and content-preserving block moves. Each works on the mount state under the
//! locks that state documents; none knows the facade.

pub(crate) mod acl;
pub(crate) mod dir_edit;
pub(crate) mod falloc;
pub(crate) mod file;
pub(crate) mod lease;
pub(crate) mod mmap;
pub(crate) mod namespace;
pub(crate) mod open;
pub(crate) mod prealloc;
pub(crate) mod relocate;
pub(crate) mod rename;
pub mod repair;
pub(crate) mod repair_dirs;
pub(crate) mod repair_leaf;
pub(crate) mod write;
pub(crate) mod xattr;
