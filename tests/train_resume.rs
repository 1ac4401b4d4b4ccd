//! A run folder that never lies: kills emulated at several points (during SFT, at the start
//! of RL, mid-RL with a half-written metrics line) resume to exactly the uninterrupted run's
//! `metrics.jsonl`, `samples.jsonl` and `summary.json`; damaged checkpoints fall back or
//! fail with exit 2; a fresh start never appends to an old run; a resume refuses a recipe
//! that changed.

mod cli_support;
mod recipe_support;
use cli_support::oxalign;
use recipe_support::{tiny_start, TINY_PPO};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Tiny and short: 6 SFT steps (checkpointed every 2), 3 RL steps (checkpointed each). Six
/// SFT steps earn no reward yet, so a wrong answer costs -0.5 and advantages are not
/// whitened: every step then has non-zero policy and critic gradients, and the compared
/// metrics (KL, entropy, losses, gradient norm) depend on the exact weights and optimizer
/// states a resume restores.
fn recipe() -> String {
    tiny_start("r", "3", 1, 6, "checkpoint_every = 2\n") + TINY_PPO
}

fn train_ok(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec!["train", "r.toml", "--quiet"];
    args.extend_from_slice(extra);
    let out = oxalign(dir, &args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "oxalign {args:?} failed:\n{}\n{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

fn train_fails(dir: &Path, extra: &[&str], code: i32) -> String {
    let mut args = vec!["train", "r.toml", "--quiet"];
    args.extend_from_slice(extra);
    let out = oxalign(dir, &args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "oxalign {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn run_dir(dir: &Path) -> PathBuf {
    dir.join("runs/r")
}

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir(dir).join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines only"))
        .collect()
}

/// The run's `samples.jsonl`.
fn samples(dir: &Path) -> String {
    std::fs::read_to_string(run_dir(dir).join("samples.jsonl")).unwrap()
}

fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(run_dir(dir).join("summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Metrics that must repeat exactly; timings and throughput are left out.
const EXACT: &[&str] = &[
    "step",
    "reward_mean",
    "accuracy",
    "kl",
    "policy_loss",
    "value_loss",
    "entropy",
    "grad_norm",
    "adv_mean",
    "data_position",
    "policy_version",
];

/// Summary fields that must repeat exactly (wall time and paths are left out).
const SUMMARY: &[&str] = &[
    "steps",
    "accuracy_init",
    "accuracy_sft",
    "accuracy_final",
    "sampled_accuracy_sft",
    "sampled_accuracy_final",
    "reward_first",
    "reward_last",
];

fn assert_same_run(full: &Path, resumed: &Path, label: &str) {
    let (a, b) = (metrics(full), metrics(resumed));
    assert_eq!(a.len(), b.len(), "{label}: each step exactly once");
    for (x, y) in a.iter().zip(&b) {
        for k in EXACT {
            assert_eq!(x[k], y[k], "{label}: step {}: {k} differs", x["step"]);
        }
    }
    let (s, t) = (summary(full), summary(resumed));
    for k in SUMMARY {
        assert_eq!(s[k], t[k], "{label}: summary.json {k} differs");
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A copy of the finished run `full` as a kill right after checkpoint `keep` would have
/// left it: newer checkpoints gone, metrics of `metrics_steps` RL steps (some after the
/// checkpoint) plus a half-written line, no summary; during SFT also no reference.
fn killed_copy(full: &Path, keep: &str, metrics_steps: usize) -> tempfile::TempDir {
    let recipe = std::fs::read_to_string(full.join("r.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    let run = run_dir(dir.path());
    copy_tree(&run_dir(full), &run);
    let order = |n: &str| (n.starts_with("step_"), n.to_string());
    for e in std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if order(&name) > order(keep) {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
    let lines: Vec<String> = metrics(full)
        .iter()
        .take(metrics_steps)
        .map(|m| format!("{m}\n"))
        .collect();
    let text = lines.concat() + "{\"step\": 9, \"reward_me";
    std::fs::write(run.join("metrics.jsonl"), text).unwrap();
    std::fs::remove_file(run.join("summary.json")).unwrap();
    if keep.starts_with("sft_") {
        std::fs::remove_dir_all(run.join("reference")).unwrap();
    }
    dir
}

#[test]
fn kills_at_any_point_resume_to_the_uninterrupted_run() {
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("r.toml"), recipe()).unwrap();
    train_ok(full.path(), &[]);
    assert_eq!(metrics(full.path()).len(), 3);
    let ckpts = run_dir(full.path()).join("checkpoints");
    for name in ["sft_000002", "sft_000004", "step_000000", "step_000003"] {
        let d = ckpts.join(name);
        assert!(
            d.join("checksums.json").is_file(),
            "{} missing",
            d.display()
        );
    }

    // During SFT, at the start of RL, and mid-RL with metrics past the checkpoint.
    for (keep, metrics_steps) in [("sft_000004", 0), ("step_000000", 0), ("step_000001", 2)] {
        let killed = killed_copy(full.path(), keep, metrics_steps);
        train_ok(killed.path(), &["--resume", "runs/r"]);
        assert_same_run(full.path(), killed.path(), keep);
        // rl.log_samples (default 4) per step, none repeated or lost by the resume
        assert_eq!(samples(killed.path()).lines().count(), 3 * 4, "{keep}");
        assert_eq!(samples(killed.path()), samples(full.path()), "{keep}");
    }

    // Several resumes in a row: 1 step, then 2, then 3.
    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("r.toml"), recipe()).unwrap();
    train_ok(split.path(), &["--set", "run.steps=1"]);
    let allow = ["--resume", "runs/r", "--allow-change", "run.steps"];
    train_ok(
        split.path(),
        &[&allow[..], &["--set", "run.steps=2"]].concat(),
    );
    train_ok(split.path(), &allow);
    assert_same_run(full.path(), split.path(), "three processes");

    // A fresh start over this run is refused; a resume that changes what the run
    // computes is refused, naming the keys.
    let err = train_fails(split.path(), &[], 2);
    assert!(err.contains("runs/r") && err.contains("--resume"), "{err}");
    let err = train_fails(
        split.path(),
        &[
            "--resume",
            "runs/r",
            "--set",
            "rl.lr=1e-3",
            "--set",
            "run.seed=6",
        ],
        2,
    );
    assert!(err.contains("rl.lr") && err.contains("run.seed"), "{err}");
    let err = train_fails(
        split.path(),
        &["--resume", "runs/r", "--set", "run.steps=5"],
        2,
    );
    assert!(err.contains("--allow-change run.steps"), "{err}");
    let err = train_fails(
        split.path(),
        &["--resume", "runs/r", "--allow-change", "rl.lr"],
        2,
    );
    assert!(err.contains("rl.lr"), "{err}");
    let recipe = std::fs::read_to_string(run_dir(split.path()).join("recipe.toml")).unwrap();
    assert!(
        recipe.contains("steps = 3"),
        "recipe.toml was overwritten: {recipe}"
    );

    damaged_checkpoints_fall_back_or_fail(full.path());
    a_tampered_run_folder_is_caught(full.path());
}

/// `rl.max_staleness = 1`: step 1 trains on its own batch, each later step on the batch the
/// engine generated while the step before was updating (one version behind, corrected by
/// token TIS). The waiting batch is saved with each checkpoint, so a kill after any RL
/// checkpoint resumes to exactly the uninterrupted run.
#[test]
fn pipelined_runs_train_one_version_behind_and_resume_exactly() {
    let full = tempfile::tempdir().unwrap();
    let stale = recipe().replace("[rl]\n", "[rl]\nmax_staleness = 1\n");
    std::fs::write(full.path().join("r.toml"), &stale).unwrap();
    train_ok(full.path(), &[]);
    let m = metrics(full.path());
    let lag: Vec<f64> = m.iter().map(|x| x["staleness"].as_f64().unwrap()).collect();
    assert_eq!(lag, [0.0, 1.0, 1.0], "batch j comes from version j - 2");
    for x in &m[1..] {
        let w = x["rollout_is_weight_mean"].as_f64().unwrap();
        assert!(w.is_finite() && w > 0.0, "token TIS is on by default: {x}");
    }
    let ckpts = run_dir(full.path()).join("checkpoints");
    for (step, waiting) in [(0, false), (1, true), (2, true), (3, false)] {
        let has = ckpts
            .join(format!("step_{step:06}"))
            .join("rollouts_ahead.json")
            .is_file();
        assert_eq!(has, waiting, "checkpoint of step {step}");
    }
    for (keep, metrics_steps) in [("step_000001", 2), ("step_000002", 2)] {
        let killed = killed_copy(full.path(), keep, metrics_steps);
        train_ok(killed.path(), &["--resume", "runs/r"]);
        assert_same_run(full.path(), killed.path(), keep);
    }
    // The on-policy run differs from step 2 on: its batches come from the newest weights.
    let on_policy = tempfile::tempdir().unwrap();
    std::fs::write(on_policy.path().join("r.toml"), recipe()).unwrap();
    train_ok(on_policy.path(), &[]);
    let k0 = metrics(on_policy.path());
    assert_eq!(
        k0[0]["reward_mean"], m[0]["reward_mean"],
        "same first batch"
    );
    assert_ne!(k0[1]["kl"], m[1]["kl"], "step 2 trains on another batch");
}

/// Flips one byte in the middle of `file`.
fn flip_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x40;
    std::fs::write(file, bytes).unwrap();
}

fn damaged_checkpoints_fall_back_or_fail(full: &Path) {
    // The newest checkpoint's policy weights are corrupt: resume from the one before.
    let killed = killed_copy(full, "step_000003", 3);
    let ckpts = run_dir(killed.path()).join("checkpoints");
    flip_byte(&ckpts.join("step_000003/policy/model.safetensors"));
    let err = train_ok(killed.path(), &["--resume", "runs/r"]);
    assert!(
        err.contains("warning") && err.contains("step_000003") && err.contains("SHA-256"),
        "{err}"
    );
    assert!(err.contains("step_000002"), "{err}");
    assert_same_run(full, killed.path(), "fallback from a corrupt checkpoint");

    // A missing critic optimizer state is a damaged checkpoint, never a fresh optimizer.
    let killed = killed_copy(full, "step_000003", 3);
    let ckpts = run_dir(killed.path()).join("checkpoints");
    std::fs::remove_file(ckpts.join("step_000003/critic/optimizer/optimizer.safetensors")).unwrap();
    let err = train_ok(killed.path(), &["--resume", "runs/r"]);
    assert!(
        err.contains("critic/optimizer/optimizer.safetensors"),
        "{err}"
    );
    assert_same_run(
        full,
        killed.path(),
        "fallback from a missing optimizer state",
    );

    // No valid checkpoint at all: exit 2, and no advice to resume the same folder again.
    let killed = killed_copy(full, "step_000001", 1);
    let ckpts = run_dir(killed.path()).join("checkpoints");
    for e in std::fs::read_dir(&ckpts).unwrap().flatten() {
        if e.path().join("policy/model.safetensors").is_file() {
            flip_byte(&e.path().join("policy/model.safetensors"));
        }
    }
    let err = train_fails(killed.path(), &["--resume", "runs/r"], 2);
    assert!(err.contains("no valid checkpoint"), "{err}");
    assert!(!err.contains("continue with"), "{err}");
}

/// Replaces `from` by `to` in `file` (which must contain it).
fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} lacks {from:?}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

/// Every file a resume reads is checked: `state.json` (covered by the checksums), the
/// metrics (each step exactly once, repaired from the checkpoint's copy), the frozen
/// reference (against the checksums recorded when RL started) and the folder's lock.
fn a_tampered_run_folder_is_caught(full: &Path) {
    let ckpt3 = run_dir(full).join("checkpoints/step_000003");
    // The finished run's policy is an HF folder of its own, without optimizer state.
    let fin = run_dir(full).join("final");
    assert_eq!(
        std::fs::read(fin.join("model.safetensors")).unwrap(),
        std::fs::read(ckpt3.join("policy/model.safetensors")).unwrap()
    );
    for f in ["config.json", "tokenizer.json", "checksums.json"] {
        assert!(fin.join(f).is_file(), "final/{f}");
    }
    assert!(!fin.join("optimizer").exists());
    assert_eq!(
        std::fs::read_to_string(ckpt3.join("metrics.jsonl")).unwrap(),
        std::fs::read_to_string(run_dir(full).join("metrics.jsonl")).unwrap(),
        "the checkpoint holds the metrics of its steps"
    );

    // An edited step in state.json: that checkpoint is damaged, the one before is used.
    let killed = killed_copy(full, "step_000003", 3);
    let ckpts = run_dir(killed.path()).join("checkpoints");
    edit(
        &ckpts.join("step_000003/state.json"),
        "\"step\": 3",
        "\"step\": 36",
    );
    let err = train_ok(killed.path(), &["--resume", "runs/r"]);
    assert!(
        err.contains("step_000003") && err.contains("state.json"),
        "{err}"
    );
    assert_same_run(full, killed.path(), "an edited state.json");

    // An edited data cursor in every checkpoint: nothing to resume from, exit 2.
    let killed = killed_copy(full, "step_000001", 1);
    let ckpts = run_dir(killed.path()).join("checkpoints");
    for e in std::fs::read_dir(&ckpts).unwrap().flatten() {
        edit(
            &e.path().join("state.json"),
            "\"data_position\": ",
            "\"data_position\": 1",
        );
    }
    let err = train_fails(killed.path(), &["--resume", "runs/r"], 2);
    assert!(
        err.contains("no valid checkpoint") && err.contains("state.json"),
        "{err}"
    );

    // metrics.jsonl cut short: restored from the checkpoint's copy, each step once.
    let killed = killed_copy(full, "step_000002", 2);
    let first = metrics(full)[0].to_string() + "\n";
    std::fs::write(run_dir(killed.path()).join("metrics.jsonl"), first).unwrap();
    let err = train_ok(killed.path(), &["--resume", "runs/r"]);
    assert!(err.contains("restored it from"), "{err}");
    assert_same_run(full, killed.path(), "metrics cut short");

    // A changed reference: refused, naming the file, before anything runs.
    let killed = killed_copy(full, "step_000002", 2);
    flip_byte(&run_dir(killed.path()).join("reference/model.safetensors"));
    let err = train_fails(killed.path(), &["--resume", "runs/r"], 2);
    assert!(
        err.contains("reference") && err.contains("model.safetensors"),
        "{err}"
    );

    // A second writer: refused while another process holds the folder, naming it.
    let killed = killed_copy(full, "step_000002", 2);
    let lock = run_dir(killed.path()).join(".oxalign.lock");
    std::fs::write(&lock, "pid 4242 on host elsewhere").unwrap();
    let held = std::fs::File::open(&lock).unwrap();
    held.try_lock().unwrap();
    let err = train_fails(killed.path(), &["--resume", "runs/r"], 2);
    assert!(err.contains("pid 4242 on host elsewhere"), "{err}");
    drop(held);
    train_ok(killed.path(), &["--resume", "runs/r"]);
    assert_same_run(full, killed.path(), "after the lock was released");
}

#[test]
fn a_fresh_start_without_checkpoints_replaces_the_old_logs() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe()
        .replace("steps = 6", "steps = 0")
        .replace("steps = 3", "steps = 1");
    std::fs::write(dir.path().join("r.toml"), recipe).unwrap();
    let run = run_dir(dir.path());
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\": 1, \"old\": true}\n{\"st",
    )
    .unwrap();
    let err = train_ok(dir.path(), &[]);
    assert!(err.contains("starting it over"), "{err}");
    let m = metrics(dir.path());
    assert_eq!(m.len(), 1);
    assert!(m[0].get("old").is_none(), "old run's line kept: {m:?}");
}

/// An expert-parallel policy (the recipe above on a tiny Qwen3-MoE with its experts over two
/// CPU devices) resumes from its checkpoints (whole weights, one AdamW state per rank in
/// `optimizer/expert_rank_<r>/`) to exactly the uninterrupted run.
#[test]
fn an_expert_parallel_run_resumes_to_the_uninterrupted_run() {
    let recipe = recipe().replace("init_family = \"llama\"", "init_family = \"qwen3_moe\"")
        + "\n[placement]\npolicy = \"cpu:0,cpu:1\"\nexpert_parallel = 2\n";
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("r.toml"), &recipe).unwrap();
    train_ok(full.path(), &[]);
    let policy = run_dir(full.path()).join("checkpoints/step_000003/policy");
    for rank in 0..2 {
        let d = policy.join(format!("optimizer/expert_rank_{rank}"));
        assert!(d.join("optimizer.safetensors").is_file(), "{}", d.display());
    }
    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("r.toml"), &recipe).unwrap();
    train_ok(split.path(), &["--set", "run.steps=1"]);
    train_ok(
        split.path(),
        &["--resume", "runs/r", "--allow-change", "run.steps"],
    );
    assert_same_run(full.path(), split.path(), "expert-parallel resume");
}
