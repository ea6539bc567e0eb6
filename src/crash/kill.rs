//! FUSE kill harness (placeholder).
