//! The wire format of the direct-path channel between a mount's daemon and the preload library
//! (`preload/`, which compiles this same file), docs/DESIGN.md §7b. Only `std`: both sides
//! build it.
//!
//! A connection is a Unix stream socket in the abstract namespace; its name is the value of the
//! virtual extended attribute [`CHANNEL_XATTR`] of every regular file of the mount and of its
//! root, and is made from the pool file's identity ([`channel_name`]). The client
//! sends requests and reads one reply to each, in order. Every number is little-endian.
//!
//! Request: `op: u32`, `len: u32`, then `len` bytes of payload. Reply: `status: i32` (0 or an
//! errno), `len: u32`, then the payload. Payloads:
//!
//! | op | request | reply payload (status 0) |
//! |---|---|---|
//! | [`OP_HELLO`] | `version: u32` | `pool_len: u64`, `board_len: u64`; the pool and the size board arrive as two descriptors (`SCM_RIGHTS`) with the reply header |
//! | [`OP_MAP`] | `ino: u64`, `off: u64`, `len: u64`, `flags: u64` ([`MAP_NO_FILL`], [`MAP_APPEND`]) | `lease: u64`, `size: u64`, `flags: u64` ([`LEASE_PRIVILEGED`]), `count: u32`, then `count` × (`file_block: u64`, `pool_block: u64`, `blocks: u64`) |
//! | [`OP_UNMAP`] | `lease: u64` | empty |
//! | [`OP_ANNOUNCE`] | `version: u32` | empty; the connection's process is a client's (its opens are direct I/O) until the connection closes |
//!
//! The size board is a shared array of two `u64`s per inode number, at `16 * ino`: the size
//! word of every file the client holds a lease on (`state/size_word.rs`: the size, a sequence
//! number, a frozen bit), and its layout generation, which changes whenever the file gives
//! blocks up (truncate, punch hole) — a client's leased extents of the file may then be stale,
//! and it stops using them for `read`/`write`. A client holding a [`MAP_APPEND`] lease of a
//! file grows its size by swapping the word (never while it is frozen, never across a change
//! of its sequence number).

/// The extended attribute that names a mount's channel (answered by the daemon, not stored).
pub const CHANNEL_XATTR: &str = "user.winefs.channel";

/// The abstract name of the channel of the daemon that serves the pool file with `st_dev`
/// `pool_dev` and `st_ino` `pool_ino`. A process finds it from the mount table (a mount's
/// source is its pool file) and a stat of the pool, without touching the mount: an open of
/// the mount, however short, makes an unmount that meets it fail with EBUSY.
pub fn channel_name(pool_dev: u64, pool_ino: u64) -> String {
    format!("winefs.pool.{pool_dev:x}.{pool_ino:x}")
}
/// The virtual extended attribute of a mount's root that answers its write accounting as
/// JSON (`state::accounting::WriteStats`; `winefs stat` reads it).
pub const STATS_XATTR: &str = "user.winefs.stats";
/// Protocol version sent in [`OP_HELLO`]; a daemon refuses any other with `EPROTO`.
pub const VERSION: u32 = 3;
/// Authenticate; receive the pool and the size board.
pub const OP_HELLO: u32 = 1;
/// Lease a range of a file: holes inside the file are filled, the extents returned.
pub const OP_MAP: u32 = 2;
/// Give a lease back.
pub const OP_UNMAP: u32 = 3;
/// Say that the connecting process will use the direct path, before it opens files on the
/// mount (the preload library, as its process starts); nothing else is sent on the connection.
pub const OP_ANNOUNCE: u32 = 4;
/// [`OP_MAP`] flag: lease only the blocks the range has; fill no hole (a client that reads and
/// writes a file without mapping it must not make a sparse file dense).
pub const MAP_NO_FILL: u64 = 1;
/// [`OP_MAP`] flag: an append lease — every block of the range is allocated, past the end of
/// the file too, and the client grows the size itself on the size board until it gives the
/// lease back.
pub const MAP_APPEND: u64 = 2;
/// [`OP_MAP`] reply flag: the file carries privileges a write drops (a set-user-ID or
/// set-group-ID bit, file capabilities): the client writes it through FUSE, where the daemon
/// drops them, never directly. Loads and stores through the client's mappings are not writes
/// (the kernel drops nothing at a store through a mapping either).
pub const LEASE_PRIVILEGED: u64 = 1;
/// Largest payload either side accepts (a reply to a map of a badly fragmented file).
pub const MAX_PAYLOAD: u32 = 64 << 20;

