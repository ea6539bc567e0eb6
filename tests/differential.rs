//! Differential test: random operation sequences applied to winefs (through the library API)
//! and to a directory on the host's tmpfs; every outcome (value or errno) must agree, and after
//! each sequence fsck must be clean and the two trees must be identical.
//!
//! The host side calls the xattr system calls std lacks directly: this test file is allowed
//! `unsafe` (Cargo.toml [lints]), each block with its SAFETY comment.
#![allow(unsafe_code)]

use proptest::prelude::*;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use winefs::{Consistency, Error, FileKind, Fs, XattrSet};

mod common;

const MIB2: u64 = 2 << 20;

// ---------------------------------------------------------------------------------------------
// The operation language.

/// Candidate parent directories (they may stop existing or be replaced by files/symlinks).
const DIRS: &[&str] = &["", "d0", "d1", "d0/d2", "a"];

fn long_name() -> String {
    "L".repeat(200)
}

/// Candidate final names; "d0"/"d2" collide with directory names on purpose.
fn name(i: usize) -> String {
    match i % 6 {
        0 => "a".into(),
        1 => "b".into(),
        2 => "c".into(),
        3 => "d0".into(),
        4 => "d2".into(),
        _ => long_name(),
    }
}

/// Symlink targets: relative and without "..", so host resolution never leaves the test root.
const TARGETS: &[&str] = &["a", "b", "d2", "zz", "d2/a", "d0"];
/// The last two are refused, as tmpfs refuses them: a namespace the kernel does not know
/// (EOPNOTSUPP) and a namespace alone (EINVAL).
const XNAMES: &[&str] = &[
    "user.x",
    "user.y",
    "user.a-rather-longer-attribute-name",
    "bogus.x",
    "user.",
];

#[derive(Clone, Copy, Debug)]
struct P {
    dir: usize,
    name: usize,
}

impl P {
    fn path(&self) -> String {
        let d = DIRS[self.dir % DIRS.len()];
        if d.is_empty() {
            name(self.name)
        } else {
            format!("{d}/{}", name(self.name))
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(P),
    Write {
        p: P,
        off: u64,
        len: usize,
        seed: u8,
    },
    Append {
        p: P,
        len: usize,
        seed: u8,
    },
    Truncate(P, u64),
    Read(P),
    Unlink(P),
    Rename(P, P),
    /// Rename a directory into its own subdirectory (must fail with EINVAL).
    RenameIntoSelf(usize),
    Mkdir(P),
    Rmdir(P),
    Link(P, P),
    Symlink(P, usize),
    Readlink(P),
    Stat(P),
    Readdir(usize),
    SetXattr {
        p: P,
        x: usize,
        vlen: usize,
        seed: u8,
        how: u8,
    },
    GetXattr(P, usize),
    ListXattr(P),
    RemoveXattr(P, usize),
    Fallocate {
        p: P,
        off: u64,
        len: u64,
    },
    /// Unmount and mount again; `true`: just drop the Fs (which unmounts too).
    Remount(bool),
}

fn p_strat() -> impl Strategy<Value = P> {
    // Mostly existing directories and file-ish names, so most operations succeed; the rest
    // (parent "a", names "d0"/"d2") exercise the error paths.
    let dir = prop_oneof![3 => Just(0usize), 3 => Just(1usize), 2 => Just(2usize), 2 => Just(3usize), 1 => Just(4usize)];
    let name = prop_oneof![4 => Just(0usize), 4 => Just(1usize), 3 => Just(2usize), 1 => Just(3usize), 1 => Just(4usize), 2 => Just(5usize)];
    (dir, name).prop_map(|(dir, name)| P { dir, name })
}

fn off_strat() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..300_000u64,
        2 => (0..80u64).prop_map(|k| k * 4096 + 4000), // crosses a 4 KiB boundary
        1 => (MIB2 - 70_000)..(MIB2 + 10_000),          // crosses / sits near 2 MiB
    ]
}

