//! `winefs frag`, `winefs filemap` and `winefs rewrite` on a pool prepared with the library.

use std::process::Command;
use winefs::{Fs, MkfsOptions, MountOptions};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "winefs {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The number after `key` in `text` (up to the next space, '%' or ')').
fn number_after(text: &str, key: &str) -> f64 {
    let text = &text[text.find("total:").unwrap_or(0)..];
    let i = text
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in:\n{text}"))
        + key.len();
    let t: String = text[i..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    t.parse()
        .unwrap_or_else(|_| panic!("no number after {key:?} in:\n{text}"))
}

#[test]
fn frag_filemap_and_rewrite_report_the_layout() {
    let d = tempfile::tempdir().unwrap();
    let pool = d.path().join("pool");
    let ps = pool.to_str().unwrap();
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(128 << 20),
            partitions: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let fresh = run(&["frag", ps]);
    let fresh_aligned = number_after(&fresh, "aligned 2 MiB extents");
    {
        let fs = Fs::mount(&pool, MountOptions::default()).unwrap();
        let a = fs.create_file("/aligned").unwrap();
        a.fallocate(0, 8 << 20).unwrap();
        let s = fs.create_file("/scattered").unwrap();
        s.write_at(0, &vec![9u8; 4 << 20]).unwrap();
        fs.scatter(s.ino()).unwrap();
        fs.unmount().unwrap();
    }
    let after = run(&["frag", ps]);
    let used = fresh_aligned - number_after(&after, "aligned 2 MiB extents");
    // 4 for /aligned, 2 for /scattered's original placement is freed again; scattering takes
    // single blocks (breaking at most a few extents).
    assert!(used >= 4.0, "{fresh}\n{after}");
    let fa = run(&["filemap", ps, "/aligned"]);
    assert!(fa.contains("hugepage-mappable 8.0 MiB (100.0%)"), "{fa}");
    let fsc = run(&["filemap", ps, "/scattered"]);
    assert!(fsc.contains("in 1024 extents"), "{fsc}");
    assert!(fsc.contains("(0.0%)"), "{fsc}");
    let rw = run(&["rewrite", ps, "/scattered"]);
    assert!(rw.contains("2 of 2 units"), "{rw}");
    assert!(rw.contains("hugepage-mappable 100.0%"), "{rw}");
    let fsc = run(&["filemap", ps, "/scattered"]);
    assert!(fsc.contains("(100.0%)"), "{fsc}");
    // A missing path is one clear line and a failure.
    let out = Command::new(BIN)
        .args(["filemap", ps, "/nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nope"), "{err}");
    assert!(run(&["fsck", ps]).starts_with("clean: "));
}
