//! The table of loaded inodes (inode number → state), split into shards that each have their
//! own lock. Every operation reads it to find its inodes; creates and unlinks (and the first use
//! of an inode left on media) write it. Under one lock, which favours writers, a writer waiting
//! for the readers of the moment made every later reader wait behind it. Split by inode number,
//! a writer holds up only the readers of its own shard. (Most of the waiting once seen on the
//! table came from a bug that made loads from media frequent, since fixed; on two CPUs the split
//! alone measured no faster: docs/EVALUATION.md, "The cache of loaded inodes".)

use crate::spin::{CacheAligned, taken};
use crate::state::inode_state::{InoMap, InodeRef};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shards of the table: enough that two threads rarely meet in one, few enough that a walk over
/// all of them (fsck, repair, DRAM accounting) stays cheap.
const SHARDS: usize = 64;

/// Loaded inodes by number, in [`SHARDS`] separately locked maps.
pub struct InodeTable {
    /// Each on its own cache lines: every operation takes a shard's lock.
    shards: Box<[CacheAligned<RwLock<InoMap<InodeRef>>>]>,
}

/// One shard, write-locked: where an inode of that shard is inserted or removed.
pub type ShardGuard<'a> = RwLockWriteGuard<'a, InoMap<InodeRef>>;

impl InodeTable {
    /// A table holding the states of `loaded`.
    pub fn new(loaded: InoMap<InodeRef>) -> InodeTable {
        let per = loaded.len() / SHARDS + 1;
        let mut maps: Vec<InoMap<InodeRef>> = (0..SHARDS)
            .map(|_| InoMap::with_capacity_and_hasher(per, Default::default()))
            .collect();
        for (ino, node) in loaded {
            maps[shard_of(ino)].insert(ino, node);
        }
        InodeTable {
            shards: maps.into_iter().map(|m| CacheAligned(RwLock::new(m))).collect(),
        }
    }

    fn read_shard(&self, i: usize) -> RwLockReadGuard<'_, InoMap<InodeRef>> {
        self.shards[i].0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The state of `ino`, if loaded.
    pub fn get(&self, ino: u64) -> Option<InodeRef> {
        self.read_shard(shard_of(ino)).get(&ino).cloned()
    }

    /// Whether `ino` is loaded with exactly the state `node`.
    pub fn holds(&self, ino: u64, node: &InodeRef) -> bool {
        self.read_shard(shard_of(ino))
            .get(&ino)
            .is_some_and(|n| std::sync::Arc::ptr_eq(n, node))
    }

    /// Whether `ino` is loaded; None if its shard is write-locked now.
    pub fn try_contains(&self, ino: u64) -> Option<bool> {
        taken(self.shards[shard_of(ino)].0.try_read()).map(|m| m.contains_key(&ino))
    }

    /// The shard of `ino`, write-locked.
    pub fn write(&self, ino: u64) -> ShardGuard<'_> {
        self.shards[shard_of(ino)]
            .0
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The shard of `ino`, write-locked, if no one holds it now.
    pub fn try_write(&self, ino: u64) -> Option<ShardGuard<'_>> {
        taken(self.shards[shard_of(ino)].0.try_write())
    }

    /// Which of [`InodeTable::write_all`]'s guards holds `ino`.
    pub fn shard_index(ino: u64) -> usize {
        shard_of(ino)
    }

    /// Whether `a` and `b` live in the same shard.
    pub fn same_shard(a: u64, b: u64) -> bool {
        shard_of(a) == shard_of(b)
    }

    /// Every shard, write-locked, in shard order (the only order in which more than one shard
    /// is waited for, so two such callers cannot deadlock).
    pub fn write_all(&self) -> Vec<ShardGuard<'_>> {
        self.shards
            .iter()
            .map(|s| s.0.write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// Remove `ino`'s state, if loaded.
    pub fn remove(&self, ino: u64) -> Option<InodeRef> {
        self.write(ino).remove(&ino)
    }

    /// Every loaded state, as of now (each shard read in turn).
    pub fn values(&self) -> Vec<InodeRef> {
        let mut out = Vec::new();
        for i in 0..SHARDS {
            out.extend(self.read_shard(i).values().cloned());
        }
        out
    }

    /// The hash tables' capacities (slots allocated, summed over the shards).
    pub fn capacity(&self) -> usize {
        (0..SHARDS).map(|i| self.read_shard(i).capacity()).sum()
    }
}

/// The shard `ino` lives in. Inode numbers are handed out densely from the low end of each
/// partition's range, so consecutive numbers land in different shards.
fn shard_of(ino: u64) -> usize {
    (ino % SHARDS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::layout::InodeHeader;
    use crate::meta::inode::FileMap;
    use crate::state::inode_state::InodeState;
    use std::sync::Arc;

    fn node(ino: u64) -> InodeRef {
        crate::state::inode_state::InodeCell::new_ref(InodeState::new(
            ino,
            InodeHeader::default(),
            FileMap::new(),
            None,
        ))
    }

    #[test]
    fn states_are_found_where_they_were_put_and_gone_once_removed() {
        let mut first = InoMap::default();
        for ino in 1..=100 {
            first.insert(ino, node(ino));
        }
        let t = InodeTable::new(first);
        assert_eq!(t.values().len(), 100);
        let extra = node(1000);
        t.write(1000).insert(1000, Arc::clone(&extra));
        assert!(t.holds(1000, &extra));
        assert!(
            !t.holds(1000, &node(1000)),
            "a different state of the same number"
        );
        for ino in 1..=100 {
            assert_eq!(
                t.get(ino).map(|n| crate::state::inode_state::rlock(&n).ino),
                Some(ino)
            );
        }
        assert!(t.remove(7).is_some());
        assert!(t.get(7).is_none());
        assert!(t.remove(7).is_none());
        assert_eq!(t.values().len(), 100);
        assert!(t.capacity() >= 100);
    }

    #[test]
    fn a_held_shard_blocks_only_its_own_inodes() {
        let t = InodeTable::new(InoMap::default());
        let held = t.write(5);
        assert!(t.try_write(5).is_none());
        assert!(t.try_write(5 + SHARDS as u64).is_none(), "same shard");
        assert!(InodeTable::same_shard(5, 5 + SHARDS as u64));
        assert!(!InodeTable::same_shard(5, 6));
        // Another shard is free for writing and for reading.
        assert!(t.try_write(6).is_some());
        assert!(t.get(6).is_none());
        drop(held);
        assert_eq!(t.write_all().len(), SHARDS);
    }
}
