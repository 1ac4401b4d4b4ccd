//! End-to-end runs of `oxalign train` on a small arithmetic task: PPO raises the reward, and
//! a run resumed from a checkpoint reproduces the uninterrupted run's metrics step for step.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// A deliberately small recipe: single-digit sums, a tiny model, a short SFT warm-up.
const RECIPE: &str = r#"
[run]
name = "e2e"
seed = 3
steps = 30
checkpoint_every = 2
keep_checkpoints = 10

[model]
init_family = "llama"
init_preset = "tiny"

[data]
max_operand = 9
eval_size = 20

[sft]
steps = 100
batch_size = 32
lr = 3e-3
warmup_steps = 5

[rl]
prompts_per_step = 64
minibatch_size = 32
ppo_epochs = 4
lr = 3e-4
critic_lr = 1e-3
kl_coef = 0.02
max_new_tokens = 3
"#;

fn train(dir: &Path, extra: &[&str]) {
    let mut args = vec!["train", "r.toml", "--quiet"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(&args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oxalign {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn metrics(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("runs/e2e/metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn reward(m: &Value) -> f64 {
    m["reward_mean"].as_f64().unwrap()
}

#[test]
fn ppo_raises_reward_beyond_noise() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), RECIPE).unwrap();
    train(dir.path(), &[]);
    let m = metrics(dir.path());
    assert_eq!(m.len(), 30);
    let n = 64.0;
    let first: Vec<f64> = m[..5].iter().map(reward).collect();
    let last: Vec<f64> = m[m.len() - 5..].iter().map(reward).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (p0, p1) = (mean(&first), mean(&last));
    // Sampling noise of a mean of 5 batches of 64 Bernoulli rewards, for each window.
    let se = ((p0 * (1.0 - p0) + p1 * (1.0 - p1)) / (5.0 * n))
        .sqrt()
        .max(1.0 / (5.0 * n));
    assert!(
        p1 - p0 > 2.0 * se,
        "reward did not rise beyond noise: first {first:?} last {last:?} (2·se = {:.3})",
        2.0 * se
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/e2e/summary.json")).unwrap(),
    )
    .unwrap();
    for k in ["accuracy_sft", "accuracy_final", "wall_seconds", "steps"] {
        assert!(summary[k].is_number(), "summary.json lacks {k}: {summary}");
    }
    // The engine's log-probs equal the trainer's (same weights, same precision).
    for row in &m {
        assert!(
            row["logprob_mismatch_max"].as_f64().unwrap() < 1e-4,
            "{row}"
        );
    }
}

/// Metrics that must repeat exactly; timings and throughput are left out.
const EXACT: &[&str] = &[
    "reward_mean",
    "reward_std",
    "accuracy",
    "kl",
    "kl_coef",
    "policy_loss",
    "value_loss",
    "entropy",
    "clip_frac",
    "adv_mean",
    "adv_std",
    "response_len",
    "grad_norm",
    "data_position",
    "policy_version",
];

/// Every [`EXACT`] metric of `uninterrupted` equal to `resumed`'s, step by step.
fn assert_same_exact_metrics(uninterrupted: &[Value], resumed: &[Value]) {
    for (x, y) in uninterrupted.iter().zip(resumed) {
        for k in EXACT {
            assert_eq!(x[k], y[k], "step {}: {k} differs after resume", x["step"]);
        }
    }
}

/// `measured` (uninterrupted, `rl.eval_every=3` over 4 steps) and `resumed` (no held-out
/// measurement) trained alike: every exact metric equal step by step, and held-out accuracy
/// only in `measured`, after steps 3 and 4 (the last).
fn assert_resumed_equals_measured_run(measured: &[Value], resumed: &[Value]) {
    assert_same_exact_metrics(measured, resumed);
    let steps: Vec<u64> = measured
        .iter()
        .filter(|m| (0.0..=1.0).contains(&m["heldout_greedy"].as_f64().unwrap_or(-1.0)))
        .filter(|m| (0.0..=1.0).contains(&m["heldout_sampled"].as_f64().unwrap_or(-1.0)))
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        steps,
        vec![3, 4],
        "held-out accuracy every 3 steps and after the last"
    );
    assert!(resumed.iter().all(|m| m.get("heldout_greedy").is_none()));
}

#[test]
fn resumed_run_matches_uninterrupted_run() {
    let full = tempfile::tempdir().unwrap();
    let recipe = RECIPE
        .replace("steps = 30", "steps = 4")
        .replace("steps = 100", "steps = 10");
    std::fs::write(full.path().join("r.toml"), &recipe).unwrap();
    // The uninterrupted run also measures held-out accuracy during RL (steps 3 and 4, the
    // last): that must change nothing it trains on.
    train(full.path(), &["--set", "rl.eval_every=3"]);

    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("r.toml"), &recipe).unwrap();
    train(split.path(), &["--set", "run.steps=2"]);
    train(
        split.path(),
        &["--resume", "runs/e2e", "--allow-change", "run.steps"],
    );

    let (a, b) = (metrics(full.path()), metrics(split.path()));
    assert_eq!(a.len(), 4);
    assert_eq!(b.len(), 4, "resume must neither replay nor skip steps");
    assert_resumed_equals_measured_run(&a, &b);
}

