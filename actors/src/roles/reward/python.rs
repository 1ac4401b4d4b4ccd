//! `reward.kind = "python"`: the reward server (`tools/reward_server.py`, built into the
//! binary) as a child process on 127.0.0.1, started with the reward role and stopped with
//! it (dropped: killed). The child also exits by itself when its standard input closes, so
//! it does not outlive an oxalign process that was killed. Its stderr (a failing function's
//! traceback) is relayed line by line, prefixed `reward.python: `.

use crate::recipe::{key_error, PythonRewardSection, RewardKeyError};
use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The server's source.
const SERVER: &str = include_str!("../../../../tools/reward_server.py");

/// Lines of the server's stderr kept for a failure report.
const KEPT_LINES: usize = 40;

/// The running server; killed when dropped.
#[derive(Debug)]
pub struct PythonServer {
    _child: Child,
    /// Held open: the server exits when it closes.
    _stdin: ChildStdin,
}

/// Relays the child's stderr to ours and keeps its last lines; returns them once it ends.
fn relay_stderr(
    stderr: tokio::process::ChildStderr,
) -> (Arc<Mutex<VecDeque<String>>>, tokio::task::JoinHandle<()>) {
    let kept = Arc::new(Mutex::new(VecDeque::new()));
    let sink = kept.clone();
    let task = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("reward.python: {line}");
            let mut k = sink.lock().unwrap_or_else(|p| p.into_inner());
            if k.len() == KEPT_LINES {
                k.pop_front();
            }
            k.push_back(line);
        }
    });
    (kept, task)
}

/// Reads the server's stdout up to its address line (`http://127.0.0.1:PORT/`), relaying
/// what the user's module printed before it; `None` when stdout closes first.
async fn announced_url(stdout: &mut tokio::io::Lines<BufReader<ChildStdout>>) -> Option<String> {
    while let Ok(Some(line)) = stdout.next_line().await {
        if line.starts_with("http://127.0.0.1:") {
            return Some(line.trim().to_string());
        }
        eprintln!("reward.python: {line}");
    }
    None
}

/// Starts the server for `section` and waits until it listens; returns it and its URL.
/// Errors (no interpreter, a file that does not import, a missing function, a server that
/// does not come up in time) name the `reward.python` key and carry the server's message.
pub async fn start(
    section: &PythonRewardSection,
) -> Result<(PythonServer, String), RewardKeyError> {
    let mut cmd = Command::new(&section.python);
    cmd.arg("-c").arg(SERVER).arg("--file").arg(&section.file);
    for f in &section.functions {
        cmd.arg("--function").arg(f);
    }
    for w in &section.weights {
        cmd.arg("--weight").arg(w.to_string());
    }
    cmd.args(["--host", "127.0.0.1", "--port", "0", "--exit-with-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        key_error(
            "reward.python.python",
            format!("cannot start {:?}: {e}", section.python),
        )
    })?;
    let (stdin, stdout, stderr) =
        match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => unreachable!("all three were piped"),
        };
    let (kept, relay) = relay_stderr(stderr);
    let mut stdout = BufReader::new(stdout).lines();
    let limit = Duration::from_secs_f64(section.startup_timeout_s);
    let url = match tokio::time::timeout(limit, announced_url(&mut stdout)).await {
        Ok(Some(url)) => url,
        Err(_) => {
            return Err(key_error(
                "reward.python.startup_timeout_s",
                format!(
                    "the reward server for {:?} did not listen within {} s",
                    section.file, section.startup_timeout_s
                ),
            ))
        }
        Ok(None) => {
            // its stdout closed: it is exiting (give it a moment, then it is killed on drop)
            let wait = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            let status = match wait {
                Ok(Ok(s)) => s.to_string(),
                _ => "still running".into(),
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), relay).await;
            let said: Vec<String> = kept
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect();
            return Err(key_error(
                "reward.python",
                format!(
                    "the reward server for {:?} stopped before it listened ({status}):\n{}",
                    section.file,
                    said.join("\n")
                ),
            ));
        }
    };
    // what the user's functions print goes on being relayed (a closed pipe would make
    // their `print` raise)
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            eprintln!("reward.python: {line}");
        }
    });
    Ok((
        PythonServer {
            _child: child,
            _stdin: stdin,
        },
        url,
    ))
}
