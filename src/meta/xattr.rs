//! Extended attributes on media: one block per inode, and the names winefs gives meaning to.
//!
//! Block format (docs/DESIGN.md §2, "Xattr block"): magic u32, entry count u16, reserved u16,
//! bytes used u32, crc32c u32 of the entries, then entries (name length u8, reserved u8, value
//! length u16, name, value). Blocks are never changed in place: `ops::xattr` writes a whole new
//! block and points the inode at it in one transaction, so an update is atomic and the block
//! never needs journaling. The offsets are `layout::xattr_block` and `layout::xattr_entry`.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result, corrupt};
use crate::media::layout::{
    BLOCK_BYTES, BLOCK_SIZE, Geometry, XATTR_MAGIC, get_u16, get_u32, put_u16, put_u32,
    xattr_block as blk, xattr_entry as ent,
};
use crate::media::pool::Pool;
use crate::meta::acl;

/// Longest attribute name (XATTR_NAME_MAX).
pub(crate) const XATTR_NAME_MAX: usize = 255;
/// Bytes of entries one xattr block holds.
pub const XATTR_SPACE: usize = BLOCK_BYTES - blk::ENTRIES;
/// Longest value accepted (Linux's XATTR_SIZE_MAX); the encoded block (XATTR_SPACE) is far
/// smaller, so the u16 length fields on media can never overflow.
pub(crate) const XATTR_SIZE_MAX: usize = 65536;

/// The alignment hint (see docs/DESIGN.md): a file carrying it gets whole aligned 2 MiB
/// extents even when written in small pieces; a directory carrying it passes it to the files
/// created directly in it. Set automatically once a file receives an aligned extent. Readable
/// and settable by name, but never listed (`ops::xattr::list`), so copying tools leave it
/// behind: it describes this pool's layout, not the file's content.
pub const HUGEPAGE_HINT: &[u8] = b"user.winefs.hugepage";

/// An inode's attributes, in order: (name, value).
pub(crate) type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Decode and validate an xattr block read from media (`ino` names its owner in errors).
pub(crate) fn decode(b: &[u8], ino: u64) -> Result<Attrs> {
    if get_u32(b, blk::MAGIC) != XATTR_MAGIC {
        return Err(corrupt!("inode {ino}: xattr block has no magic"));
    }
    let count = usize::from(get_u16(b, blk::COUNT));
    let claimed = get_u32(b, blk::USED);
    let used = usize::try_from(claimed)
        .ok()
        .filter(|&u| u <= XATTR_SPACE)
        .ok_or_else(|| corrupt!("inode {ino}: xattr block claims {claimed} bytes"))?;
    let end = blk::ENTRIES + used;
    if crate::media::crc::crc32c(&b[blk::ENTRIES..end]) != get_u32(b, blk::CRC) {
        return Err(corrupt!("inode {ino}: xattr block checksum mismatch"));
    }
    let mut out = Vec::with_capacity(count);
    let mut p = blk::ENTRIES;
    for _ in 0..count {
        if p + ent::NAME > end {
            return Err(corrupt!(
                "inode {ino}: xattr entry header past the used bytes"
            ));
        }
        let nl = usize::from(b[p + ent::NAME_LEN]);
        let vl = usize::from(get_u16(b, p + ent::VALUE_LEN));
        let name = p + ent::NAME;
        if nl == 0 || name + nl + vl > end {
            return Err(corrupt!(
                "inode {ino}: xattr entry of {nl}+{vl} bytes does not fit"
            ));
        }
        out.push((
            b[name..name + nl].to_vec(),
            b[name + nl..name + nl + vl].to_vec(),
        ));
        p = name + nl + vl;
    }
    Ok(out)
}

