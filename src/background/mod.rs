//! Background work over the data path: the reactive rewrite of fragmented files onto aligned
//! extents, hole compaction, and the worker thread that runs both on behalf of a mount; and
//! the thread that faults the pool in after mount.

pub(crate) mod compact;
pub(crate) mod prefault;
pub(crate) mod rewrite;
pub(crate) mod worker;

pub(crate) use compact::compact_now;
pub(crate) use rewrite::rewrite_file;
pub(crate) use worker::attach;