/// Rollouts at T = 0.7 with top-k 20: every log-prob of the step (engine, trainer, reference)
/// is taken under the distribution sampled, so the engine matches the trainer within 1e-5
/// and the KL to the reference is exactly 0 before the policy first moves.
#[test]
fn tempered_truncated_rollouts_are_scored_under_their_own_distribution() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), RECIPE).unwrap();
    let sets = [
        "--set",
        "run.steps=3",
        "--set",
        "sft.steps=20",
        "--set",
        "rl.temperature=0.7",
        "--set",
        "rl.top_k=20",
        "--set",
        "rl.algorithm=grpo",
        "--set",
        "rl.samples_per_prompt=4",
        "--set",
        "rl.prompts_per_step=16",
    ];
    train(dir.path(), &sets);
    let m = metrics(dir.path());
    assert_eq!(m.len(), 3);
    assert_eq!(m[0]["kl"].as_f64().unwrap(), 0.0, "{}", m[0]);
    for row in &m {
        let mismatch = row["logprob_mismatch_max"].as_f64().unwrap();
        assert!(mismatch <= 1e-5, "engine vs trainer {mismatch}: {row}");
    }
}

/// `sft.packing` and `rl.packing` on: the SFT warm-up and the PPO policy and critic updates
/// run on packed rows end to end, with finite losses every step.
#[test]
fn packed_sft_and_rl_run_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = RECIPE
        .replace("steps = 30", "steps = 2")
        .replace("steps = 100", "steps = 4")
        .replace("[sft]\n", "[sft]\npacking = true\n")
        .replace("[rl]\n", "[rl]\npacking = true\n");
    std::fs::write(dir.path().join("r.toml"), &recipe).unwrap();
    train(dir.path(), &[]);
    let m = metrics(dir.path());
    assert_eq!(m.len(), 2);
    for step in &m {
        for k in ["policy_loss", "value_loss"] {
            let v = step[k].as_f64().unwrap_or(f64::NAN);
            assert!(v.is_finite(), "step {}: {k} = {}", step["step"], step[k]);
        }
    }
}

/// PPO with the policy and critic sharded (FSDP) over two CPU replicas: the run checkpoints
/// whole HF weights plus every rank's optimizer shard, and a run resumed from a checkpoint
/// (which reloads the shards) reproduces the uninterrupted sharded run step for step.
#[test]
fn sharded_run_checkpoints_and_resumes_exactly() {
    let recipe = RECIPE
        .replace("steps = 30", "steps = 4")
        .replace("steps = 100", "steps = 10")
        + "\n[placement]\npolicy = \"cpu:0,cpu:1\"\ncritic = \"cpu:0,cpu:1\"\nsharding = \"sharded\"\n";
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("r.toml"), &recipe).unwrap();
    train(full.path(), &["--check"]);
    // The uninterrupted run also measures held-out accuracy during RL (steps 3 and 4, the
    // last): that must change nothing it trains on.
    train(full.path(), &["--set", "rl.eval_every=3"]);
    let step2 = full.path().join("runs/e2e/checkpoints/step_000002");
    for rank in 0..2 {
        let layout = format!("policy/optimizer/shard_{rank}/shard_layout.json");
        assert!(step2.join(&layout).is_file(), "{layout} missing");
    }

    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("r.toml"), &recipe).unwrap();
    train(split.path(), &["--set", "run.steps=2"]);
    train(
        split.path(),
        &["--resume", "runs/e2e", "--allow-change", "run.steps"],
    );
    let (a, b) = (metrics(full.path()), metrics(split.path()));
    assert_eq!((a.len(), b.len()), (4, 4));
    assert_resumed_equals_measured_run(&a, &b);
}