/// Encode a whole xattr block. Names longer than [`XATTR_NAME_MAX`] are refused with `Range`,
/// attributes that do not fit one block with `NoSpace`.
pub(crate) fn encode(attrs: &Attrs) -> Result<Vec<u8>> {
    let used: usize = attrs
        .iter()
        .map(|(n, v)| ent::NAME + n.len() + v.len())
        .sum();
    let no_space = || {
        Error::NoSpace(format!(
            "extended attributes need {used} bytes; an inode holds {XATTR_SPACE}"
        ))
    };
    if used > XATTR_SPACE {
        return Err(no_space());
    }
    // Every entry takes at least one byte and the total fits XATTR_SPACE (< 2^16), so the
    // count, the total and each value length fit their fields; a name must fit its u8 field.
    let count = u16::try_from(attrs.len()).map_err(|_| no_space())?;
    let used_field = u32::try_from(used).map_err(|_| no_space())?;
    let mut b = vec![0u8; BLOCK_BYTES];
    put_u32(&mut b, blk::MAGIC, XATTR_MAGIC);
    put_u16(&mut b, blk::COUNT, count);
    put_u32(&mut b, blk::USED, used_field);
    let mut p = blk::ENTRIES;
    for (n, v) in attrs {
        b[p + ent::NAME_LEN] = u8::try_from(n.len()).map_err(|_| Error::Range)?;
        put_u16(
            &mut b,
            p + ent::VALUE_LEN,
            u16::try_from(v.len()).map_err(|_| no_space())?,
        );
        let name = p + ent::NAME;
        b[name..name + n.len()].copy_from_slice(n);
        b[name + n.len()..name + n.len() + v.len()].copy_from_slice(v);
        p = name + n.len() + v.len();
    }
    let crc = crate::media::crc::crc32c(&b[blk::ENTRIES..blk::ENTRIES + used]);
    put_u32(&mut b, blk::CRC, crc);
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
    let mut b = vec![0u8; BLOCK_BYTES];
    pool.read(block * BLOCK_SIZE, &mut b)?;
    decode(&b, ino)
}

/// The namespaces an attribute name may start with, as on ext4. Of `system.` names only the
/// two POSIX ACLs (`meta::acl`) are kept: the kernel interprets them when the mount negotiates
/// `FUSE_POSIX_ACL`, and the others are the kernel's own.
const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// Check an attribute name: not empty, no NUL, at most [`XATTR_NAME_MAX`] bytes (ERANGE), one
/// of the POSIX ACLs or in one of the [`NAMESPACES`] (EOPNOTSUPP otherwise) and more than the
/// namespace alone (EINVAL), answered as ext4 answers them.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::Invalid("empty attribute name".into()));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    if acl::is_acl(name) {
        return Ok(());
    }
    match NAMESPACES.iter().find(|ns| name.starts_with(ns)) {
        Some(ns) if name.len() == ns.len() => Err(Error::Invalid(format!(
            "attribute name {:?} is a namespace alone",
            String::from_utf8_lossy(name)
        ))),
        Some(_) => Ok(()),
        None => Err(Error::NotSupported(format!(
            "attribute {:?}: winefs keeps user., trusted. and security. attributes and POSIX ACLs",
            String::from_utf8_lossy(name)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_kept_namespaces_are_refused_as_ext4_refuses_them() {
        for ok in [
            &b"user.x"[..],
            b"trusted.t",
            b"security.selinux",
            b"user.winefs.hugepage",
            b"system.posix_acl_access",
            b"system.posix_acl_default",
        ] {
            assert!(check_name(ok).is_ok(), "{ok:?}");
        }
        for unsupported in [&b"system.posix_acl_other"[..], b"system.", b"bogus.x", b"user", b"x"] {
            assert!(matches!(check_name(unsupported), Err(Error::NotSupported(_))), "{unsupported:?}");
        }
        for alone in [&b"user."[..], b"trusted.", b"security."] {
            assert!(matches!(check_name(alone), Err(Error::Invalid(_))), "{alone:?}");
        }
        assert!(matches!(check_name(&[b'u'; 256]), Err(Error::Range)));
    }

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
