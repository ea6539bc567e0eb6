//! `winefs frag`, `winefs filemap` and `winefs rewrite` on a pool prepared with the library.

use std::process::Command;

mod common;

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
    common::format(&pool, 128 << 20, Some(2));
    let fresh = run(&["frag", ps]);
    let fresh_aligned = number_after(&fresh, "aligned 2 MiB extents");
    // A fresh pool's free space is all in aligned 2 MiB extents, in every partition.
    assert!(fresh_aligned >= 50.0, "{fresh}");
    assert!(
        fresh.contains(&format!(
            "aligned 2 MiB extents {fresh_aligned} (100.0% of free space)"
        )),
        "{fresh}"
    );
    assert_eq!(
        fresh.matches("(100.0% of its free space)").count(),
        2,
        "{fresh}"
    );
    // The first file in the root takes one block for the directory (from one aligned extent,
    // which becomes the hole later metadata comes from); the fallocate is then measured alone.
    {
        let fs = common::mount(&pool);
        fs.create_file("/aligned").unwrap();
        fs.create_file("/scattered").unwrap();
        fs.unmount().unwrap();
    }
    let created = run(&["frag", ps]);
    let created_aligned = number_after(&created, "aligned 2 MiB extents");
    assert!(fresh_aligned - created_aligned <= 1.0, "{fresh}\n{created}");
    {
        let fs = common::mount(&pool);
        fs.open_file("/aligned")
            .unwrap()
            .fallocate(0, 8 << 20)
            .unwrap();
        fs.unmount().unwrap();
    }
    let after = run(&["frag", ps]);
    // An 8 MiB fallocate takes exactly four aligned extents, and its extent-index block one
    // block from a hole; where the mount ran on a CPU whose partition had no hole, that block
    // broke an extent of its own (a fifth), leaving a hole in every partition.
    let used = created_aligned - number_after(&after, "aligned 2 MiB extents");
    let holes_everywhere = !after.contains(" holes 0 (");
    assert!(used == 4.0 || (used == 5.0 && holes_everywhere), "{created}\n{after}");
    {
        let fs = common::mount(&pool);
        let s = fs.open_file("/scattered").unwrap();
        s.write_at(0, &vec![9u8; 4 << 20]).unwrap();
        fs.scatter(s.ino()).unwrap();
        fs.unmount().unwrap();
    }
    let scattered = run(&["frag", ps]);
    // Scattering leaves free single blocks between the file's blocks: small free runs appear
    // and the aligned count drops further.
    assert!(
        number_after(&scattered, "aligned 2 MiB extents") < created_aligned - 4.0,
        "{after}\n{scattered}"
    );
    assert!(
        !scattered.contains("4.0 KiB                        0 "),
        "{scattered}"
    );
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
    // A directory is refused, not reported as an empty file.
    let out = Command::new(BIN)
        .args(["filemap", ps, "/"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    assert!(run(&["fsck", ps]).starts_with("clean: "));
}