/// One extent of a leased range: `blocks` blocks of the file from `file_block` are pool blocks
/// from `pool_block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First logical block.
    pub file_block: u64,
    /// First pool block.
    pub pool_block: u64,
    /// Length in blocks.
    pub blocks: u64,
}

/// The answer to [`OP_MAP`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapReply {
    /// Names the lease for [`OP_UNMAP`].
    pub lease: u64,
    /// The file size when the lease was granted.
    pub size: u64,
    /// [`LEASE_PRIVILEGED`] or 0.
    pub flags: u64,
    /// Every block of the range inside the file, in file order.
    pub extents: Vec<Extent>,
}

/// A request or reply header with its payload.
pub fn frame(head: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + payload.len());
    v.extend_from_slice(&head.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Split an 8-byte header into its first word and the payload length.
pub fn parse_head(h: [u8; 8]) -> (u32, u32) {
    let w = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    (w(0), w(4))
}

/// Payload of [`OP_MAP`].
pub fn encode_map(ino: u64, off: u64, len: u64, flags: u64) -> Vec<u8> {
    [ino, off, len, flags].iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The `i`th little-endian `u64` of `p`, if it is there.
pub fn u64_at(p: &[u8], i: usize) -> Option<u64> {
    let b = p.get(i * 8..i * 8 + 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// Decode an [`OP_MAP`] request: (ino, off, len, flags).
pub fn decode_map(p: &[u8]) -> Option<(u64, u64, u64, u64)> {
    (p.len() == 32).then_some((u64_at(p, 0)?, u64_at(p, 1)?, u64_at(p, 2)?, u64_at(p, 3)?))
}

/// Payload of a reply to [`OP_MAP`].
pub fn encode_map_reply(r: &MapReply) -> Vec<u8> {
    let mut v = Vec::with_capacity(28 + 24 * r.extents.len());
    v.extend_from_slice(&r.lease.to_le_bytes());
    v.extend_from_slice(&r.size.to_le_bytes());
    v.extend_from_slice(&r.flags.to_le_bytes());
    v.extend_from_slice(&(r.extents.len() as u32).to_le_bytes());
    for e in &r.extents {
        for x in [e.file_block, e.pool_block, e.blocks] {
            v.extend_from_slice(&x.to_le_bytes());
        }
    }
    v
}

/// Decode a reply to [`OP_MAP`]; None if it is malformed.
pub fn decode_map_reply(p: &[u8]) -> Option<MapReply> {
    let lease = u64_at(p, 0)?;
    let size = u64_at(p, 1)?;
    let flags = u64_at(p, 2)?;
    let count = u32::from_le_bytes(p.get(24..28)?.try_into().ok()?) as usize;
    let rest = p.get(28..)?;
    if rest.len() != count.checked_mul(24)? {
        return None;
    }
    let extents = (0..count)
        .map(|i| {
            Some(Extent {
                file_block: u64_at(rest, 3 * i)?,
                pool_block: u64_at(rest, 3 * i + 1)?,
                blocks: u64_at(rest, 3 * i + 2)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(MapReply {
        lease,
        size,
        flags,
        extents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_request_and_reply_round_trip() {
        assert_eq!(decode_map(&encode_map(7, 4096, 1 << 21, 1)), Some((7, 4096, 1 << 21, 1)));
        assert_eq!(decode_map(&encode_map(7, 4096, 1 << 21, 0)[..31]), None);
        let r = MapReply {
            lease: 3,
            size: 5 << 20,
            flags: LEASE_PRIVILEGED,
            extents: vec![
                Extent { file_block: 0, pool_block: 512, blocks: 512 },
                Extent { file_block: 512, pool_block: 9, blocks: 1 },
            ],
        };
        let enc = encode_map_reply(&r);
        assert_eq!(decode_map_reply(&enc), Some(r));
        // A count that disagrees with the length is refused, never read past.
        assert_eq!(decode_map_reply(&enc[..enc.len() - 1]), None);
        let mut bad = enc.clone();
        bad[24] = 200;
        assert_eq!(decode_map_reply(&bad), None);
    }

    #[test]
    fn frames_carry_their_length() {
        let f = frame(OP_UNMAP, &9u64.to_le_bytes());
        assert_eq!(parse_head(f[..8].try_into().unwrap()), (OP_UNMAP, 8));
        assert_eq!(u64_at(&f[8..], 0), Some(9));
    }
}
