//! `rl.routing_replay` end to end, on configs/moe-grpo.toml's Qwen3-MoE with an int8 rollout
//! engine (whose routers pick other experts than the f32 trainer's on some tokens): the
//! run replays the rollout's experts in the trainer, reports how often that overrode the
//! trainer's own routing (`routing_overridden`), and its first step's engine/trainer
//! log-prob gap (same weights and rollout in both runs) is no wider than without replay.
//! With the trainer in the engine's int8 numbers as well (`rl.trainer_precision =
//! "fake_int8"`) the trainer runs the engine's decoder bit for bit and the gap is within 1e-5
//! on every token (only the LM head sums in another order). Experts over two devices
//! replay like data parallelism does. A dense policy is refused
//! with the key named.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Runs configs/moe-grpo.toml with an int8 engine for 2 RL steps with `sets`; returns its
/// metrics rows.
fn run(dir: &Path, sets: &[&str]) -> Vec<Value> {
    let int8 = ["engine.quant=\"int8\"", "engine.refit_tolerance=0.05"];
    run_recipe("moe-grpo", dir, &[&int8[..], sets].concat())
}

/// Runs `configs/{name}.toml` for 2 RL steps after 60 SFT steps with `sets`; returns its
/// metrics rows.
fn run_recipe(name: &str, dir: &Path, sets: &[&str]) -> Vec<Value> {
    let recipe = format!("{}/configs/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxalign"));
    cmd.args(["train", &recipe, "--quiet"])
        .args(["--set", "run.steps=2", "--set", "sft.steps=60"])
        .current_dir(dir);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{name} {sets:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join(format!("runs/{name}/metrics.jsonl"))).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn int8_rollouts_replay_their_experts_in_the_trainer() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let replayed = run(a.path(), &["rl.routing_replay=true"]);
    let own = run(b.path(), &[]);
    assert_eq!(replayed.len(), 2);
    for r in &replayed {
        let f = r["routing_overridden"].as_f64().unwrap();
        assert!((0.0..0.5).contains(&f), "{r}");
        assert!(r["refit_probe_max_abs_diff"].as_f64().unwrap().is_finite());
        assert!(r["grad_norm"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(own.iter().all(|r| r.get("routing_overridden").is_none()));
    let gap = |m: &[Value]| m[0]["logprob_mismatch_max"].as_f64().unwrap();
    println!(
        "step 1 engine/trainer max |Δ log-prob|: replay {:.3e}, own routing {:.3e}; \
         replay overrode {:.2}% of token-layers",
        gap(&replayed),
        gap(&own),
        100.0 * replayed[0]["routing_overridden"].as_f64().unwrap()
    );
    assert!(gap(&replayed) <= gap(&own) + 1e-6);
    let c = tempfile::tempdir().unwrap();
    let int8_trainer = [
        "rl.routing_replay=true",
        "rl.trainer_precision=\"fake_int8\"",
    ];
    let fake = run(c.path(), &int8_trainer);
    let mean = |m: &[Value]| m[0]["logprob_mismatch_mean"].as_f64().unwrap();
    println!(
        "step 1 with the trainer in the engine's int8 numbers and replay: max {:.3e}, mean \
         {:.3e} (f32 trainer with replay: mean {:.3e})",
        gap(&fake),
        mean(&fake),
        mean(&replayed)
    );
    assert!(gap(&fake) <= 1e-5, "{}", gap(&fake));
    assert!(mean(&fake) < mean(&replayed) / 20.0, "{}", mean(&fake));
}

/// Experts over two devices (configs/moe-grpo-ep2.toml) replay the rollout's routing like
/// data parallelism over the same two devices does: the same metrics to f32 rounding, and
/// with f32 rollouts no routing of the first minibatch is overridden. (Replay is not a
/// no-op against a run without it even then: the later minibatches of an update keep the
/// rollout's experts while the updated routers would choose others.)
#[test]
fn expert_parallel_runs_replay_routing_like_data_parallel() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let replay = "rl.routing_replay=true";
    let ep2 = run_recipe("moe-grpo-ep2", a.path(), &[replay]);
    let dp2 = run_recipe(
        "moe-grpo",
        b.path(),
        &[
            replay,
            "placement.policy=\"cpu:0,cpu:1\"",
            // configs/moe-grpo-ep2.toml samples dynamically; the one-device recipe does not.
            "rl.dynamic_sampling=true",
        ],
    );
    assert_eq!(ep2.len(), 2);
    for (x, y) in ep2.iter().zip(&dp2) {
        assert_eq!(x["routing_overridden"].as_f64(), Some(0.0), "{x}");
        for key in ["reward_mean", "kl", "grad_norm", "policy_loss"] {
            let (p, q) = (x[key].as_f64().unwrap(), y[key].as_f64().unwrap());
            assert!(
                (p - q).abs() <= 5e-4 * q.abs().max(1e-2),
                "{key}: EP=2 {p} vs DP=2 {q}"
            );
        }
    }
}

#[test]
fn a_dense_policy_cannot_replay_routing() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = format!("{}/configs/quickstart.toml", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args([
            "train",
            &recipe,
            "--quiet",
            "--set",
            "rl.routing_replay=true",
        ])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rl.routing_replay"), "{err}");
    assert!(err.contains("dense"), "{err}");
}
