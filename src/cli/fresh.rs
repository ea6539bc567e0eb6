//! `winefs fresh`: a fresh large file allocated the way an application would (fallocate, 4 KiB
//! writes, or ftruncate and stores through a mapping), with its hugepage-mappable share; the
//! aging experiment measures aged pools with it.

use crate::fail::{Ctx, Fail, fail};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use winefs::report::FileMapReport;
use winefs::units::{format_size, parse_size};
use winefs::{Fs, MountOptions};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum FreshHow {
    /// One fallocate of the whole size.
    Fallocate,
    /// Sequential 4 KiB writes.
    Write4k,
    /// ftruncate to the size, then a store to every page through a memory mapping (allocation
    /// at fault time, the LMDB pattern).
    Touch,
}

#[derive(Args)]
pub struct FreshArgs {
    pool: PathBuf,
    /// Path of the new file inside the pool.
    path: String,
    /// File size (K/M/G/T suffixes; a multiple of 4 KiB).
    #[arg(long, value_parser = parse_size)]
    size: u64,
    #[arg(long, value_enum, default_value = "fallocate")]
    how: FreshHow,
    /// Remove the file again after measuring it.
    #[arg(long)]
    remove: bool,
}

/// Allocate a fresh file the way an application would and report its hugepage-mappable share.
pub fn fresh(a: FreshArgs) -> Result<u8, Fail> {
    let p = a.pool.display().to_string();
    if a.size == 0 || !a.size.is_multiple_of(4096) {
        return Err(fail("fresh", "--size must be a positive multiple of 4 KiB"));
    }
    // No background rewrite: the file is measured as the allocator placed it.
    let fs = Fs::mount(
        &a.pool,
        MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        },
    )
    .ctx(|| format!("mount {p}"))?;
    let f = fs
        .create_file(&a.path)
        .ctx(|| format!("create {}", a.path))?;
    let r = (|| {
        match a.how {
            FreshHow::Fallocate => f.fallocate(0, a.size)?,
            FreshHow::Write4k => {
                let page = vec![0x5au8; 4096];
                for off in (0..a.size).step_by(4096) {
                    f.write_at(off, &page)?;
                }
            }
            FreshHow::Touch => {
                f.set_len(a.size)?;
                let m = f.mmap(0, a.size as usize)?;
                for off in (0..a.size as usize).step_by(4096) {
                    m.store(off, &[1])?;
                }
                m.msync(0, a.size as usize)?;
            }
        }
        FileMapReport::new(&fs, f.ino())
    })();
    let r = r.ctx(|| format!("allocate {} ({:?})", a.path, a.how))?;
    drop(f);
    if a.remove {
        fs.unlink_path(&a.path)
            .ctx(|| format!("remove {}", a.path))?;
    }
    fs.unmount().ctx(|| format!("unmount {p}"))?;
    println!(
        "{}: {} in {} extents; hugepage-mappable {:.2}%",
        a.path,
        format_size(r.size),
        r.extents.len(),
        100.0 * r.mappable_share()
    );
    Ok(0)
}
