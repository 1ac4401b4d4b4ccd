//! The `oxalign` library side of the root package: the pieces of the launcher that tests and
//! other binaries reuse (the dashboard server). Command-line parsing lives in `main.rs`.

pub mod dashboard;
