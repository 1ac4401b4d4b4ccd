//! Supervision under injected faults (`[[faults]]`): a panic in the policy's training, an
//! error from the reward, a hang in the reference (ended by the call timeout) and an executor
//! panic in the critic's training each restart the failed role and replay the step. The run
//! completes, reports the restart (`restarts` in `metrics.jsonl`, the actor's count in
//! `actors.json`), and its metrics equal a clean run's except timings and the restart count.
//! A spent restart budget fails with exit 1 and the `--resume` command.

mod recipe_support;
use recipe_support::{tiny_start, EXACT, TINY_PPO};
use serde_json::Value;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Tiny and short (PPO, so the critic trains): 6 SFT steps, 3 RL steps checkpointed every 2,
/// so a fault at step 2 replays step 1 from `step_000000` and one at step 3 replays from
/// `step_000002`. As in `train_resume.rs`, six SFT steps earn no reward yet and advantages
/// are not whitened: every step has non-zero policy and critic gradients, so the compared
/// metrics depend on the exact weights and optimizer states a restart restores.
fn recipe() -> String {
    tiny_start("f", "3", 2, 6, "") + TINY_PPO
}

/// Summary fields that must repeat exactly.
const SUMMARY: &[&str] = &[
    "steps",
    "accuracy_sft",
    "accuracy_final",
    "sampled_accuracy_final",
    "reward_first",
    "reward_last",
];

/// A finished run's files.
struct Run {
    dir: tempfile::TempDir,
    out: Output,
    metrics: Vec<Value>,
    summary: Option<Value>,
    actors: Value,
}

fn train(faults: &str, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), format!("{}{faults}", recipe())).unwrap();
    train_in(dir, extra)
}

/// Runs `oxalign train r.toml --quiet EXTRA` in `dir` (which holds `r.toml`).
fn train_in(dir: tempfile::TempDir, extra: &[&str]) -> Run {
    let mut args = vec!["train", "r.toml", "--quiet"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(&args)
        .current_dir(dir.path())
        .output()
        .expect("run oxalign");
    let run = dir.path().join("runs/f");
    let read = |f: &str| std::fs::read_to_string(run.join(f)).ok();
    let metrics = read("metrics.jsonl")
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines only"))
        .collect();
    let summary = read("summary.json").map(|t| serde_json::from_str(&t).unwrap());
    let actors = read("actors.json")
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(Value::Null);
    Run {
        dir,
        out,
        metrics,
        summary,
        actors,
    }
}

fn stderr(r: &Run) -> String {
    String::from_utf8_lossy(&r.out.stderr).into_owned()
}

/// The run without faults, shared by the tests.
fn clean() -> &'static Run {
    static CLEAN: OnceLock<Run> = OnceLock::new();
    CLEAN.get_or_init(|| {
        let r = train("", &[]);
        assert!(r.out.status.success(), "clean run failed: {}", stderr(&r));
        r
    })
}

/// `actors.json`'s restart count of `actor`.
fn restarts_of(r: &Run, actor: &str) -> u64 {
    let list = r
        .actors
        .as_array()
        .or_else(|| r.actors["actors"].as_array());
    list.and_then(|a| a.iter().find(|x| x["name"] == actor))
        .and_then(|x| x["restarts"].as_u64())
        .unwrap_or_else(|| panic!("no {actor} in actors.json: {}", r.actors))
}

/// Runs with one fault; checks the run completed with `restarted` rebuilt once each, the
/// failure reported as `says` and the failed step reporting one restart, and that its metrics
/// equal the clean run's.
fn recovers(fault: &str, step: u64, restarted: &[&str], extra: &[&str], says: &str) {
    let r = train(fault, extra);
    let err = stderr(&r);
    assert!(r.out.status.success(), "{fault}: the run failed: {err}");
    for want in [says, "restarting"] {
        assert!(err.contains(want), "{fault}: expected {want:?} in: {err}");
    }
    let clean = clean();
    assert_eq!(
        r.metrics.len(),
        clean.metrics.len(),
        "each step exactly once"
    );
    for (x, y) in clean.metrics.iter().zip(&r.metrics) {
        for k in EXACT {
            assert_eq!(x[k], y[k], "{fault}: step {}: {k} differs", x["step"]);
        }
        let want = f64::from(u8::from(y["step"].as_u64() == Some(step)));
        assert_eq!(
            y["restarts"].as_f64(),
            Some(want),
            "{fault}: step {}",
            y["step"]
        );
        assert_eq!(x["restarts"].as_f64(), Some(0.0), "a clean step reports 0");
    }
    let (s, t) = (clean.summary.as_ref().unwrap(), r.summary.as_ref().unwrap());
    for k in SUMMARY {
        assert_eq!(s[k], t[k], "{fault}: summary.json {k} differs");
    }
    for actor in ["policy", "reference", "reward", "critic"] {
        let want = u64::from(restarted.contains(&actor));
        assert_eq!(restarts_of(&r, actor), want, "{fault}: restarts of {actor}");
    }
}

fn fault(role: &str, phase: &str, step: u64, kind: &str) -> String {
    format!(
        "\n[[faults]]\nrole = \"{role}\"\nphase = \"{phase}\"\nstep = {step}\nkind = \"{kind}\"\n"
    )
}

