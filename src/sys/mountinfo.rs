//! The mount table as `/proc/self/mountinfo` gives it: each mount's point, options, type and source, with
//! the octal escapes the kernel writes for a space, tab, newline or backslash in them undone.
//! The preload library reads the table too and builds this file into itself (`#[path]`), so it
//! is plain safe Rust with nothing from the rest of the crate.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// One mount of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// Its file-system type (`fuse.winefs` for a winefs FUSE mount).
    pub fstype: String,
    /// Its source (a winefs mount names its pool file).
    pub source: PathBuf,
    /// Its per-mount options (`rw`/`ro`, `nosuid`, `noatime`, ...).
    pub options: Vec<String>,
}

/// The mounts this process sees, in the table's order (a mount over another comes after it);
/// empty if the table cannot be read.
pub fn mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| parse(&info))
        .unwrap_or_default()
}

/// The mounts of a mountinfo text; lines that do not parse are skipped.
pub fn parse(info: &str) -> Vec<Mount> {
    // Fields: id parent maj:min root point options [optional...] - fstype source superoptions
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut l = left.split(' ').skip(4);
            let (point, options) = (l.next()?, l.next()?);
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            Some(Mount {
                point: unescape(point),
                fstype: fstype.to_string(),
                source: unescape(source),
                options: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A field with its octal escapes (`\040` for a space) undone; a backslash not followed by
/// three octal digits stays as it is.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    OsString::from_vec(out).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn fields_are_unescaped_as_mountinfo_escapes_them() {
        assert_eq!(unescape("/mnt/winefs"), Path::new("/mnt/winefs"));
        assert_eq!(
            unescape("/mnt/a\\040b\\011c\\012"),
            Path::new("/mnt/a b\tc\n")
        );
        assert_eq!(unescape("/back\\134slash"), Path::new("/back\\slash"));
        // Not an escape: a backslash without three octal digits stays.
        assert_eq!(unescape("/x\\09"), Path::new("/x\\09"));
        assert_eq!(unescape("/end\\04"), Path::new("/end\\04"));
    }

    #[test]
    fn a_table_gives_each_mounts_point_type_and_source() {
        let info = "\
22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
97 22 0:50 / /mnt/my\\040pool rw,nosuid,nodev master:1 shared:7 - fuse.winefs /pools/a\\040b.pool rw,user_id=0
garbage line
98 22 0:51 / /mnt/x rw - fuse /pools/old.pool rw
";
        let m = parse(info);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1],
            Mount {
                point: "/mnt/my pool".into(),
                fstype: "fuse.winefs".into(),
                source: "/pools/a b.pool".into(),
                options: vec!["rw".into(), "nosuid".into(), "nodev".into()],
            }
        );
        assert_eq!(
            (m[0].fstype.as_str(), m[2].fstype.as_str()),
            ("proc", "fuse")
        );
        // This process's own table parses and has the root in it.
        assert!(mounts().iter().any(|m| m.point == Path::new("/")));
    }
}
