//! `oxalign launch --start`: starts what the printed commands would. A loopback node's worker
//! runs here as a child process; any other node's through
//! `$OXALIGN_SSH -tt -o SendEnv=COOKIE_ENV HOST 'cd DIR && exec oxalign worker --listen ADDR'`
//! (`OXALIGN_SSH` defaults to `ssh`; its words are split on spaces, so `ssh -i KEY` works and a
//! test can put a script there). It waits until every worker answers the handshake (within
//! `cluster.connect_timeout_s`), then runs the controller's `oxalign train` here and stops
//! the workers when it ends (`-tt` and `exec`: closing the ssh session hangs the worker up).

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use oxalign_actors::cluster::{ClusterError, Connection, Endpoint};
use oxalign_actors::recipe::{is_loopback, split_addr, Recipe, DEFAULT_COOKIE_ENV};

use super::quote::{command_line, quote};
use crate::user_error::{user_error, IntoUserError, UserError};

/// The environment variable naming the ssh program.
pub const SSH_ENV: &str = "OXALIGN_SSH";

/// How long one connection attempt may take before the worker's process is checked again.
const PROBE: Duration = Duration::from_millis(500);

/// A started worker, killed when dropped.
struct Started {
    node: String,
    addr: String,
    /// The command line, for the user to retry by hand.
    command: String,
    child: Child,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts node `name`'s worker at `addr`.
fn spawn_worker(recipe: &Recipe, name: &str, addr: &str, dir: &Path) -> anyhow::Result<Started> {
    let exe = std::env::current_exe()?;
    let worker = super::worker_words(recipe, addr);
    let (mut cmd, command) = if is_loopback(addr) {
        let mut c = Command::new(&exe);
        c.args(&worker[1..]);
        (c, command_line(worker.iter().map(String::as_str)))
    } else {
        let ssh = std::env::var(SSH_ENV).unwrap_or_else(|_| "ssh".into());
        let mut words = ssh.split_whitespace();
        let Some(program) = words.next() else {
            return user_error(format!("${SSH_ENV} is empty: expected an ssh program"));
        };
        let host = split_addr(addr).map(|(h, _)| h).unwrap_or(addr);
        // ssh hands its command to the remote shell: every word is quoted.
        let remote = format!(
            "cd {} && exec {}",
            quote(&dir.display().to_string()),
            command_line(worker.iter().map(String::as_str))
        );
        let send_env = format!("SendEnv={}", recipe.cluster.cookie_env);
        let mut c = Command::new(program);
        c.args(words).args(["-tt", "-o", &send_env, host, &remote]);
        (
            c,
            format!(
                "{ssh} {}",
                command_line(["-tt", "-o", &send_env, host, &remote])
            ),
        )
    };
    // The worker reads its cookie from OXALIGN_COOKIE, whatever the recipe's cookie_env.
    if let Some(cookie) = recipe.cluster.cookie() {
        cmd.env(DEFAULT_COOKIE_ENV, cookie);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| UserError::new(format!("node {name}: cannot run `{command}`: {e}")))?;
    Ok(Started {
        node: name.to_string(),
        addr: addr.to_string(),
        command,
        child,
    })
}

/// Why a worker is not ready.
fn not_ready(w: &Started, why: String) -> anyhow::Error {
    UserError::new(format!(
        "node {} ({}): {why}; start it by hand with `{}`, or fix the host list and run \
         `oxalign launch ... --start` again",
        w.node, w.addr, w.command
    ))
    .into()
}

/// Waits until `w` answers the handshake, its process ends, or `deadline` passes.
async fn wait_ready(w: &mut Started, recipe: &Recipe, deadline: Instant) -> anyhow::Result<()> {
    let mut ep = Endpoint {
        node: w.node.clone(),
        addr: w.addr.clone(),
        cookie: recipe.cluster.cookie(),
        max_frame: recipe.cluster.max_message_bytes(),
        patience: PROBE,
        tls: recipe.cluster.tls().user_err("")?,
    };
    loop {
        if let Some(status) = w.child.try_wait()? {
            return Err(not_ready(w, format!("`{}` {}", w.command, ended(status))));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        ep.patience = PROBE.min(left);
        match Connection::open(&ep).await {
            Ok(_) => return Ok(()),
            Err(ClusterError::NoWorker { .. }) if !left.is_zero() => continue,
            Err(ClusterError::NoWorker { .. }) => {
                let waited = recipe.cluster.connect_timeout().as_secs_f64();
                return Err(not_ready(
                    w,
                    format!("no worker answered within {waited:.0} s (cluster.connect_timeout_s)"),
                ));
            }
            Err(e) => return Err(not_ready(w, e.to_string())),
        }
    }
}

fn ended(status: ExitStatus) -> String {
    match status.code() {
        Some(c) => format!("exited with status {c} before its worker answered"),
        None => "was killed before its worker answered".into(),
    }
}

/// Starts the workers, waits for them, runs the controller, then stops the workers. Exits
/// with the controller's exit code when it fails.
pub fn run(recipe: &Recipe, recipe_path: &Path, overrides: &[String]) -> anyhow::Result<()> {
    let dir = std::path::absolute(".")?;
    let nodes = recipe
        .cluster
        .resolved_nodes()
        .map_err(|e| UserError::new(e.to_string()))?;
    let mut workers = Vec::new();
    for (name, addr) in &nodes {
        workers.push(spawn_worker(recipe, name, addr, &dir)?);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + recipe.cluster.connect_timeout();
    for w in &mut workers {
        rt.block_on(wait_ready(w, recipe, deadline))?;
    }
    eprintln!(
        "launch: {} workers answer ({}); starting the controller",
        workers.len(),
        workers
            .iter()
            .map(|w| w.node.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut train = Command::new(std::env::current_exe()?);
    train.arg("train").arg(recipe_path);
    for o in overrides {
        train.args(["--set", o]);
    }
    let status = train.status()?;
    drop(workers);
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
