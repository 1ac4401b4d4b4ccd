//! Numbers checked at the door (issue 27): absurd sizes, out-of-range numbers and bad model
//! configs are refused by the `oxalign` binary with exit code 2 and a message naming the key,
//! before anything is allocated or any run folder is made; never a panic or a wrong answer.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn oxalign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .output()
        .expect("the oxalign binary runs")
}

/// Runs `oxalign`, asserts exit code 2, no panic and every `needle` in stderr.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let out = oxalign(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "oxalign {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}: {stderr}");
    }
    stderr
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tiny llama folder in `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    let out = oxalign(&[
        "init-model",
        "--family",
        "llama",
        "--preset",
        "tiny",
        "--out",
        s(&model),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

/// Sets `key` of `model`'s config.json to `value`.
fn set_config(model: &Path, key: &str, value: serde_json::Value) {
    let path = model.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg[key] = value;
    std::fs::write(&path, cfg.to_string()).unwrap();
}

#[test]
fn generate_refuses_a_max_new_tokens_that_overflows_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"input_ids\": [1, 2, 3]}\n").unwrap();
    let max = u64::MAX.to_string();
    fails(
        &[
            "generate",
            "--model",
            s(&model),
            "--input",
            s(&input),
            "--max-new-tokens",
            &max,
            "--ignore-eos",
        ],
        &[
            "in.jsonl:1",
            &format!("--max-new-tokens {max}"),
            "max_position_embeddings",
        ],
    );
}

#[test]
fn bad_config_numbers_are_refused_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"input_ids\": [1, 2, 3]}\n").unwrap();
    let args = ["logprobs", "--model", s(&model), "--input", s(&input)];
    for (key, value) in [
        ("rms_norm_eps", serde_json::json!(-1e-6)),
        ("rope_theta", serde_json::json!(0.0)),
        ("num_hidden_layers", serde_json::json!(10_000_000)),
    ] {
        let before: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap())
                .unwrap();
        set_config(&model, key, value);
        fails(&args, &[&format!("`{key}`"), "config.json"]);
        set_config(&model, key, before[key].clone());
    }
}

#[test]
fn arithmetic_data_sums_are_exact_and_a_folder_is_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("data");
    let args = [
        "data",
        "arithmetic",
        "--out",
        s(&out),
        "--max-operand",
        "3000000000",
        "--eval-size",
        "5",
        "--train-size",
        "200",
    ];
    let run = oxalign(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let sft = std::fs::read_to_string(out.join("sft.train.jsonl")).unwrap();
    assert_eq!(sft.lines().count(), 200);
    for line in sft.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let (a, b) = row["prompt"]
            .as_str()
            .unwrap()
            .trim_end_matches('=')
            .split_once('+')
            .unwrap();
        let sum = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
        assert_eq!(row["response"].as_str().unwrap(), sum.to_string(), "{line}");
    }
    fails(&args, &[s(&out), "--force"]);
    assert_eq!(
        std::fs::read_to_string(out.join("sft.train.jsonl")).unwrap(),
        sft
    );
    let forced = oxalign(&[&args[..], &["--force"]].concat());
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
}

#[test]
fn check_refuses_non_finite_rates_and_absurd_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.toml");
    std::fs::write(&recipe, "").unwrap();
    for (set, key) in [
        ("rl.kl_coef=nan", "rl.kl_coef"),
        ("rl.kl_coef=-1", "rl.kl_coef"),
        ("rl.critic_lr=-inf", "rl.critic_lr"),
        ("rl.temperature=nan", "rl.temperature"),
        ("reward.correct=1e39", "reward.correct"),
        (
            "supervision.call_timeout_s=1e300",
            "supervision.call_timeout_s",
        ),
        ("engine.kv_memory_mb=1000000000", "engine.kv_memory_mb"),
        ("sft.batch_size=1000000000", "sft.batch_size"),
    ] {
        fails(&["train", s(&recipe), "--check", "--set", set], &[key]);
    }
}

#[test]
fn a_refused_dashboard_leaves_no_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.toml");
    let runs = dir.path().join("runs");
    std::fs::write(
        &recipe,
        format!("[run]\nout_dir = {:?}\nsteps = 1\n", s(&runs)),
    )
    .unwrap();
    fails(
        &["train", s(&recipe), "--dashboard", "0.0.0.0:0"],
        &["--dashboard", "--token"],
    );
    fails(
        &[
            "train",
            s(&recipe),
            "--dashboard",
            "127.0.0.1:0",
            "--token",
            "has space",
        ],
        &["invalid dashboard token"],
    );
    assert!(
        !runs.join("run").exists(),
        "a refused start left {}",
        runs.display()
    );
}

#[test]
fn a_max_new_tokens_past_the_models_context_is_refused_by_check_and_leaves_no_folder() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    set_config(&model, "max_position_embeddings", serde_json::json!(16));
    let recipe = dir.path().join("r.toml");
    let runs = dir.path().join("runs");
    let text = format!(
        "[run]\nout_dir = {:?}\nsteps = 1\n[model]\npath = {:?}\n[rl]\nmax_new_tokens = 100\n",
        s(&runs),
        s(&model)
    );
    std::fs::write(&recipe, text).unwrap();
    fails(
        &["train", s(&recipe), "--check"],
        &["rl.max_new_tokens = 100", "16"],
    );
    fails(&["train", s(&recipe)], &["rl.max_new_tokens"]);
    assert!(
        !runs.join("run").exists(),
        "a refused start left {}",
        runs.display()
    );
}
