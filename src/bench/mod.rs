//! Benchmarks, beside the core: each measures winefs and a host baseline in the same run and
//! prints ratios (no test asserts on time).
//! - [`app`]: LMDB and RocksDB, unmodified, on hugepage tmpfs, on a winefs FUSE mount and
//!   with the preload library, clean and aged (`winefs bench app`; scaffolding in `app_env`, tables in `app_report`).
//! - [`syscall`]: the library against `std::fs` on tmpfs (`winefs bench syscall`).
//! - [`wear`]: block wear under a varmail-like churn, default and wear-aware allocation (`winefs bench wear`).
//! - [`small`]: small strict overwrites by alternate writing, undo journaling and copy-on-write (`winefs bench small`).
//! - [`fuse`]: a FUSE mount of winefs against tmpfs (`winefs bench fuse`).
//! - [`layout`]: the mmap benchmark over aged winefs files and replayed ext4/xfs layouts (`winefs bench layout`).
//! - [`mmap`]: memory-mapped access to aligned, 4 KiB-scattered and plain tmpfs files (`winefs bench mmap`).
//! - [`workload`]: Filebench-like personalities, the paper's Fig. 6 microbenchmarks and Fig. 10
//!   scalability on the library, a FUSE mount, tmpfs, passthrough_ll, ext4 and xfs (`winefs bench workload`;
//!   the setups in `workload_setups`, the report in `workload_report`).
//! - [`space`]: space used by a seeded fsstress-style workload on tmpfs and on winefs (`winefs bench space`).

pub mod app;
mod app_env;
mod app_report;
pub mod fuse;
pub mod layout;
pub mod mmap;
pub mod small;
pub mod space;
pub mod syscall;
pub mod wear;
pub mod workload;
mod workload_flows;
mod workload_hist;
mod workload_plan;
mod workload_report;
mod workload_setups;

pub use app::{AppBenchConfig, AppBenchReport, app_bench};
pub use fuse::{FuseBenchConfig, FuseBenchReport, fuse_bench};
pub use mmap::{MmapBenchConfig, MmapBenchReport, mmap_bench};
pub use small::{SmallBenchConfig, SmallBenchReport, small_bench};
pub use space::{SpaceBenchConfig, SpaceBenchReport, space_bench};
pub use syscall::{BenchRow, PersistPerOp, SyscallBenchConfig, SyscallBenchReport, syscall_bench};
pub use wear::{WearBenchConfig, WearBenchReport, wear_bench};
pub use workload::{Setup, Workload, WorkloadBenchConfig, WorkloadBenchReport, workload_bench};
