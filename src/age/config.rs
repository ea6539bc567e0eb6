//! What an ager run is asked to do.

use crate::age::profile::Profile;
use std::path::PathBuf;
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct AgeConfig {
    /// The distributions to follow.
    pub profile: Profile,
    /// Seed of every choice: the same seed on the same fresh file system runs the same way.
    pub seed: u64,
    /// Target utilization, 0 < u < 1.
    pub utilization: f64,
    /// Total bytes to write, as a multiple of the capacity (fill included).
    pub writes: f64,
    /// Stop once the age distribution converges (after the fill), even before `writes`.
    pub stop_on_convergence: bool,
    /// Where the ager's state lives (checkpointed every `checkpoint_every` and at the end).
    pub state: Option<PathBuf>,
    /// How often the state is checkpointed while running.
    pub checkpoint_every: Duration,
    /// Draw a progress bar on standard error.
    pub progress: bool,
}

impl AgeConfig {
    /// The defaults for `profile`: seed 1, 75% utilization, 10x capacity of writes, no state
    /// file, a checkpoint every 30 s, no progress bar.
    pub fn new(profile: Profile) -> AgeConfig {
        AgeConfig {
            profile,
            seed: 1,
            utilization: 0.75,
            writes: 10.0,
            stop_on_convergence: false,
            state: None,
            checkpoint_every: Duration::from_secs(30),
            progress: false,
        }
    }
}
