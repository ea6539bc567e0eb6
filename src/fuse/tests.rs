//! Unit tests of the FUSE front end (`fuse`), in their own file.

use super::*;

#[test]
fn files_are_direct_io_only_while_a_direct_path_may_store_behind_the_kernel() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("pool");
    let small = crate::MkfsOptions {
        size: Some(48 << 20),
        ..Default::default()
    };
    Fs::mkfs(&p, &small).unwrap();
    let fs = Arc::new(Fs::mount(&p, crate::MountOptions::default()).unwrap());
    let kernel_maps_direct_io = |a: WinefsFuse| WinefsFuse { direct_io: true, ..a };
    let direct = FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
    let kept = FopenFlags::FOPEN_KEEP_CACHE;
    let other = u32::MAX - 1; // no client's thread
    // With a direct path: writers that do not read, appenders and O_DIRECT opens are direct
    // I/O; an open that may read is cached while nobody leases the file, direct I/O while it
    // is leased.
    let served = kernel_maps_direct_io(WinefsFuse::new(Arc::clone(&fs)).with_channel("c"));
    assert_eq!(served.open_file(5, other, libc::O_WRONLY), (FileHandle(0), direct));
    assert_eq!(served.open_file(5, other, libc::O_RDWR | libc::O_DIRECT), (FileHandle(0), direct));
    assert_eq!(served.open_file(5, other, libc::O_RDWR | libc::O_APPEND), (FileHandle(0), direct));
    assert_eq!(served.open_file(5, other, libc::O_RDONLY | libc::O_DIRECT), (FileHandle(0), direct));
    assert_eq!(served.open_file(5, other, libc::O_RDONLY), (CACHED_OPEN, kept));
    assert_eq!(served.open_file(5, other, libc::O_RDWR), (CACHED_OPEN, kept));
    assert!(!served.gate.lease(5, Duration::ZERO), "leased under a cached open");
    served.gate.closed(5);
    assert!(!served.gate.lease(5, Duration::ZERO), "leased under a cached open for writing");
    served.gate.closed(5);
    assert!(served.gate.lease(5, Duration::ZERO));
    assert_eq!(served.open_file(5, other, libc::O_RDONLY), (FileHandle(0), direct));
    assert_eq!(served.open_file(5, other, libc::O_RDWR), (FileHandle(0), direct));
    // A client's own opens are direct I/O whether or not it leased the file yet.
    served.gate.client_connected(std::process::id());
    assert_eq!(served.open_file(6, std::process::id(), libc::O_RDONLY), (FileHandle(0), direct));
    // Without one, or with the kernel's own caches, always cached, kept and never counted.
    let cached = kernel_maps_direct_io(WinefsFuse::new(Arc::clone(&fs)).with_page_cache());
    assert_eq!(cached.open_file(5, other, libc::O_RDWR), (FileHandle(0), kept));
    let written_back = kernel_maps_direct_io(WinefsFuse::new(fs).with_writeback_cache());
    assert_eq!(written_back.open_file(5, other, libc::O_RDWR), (FileHandle(0), kept));
}
