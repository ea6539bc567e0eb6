//! Metadata structures on media and their DRAM indexes: inode extent maps, directory blocks,
//! extended-attribute blocks, POSIX ACLs.

pub mod acl;
pub mod dir;
pub mod extent_map;
pub mod inode;
pub mod inode_flags;
pub mod xattr;