fn op_strat() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => p_strat().prop_map(Op::Create),
        8 => (p_strat(), off_strat(), 0..70_000usize, any::<u8>()).prop_map(|(p, off, len, seed)| Op::Write { p, off, len, seed }),
        3 => (p_strat(), 0..20_000usize, any::<u8>()).prop_map(|(p, len, seed)| Op::Append { p, len, seed }),
        3 => (p_strat(), prop_oneof![0..400_000u64, (MIB2 - 5000)..(MIB2 + 5000)]).prop_map(|(p, s)| Op::Truncate(p, s)),
        4 => p_strat().prop_map(Op::Read),
        3 => p_strat().prop_map(Op::Unlink),
        5 => (p_strat(), p_strat()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (0..3usize).prop_map(Op::RenameIntoSelf),
        3 => p_strat().prop_map(Op::Mkdir),
        2 => p_strat().prop_map(Op::Rmdir),
        3 => (p_strat(), p_strat()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => (p_strat(), 0..TARGETS.len()).prop_map(|(p, t)| Op::Symlink(p, t)),
        1 => p_strat().prop_map(Op::Readlink),
        3 => p_strat().prop_map(Op::Stat),
        2 => (0..DIRS.len()).prop_map(Op::Readdir),
        2 => (p_strat(), 0..XNAMES.len(), 0..120usize, any::<u8>(), 0..3u8)
            .prop_map(|(p, x, vlen, seed, how)| Op::SetXattr { p, x, vlen, seed, how }),
        1 => (p_strat(), 0..XNAMES.len()).prop_map(|(p, x)| Op::GetXattr(p, x)),
        1 => p_strat().prop_map(Op::ListXattr),
        1 => (p_strat(), 0..XNAMES.len()).prop_map(|(p, x)| Op::RemoveXattr(p, x)),
        2 => (p_strat(), off_strat(), prop_oneof![1 => Just(0u64), 8 => 1..100_000u64]).prop_map(|(p, off, len)| Op::Fallocate { p, off, len }),
        1 => any::<bool>().prop_map(Op::Remount),
    ]
}

fn content(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(31).wrapping_add(seed as u32 * 7) % 251) as u8)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Outcomes.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Unit,
    Bytes(Vec<u8>),
    Names(Vec<Vec<u8>>),
    /// kind, size (None for directories: tmpfs sizes differ), nlink
    Stat(char, Option<u64>, u64),
    Err(i32),
}

fn short(o: &Out) -> String {
    match o {
        Out::Bytes(b) => format!("Bytes(len {})", b.len()),
        o => format!("{o:?}"),
    }
}

fn w<T>(r: Result<T, Error>, f: impl FnOnce(T) -> Out) -> Out {
    match r {
        Ok(v) => f(v),
        Err(e) => Out::Err(e.errno()),
    }
}

fn h<T>(r: std::io::Result<T>, f: impl FnOnce(T) -> Out) -> Out {
    match r {
        Ok(v) => f(v),
        Err(e) => Out::Err(
            e.raw_os_error()
                .unwrap_or_else(|| panic!("host error without errno: {e}")),
        ),
    }
}

fn kind_char(k: FileKind) -> char {
    match k {
        FileKind::File => 'f',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '?',
    }
}

fn host_kind(m: &std::fs::Metadata) -> char {
    let t = m.file_type();
    if t.is_dir() {
        'd'
    } else if t.is_symlink() {
        'l'
    } else if t.is_file() {
        'f'
    } else {
        '?'
    }
}

fn host_stat(m: std::fs::Metadata) -> Out {
    let k = host_kind(&m);
    Out::Stat(k, (k != 'd').then_some(m.len()), m.nlink())
}

// ---------------------------------------------------------------------------------------------
// Host side.

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn last_err<T>() -> std::io::Result<T> {
    Err(std::io::Error::last_os_error())
}

fn host_setxattr(p: &Path, n: &str, v: &[u8], flags: i32) -> std::io::Result<()> {
    let (cp, cn) = (cpath(p), CString::new(n).unwrap());
    // SAFETY: valid NUL-terminated strings and a valid buffer of v.len() bytes.
    let r = unsafe { libc::setxattr(cp.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), v.len(), flags) };
    if r < 0 { last_err() } else { Ok(()) }
}

fn host_getxattr(p: &Path, n: &str) -> std::io::Result<Vec<u8>> {
    let (cp, cn) = (cpath(p), CString::new(n).unwrap());
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid strings and a writable buffer of buf.len() bytes.
    let r = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return last_err();
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn host_listxattr(p: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    let cp = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid string and a writable buffer of buf.len() bytes.
    let r = unsafe { libc::listxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return last_err();
    }
    let mut v: Vec<Vec<u8>> = buf[..r as usize]
        .split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| s.to_vec())
        .collect();
    // Only "user." names are ours (tmpfs may expose security.* labels).
    v.retain(|n| n.starts_with(b"user."));
    v.sort();
    Ok(v)
}

