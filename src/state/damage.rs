//! The "needs fsck" flag (docs/DESIGN.md §7): the first check of media that fails while a
//! mount serves it (the caller gets EIO for that object) is recorded in the superblock's state
//! record, once per mount; a flagged pool then mounts only read-only until
//! `winefs fsck --repair` finds it clean and clears the flag. Also the read-only guard of the
//! calls that would change a pool.

use crate::error::{Error, Result};
use crate::state::locks::lock;
use crate::state::mkfs::write_state;
use crate::state::mount_state::MountState;
use std::sync::atomic::Ordering;

/// What failed its check at run time: the code kept at `sb::STATE_NEEDS_FSCK` (0 = no flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// A symlink's target does not match the checksum its inode keeps.
    SymlinkTarget = 1,
    /// An xattr block fails its magic, checksum or bounds.
    XattrBlock = 2,
    /// An extent-index block a transaction was about to change fails its checksum.
    IndexBlock = 3,
    /// An inode a transaction was about to change fails its checksum.
    Inode = 4,
}

/// The words for a flag's code; a code this build does not know is still a flag.
pub fn describe(code: u32) -> String {
    match code {
        1 => "a symlink target failed its checksum".into(),
        2 => "an xattr block failed its checks".into(),
        3 => "an extent-index block failed its checksum".into(),
        4 => "an inode failed its checksum".into(),
        c => format!("a check with code {c} failed"),
    }
}

/// The refusal of a writable mount of a pool flagged with `code`.
pub(crate) fn refusal(pool: &std::path::Path, code: u32) -> Error {
    Error::NeedsFsck(format!(
        "a checksum failed at run time ({}); run `winefs fsck --repair {}`, or mount with --read-only",
        describe(code),
        pool.display()
    ))
}

impl MountState {
    /// Refuse a call that would change the pool on a read-only mount.
    pub fn check_writable(&self) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Whether the mount is read-only now.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// A check of media failed while serving `what` (which names the object: inode, block,
    /// what failed): log it, flag the pool "needs fsck" (the first time in this mount: the
    /// state record is written, flushed and fenced), and return the EIO for the caller.
    pub fn media_damage(&self, kind: Damage, what: String) -> Error {
        let path = self.pool.path().display().to_string();
        let mut rec = lock(&self.record);
        let first = rec.needs_fsck == 0;
        let note = if !first {
            ""
        } else if self.pool.is_private() {
            "; the pool needs fsck (not recorded: this mount writes nothing)"
        } else {
            "; the pool is flagged \"needs fsck\""
        };
        log::error!("{path}: {what}{note}");
        if first {
            rec.needs_fsck = kind as u32;
            if let Err(e) = write_state(&self.pool, *rec) {
                log::error!("{path}: could not record the \"needs fsck\" flag: {e}");
            }
        }
        Error::Corrupted(what)
    }

    /// [`MountState::media_damage`] for extent-index block `block`, which a transaction was about
    /// to change and seal although it fails its checksum as it stands.
    pub(crate) fn index_block_damage(&self, block: u64) -> Error {
        self.media_damage(
            Damage::IndexBlock,
            format!(
                "extent-index block {block} fails its checksum; a change to it was refused rather than sealing the damage"
            ),
        )
    }

    /// [`MountState::media_damage`] for inode `ino`, which a transaction was about to change and
    /// seal although its slot fails its checksum as it stands (damage since mount).
    pub(crate) fn inode_damage(&self, ino: u64) -> Error {
        self.media_damage(
            Damage::Inode,
            format!(
                "inode {ino} fails its checksum; a change to it was refused rather than sealing the damage"
            ),
        )
    }

    /// The pool's "needs fsck" flag as this mount keeps it (0 = not flagged).
    pub fn needs_fsck(&self) -> u32 {
        lock(&self.record).needs_fsck
    }

    /// Clear the flag (repair, once the pool checks clean); the clean unmount records it.
    pub(crate) fn clear_needs_fsck(&self) {
        lock(&self.record).needs_fsck = 0;
    }
}
