//! `winefs age`: a file-system ager in the spirit of Geriatrix (Kadekodi et al., ATC'18), a
//! tool beside the core. It creates and deletes files following a profile's file-size,
//! file-age and directory-depth distributions until the file system reaches a target
//! utilization, then keeps churning (deleting to make room, creating to refill) at that
//! utilization until a target volume of writes, a multiple of the capacity, has passed.
//!
//! * **Ages** are relative, as in Geriatrix: a clock ticks once per create or delete, and a file
//!   born at tick b has age (clock − b) / clock; bucket i of the profile's age list holds the
//!   files younger than cutoff_i / cutoff_last of that. A deletion picks its victim uniformly
//!   in the bucket that holds the most files beyond its share, so the live files' ages converge
//!   to the profile. Convergence (a chi-square test at 95%) is reported, and stops the run only
//!   when asked (`stop_on_convergence`): the requested volume of writes is honoured.
//! * **Directories**: depth d of the profile holds `subdirs(d-1)` subdirectories per directory
//!   of depth d-1, capped at `MAX_DIRS_PER_DEPTH` (256); a new file picks a depth by weight and a
//!   directory of that depth uniformly; directories are made on first use.
//! * **Deterministic** under a seed: every choice comes from one seeded generator, so the same
//!   seed on the same (fresh) file system gives the same sequence of operations.
//! * **Resumable**: the ager's state is checkpointed (atomically) beside the target; a new run
//!   with the same state file reconciles it with the file system and goes on.

pub mod profile;
pub mod target;

mod ager;
mod config;
mod report;
mod state;

pub use ager::Ager;
pub use config::AgeConfig;
pub use report::AgeReport;
pub use target::{AgeTarget, CreateMethod, LibraryTarget, PosixTarget, Usage};
