//! Loading one inode from its table slot into DRAM, with every check mount makes of it: at
//! mount (the scan of the inode tables) and when a file the mount left on media is first used
//! (`MountState::inode`).
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::checksum;
use crate::media::layout::{
    BLOCK_BYTES, BLOCK_SIZE, FileKind, Geometry, INODE_BYTES, InodeHeader, MAX_FILE_SIZE, dir_block,
};
use crate::media::pool::Pool;
use crate::meta::dir::{DirIndex, DirMedia};
use crate::meta::inode::{FileMap, SlotId};
use crate::state::inode_state::InodeState;

/// What loading one inode found besides the inode itself.
pub(crate) struct LoadedInode {
    /// Its dead extent slots.
    pub dead: Vec<SlotId>,
    /// Its extent-index blocks and directory block headers that fail their checksum.
    pub bad_checksums: Vec<String>,
    /// Its directory blocks loaded with a rebuilt header.
    pub rebuilt_dir_headers: Vec<(u64, u32)>,
}

/// Load in-use inode `cur` (header `hdr`, raw bytes `raw`): validate its header ranges, its
/// extent map and, for a directory, its blocks.
pub(crate) fn load_inode(
    pool: &Pool,
    g: &Geometry,
    cur: u64,
    raw: &[u8],
    hdr: InodeHeader,
) -> Result<(InodeState, LoadedInode)> {
    let total = g.total_inodes();
    let kind = hdr
        .kind()
        .ok_or_else(|| corrupt!("inode {cur}: unknown file type in mode {:o}", hdr.mode))?;
    if hdr.size > MAX_FILE_SIZE || hdr.map_end > u64::from(u32::MAX) {
        return Err(corrupt!(
            "inode {cur}: size {} / map end {} out of range",
            hdr.size,
            hdr.map_end
        ));
    }
    if hdr.xattr_block != 0 && !g.is_data_block(hdr.xattr_block) {
        return Err(corrupt!(
            "inode {cur}: xattr block {} outside the data area",
            hdr.xattr_block
        ));
    }
    if hdr.index_block != 0 && !g.is_data_block(hdr.index_block) {
        return Err(corrupt!(
            "inode {cur}: extent index block {} outside the data area",
            hdr.index_block
        ));
    }
    let loaded = FileMap::load(pool, g, cur, raw, hdr.index_block, hdr.map_end)?;
    let map = loaded.map;
    let mut l = LoadedInode {
        bad_checksums: loaded
            .bad_checksum
            .iter()
            .map(|b| bad_index_block(cur, *b))
            .collect(),
        dead: loaded.dead,
        rebuilt_dir_headers: Vec::new(),
    };
    let dir = if kind == FileKind::Dir {
        if !hdr.size.is_multiple_of(BLOCK_SIZE) {
            return Err(corrupt!(
                "directory {cur}: size {} is not a whole number of blocks",
                hdr.size
            ));
        }
        if hdr.parent == 0 || hdr.parent > total {
            return Err(corrupt!(
                "directory {cur}: parent {} out of range",
                hdr.parent
            ));
        }
        let mut d = DirIndex::default();
        let media = DirMedia {
            pool,
            map: &map,
            ino: cur,
        };
        // The entries the blocks' `starts` words mark, to size the index once (growing it
        // moved every entry per doubling). Only a hint: each block's word is checked as it is
        // loaded below.
        let mut marked = 0usize;
        for k in 0..hdr.size / BLOCK_SIZE {
            if let Some((phys, _)) = map.lookup(k) {
                let starts = pool.read_array::<8>(phys * BLOCK_SIZE + dir_block::STARTS as u64)?;
                marked += (u64::from_le_bytes(starts) & !1).count_ones() as usize;
            }
        }
        d.reserve(marked);
        let mut b = vec![0u8; BLOCK_BYTES];
        for k in 0..hdr.size / BLOCK_SIZE {
            let (phys, _) = map
                .lookup(k)
                .ok_or_else(|| corrupt!("directory {cur}: block {k} is not mapped"))?;
            pool.read(phys * BLOCK_SIZE, &mut b)?;
            let block = u32::try_from(k)
                .map_err(|_| corrupt!("directory {cur}: block {k} beyond 2^32 blocks"))?;
            if !d.load_block(&media, block, &b)? {
                l.bad_checksums.push(bad_dir_header(cur, block));
                l.rebuilt_dir_headers.push((cur, block));
            }
        }
        Some(d)
    } else {
        None
    };
    Ok((InodeState::new(cur, hdr, map, dir), l))
}

/// The problem line of an extent-index block failing its checksum (mount and fsck).
pub(crate) fn bad_index_block(ino: u64, block: u64) -> String {
    format!("inode {ino}: extent-index block {block} fails its checksum")
}

/// The problem line of a directory block header failing its checksum (mount and fsck).
pub(crate) fn bad_dir_header(dir: u64, block: u32) -> String {
    format!("directory {dir}: the header of block {block} fails its checksum")
}

/// Load in-use inode `ino` from its table slot after mount, as mount would have: the mount
/// checked it already, so a failed check now (a checksum, a bad extent-index block) is damage
/// since, reported as corruption rather than loaded. Dead extent slots (records past the map's
/// end that a truncate left) are free slots, as a live mount treats them.
pub(crate) fn load_after_mount(pool: &Pool, g: &Geometry, ino: u64) -> Result<InodeState> {
    let mut raw = [0u8; INODE_BYTES];
    pool.read(g.inode_offset(ino)?, &mut raw)?;
    let hdr = InodeHeader::decode(&raw);
    if !hdr.in_use() {
        return Err(corrupt!(
            "inode {ino} was in use at mount and is free on media now"
        ));
    }
    if !checksum::inode_checksum_ok(&raw) {
        return Err(corrupt!("inode {ino} fails its checksum"));
    }
    let (node, found) = load_inode(pool, g, ino, &raw, hdr)?;
    if let Some(first) = found.bad_checksums.first() {
        return Err(Error::Corrupted(first.clone()));
    }
    Ok(node)
}
