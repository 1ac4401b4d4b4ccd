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

/// Runs `recipe` (in configs/) as run `name` for `steps` RL steps after `sft` SFT steps, with
/// `extra` overrides, in a fresh folder; returns the folder and the metrics lines.
fn run_moe(
    recipe: &str,
    name: &str,
    steps: usize,
    sft: usize,
    extra: &[&str],
) -> (tempfile::TempDir, Vec<Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let path = format!("{}/configs/{recipe}.toml", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxalign"));
    cmd.args(["train", &path, "--quiet"])
        .args(["--set", &format!("run.name={name}")])
        .args(["--set", &format!("run.steps={steps}")])
        .args(["--set", &format!("sft.steps={sft}")])
        .args(["--set", &format!("run.checkpoint_every={steps}")]);
    for e in extra {
        cmd.args(["--set", e]);
    }
    let out = cmd.current_dir(tmp.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{recipe} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(tmp.path().join(format!("runs/{name}/metrics.jsonl")));
    let m = text
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (tmp, m)
}

/// The MoE recipe with its experts over two CPU devices (configs/moe-grpo-ep2.toml,
/// `placement.expert_parallel = 2`) trains with verified refits, writes whole-model
/// checkpoints with one optimizer state per rank, and follows, step by step, the same seed
/// data-parallel over the same two devices with every expert on each (configs/moe-grpo.toml
/// with `placement.policy = "cpu:0,cpu:1"`): the updates are the same to f32 rounding. Both
/// use dynamic sampling, so the expert-parallel engines also generate the extra rounds
/// together.
#[test]
fn a_moe_policy_with_experts_over_two_devices_trains_like_data_parallel() {
    let dynamic = "rl.dynamic_sampling=true";
    let (ep2_dir, ep2) = run_moe("moe-grpo-ep2", "ep2", 3, 60, &[dynamic]);
    let two_cpus = "placement.policy=\"cpu:0,cpu:1\"";
    let (dp2_dir, dp2) = run_moe("moe-grpo", "dp2", 3, 60, &[two_cpus, dynamic]);
    assert_eq!(ep2.len(), 3);
    let rounds: f64 = ep2
        .iter()
        .map(|m| m["dynamic_rounds"].as_f64().unwrap())
        .sum();
    assert!(rounds > 3.0, "some step drew more than one round: {rounds}");
    for (a, b) in ep2.iter().zip(&dp2) {
        assert_eq!(
            a["dynamic_rounds"], b["dynamic_rounds"],
            "step {}",
            a["step"]
        );
        let mismatch = a["logprob_mismatch_max"].as_f64().unwrap();
        assert!(mismatch < 1e-4, "EP=2 engine vs trainer: {a}");
        assert!(
            a["refit_probe_max_abs_diff"].as_f64().unwrap() < 1e-4,
            "{a}"
        );
        assert!(a["refit_tensors_verified"].as_f64().unwrap() > 0.0, "{a}");
        assert!(a["grad_norm"].as_f64().unwrap() > 0.0, "{a}");
        for key in ["reward_mean", "kl", "grad_norm", "policy_loss"] {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
            eprintln!("step {}: {key} EP=2 {x} DP=2 {y}", a["step"]);
            assert!(
                (x - y).abs() <= 5e-4 * y.abs().max(1e-2),
                "step {}: {key} EP=2 {x} vs DP=2 {y}",
                a["step"]
            );
        }
    }
    let policy = |dir: &tempfile::TempDir, run: &str| {
        let c = dir.path().join(format!("runs/{run}/checkpoints"));
        let step = std::fs::read_dir(&c).unwrap().flatten().map(|e| e.path());
        let step = step
            .filter(|p| p.to_string_lossy().contains("step_"))
            .max()
            .unwrap();
        step.join("policy")
    };
    let (p2, p1) = (policy(&ep2_dir, "ep2"), policy(&dp2_dir, "dp2"));
    let size = |p: &std::path::Path| {
        std::fs::metadata(p.join("model.safetensors"))
            .unwrap()
            .len()
    };
    assert_eq!(size(&p2), size(&p1), "the checkpoint holds every expert");
    for rank in 0..2 {
        let opt = p2.join(format!(
            "optimizer/expert_rank_{rank}/optimizer.safetensors"
        ));
        assert!(opt.is_file(), "{opt:?}");
    }
}

/// `placement.expert_parallel` is refused with exit 2 when the policy's group does not have
/// that many devices, and for a dense policy.
#[test]
fn expert_parallel_needs_its_devices_and_a_moe_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = format!("{}/configs/moe-grpo.toml", env!("CARGO_MANIFEST_DIR"));
    let grpo = format!("{}/configs/grpo.toml", env!("CARGO_MANIFEST_DIR"));
    for (path, sets, want) in [
        (
            &recipe,
            vec!["placement.expert_parallel=2"],
            "2 CPU devices",
        ),
        (
            &grpo,
            vec![
                "placement.expert_parallel=2",
                "placement.policy=\"cpu:0,cpu:1\"",
            ],
            "mixture-of-experts",
        ),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxalign"));
        cmd.args(["train", path, "--quiet"]).current_dir(tmp.path());
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("placement.expert_parallel") && err.contains(want),
            "{err}"
        );
    }
}