fn host_removexattr(p: &Path, n: &str) -> std::io::Result<()> {
    let (cp, cn) = (cpath(p), CString::new(n).unwrap());
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) };
    if r < 0 { last_err() } else { Ok(()) }
}

fn host_fallocate(p: &Path, off: u64, len: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(p)?;
    winefs::sys::fallocate(&f, off, len)
}

fn host_apply(root: &Path, op: &Op) -> Out {
    let j = |p: &P| -> PathBuf { root.join(p.path()) };
    let jd = |d: usize| -> PathBuf {
        let s = DIRS[d % DIRS.len()];
        if s.is_empty() {
            root.to_path_buf()
        } else {
            root.join(s)
        }
    };
    match op {
        Op::Create(p) => h(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(j(p)),
            |_| Out::Unit,
        ),
        Op::Write { p, off, len, seed } => h(
            std::fs::OpenOptions::new()
                .write(true)
                .open(j(p))
                .and_then(|f| f.write_all_at(&content(*len, *seed), *off)),
            |_| Out::Unit,
        ),
        Op::Append { p, len, seed } => h(
            std::fs::OpenOptions::new()
                .append(true)
                .open(j(p))
                .and_then(|mut f| f.write_all(&content(*len, *seed))),
            |_| Out::Unit,
        ),
        Op::Truncate(p, s) => h(
            std::fs::OpenOptions::new()
                .write(true)
                .open(j(p))
                .and_then(|f| f.set_len(*s)),
            |_| Out::Unit,
        ),
        Op::Read(p) => h(std::fs::read(j(p)), Out::Bytes),
        Op::Unlink(p) => h(std::fs::remove_file(j(p)), |_| Out::Unit),
        Op::Rename(a, b) => h(std::fs::rename(j(a), j(b)), |_| Out::Unit),
        Op::RenameIntoSelf(k) => {
            let (from, to) = rename_into_self(*k);
            h(std::fs::rename(root.join(from), root.join(to)), |_| {
                Out::Unit
            })
        }
        Op::Mkdir(p) => h(std::fs::create_dir(j(p)), |_| Out::Unit),
        Op::Rmdir(p) => h(std::fs::remove_dir(j(p)), |_| Out::Unit),
        Op::Link(a, b) => h(std::fs::hard_link(j(a), j(b)), |_| Out::Unit),
        Op::Symlink(p, t) => h(std::os::unix::fs::symlink(TARGETS[*t], j(p)), |_| Out::Unit),
        Op::Readlink(p) => h(std::fs::read_link(j(p)), |t| {
            Out::Bytes(t.as_os_str().as_bytes().to_vec())
        }),
        Op::Stat(p) => h(std::fs::symlink_metadata(j(p)), host_stat),
        Op::Readdir(d) => h(
            std::fs::read_dir(jd(*d)).and_then(|it| {
                it.map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
                    .collect::<std::io::Result<Vec<_>>>()
            }),
            |mut v| {
                // The alignment hint winefs adds to files given aligned extents has no host
                // counterpart.
                v.retain(|n| n != winefs::meta::xattr::HUGEPAGE_HINT);
                v.sort();
                Out::Names(v)
            },
        ),
        Op::SetXattr {
            p,
            x,
            vlen,
            seed,
            how,
        } => {
            let flags = match how {
                0 => 0,
                1 => libc::XATTR_CREATE,
                _ => libc::XATTR_REPLACE,
            };
            h(
                host_setxattr(&j(p), XNAMES[*x], &content(*vlen, *seed), flags),
                |_| Out::Unit,
            )
        }
        Op::GetXattr(p, x) => h(host_getxattr(&j(p), XNAMES[*x]), Out::Bytes),
        Op::ListXattr(p) => h(host_listxattr(&j(p)), Out::Names),
        Op::RemoveXattr(p, x) => h(host_removexattr(&j(p), XNAMES[*x]), |_| Out::Unit),
        Op::Fallocate { p, off, len } => h(host_fallocate(&j(p), *off, *len), |_| Out::Unit),
        Op::Remount(_) => Out::Unit,
    }
}

