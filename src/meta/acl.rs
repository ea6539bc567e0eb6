//! POSIX access control lists (POSIX.1e draft 17, as Linux keeps them): the value of the
//! extended attributes `system.posix_acl_access` and `system.posix_acl_default`, and the three
//! rules that tie an access ACL to the file's mode bits — setting an ACL sets the mode, a
//! chmod rewrites the ACL, and a new inode takes its directory's default ACL.
//!
//! The value is stored exactly as the kernel hands it over (little-endian: version u32 = 2,
//! then entries of tag u16, permission u16, id u32), so what `getxattr` returns is what was
//! set. Tags are ordered as Linux requires: the owner, named users, the owning group, named
//! groups, the mask (required with any named entry), others.
#![deny(clippy::cast_possible_truncation)]

use crate::error::{Error, Result};

/// The access ACL's attribute name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's attribute name (directories only): what new inodes in it start with.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
/// The id of an entry that names nobody (owner, owning group, mask, others).
pub const NO_ID: u32 = u32::MAX;

/// Whether attribute `name` is one of the two ACLs.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

/// An entry's tag (`ACL_USER_OBJ` and the rest, with Linux's numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Owner = 0x01,
    User = 0x02,
    OwningGroup = 0x04,
    Group = 0x08,
    Mask = 0x10,
    Other = 0x20,
}

