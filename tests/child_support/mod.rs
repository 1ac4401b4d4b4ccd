//! Child processes of the tests that announce themselves on their first line of stdout (a
//! worker's `listening on ADDR`, the reward server's URL) and are killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with its stdout piped and returns it with its first line, trimmed.
pub fn spawn_announced(cmd: &mut Command) -> (KillOnDrop, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start the child");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (KillOnDrop(child), line.trim().to_string())
}
