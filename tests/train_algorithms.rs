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