/// The tensors of `dir/model.safetensors`.
fn weights_of(dir: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
        .unwrap()
}

/// With `[lora]` (the SFT warm-up trains adapters with seeded dropout masks; RL puts fresh
/// ones on the merged result, the reference): a run resumed from a checkpoint equals the uninterrupted one step for
/// step (the adapters and their optimizer come back exactly, the frozen base from the
/// folder the adapter names); nothing but adapters ever trains (the merged final policy's
/// embeddings and norms are the initial model's bits, its projections are not); `final/`
/// is a merged HF folder with PEFT's files in `adapter/` naming the reference as its base.
#[test]
fn a_lora_run_resumes_exactly_and_leaves_the_base_frozen() {
    lora_run_resumes_exactly("");
}

/// The same with the frozen base kept in bf16 (`lora.base_dtype = "bf16"`): the
/// projections rounded once at load, the embeddings and norms still the initial bits.
#[test]
fn a_lora_run_on_a_bf16_base_resumes_exactly() {
    lora_run_resumes_exactly("base_dtype = \"bf16\"\n");
}

fn lora_run_resumes_exactly(lora_keys: &str) {
    let recipe = RECIPE
        .replace("steps = 30", "steps = 4")
        .replace("steps = 100", "steps = 10")
        + "\n[lora]\nr = 4\nalpha = 8\ndropout = 0.1\n"
        + lora_keys;
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("r.toml"), &recipe).unwrap();
    train(full.path(), &[]);
    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("r.toml"), &recipe).unwrap();
    train(split.path(), &["--set", "run.steps=2"]);
    train(
        split.path(),
        &["--resume", "runs/e2e", "--allow-change", "run.steps"],
    );
    let (a, b) = (metrics(full.path()), metrics(split.path()));
    assert_eq!((a.len(), b.len()), (4, 4));
    assert_same_exact_metrics(&a, &b);
    let run = full.path().join("runs/e2e");
    let (init, last) = (
        weights_of(&run.join("init")),
        weights_of(&run.join("final")),
    );
    for (name, t) in &init {
        let same = t
            .eq(&last[name])
            .unwrap()
            .min_all()
            .unwrap()
            .to_scalar::<u8>()
            .unwrap()
            == 1;
        let adapted = name.contains("_proj.");
        assert_eq!(
            same, !adapted,
            "{name}: frozen base or merged adapter expected"
        );
    }
    let config = std::fs::read_to_string(run.join("final/adapter/adapter_config.json")).unwrap();
    let config: Value = serde_json::from_str(&config).unwrap();
    let base = config["base_model_name_or_path"].as_str().unwrap();
    assert!(
        Path::new(base).is_absolute() && base.ends_with("runs/e2e/reference"),
        "{base}"
    );
    assert!(!run.join("reference/adapter").exists());
    assert_eq!(config["r"], 4);
}

/// `model.gradient_checkpointing = true` trains the same run: the SFT warm-up, the policy
/// (PPO) and the critic recompute their layers in the backward and take the same steps, so
/// every exact metric equals the run without it, with full weights and with LoRA adapters.
#[test]
fn activation_checkpointing_trains_the_same_run() {
    let recipe = RECIPE
        .replace("steps = 30", "steps = 3")
        .replace("steps = 100", "steps = 10");
    for lora in ["", "\n[lora]\nr = 4\nalpha = 8\n"] {
        let recipe = recipe.clone() + lora;
        let run = |checkpointing: &str| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("r.toml"), &recipe).unwrap();
            let key = format!("model.gradient_checkpointing={checkpointing}");
            train(dir.path(), &["--set", &key]);
            metrics(dir.path())
        };
        let (plain, checkpointed) = (run("false"), run("true"));
        assert_eq!((plain.len(), checkpointed.len()), (3, 3));
        assert_same_exact_metrics(&plain, &checkpointed);
    }
}
