//! `libwinefs_preload.so`: the direct data path for unmodified, dynamically linked programs on
//! a winefs FUSE mount (docs/DESIGN.md §7b). `LD_PRELOAD` it, and a shared `mmap` of a winefs
//! file maps the file's pool extents themselves (2 MiB pages where the extents are aligned),
//! and `read`/`write`/`pread`/`pwrite` inside such a mapping copy from and to the pool. Every
//! descriptor stays the kernel's FUSE descriptor: open, close, dup, fork, locks, permissions
//! and every call not replaced here work as without the library, and anything it cannot serve
//! directly goes through FUSE. `WINEFS_PRELOAD_LOG=1` says what went direct.
//!
//! The exported replacements of libc's functions are in `shims` (thin, `unsafe` by nature:
//! they take the application's raw pointers); the work is in `direct`, the connection to a
//! daemon in `client`, the system calls in `sys`. Only `shims` and `sys` may use `unsafe`.

mod client;
mod direct;
#[path = "../../src/sys/mountinfo.rs"]
mod mountinfo;
#[path = "../../src/fuse/proto.rs"]
#[allow(dead_code)]
mod proto;
mod shims;
// The daemon's half (`published`) is not used here.
#[path = "../../src/state/size_word.rs"]
#[allow(dead_code)]
mod size_word;
mod stats;
mod sys;
