//! The mount state: what a mounted pool holds in DRAM (inodes, locks, mappings, the mailbox of
//! background work) and how it comes to be and ends (mkfs, mount with recovery, unmount), with
//! the transaction helpers every operation builds on and fsck's invariant checks.

pub mod accounting;
pub(crate) mod alloc_snapshot;
pub(crate) mod appends;
pub(crate) mod background;
pub(crate) mod claims;
pub mod damage;
pub(crate) mod dram;
pub(crate) mod inode_bits;
pub(crate) mod inode_load;
pub mod fsck;
pub(crate) mod inode_state;
pub(crate) mod inode_table;
pub(crate) mod leases;
pub(crate) mod locks;
pub(crate) mod map_hooks;
pub(crate) mod mappings;
pub mod mkfs;
pub mod mount;
pub(crate) mod mount_state;
pub(crate) mod prealloc;
pub(crate) mod removed_held;
pub(crate) mod scan;
pub mod size_word;
pub(crate) mod slots;
pub(crate) mod tx;
pub(crate) mod validate;
pub(crate) mod zones;
