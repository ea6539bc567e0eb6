//! Taking a mutex of the mount state. A panic while one was held does not make the state
//! unusable: every change is committed to media before DRAM follows, so the guard is taken
//! over rather than the poison passed on.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking over a poisoned lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
