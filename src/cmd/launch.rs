//! `oxalign launch RECIPE [--hosts FILE] [--start]`: prints the commands that start a
//! multi-process run — one `oxalign worker` per node of the recipe's `[cluster]` (over ssh for
//! a node beyond loopback), then the controller's `oxalign train` — or, with `--start`, runs
//! them (`launch/start.rs`).

mod quote;
mod start;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use oxalign_actors::recipe::{is_loopback, split_addr, validate, ClusterSection, Recipe};

use self::quote::{command_line, quote};
use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign launch`.
#[derive(Debug, Parser)]
#[command(
    about = "Print (or with --start, run) the commands that start a multi-process run",
    long_about = "Print the commands that start a multi-process run: one `oxalign worker` per \
node of the recipe's [cluster] nodes (prefixed with ssh for a node beyond loopback, passing \
OXALIGN_COOKIE with SendEnv), then the controller's `oxalign train`. --hosts FILE lists nodes as \
`NAME HOST:PORT` lines (# comments), added to [cluster] nodes. By default it starts nothing. With --start it runs them: loopback nodes' workers here, the others over ssh (the program in $OXALIGN_SSH, default `ssh`, with -tt so the worker ends with the session); it waits until every worker answers its handshake (within cluster.connect_timeout_s), runs `oxalign train` here, and stops the workers when the run ends. A worker that fails to start or never answers exits 2 with the command to retry."
)]
pub struct Args {
    /// The recipe.
    pub recipe: PathBuf,
    /// A host list: one `NAME HOST:PORT` per line.
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// Override a recipe key (repeatable), passed on to `oxalign train`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Start the workers (over ssh beyond loopback) and run the controller, instead of
    /// printing the commands.
    #[arg(long)]
    pub start: bool,
}

/// `true` for a node name that can stand in a recipe key: letters, digits, `_` and `-`.
fn valid_node_name(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The nodes of a host list, as `--set cluster.nodes.NAME=ADDR` overrides.
fn host_overrides(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).user_err(format!("--hosts {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let mut words = line.split_whitespace();
        let (Some(name), Some(addr), None) = (words.next(), words.next(), words.next()) else {
            return user_error(format!("{at}: expected `NAME HOST:PORT`, got {line:?}"));
        };
        if !valid_node_name(name) {
            return user_error(format!(
                "{at}: the node name {name:?} is not a name: expected letters, digits, '_' and '-'"
            ));
        }
        split_addr(addr).map_err(|e| crate::user_error::UserError::new(format!("{at}: {e}")))?;
        out.push(format!("cluster.nodes.{name}={addr}"));
    }
    Ok(out)
}

/// The words of the command that starts node `addr`'s worker: its address, and the recipe's
/// TLS files, `insecure` (beyond loopback) and message cap where they are set.
pub(crate) fn worker_words(recipe: &Recipe, addr: &str) -> Vec<String> {
    let c = &recipe.cluster;
    let mut words: Vec<String> = ["oxalign", "worker", "--listen", addr]
        .map(String::from)
        .into();
    if let Some(files) = c.tls_files() {
        for (flag, path) in [
            ("--tls-cert", &files.cert),
            ("--tls-key", &files.key),
            ("--tls-ca", &files.ca),
        ] {
            words.extend([flag.to_string(), path.display().to_string()]);
        }
    }
    if c.insecure && !is_loopback(addr) {
        words.push("--insecure".into());
    }
    if c.max_message_mb != ClusterSection::default().max_message_mb {
        words.extend(["--max-message-mb".into(), c.max_message_mb.to_string()]);
    }
    words
}

/// The shell commands, one per line, with `#` comments; every word that a shell would
/// read specially is quoted (`launch/quote.rs`).
fn commands(recipe: &Recipe, recipe_path: &Path, overrides: &[String]) -> String {
    let dir = std::path::absolute(".").unwrap_or_else(|_| PathBuf::from("."));
    let mut out = String::new();
    let nodes = recipe.cluster.resolved_nodes().unwrap_or_default();
    for (name, addr) in &nodes {
        let _ = writeln!(out, "# node {}", name.escape_debug());
        let worker = command_line(worker_words(recipe, addr).iter().map(String::as_str));
        if is_loopback(addr) {
            let _ = writeln!(out, "{worker} &");
        } else {
            let host = split_addr(addr).map(|(h, _)| h).unwrap_or(addr);
            let remote = format!("cd {} && {worker}", quote(&dir.display().to_string()));
            let send_env = format!("SendEnv={}", recipe.cluster.cookie_env);
            let ssh = command_line(["ssh", "-o", &send_env, host, &remote]);
            let _ = writeln!(out, "{ssh} &");
        }
    }
    let _ = writeln!(out, "# the controller, here");
    let recipe_path = recipe_path.display().to_string();
    let mut train = vec!["oxalign", "train", recipe_path.as_str()];
    for o in overrides {
        train.extend(["--set", o.as_str()]);
    }
    let _ = writeln!(out, "{}", command_line(train));
    out
}

/// Runs `oxalign launch`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut overrides = args.overrides.clone();
    if let Some(h) = &args.hosts {
        overrides.extend(host_overrides(h)?);
    }
    let recipe = Recipe::load(&args.recipe, &overrides).user_err("")?;
    validate(&recipe, &args.recipe).user_err("")?;
    if recipe.cluster.resolved_nodes().is_ok_and(|n| n.is_empty()) {
        return user_error(format!(
            "{}: [cluster] nodes is empty: list the worker nodes there or with --hosts FILE",
            args.recipe.display()
        ));
    }
    if args.start {
        return start::run(&recipe, &args.recipe, &overrides);
    }
    print!("{}", commands(&recipe, &args.recipe, &overrides));
    Ok(())
}
