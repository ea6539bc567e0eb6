//! Extended attributes on media: one block per inode, and the names winefs gives meaning to.
//!
//! Block format (docs/DESIGN.md §2, "Xattr block"): magic u32, entry count u16, reserved u16,
//! bytes used u32, crc32c u32 of the entries, then entries (name length u8, reserved u8, value
//! length u16, name, value). Blocks are never changed in place: `ops::xattr` writes a whole new
//! block and points the inode at it in one transaction, so an update is atomic and the block
//! never needs journaling.

use crate::error::{Error, Result, corrupt};
use crate::media::layout::Geometry;
use crate::media::layout::{BLOCK_SIZE, XATTR_MAGIC, get_u16, get_u32, put_u16, put_u32};
use crate::media::pool::Pool;

/// Longest attribute name (XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Bytes of entries one xattr block holds.
pub const XATTR_SPACE: usize = BLOCK_SIZE as usize - 16;
/// Longest value accepted (Linux's XATTR_SIZE_MAX); the encoded block (XATTR_SPACE) is far
/// smaller, so the u16 length fields on media can never overflow.
pub const XATTR_SIZE_MAX: usize = 65536;

/// The alignment hint (see docs/DESIGN.md): a file carrying it gets whole aligned 2 MiB
/// extents even when written in small pieces; a directory carrying it passes it to the files
/// created directly in it. Set automatically once a file receives an aligned extent, so it
/// travels with `cp --preserve=xattr` and `rsync -X`.
pub const HUGEPAGE_HINT: &[u8] = b"user.winefs.hugepage";

/// An inode's attributes, in order: (name, value).
pub(crate) type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

pub(crate) fn decode(b: &[u8], ino: u64) -> Result<Attrs> {
    if get_u32(b, 0) != XATTR_MAGIC {
        return Err(corrupt!("inode {ino}: xattr block has no magic"));
    }
    let count = get_u16(b, 4) as usize;
    let used = get_u32(b, 8) as usize;
    if used > XATTR_SPACE {
        return Err(corrupt!("inode {ino}: xattr block claims {used} bytes"));
    }
    if crc32c::crc32c(&b[16..16 + used]) != get_u32(b, 12) {
        return Err(corrupt!("inode {ino}: xattr block checksum mismatch"));
    }
    let mut out = Vec::with_capacity(count);
    let mut p = 16;
    for _ in 0..count {
        if p + 4 > 16 + used {
            return Err(corrupt!(
                "inode {ino}: xattr entry header past the used bytes"
            ));
        }
        let nl = b[p] as usize;
        let vl = get_u16(b, p + 2) as usize;
        if nl == 0 || p + 4 + nl + vl > 16 + used {
            return Err(corrupt!(
                "inode {ino}: xattr entry of {nl}+{vl} bytes does not fit"
            ));
        }
        out.push((
            b[p + 4..p + 4 + nl].to_vec(),
            b[p + 4 + nl..p + 4 + nl + vl].to_vec(),
        ));
        p += 4 + nl + vl;
    }
    Ok(out)
}

pub(crate) fn encode(attrs: &Attrs) -> Result<Vec<u8>> {
    let used: usize = attrs.iter().map(|(n, v)| 4 + n.len() + v.len()).sum();
    if used > XATTR_SPACE {
        return Err(Error::NoSpace(format!(
            "extended attributes need {used} bytes; an inode holds {XATTR_SPACE}"
        )));
    }
    let mut b = vec![0u8; BLOCK_SIZE as usize];
    put_u32(&mut b, 0, XATTR_MAGIC);
    put_u16(&mut b, 4, attrs.len() as u16);
    put_u32(&mut b, 8, used as u32);
    let mut p = 16;
    for (n, v) in attrs {
        b[p] = n.len() as u8;
        put_u16(&mut b, p + 2, v.len() as u16);
        b[p + 4..p + 4 + n.len()].copy_from_slice(n);
        b[p + 4 + n.len()..p + 4 + n.len() + v.len()].copy_from_slice(v);
        p += 4 + n.len() + v.len();
    }
    let crc = crc32c::crc32c(&b[16..16 + used]);
    put_u32(&mut b, 12, crc);
    Ok(b)
}

/// Read and validate an inode's xattr block (empty if none).
pub(crate) fn load(pool: &Pool, geo: &Geometry, ino: u64, block: u64) -> Result<Attrs> {
    if block == 0 {
        return Ok(Vec::new());
    }
    if !geo.is_data_block(block) {
        return Err(corrupt!(
            "inode {ino}: xattr block {block} outside the data area"
        ));
    }
    let mut b = vec![0u8; BLOCK_SIZE as usize];
    pool.read(block * BLOCK_SIZE, &mut b)?;
    decode(&b, ino)
}

/// Check an attribute name: not empty, no NUL, at most [`XATTR_NAME_MAX`] bytes.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::Invalid("empty attribute name".into()));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_round_trip_and_checksum() {
        let a = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"user.b".to_vec(), vec![7u8; 300]),
        ];
        let mut b = encode(&a).unwrap();
        assert_eq!(decode(&b, 1).unwrap(), a);
        b[30] ^= 1;
        assert!(matches!(decode(&b, 1), Err(Error::Corrupted(_))));
        assert!(matches!(
            encode(&vec![(b"n".to_vec(), vec![0u8; 5000])]),
            Err(Error::NoSpace(_))
        ));
    }
}