impl Tag {
    fn from_u16(v: u16) -> Option<Tag> {
        Some(match v {
            0x01 => Tag::Owner,
            0x02 => Tag::User,
            0x04 => Tag::OwningGroup,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: Tag,
    /// Read 4, write 2, execute 1.
    perm: u32,
    id: u32,
}

/// A decoded, valid ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

fn invalid(why: &str) -> Error {
    Error::Invalid(format!("POSIX ACL: {why}"))
}

impl Acl {
    /// Decode an attribute value, refusing (EINVAL) what Linux refuses: another version, a
    /// length that is not whole entries, an unknown tag or permission bit, entries out of
    /// order, a missing owner, owning group or others entry, named entries without a mask.
    /// An ACL of no entries is `None` (Linux takes it as "remove the ACL").
    pub fn decode(value: &[u8]) -> Result<Option<Acl>> {
        if value.len() < HEADER || !(value.len() - HEADER).is_multiple_of(ENTRY) {
            return Err(invalid(&format!("{} bytes are not whole entries", value.len())));
        }
        let word = |o: usize| u32::from_le_bytes([value[o], value[o + 1], value[o + 2], value[o + 3]]);
        let half = |o: usize| u16::from_le_bytes([value[o], value[o + 1]]);
        if word(0) != VERSION {
            return Err(invalid(&format!("version {} (Linux writes 2)", word(0))));
        }
        let mut entries = Vec::with_capacity((value.len() - HEADER) / ENTRY);
        for o in (HEADER..value.len()).step_by(ENTRY) {
            let tag = Tag::from_u16(half(o))
                .ok_or_else(|| invalid(&format!("unknown tag {:#x}", half(o))))?;
            let perm = u32::from(half(o + 2));
            if perm & !0o7 != 0 {
                return Err(invalid(&format!("permission bits {perm:#o}")));
            }
            let id = match tag {
                Tag::User | Tag::Group => word(o + 4),
                _ => NO_ID,
            };
            entries.push(Entry { tag, perm, id });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        check_order(&entries)?;
        Ok(Some(Acl(entries)))
    }

    /// The attribute value of this ACL.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + ENTRY * self.0.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.0 {
            v.extend_from_slice(&(e.tag as u16).to_le_bytes());
            // Permissions are checked to three bits at decode and only narrowed after.
            v.extend_from_slice(&u16::try_from(e.perm & 0o7).unwrap_or(0).to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// The permission bits (0o777) this access ACL gives the file's mode — the owner's, the
    /// mask's (or the owning group's if there is no mask) and others' — and whether the ACL
    /// says no more than they do (only the three required entries), so that it need not be
    /// stored.
    pub fn mode(&self) -> (u32, bool) {
        let perm = |tag| self.0.iter().find(|e| e.tag == tag).map_or(0, |e| e.perm);
        let group = match self.0.iter().any(|e| e.tag == Tag::Mask) {
            true => perm(Tag::Mask),
            false => perm(Tag::OwningGroup),
        };
        let mode = (perm(Tag::Owner) << 6) | (group << 3) | perm(Tag::Other);
        (mode, self.0.len() == 3)
    }

    /// A chmod to permission bits `mode`: the owner's and others' entries and the mask (or the
    /// owning group, without one) take the new bits; named entries keep theirs (the mask
    /// limits them).
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.0 {
            match e.tag {
                Tag::Owner => e.perm = (mode >> 6) & 0o7,
                Tag::Mask => e.perm = (mode >> 3) & 0o7,
                Tag::OwningGroup if !has_mask => e.perm = (mode >> 3) & 0o7,
                Tag::Other => e.perm = mode & 0o7,
                _ => {}
            }
        }
    }

    /// A new inode made with permission bits `*mode` in a directory whose default ACL is
    /// `self`: each class's entry and its mode bits are narrowed to what both allow (the mask
    /// standing for the group class when there is one), and `self` becomes the new inode's
    /// access ACL. Returns false when that ACL says no more than the mode (it is then not
    /// stored).
    pub fn create(&mut self, mode: &mut u32) -> bool {
        let has_mask = self.0.iter().any(|e| e.tag == Tag::Mask);
        let mut bits = *mode & 0o777;
        for e in &mut self.0 {
            let shift = match e.tag {
                Tag::Owner => 6,
                Tag::Mask => 3,
                Tag::OwningGroup if !has_mask => 3,
                Tag::Other => 0,
                _ => continue,
            };
            e.perm &= (bits >> shift) & 0o7;
            bits &= !(0o7 << shift) | (e.perm << shift);
        }
        *mode = (*mode & !0o777) | bits;
        self.0.len() > 3
    }
}

/// The attribute value of ACL `entries` (tag, permission, id; Linux's numbers), unchecked, as
/// setfacl hands it over: for tools and tests that set ACLs without setfacl.
pub fn value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Linux's ordering of entries (`posix_acl_valid`): owner first and once, then named users,
/// the owning group once, named groups, the mask (required if there are named entries, else
/// optional), others last.
fn check_order(entries: &[Entry]) -> Result<()> {
    let rank = |t: Tag| match t {
        Tag::Owner => 0,
        Tag::User => 1,
        Tag::OwningGroup => 2,
        Tag::Group => 3,
        Tag::Mask => 4,
        Tag::Other => 5,
    };
    let once = |t: Tag| entries.iter().filter(|e| e.tag == t).count();
    if once(Tag::Owner) != 1 || once(Tag::OwningGroup) != 1 || once(Tag::Other) != 1 {
        return Err(invalid("needs one owner, one owning group and one others entry"));
    }
    if once(Tag::Mask) > 1 {
        return Err(invalid("more than one mask"));
    }
    if entries.windows(2).any(|w| rank(w[0].tag) > rank(w[1].tag)) {
        return Err(invalid("entries out of order"));
    }
    let named = entries.iter().any(|e| matches!(e.tag, Tag::User | Tag::Group));
    if named && once(Tag::Mask) == 0 {
        return Err(invalid("named entries without a mask"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u32 = u32::MAX;

    #[test]
    fn a_minimal_acl_is_the_mode_and_a_named_entry_is_more() {
        let minimal = value(&[(1, 6, U), (4, 4, U), (0x20, 0, U)]);
        let acl = Acl::decode(&minimal).unwrap().unwrap();
        assert_eq!(acl.mode(), (0o640, true));
        assert_eq!(acl.encode(), minimal);
        let named = value(&[(1, 7, U), (2, 6, 1000), (4, 4, U), (0x10, 5, U), (0x20, 1, U)]);
        let acl = Acl::decode(&named).unwrap().unwrap();
        // The mask, not the owning group's entry, is the mode's group class.
        assert_eq!(acl.mode(), (0o751, false));
        assert_eq!(acl.encode(), named);
    }

    #[test]
    fn what_linux_refuses_is_refused() {
        let bad = [
            vec![1u8, 0, 0, 0],                                                // version 1
            value(&[(1, 6, U), (4, 4, U)])[..15].to_vec(),                     // a partial entry
            value(&[(1, 6, U), (4, 4, U)]),                                    // no others
            value(&[(4, 4, U), (1, 6, U), (0x20, 0, U)]),                      // out of order
            value(&[(1, 6, U), (2, 6, 5), (4, 4, U), (0x20, 0, U)]),           // named, no mask
            value(&[(1, 6, U), (4, 4, U), (0x40, 0, U), (0x20, 0, U)]),        // unknown tag
            value(&[(1, 8, U), (4, 4, U), (0x20, 0, U)]),                      // permission bit
            value(&[(1, 6, U), (1, 6, U), (4, 4, U), (0x20, 0, U)]),           // two owners
        ];
        for b in bad {
            assert!(matches!(Acl::decode(&b), Err(Error::Invalid(_))), "{b:?}");
        }
        assert_eq!(Acl::decode(&value(&[])).unwrap(), None);
    }

    #[test]
    fn chmod_rewrites_the_owner_mask_and_others() {
        let mut acl = Acl::decode(&value(&[(1, 7, U), (2, 7, 9), (4, 5, U), (0x10, 7, U), (0x20, 5, U)]))
            .unwrap()
            .unwrap();
        acl.chmod(0o640);
        assert_eq!(
            acl.encode(),
            value(&[(1, 6, U), (2, 7, 9), (4, 5, U), (0x10, 4, U), (0x20, 0, U)])
        );
        let mut plain = Acl::decode(&value(&[(1, 7, U), (4, 5, U), (0x20, 5, U)])).unwrap().unwrap();
        plain.chmod(0o600);
        assert_eq!(plain.mode(), (0o600, true));
    }

    #[test]
    fn a_new_inode_takes_the_default_acl_narrowed_by_its_mode() {
        // default: user::rwx user:9:rwx group::r-x mask::rwx other::r-x; creat(0666).
        let mut acl = Acl::decode(&value(&[(1, 7, U), (2, 7, 9), (4, 5, U), (0x10, 7, U), (0x20, 5, U)]))
            .unwrap()
            .unwrap();
        let mut mode = 0o100666;
        assert!(acl.create(&mut mode));
        assert_eq!(mode, 0o100664);
        assert_eq!(
            acl.encode(),
            value(&[(1, 6, U), (2, 7, 9), (4, 5, U), (0x10, 6, U), (0x20, 4, U)])
        );
        // A default ACL of the three required entries gives a mode and no access ACL.
        let mut min = Acl::decode(&value(&[(1, 7, U), (4, 0, U), (0x20, 0, U)])).unwrap().unwrap();
        let mut mode = 0o40777;
        assert!(!min.create(&mut mode));
        assert_eq!(mode, 0o40700);
    }
}