fn rename_into_self(k: usize) -> (&'static str, &'static str) {
    match k % 3 {
        0 => ("d0", "d0/d2/x"),
        1 => ("d0", "d0/x"),
        _ => ("d1", "d1/x"),
    }
}

// ---------------------------------------------------------------------------------------------
// winefs side.

fn win_read_all(fs: &Fs, ino: u64) -> Result<Vec<u8>, Error> {
    let size = fs.getattr(ino)?.size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(ino, 0, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn win_apply(fs: &Fs, op: &Op) -> Out {
    let pp = |p: &P| fs.parent_of(&p.path());
    let jd = |d: usize| DIRS[d % DIRS.len()].to_string();
    match op {
        Op::Create(p) => w(
            pp(p).and_then(|(d, n)| fs.create(d, &n, 0o644, 0, 0)),
            |_| Out::Unit,
        ),
        Op::Write { p, off, len, seed } => w(
            fs.resolve(&p.path(), true).and_then(|i| {
                let data = content(*len, *seed);
                let n = fs.write(i, *off, &data)?;
                assert_eq!(n, data.len(), "short write without ENOSPC on a roomy pool");
                Ok(())
            }),
            |_| Out::Unit,
        ),
        Op::Append { p, len, seed } => w(
            fs.resolve(&p.path(), true).and_then(|i| {
                let data = content(*len, *seed);
                let (n, _) = fs.append(i, &data)?;
                assert_eq!(n, data.len());
                Ok(())
            }),
            |_| Out::Unit,
        ),
        Op::Truncate(p, s) => w(
            fs.resolve(&p.path(), true).and_then(|i| fs.truncate(i, *s)),
            |_| Out::Unit,
        ),
        Op::Read(p) => w(
            fs.resolve(&p.path(), true)
                .and_then(|i| win_read_all(fs, i)),
            Out::Bytes,
        ),
        Op::Unlink(p) => w(pp(p).and_then(|(d, n)| fs.unlink(d, &n)), |_| Out::Unit),
        Op::Rename(a, b) => w(
            pp(a).and_then(|(d1, n1)| {
                let (d2, n2) = pp(b)?;
                fs.rename(d1, &n1, d2, &n2, Default::default())
            }),
            |_| Out::Unit,
        ),
        Op::RenameIntoSelf(k) => {
            let (from, to) = rename_into_self(*k);
            w(fs.rename_path(from, to), |_| Out::Unit)
        }
        Op::Mkdir(p) => w(
            pp(p).and_then(|(d, n)| fs.mkdir(d, &n, 0o755, 0, 0)),
            |_| Out::Unit,
        ),
        Op::Rmdir(p) => w(pp(p).and_then(|(d, n)| fs.rmdir(d, &n)), |_| Out::Unit),
        Op::Link(a, b) => w(
            fs.resolve(&a.path(), false).and_then(|i| {
                let (d, n) = pp(b)?;
                fs.link(i, d, &n)
            }),
            |_| Out::Unit,
        ),
        Op::Symlink(p, t) => w(
            pp(p).and_then(|(d, n)| fs.symlink(d, &n, TARGETS[*t].as_bytes(), 0, 0)),
            |_| Out::Unit,
        ),
        Op::Readlink(p) => w(
            fs.resolve(&p.path(), false).and_then(|i| fs.readlink(i)),
            Out::Bytes,
        ),
        Op::Stat(p) => w(
            fs.resolve(&p.path(), false).and_then(|i| fs.getattr(i)),
            |a| {
                Out::Stat(
                    kind_char(a.kind),
                    (a.kind != FileKind::Dir).then_some(a.size),
                    a.nlink as u64,
                )
            },
        ),
        Op::Readdir(d) => w(fs.list_dir(&jd(*d)), |mut v| {
            v.sort();
            Out::Names(v)
        }),
        Op::SetXattr {
            p,
            x,
            vlen,
            seed,
            how,
        } => {
            let how = match how {
                0 => XattrSet::Any,
                1 => XattrSet::Create,
                _ => XattrSet::Replace,
            };
            w(
                fs.resolve(&p.path(), true).and_then(|i| {
                    fs.setxattr(i, XNAMES[*x].as_bytes(), &content(*vlen, *seed), how)
                }),
                |_| Out::Unit,
            )
        }
        Op::GetXattr(p, x) => w(
            fs.resolve(&p.path(), true)
                .and_then(|i| fs.getxattr(i, XNAMES[*x].as_bytes())),
            Out::Bytes,
        ),
        Op::ListXattr(p) => w(
            fs.resolve(&p.path(), true).and_then(|i| fs.listxattr(i)),
            |mut v| {
                // The alignment hint winefs adds to files given aligned extents has no host
                // counterpart.
                v.retain(|n| n != winefs::meta::xattr::HUGEPAGE_HINT);
                v.sort();
                Out::Names(v)
            },
        ),
        Op::RemoveXattr(p, x) => w(
            fs.resolve(&p.path(), true)
                .and_then(|i| fs.removexattr(i, XNAMES[*x].as_bytes())),
            |_| Out::Unit,
        ),
        Op::Fallocate { p, off, len } => w(
            fs.resolve(&p.path(), true).and_then(|i| {
                // The host opens the file for writing first, which fails on a directory.
                if fs.getattr(i)?.kind == FileKind::Dir {
                    return Err(Error::IsDir);
                }
                fs.fallocate(i, *off, *len, false)
            }),
            |_| Out::Unit,
        ),
        Op::Remount(_) => Out::Unit,
    }
}

// ---------------------------------------------------------------------------------------------
// Whole-tree comparison.

fn compare_trees(fs: &Fs, root: &Path) -> Result<(), String> {
    fn walk(
        fs: &Fs,
        ino: u64,
        host: &Path,
        rel: &str,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        let mut hn: Vec<Vec<u8>> = std::fs::read_dir(host)
            .map_err(|e| format!("{rel}: host readdir: {e}"))?
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        hn.sort();
        let mut wents = fs
            .readdir(ino, 2)
            .map_err(|e| format!("{rel}: winefs readdir: {e}"))?;
        wents.sort_by(|a, b| a.name.cmp(&b.name));
        let wn: Vec<Vec<u8>> = wents.iter().map(|e| e.name.clone()).collect();
        if hn != wn {
            return Err(format!(
                "{rel}: names differ: host {:?} winefs {:?}",
                hn.iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect::<Vec<_>>(),
                wn.iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect::<Vec<_>>()
            ));
        }
        let dattr = fs.getattr(ino).map_err(|e| e.to_string())?;
        let dmeta = std::fs::symlink_metadata(host).unwrap();
        if dattr.nlink as u64 != dmeta.nlink() {
            return Err(format!(
                "{rel}: directory nlink host {} winefs {}",
                dmeta.nlink(),
                dattr.nlink
            ));
        }
        for e in wents {
            let name = String::from_utf8(e.name.clone()).unwrap();
            let hp = host.join(&name);
            let r = format!("{rel}/{name}");
            let m = std::fs::symlink_metadata(&hp).unwrap();
            let a = fs
                .getattr(e.ino)
                .map_err(|x| format!("{r}: getattr: {x}"))?;
            if host_kind(&m) != kind_char(a.kind) || kind_char(e.kind) != kind_char(a.kind) {
                return Err(format!(
                    "{r}: kinds differ: host {} winefs {:?} (dirent {:?})",
                    host_kind(&m),
                    a.kind,
                    e.kind
                ));
            }
            if m.nlink() != a.nlink as u64 {
                return Err(format!("{r}: nlink host {} winefs {}", m.nlink(), a.nlink));
            }
            match a.kind {
                FileKind::Dir => walk(fs, e.ino, &hp, &r, out)?,
                FileKind::Symlink => {
                    let t = fs.readlink(e.ino).map_err(|x| x.to_string())?;
                    let ht = std::fs::read_link(&hp).unwrap();
                    if t != ht.as_os_str().as_bytes() {
                        return Err(format!("{r}: symlink targets differ"));
                    }
                }
                _ => {
                    if m.len() != a.size {
                        return Err(format!("{r}: size host {} winefs {}", m.len(), a.size));
                    }
                    let wc = win_read_all(fs, e.ino).map_err(|x| x.to_string())?;
                    let hc = std::fs::read(&hp).unwrap();
                    if wc != hc {
                        let first = wc.iter().zip(&hc).position(|(x, y)| x != y);
                        return Err(format!(
                            "{r}: contents differ (first difference at {first:?})"
                        ));
                    }
                    let mut hx = host_listxattr(&hp).unwrap();
                    hx.sort();
                    let mut wx = fs.listxattr(e.ino).map_err(|x| x.to_string())?;
                    wx.retain(|n| n != winefs::meta::xattr::HUGEPAGE_HINT);
                    wx.sort();
                    if hx != wx {
                        return Err(format!("{r}: xattr names differ"));
                    }
                    for x in &wx {
                        let n = std::str::from_utf8(x).unwrap();
                        if fs.getxattr(e.ino, x).unwrap() != host_getxattr(&hp, n).unwrap() {
                            return Err(format!("{r}: xattr {n} differs"));
                        }
                    }
                }
            }
            out.push(r);
        }
        Ok(())
    }
    let mut seen = Vec::new();
    walk(fs, fs.root(), root, "", &mut seen)
}

// ---------------------------------------------------------------------------------------------
// The driver.

fn run_sequence(mode: Consistency, ops: &[Op]) -> Result<(), TestCaseError> {
    let (_pool_dir, pool) = common::fresh_pool(64 << 20, Some(2));
    let host_dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let host = host_dir.path();
    let mut fs = Some(common::mount_with(&pool, mode));
    // The starting namespace.
    let setup = [
        Op::Mkdir(P { dir: 0, name: 3 }),                         // d0
        Op::Mkdir(P { dir: 0, name: 0 }),                         // a (a directory at first)
        Op::Rename(P { dir: 0, name: 0 }, P { dir: 0, name: 0 }), // no-op rename
        Op::Rmdir(P { dir: 0, name: 0 }),                         // a gone again
        Op::Create(P { dir: 1, name: 0 }),                        // d0/a
    ];
    for op in setup.iter() {
        prop_assert_eq!(host_apply(host, op), win_apply(fs.as_ref().unwrap(), op));
    }
    std::fs::create_dir(host.join("d1")).unwrap();
    fs.as_ref().unwrap().mkdir_path("d1").unwrap();
    std::fs::create_dir(host.join("d0/d2")).unwrap();
    fs.as_ref().unwrap().mkdir_path("d0/d2").unwrap();

    let mut succeeded = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if let Op::Remount(drop_only) = op {
            let f = fs.take().unwrap();
            if *drop_only {
                drop(f);
            } else {
                f.unmount().unwrap();
            }
            let f = common::mount_with(&pool, mode);
            let r = f.check();
            prop_assert!(r.is_clean(), "after remount at op {}: {:?}", i, r.problems);
            fs = Some(f);
            continue;
        }
        let f = fs.as_ref().unwrap();
        let ho = host_apply(host, op);
        let wo = win_apply(f, op);
        if ho != wo {
            return Err(TestCaseError::fail(format!(
                "op #{i} {op:?}: host {} winefs {}",
                short(&ho),
                short(&wo)
            )));
        }
        succeeded += !matches!(ho, Out::Err(_)) as usize;
    }
    if std::env::var_os("WINEFS_DIFF_STATS").is_some() {
        eprintln!("{mode:?}: {} ops, {succeeded} succeeded", ops.len());
    }
    let f = fs.take().unwrap();
    let r = f.check();
    prop_assert!(r.is_clean(), "fsck: {:?}", r.problems);
    if let Err(e) = compare_trees(&f, host) {
        return Err(TestCaseError::fail(format!("final comparison: {e}")));
    }
    f.unmount().unwrap();
    // And once more after a final remount.
    let f = common::mount_with(&pool, mode);
    let r = f.check();
    prop_assert!(r.is_clean(), "fsck after final remount: {:?}", r.problems);
    if let Err(e) = compare_trees(&f, host) {
        return Err(TestCaseError::fail(format!(
            "final comparison after remount: {e}"
        )));
    }
    Ok(())
}

/// Insert a remount roughly every 40 operations (in addition to the random ones).
fn with_remounts(mut ops: Vec<Op>, drop_bits: u64) -> Vec<Op> {
    let mut k = 0;
    let mut i = 40;
    while i < ops.len() {
        ops.insert(i, Op::Remount(drop_bits >> (k % 64) & 1 == 1));
        k += 1;
        i += 41;
    }
    ops
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn differential_strict(ops in prop::collection::vec(op_strat(), 100..300), bits in any::<u64>()) {
        run_sequence(Consistency::Strict, &with_remounts(ops, bits))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn differential_relaxed(ops in prop::collection::vec(op_strat(), 100..300), bits in any::<u64>()) {
        run_sequence(Consistency::Relaxed, &with_remounts(ops, bits))?;
    }
}
