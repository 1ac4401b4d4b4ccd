//! Running the `oxalign` binary of this build in a test's folder.
#![allow(dead_code)] // each test file uses a different subset

use std::path::Path;
use std::process::{Command, Output};

/// `oxalign args…` run in `dir`.
pub fn oxalign(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run oxalign")
}

/// Runs `oxalign`, asserts success; stdout and stderr together.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let out = oxalign(dir, args);
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "oxalign {args:?} failed:\n{text}");
    text
}
