//! Shared helpers of the cluster tests: `oxalign worker` processes on 127.0.0.1 (killed when
//! dropped, so a failed test leaves none behind), a recipe that places roles on them, and
//! runs of `oxalign train` read back.
#![allow(dead_code)] // each test file uses a different subset

pub mod fake_worker;
#[path = "../recipe_support/mod.rs"]
mod recipe_support;

pub use recipe_support::EXACT;
use recipe_support::{tiny_start, TINY_PPO};

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Tiny and short (PPO, so all four roles work): as `train_faults.rs`, with `STEPS` RL
/// steps checkpointed every 2.
pub fn base_recipe() -> String {
    tiny_start("c", "STEPS", 2, 6, "") + TINY_PPO + "\n[supervision]\ncall_timeout_s = 60\n"
}

/// Summary fields that must repeat exactly.
pub const SUMMARY: &[&str] = &[
    "steps",
    "accuracy_sft",
    "accuracy_final",
    "sampled_accuracy_final",
    "reward_first",
    "reward_last",
];

/// A running `oxalign worker`, killed on drop.
pub struct Worker {
    child: Child,
    /// The address it listens on.
    pub addr: String,
}

impl Worker {
    /// Starts a worker on `listen` (`127.0.0.1:0` for a free port) and waits for its
    /// `listening on ADDR` line.
    pub fn start(listen: &str, cookie: Option<&str>) -> Worker {
        Self::start_with(
            Command::new(env!("CARGO_BIN_EXE_oxalign")),
            listen,
            cookie,
            &[],
        )
    }

    /// As [`Worker::start`], with more arguments (`--tls-cert ...`).
    pub fn start_args(listen: &str, cookie: Option<&str>, args: &[&str]) -> Worker {
        let cmd = Command::new(env!("CARGO_BIN_EXE_oxalign"));
        Self::start_with(cmd, listen, cookie, args)
    }

    /// As [`Worker::start`], with at most `nofile` open file descriptors (`ulimit -n`).
    pub fn start_with_nofile(listen: &str, cookie: Option<&str>, nofile: u32) -> Worker {
        let mut sh = Command::new("sh");
        sh.args(["-c", &format!("ulimit -n {nofile} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_oxalign"));
        Self::start_with(sh, listen, cookie, &[])
    }

    /// Runs `cmd` with the worker's arguments.
    fn start_with(mut cmd: Command, listen: &str, cookie: Option<&str>, args: &[&str]) -> Worker {
        cmd.args(["worker", "--listen", listen])
            .args(args)
            .env_remove("OXALIGN_COOKIE")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(c) = cookie {
            cmd.args(["--cookie", c]);
        }
        let mut child = cmd.spawn().expect("start oxalign worker");
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        BufReader::new(out).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("worker said {line:?}"))
            .to_string();
        Worker { child, addr }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The recipe with `steps` RL steps, in this process or with the policy on `node1` and the
/// reference, reward and critic on `node2`.
pub fn recipe(steps: u64, nodes: Option<(&str, &str)>) -> String {
    let mut r = base_recipe().replace("STEPS", &steps.to_string());
    if let Some((n1, n2)) = nodes {
        r.push_str(&format!(
            "\n[placement]\npolicy = \"node1:cpu\"\nreference = \"node2:cpu\"\nreward = \
             \"node2:cpu\"\ncritic = \"node2:cpu\"\n\n[cluster]\nnodes = {{ node1 = \"{n1}\", \
             node2 = \"{n2}\" }}\nconnect_timeout_s = 20\n"
        ));
    }
    r
}

/// `oxalign train r.toml --quiet` in `dir` (with `r.toml` written from `recipe`), started.
pub fn spawn_train(dir: &Path, recipe: &str) -> Child {
    spawn_train_env(dir, recipe, &[])
}

/// [`spawn_train`] with environment variables `env` set.
pub fn spawn_train_env(dir: &Path, recipe: &str, env: &[(&str, &str)]) -> Child {
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["train", "r.toml", "--quiet"])
        .env_remove("OXALIGN_COOKIE")
        .env_remove("SLURM_JOB_NODELIST")
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oxalign train")
}

/// Runs `oxalign train` to the end.
pub fn train(dir: &Path, recipe: &str) -> Output {
    spawn_train(dir, recipe).wait_with_output().unwrap()
}

/// The lines of `metrics.jsonl` in `dir`'s run folder (none when it is missing).
pub fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("runs/c/metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines only"))
        .collect()
}

/// `summary.json` of `dir`'s run.
pub fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("runs/c/summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Asserts the runs in `a` and `b` have the same metrics (except timings and restarts)
/// and summaries.
pub fn assert_same_run(a: &Path, b: &Path) {
    let (x, y) = (metrics(a), metrics(b));
    assert_eq!(x.len(), y.len(), "each step exactly once");
    assert!(!x.is_empty());
    for (l, r) in x.iter().zip(&y) {
        for k in EXACT {
            assert!(l.get(*k).is_some(), "metrics lack {k}");
            assert_eq!(l[k], r[k], "step {}: {k} differs", l["step"]);
        }
    }
    let (s, t) = (summary(a), summary(b));
    for k in SUMMARY {
        assert_eq!(s[k], t[k], "summary.json {k} differs");
    }
}

/// stderr of `out`, for messages.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
