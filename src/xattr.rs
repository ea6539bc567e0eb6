//! Extended attributes: one copy-on-write block per inode.
//!
//! Block format: magic u32, entry count u16, reserved u16, bytes used u32, crc32c u32 of the
//! entries, then entries (name length u8, reserved u8, value length u16, name, value). A change
//! writes a whole new block, then one transaction points the inode at it; the old block is freed
//! after commit. So an update is atomic and the block never needs journaling.

use crate::error::{Error, Result, corrupt};
use crate::fs::{Inner, Node, Reserved, XattrSet, now_ns, rlock, wlock};
use crate::journal::Tx;
use crate::layout::{BLOCK_SIZE, XATTR_MAGIC, get_u16, get_u32, put_u16, put_u32};
use crate::pool::Category;

/// Longest attribute name (XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Bytes of entries one xattr block holds.
pub const XATTR_SPACE: usize = BLOCK_SIZE as usize - 16;

type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

fn decode(b: &[u8], ino: u64) -> Result<Attrs> {
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

fn encode(attrs: &Attrs) -> Result<Vec<u8>> {
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
pub(crate) fn load(inner: &Inner, ino: u64, block: u64) -> Result<Attrs> {
    if block == 0 {
        return Ok(Vec::new());
    }
    if !inner.geo.is_data_block(block) {
        return Err(corrupt!(
            "inode {ino}: xattr block {block} outside the data area"
        ));
    }
    let mut b = vec![0u8; BLOCK_SIZE as usize];
    inner.pool.read(block * BLOCK_SIZE, &mut b)?;
    decode(&b, ino)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::Invalid("empty attribute name".into()));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    Ok(())
}

pub(crate) fn get(inner: &Inner, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
    inner.check_alive()?;
    check_name(name)?;
    let n = inner.node(ino)?;
    let g = rlock(&n);
    load(inner, ino, g.hdr.xattr_block)?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .ok_or(Error::NoAttr)
}

pub(crate) fn list(inner: &Inner, ino: u64) -> Result<Vec<Vec<u8>>> {
    inner.check_alive()?;
    let n = inner.node(ino)?;
    let g = rlock(&n);
    Ok(load(inner, ino, g.hdr.xattr_block)?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

/// Set (`Some`) or remove (`None`) an attribute.
pub(crate) fn set(
    inner: &Inner,
    ino: u64,
    name: &[u8],
    value: Option<&[u8]>,
    how: XattrSet,
) -> Result<()> {
    inner.check_alive()?;
    check_name(name)?;
    // Linux's XATTR_SIZE_MAX; the encoded block (XATTR_SPACE) is far smaller, so the u16
    // length fields on media can never overflow.
    if value.is_some_and(|v| v.len() > 65536) {
        return Err(Error::Range);
    }
    let n = inner.node(ino)?;
    let mut g = wlock(&n);
    set_locked(inner, &mut g, name, value, how)
}

/// The alignment hint (see docs/DESIGN.md): a file carrying it gets whole aligned 2 MiB
/// extents even when written in small pieces; a directory carrying it passes it to the files
/// created directly in it. Set automatically once a file receives an aligned extent, so it
/// travels with `cp --preserve=xattr` and `rsync -X`.
pub const HUGEPAGE_HINT: &[u8] = b"user.winefs.hugepage";

/// Whether the inode carries the alignment hint (cached in the node).
pub(crate) fn hinted(inner: &Inner, g: &mut Node) -> Result<bool> {
    if let Some(h) = g.hugepage_hint {
        return Ok(h);
    }
    let h = load(inner, g.ino, g.hdr.xattr_block)?
        .iter()
        .any(|(k, _)| k == HUGEPAGE_HINT);
    g.hugepage_hint = Some(h);
    Ok(h)
}

/// Give the inode the alignment hint if it lacks it.
pub(crate) fn add_hint(inner: &Inner, g: &mut Node) -> Result<()> {
    if hinted(inner, g)? {
        return Ok(());
    }
    set_locked(inner, g, HUGEPAGE_HINT, Some(b"1"), XattrSet::Any)
}

/// [`set`] with the inode lock held.
pub(crate) fn set_locked(
    inner: &Inner,
    g: &mut Node,
    name: &[u8],
    value: Option<&[u8]>,
    how: XattrSet,
) -> Result<()> {
    let ino = g.ino;
    let mut attrs = load(inner, ino, g.hdr.xattr_block)?;
    let pos = attrs.iter().position(|(k, _)| k == name);
    match (value, how, pos) {
        (Some(_), XattrSet::Create, Some(_)) => return Err(Error::Exists),
        (Some(_), XattrSet::Replace, None) | (None, _, None) => return Err(Error::NoAttr),
        (Some(v), _, Some(i)) => attrs[i].1 = v.to_vec(),
        (Some(v), _, None) => attrs.push((name.to_vec(), v.to_vec())),
        (None, _, Some(i)) => {
            attrs.remove(i);
        }
    }
    let bytes = if attrs.is_empty() {
        None
    } else {
        Some(encode(&attrs)?)
    };
    install(inner, g, bytes.as_deref(), true)?;
    if name == HUGEPAGE_HINT {
        g.hugepage_hint = Some(value.is_some());
    }
    Ok(())
}

/// The copy-on-write step of every xattr change: write `bytes` (None: no attributes left) to a
/// new block, point the inode at it in one transaction (with a new ctime if `touch`), then free
/// the old block. Returns the new block (0 for none).
fn install(inner: &Inner, g: &mut Node, bytes: Option<&[u8]>, touch: bool) -> Result<u64> {
    let mut res = Reserved::new(inner);
    let new_block = match bytes {
        None => 0,
        Some(bytes) => {
            let b = res.alloc_one()?;
            inner
                .pool
                .write_flush(b * BLOCK_SIZE, bytes, Category::Metadata)?;
            b
        }
    };
    let mut hdr = g.hdr.clone();
    hdr.xattr_block = new_block;
    if touch {
        hdr.ctime = now_ns();
    }
    let mut tx = Tx::new();
    inner.header_tx(&mut tx, g.ino, &g.hdr, &hdr);
    inner.commit(tx)?;
    res.keep();
    let old = g.hdr.xattr_block;
    g.hdr = hdr;
    if old != 0 {
        inner.free_runs(&[crate::alloc::BlockRun { start: old, len: 1 }]);
    }
    Ok(new_block)
}

/// Move the inode's xattr block, which must be at `from`, onto a newly allocated block (hole
/// compaction): the copy-on-write step of [`set_locked`] with the same bytes and no new ctime.
/// Returns the new block, or None when the block is not at `from` any more.
pub(crate) fn relocate_block(inner: &Inner, g: &mut Node, from: u64) -> Result<Option<u64>> {
    if from == 0 || g.hdr.xattr_block != from {
        return Ok(None);
    }
    let mut bytes = vec![0u8; BLOCK_SIZE as usize];
    inner.pool.read(from * BLOCK_SIZE, &mut bytes)?;
    install(inner, g, Some(&bytes), false).map(Some)
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
