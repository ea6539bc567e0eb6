//! Notifications to the kernel: its cached attributes or data of an inode dropped when something
//! the kernel did not do changed them.

use fuser::{INodeNo, Notifier};
use std::sync::OnceLock;

/// Drop the kernel's cached attributes and data of `ino` (after a lease: stores behind the kernel).
/// The kernel waits for pages locked by requests in flight: never from a thread serving them.
pub(crate) fn invalidate_data(notifier: &OnceLock<Notifier>, ino: u64) {
    if let Some(n) = notifier.get()
        && let Err(e) = n.inval_inode(INodeNo(ino), 0, 0)
    {
        log::debug!("invalidating the cached data of inode {ino}: {e}");
    }
}

/// Tell the kernel, through the session's notifier once it exists, that its cached attributes
/// of `ino` are stale (offset -1: attributes only; the page cache, which a writer may hold
/// locked, is left alone).
pub(crate) fn invalidate_attributes(notifier: &OnceLock<Notifier>, ino: u64) {
    if let Some(n) = notifier.get()
        && let Err(e) = n.inval_inode(INodeNo(ino), -1, 0)
    {
        log::debug!("invalidating the attributes of inode {ino}: {e}");
    }
}

