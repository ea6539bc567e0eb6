//! Many threads at once: per-CPU journals, partitions and inode locks under contention.

mod common;

use std::sync::Arc;
use winefs::{Consistency, RenameFlags};

fn run(mode: Consistency) {
    let (_d, p) = common::fresh_pool(128 << 20, Some(4));
    let fs = Arc::new(common::mount_with(&p, mode));
    let shared = fs.create(fs.root(), b"shared", 0o644, 0, 0).unwrap().ino;
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let dir = fs
                    .mkdir(fs.root(), format!("t{t}").as_bytes(), 0o755, 0, 0)
                    .unwrap()
                    .ino;
                for i in 0..150u32 {
                    let name = format!("f{i}");
                    let a = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap();
                    let data = vec![
                        t.wrapping_mul(31).wrapping_add(i as u8);
                        1000 + (i as usize * 97) % 9000
                    ];
                    fs.write(a.ino, 0, &data).unwrap();
                    // Each thread owns one 4 KiB slot of the shared file.
                    fs.write(
                        shared,
                        t as u64 * 4096 + (i as u64 % 8) * 512,
                        &[t + 1; 512],
                    )
                    .unwrap();
                    if i % 3 == 0 {
                        fs.unlink(dir, name.as_bytes()).unwrap();
                    } else if i % 3 == 1 {
                        fs.rename(
                            dir,
                            name.as_bytes(),
                            fs.root(),
                            format!("m{t}-{i}").as_bytes(),
                            RenameFlags::default(),
                        )
                        .unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = fs.check();
    assert!(r.is_clean(), "{:?}", r.problems);
    for t in 0..6u8 {
        let mut b = vec![0u8; 4096];
        fs.read(shared, t as u64 * 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == t + 1),
            "thread {t}'s slot of the shared file"
        );
        for i in (1..150u32).step_by(3) {
            let a = fs.stat_path(&format!("/m{t}-{i}")).unwrap();
            assert_eq!(a.size, 1000 + (i as u64 * 97) % 9000);
        }
        assert_eq!(fs.list_dir(&format!("/t{t}")).unwrap().len(), 50);
    }
    let fs = Arc::try_unwrap(fs).ok().expect("threads joined");
    fs.unmount().unwrap();
    let fs = common::mount(&p);
    let r = fs.check();
    assert!(r.is_clean(), "after remount: {:?}", r.problems);
}

#[test]
fn concurrent_namespace_and_data_operations_strict() {
    run(Consistency::Strict);
}

#[test]
fn concurrent_namespace_and_data_operations_relaxed() {
    run(Consistency::Relaxed);
}
