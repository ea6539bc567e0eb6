//! The media layer: the mapped pool and its persistence primitives, the on-media format, the
//! alignment-aware allocator and the per-CPU undo journals.

pub mod alloc;
pub mod checksum;
pub mod crc;
pub(crate) mod disk_sync;
pub(crate) mod free_space;
pub(crate) mod hole_map;
pub mod journal;
pub mod geometry;
pub mod layout;
pub mod persist_stats;
pub mod pool;
pub(crate) mod pool_copy;
pub(crate) mod pool_file;
pub mod recovery;
pub mod wear;
pub mod zone;
