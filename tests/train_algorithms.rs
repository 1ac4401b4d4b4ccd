//! GRPO, RLOO, REINFORCE++, DAPO, GSPO and CISPO with the rule-based exact-match reward, from their recipes in
//! configs/: the sampled training accuracy of the last 15 steps beats the first 15 by more
//! than twice the sampling noise, and the KL to the reference stays bounded. Seeded; about
//! 20 s each on 2 cores.

use serde_json::Value;
use std::process::Command;

fn learns(algorithm: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = format!("{}/configs/{algorithm}.toml", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["train", &recipe, "--quiet"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{algorithm} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = tmp
        .path()
        .join("runs")
        .join(algorithm)
        .join("metrics.jsonl");
    let m: Vec<Value> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(m.len(), 60);
    let mean = |rows: &[Value], k: &str| {
        rows.iter().map(|r| r[k].as_f64().unwrap()).sum::<f64>() / rows.len() as f64
    };
    let (p0, p1) = (mean(&m[..15], "accuracy"), mean(&m[45..], "accuracy"));
    // 16 prompts × 4 samples per step, 15 steps per window.
    let n = 15.0 * 64.0;
    let se = ((p0 * (1.0 - p0) + p1 * (1.0 - p1)) / n).sqrt();
    let kl_max = m
        .iter()
        .map(|r| r["kl"].as_f64().unwrap())
        .fold(0.0, f64::max);
    eprintln!(
        "{algorithm}: training accuracy {p0:.3} -> {p1:.3} (2·se {:.3}), max KL {kl_max:.3}",
        2.0 * se
    );
    assert!(
        p1 - p0 > 2.0 * se,
        "{algorithm}: accuracy {p0} -> {p1}, 2·se = {}",
        2.0 * se
    );
    assert!(kl_max < 1.0, "{algorithm}: KL {kl_max}");
}

#[test]
fn grpo_raises_accuracy() {
    learns("grpo");
}

#[test]
fn rloo_raises_accuracy() {
    learns("rloo");
}

#[test]
fn reinforce_pp_raises_accuracy() {
    learns("reinforce_pp");
}

#[test]
fn dapo_raises_accuracy() {
    learns("dapo");
}

#[test]
fn gspo_raises_accuracy() {
    learns("gspo");
}

#[test]
fn cispo_raises_accuracy() {
    learns("cispo");
}

/// A mixture-of-experts policy (configs/moe-grpo.toml, Qwen3-MoE) trains through the whole
/// loop: its engine's sampling log-probs are the trainer's to f32 rounding (the routers pick
/// the same experts on both sides), every refit passes its probe, and the policy moves.
#[test]
fn a_moe_policy_trains_with_verified_refits() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = format!("{}/configs/moe-grpo.toml", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["train", &recipe, "--quiet"])
        .args(["--set", "run.steps=4", "--set", "sft.steps=150"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "moe-grpo failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = tmp.path().join("runs/moe-grpo/init/config.json");
    let config = std::fs::read_to_string(config).unwrap();
    assert!(config.contains("\"qwen3_moe\""), "{config}");
    let text = std::fs::read_to_string(tmp.path().join("runs/moe-grpo/metrics.jsonl")).unwrap();
    let m: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(m.len(), 4);
    for r in &m {
        let mismatch = r["logprob_mismatch_max"].as_f64().unwrap();
        assert!(mismatch < 1e-4, "engine vs trainer: {r}");
        assert!(r["refit_probe_max_abs_diff"].as_f64().unwrap().is_finite());
        assert!(r["grad_norm"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        m[3]["kl"].as_f64().unwrap() > 0.0,
        "the policy moved off the reference"
    );
}
