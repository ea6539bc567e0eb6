//! The facade: [`Fs`], a mounted winefs, with its inode-level and path-level API, and the open
//! handles [`File`] and [`Mapping`]. Front ends and tools use the core only through here.

mod api;
mod direct;
mod handle;
mod paths;

pub use api::Fs;
pub use direct::Lease;
pub use handle::{File, Mapping};
