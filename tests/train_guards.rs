//! Divergence stops a run: the issue's reproductions (a huge critic lr, a huge policy lr, a
//! huge SFT lr) end with a non-zero exit and a message naming what diverged and what to
//! lower, never "completed", and no checkpoint holds the diverged weights. Lengths past the
//! policy's context are refused with exit 2, before the run and during it.

use std::path::Path;
use std::process::{Command, Output};

/// Tiny and short, like the quickstart: enough SFT for a non-zero reward (with none, every
/// return and gradient is zero and nothing can diverge).
const RECIPE: &str = r#"
[run]
name = "g"
seed = 1
steps = 4
checkpoint_every = 1

[model]
init_family = "llama"
init_preset = "tiny"

[data]
max_operand = 9
eval_size = 4

[sft]
steps = 60
batch_size = 32
lr = 3e-3
warmup_steps = 5

[rl]
prompts_per_step = 16
minibatch_size = 8
ppo_epochs = 2
lr = 1e-4
critic_lr = 1e-3
max_new_tokens = 3
"#;

fn train(dir: &Path, extra: &[&str]) -> Output {
    std::fs::write(dir.join("r.toml"), RECIPE).unwrap();
    let mut args = vec!["train", "r.toml", "--quiet"];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(&args)
        .current_dir(dir)
        .output()
        .expect("run oxalign")
}

/// Runs a diverging recipe; returns stderr after the common checks.
fn diverges(extra: &[&str], wants: &[&str]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = train(dir.path(), extra);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in ["training diverged", "Lower"].iter().chain(wants) {
        assert!(err.contains(w), "{extra:?}: expected {w:?} in: {err}");
    }
    let text = std::fs::read_to_string(dir.path().join("runs/g/run.json")).unwrap();
    let run: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(run["finished"]["outcome"], "failed", "{text}");
    assert!(!dir.path().join("runs/g/summary.json").exists());
    (dir, err)
}

#[test]
fn a_huge_critic_lr_stops_before_a_checkpoint() {
    let (dir, _) = diverges(
        &["--set", "rl.critic_lr=1e30"],
        &["critic", "critic_train", "RL step 1", "rl.critic_lr"],
    );
    // The first RL step diverged, so only the RL-start checkpoint exists.
    let ckpts = dir.path().join("runs/g/checkpoints");
    assert!(ckpts.join("step_000000").is_dir());
    assert!(!ckpts.join("step_000001").exists());
}

#[test]
fn a_huge_policy_lr_stops_the_run() {
    let (dir, _) = diverges(
        &["--set", "rl.lr=1e3"],
        &["policy", "policy_train", "RL step 1", "approx KL", "rl.lr"],
    );
    // The collapse happened in step 1's update, so no RL step was checkpointed.
    assert!(!dir.path().join("runs/g/checkpoints/step_000001").exists());
}

#[test]
fn a_huge_sft_lr_stops_during_sft() {
    diverges(
        &["--set", "sft.lr=1e2"],
        &["policy", "sft", "SFT step", "sft.lr"],
    );
}

#[test]
fn generation_longer_than_the_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(dir.path(), &["--set", "rl.max_new_tokens=5000"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("rl.max_new_tokens") && err.contains("max_position_embeddings"),
        "{err}"
    );
}

#[test]
fn a_training_prompt_longer_than_the_context_is_bad_input() {
    // The tiny policy's context is 2048 tokens (one per byte); this prompt needs 3000.
    let dir = tempfile::tempdir().unwrap();
    let line = serde_json::json!({"prompt": "x".repeat(3000), "answer": "1"});
    std::fs::write(dir.path().join("p.jsonl"), format!("{line}\n")).unwrap();
    let extra = [
        "--set",
        "data.task=\"jsonl\"",
        "--set",
        "data.path=\"p.jsonl\"",
        "--set",
        "sft.steps=0",
    ];
    let out = train(dir.path(), &extra);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in [
        "RL step 1",
        "prompt",
        "max_position_embeddings",
        "rl.max_new_tokens",
    ] {
        assert!(err.contains(want), "{want:?} missing in: {err}");
    }
    assert!(!err.contains("continue with"), "{err}");
}
