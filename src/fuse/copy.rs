//! `copy_file_range` inside the daemon: one round trip for the kernel instead of a read and a
//! write per chunk.

use crate::{Fs, Result};

/// The copy goes through a buffer of this size.
const COPY_CHUNK: usize = 1 << 20;

/// Copy up to `len` bytes from `ino_in` at `off_in` to `ino_out` at `off_out`; the bytes
/// copied. The copy ends at the source's end, at a write short of space (which stores what
/// fits and says so), and at an error after some bytes, which it reports as `write(2)` does.
pub(super) fn copy_range(fs: &Fs, ino_in: u64, off_in: u64, ino_out: u64, off_out: u64, len: u64) -> Result<u64> {
    // The reply counts bytes in a u32; the kernel calls again for the rest.
    let len = len.min(1 << 30);
    let mut buf = vec![0u8; COPY_CHUNK.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let want = buf.len().min((len - done) as usize);
        let step = match fs.read(ino_in, off_in + done, &mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => fs.write(ino_out, off_out + done, &buf[..n]).map(|w| (n, w)),
            Err(e) => Err(e),
        };
        match step {
            Ok((n, w)) => {
                done += w as u64;
                if w < n {
                    break;
                }
            }
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use crate::types::{MkfsOptions, MountOptions};
    use crate::{Error, Fs};

    /// On a pool that runs out of space the copy says how much it stored (it once reported
    /// every byte); with no space at all it fails.
    #[test]
    fn a_copy_short_of_space_reports_what_it_stored() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pool");
        Fs::mkfs(&p, &MkfsOptions { size: Some(32 << 20), ..Default::default() }).unwrap();
        let fs = Fs::mount(&p, MountOptions::default()).unwrap();
        let root = fs.root();
        let src = fs.create(root, b"src", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 251) as u8 + 1).collect();
        fs.write(src, 0, &data).unwrap();
        let dst = fs.create(root, b"dst", 0o644, 0, 0).unwrap().ino;
        let full = fs.take_all_free_blocks();
        assert!(matches!(super::copy_range(&fs, src, 0, dst, 0, 4096), Err(Error::NoSpace(_))));
        drop(full);
        // Room for 10 blocks of the 64 the copy needs.
        let filler = fs.create(root, b"filler", 0o644, 0, 0).unwrap().ino;
        let free = fs.statfs().free_blocks;
        fs.fallocate(filler, 0, (free - 10) * 4096, false).unwrap();
        let n = super::copy_range(&fs, src, 0, dst, 0, data.len() as u64).unwrap();
        assert!(n > 0 && n < data.len() as u64, "copied {n} of {}", data.len());
        assert_eq!(fs.getattr(dst).unwrap().size, n, "the size is not the count reported");
        let mut back = vec![0u8; n as usize];
        fs.read(dst, 0, &mut back).unwrap();
        assert!(back[..] == data[..n as usize], "the bytes reported copied are not the source's");
    }
}