#[test]
fn a_panic_in_policy_training_rewinds_policy_and_critic() {
    // Step 3 replays from step_000002: the policy may have half-updated, the critic's update
    // ran alongside, so both are rebuilt from the checkpoint.
    let f = fault("policy", "policy_train", 3, "panic");
    let says =
        "RL step 3: policy, policy_train (replica 0): job on cpu:0/policy panicked: injected fault";
    recovers(&f, 3, &["policy", "critic"], &[], says);
}

#[test]
fn an_error_from_the_reward_rebuilds_only_the_reward() {
    // Step 1 fails before any update, right after step_000000: only the reward is rebuilt.
    let f = fault("reward", "reward", 1, "error");
    let says = "RL step 1: reward, reward (replica 0): injected fault: error in reward, reward";
    recovers(&f, 1, &["reward"], &[], says);
}

#[test]
fn a_hang_in_the_reference_is_ended_by_the_timeout() {
    // Step 2 replays step 1 from step_000000, so the policy and critic are rewound too.
    let f = fault("reference", "reference_logprobs", 2, "hang");
    let timeout = ["--set", "supervision.call_timeout_s=10"];
    let says = "RL step 2: reference, reference_logprobs: no answer within the time limit of 10 s";
    recovers(&f, 2, &["policy", "reference", "critic"], &timeout, says);
}

#[test]
fn an_executor_panic_in_the_critic_is_recovered() {
    let f = fault("critic", "critic_train", 2, "panic");
    let says = "RL step 2: critic, critic_train (replica 0): job on cpu:0/critic panicked";
    recovers(&f, 2, &["policy", "critic"], &[], says);
}

#[test]
fn a_spent_restart_budget_fails_with_the_resume_command() {
    let f = fault("reward", "reward", 2, "error");
    let r = train(&f, &["--set", "supervision.max_restarts=0"]);
    let err = stderr(&r);
    assert_eq!(r.out.status.code(), Some(1), "{err}");
    for want in [
        "RL step 2: reward, reward",
        "injected fault",
        "restart budget is spent",
        "--resume",
    ] {
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
    // The command it shows continues the run; with a budget again, the fault (armed anew in
    // the new process) is recovered and the run ends with the clean run's metrics.
    let again = [
        "--resume",
        "runs/f",
        "--allow-change",
        "supervision.max_restarts",
    ];
    let r = train_in(r.dir, &again);
    assert!(r.out.status.success(), "resume failed: {}", stderr(&r));
    let clean = clean();
    assert_eq!(
        r.metrics.len(),
        clean.metrics.len(),
        "each step exactly once"
    );
    for (x, y) in clean.metrics.iter().zip(&r.metrics) {
        for k in EXACT {
            assert_eq!(x[k], y[k], "resumed: step {}: {k} differs", x["step"]);
        }
    }
    assert_eq!(r.metrics[1]["restarts"].as_f64(), Some(1.0));
}

#[test]
fn check_names_a_bad_fault() {
    let dir = tempfile::tempdir().unwrap();
    for (f, key) in [
        (fault("judge", "reward", 1, "error"), "faults[0].role"),
        (
            fault("reward", "critic_train", 1, "error"),
            "faults[0].phase",
        ),
        (fault("reward", "reward", 9, "error"), "faults[0].step"),
    ] {
        std::fs::write(dir.path().join("r.toml"), format!("{}{f}", recipe())).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
            .args(["train", "--check", "r.toml"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{f}: {err}");
        assert!(err.contains(key), "{f}: expected {key} in: {err}");
    }
}

/// With `rl.max_staleness = 1` a failure replays from a checkpoint together with the batch
/// that waited there: a panic in policy training at step 3 (replayed from `step_000002`,
/// which holds step 3's batch) and an error in the generation ahead during step 2 (step 3's
/// batch; replayed from `step_000000`, or from `step_000001` when every step is
/// checkpointed) all end with the clean pipelined run's metrics.
#[test]
fn pipelined_runs_replay_with_the_batches_generated_ahead() {
    let stale = ["--set", "rl.max_staleness=1"];
    let clean = train("", &stale);
    assert!(clean.out.status.success(), "{}", stderr(&clean));
    let lag: Vec<f64> = clean
        .metrics
        .iter()
        .map(|m| m["staleness"].as_f64().unwrap())
        .collect();
    assert_eq!(lag, [0.0, 1.0, 1.0]);
    let every_step = [
        "--set",
        "rl.max_staleness=1",
        "--set",
        "run.checkpoint_every=1",
    ];
    for (f, step, extra) in [
        (fault("policy", "policy_train", 3, "panic"), 3, &stale[..]),
        (fault("policy", "generate", 2, "error"), 2, &stale[..]),
        // Right after step_000001: step 2's update went through before its generation ahead
        // failed, so the critic is rewound too, or the replay would train it twice.
        (fault("policy", "generate", 2, "error"), 2, &every_step[..]),
    ] {
        let r = train(&f, extra);
        assert!(r.out.status.success(), "{f}: {}", stderr(&r));
        assert!(stderr(&r).contains("restarting"), "{f}: {}", stderr(&r));
        assert_eq!(r.metrics.len(), clean.metrics.len(), "each step once");
        for (x, y) in clean.metrics.iter().zip(&r.metrics) {
            for k in EXACT {
                assert_eq!(x[k], y[k], "{f}: step {}: {k} differs", x["step"]);
            }
        }
        assert_eq!(r.metrics[step - 1]["restarts"].as_f64(), Some(1.0), "{f}");
    }
}
