//! `oxalign bench train`, `matmul` and `rl-step` on a tiny random model: each prints one
//! JSON line whose measurements are positive and finite. No timing thresholds are asserted.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `oxalign`, asserts success and returns stdout.
fn ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(args)
        .output()
        .expect("the oxalign binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "oxalign {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// The single JSON line of a bench's stdout.
fn one_json_line(stdout: &str) -> Value {
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one JSON line, got: {stdout}");
    serde_json::from_str(lines[0]).expect("the line is JSON")
}

fn positive(v: &Value, path: &str) -> f64 {
    let x = v
        .pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing or not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{path} = {x} in {v}");
    x
}

fn tiny_model(dir: &Path) -> String {
    let out = dir.join("tiny");
    let out_s = out.to_str().expect("temp path is UTF-8").to_string();
    ok(&[
        "init-model",
        "--family",
        "llama",
        "--preset",
        "tiny",
        "--out",
        &out_s,
    ]);
    out_s
}

#[test]
fn bench_train_prints_one_line_of_positive_measurements() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let v = one_json_line(&ok(&[
        "bench",
        "train",
        "--model",
        &model,
        "--batch",
        "2",
        "--seq",
        "16",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--peak-gflops",
        "100",
    ]));
    assert_eq!(v["bench"], "train");
    assert_eq!(v["batch"], 2);
    assert_eq!(v["seq"], 16);
    assert_eq!(v["tokens_per_step"], 32);
    for p in [
        "/tokens_per_sec",
        "/step_seconds/median",
        "/step_seconds/min",
        "/step_seconds/max",
        "/forward_seconds/median",
        "/backward_seconds/median",
        "/optimizer_seconds/median",
        "/peak_rss_bytes",
        "/params",
        "/matmul_params",
        "/threads",
        "/flops_per_step",
        "/achieved_gflops",
        "/mfu",
        "/loss_first",
    ] {
        positive(&v, p);
    }
    assert_eq!(v["peak_gflops"], 100.0);
    assert_eq!(v["peak_source"], "given");
    // With one step, min, median and max are the same measurement.
    assert_eq!(v["step_seconds"]["min"], v["step_seconds"]["max"]);
    // The loss of a random model on uniform tokens is about ln(vocab).
    let vocab = positive(&v, "/vocab");
    let loss = positive(&v, "/loss_first");
    assert!(
        (loss - vocab.ln()).abs() < 1.5,
        "loss {loss}, ln V {}",
        vocab.ln()
    );
    let params = positive(&v, "/params");
    assert!(positive(&v, "/matmul_params") <= params);
}

/// Variable lengths, padded and packed: the same sequences (same real tokens and first loss,
/// to f32 rounding), on fewer rows when packed.
#[test]
fn bench_train_runs_variable_lengths_padded_and_packed() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "train",
            "--model",
            &model,
            "--batch",
            "6",
            "--seq",
            "16",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--peak-gflops",
            "100",
            "--lengths",
            "uniform",
        ];
        args.extend_from_slice(extra);
        one_json_line(&ok(&args))
    };
    let (padded, packed) = (run(&[]), run(&["--packing"]));
    assert_eq!(padded["packing"], false);
    assert_eq!(packed["packing"], true);
    assert_eq!(packed["lengths"], "uniform");
    assert_eq!(padded["tokens_per_step"], packed["tokens_per_step"]);
    assert!(
        positive(&padded, "/tokens_per_step") < 6.0 * 16.0,
        "{padded}"
    );
    assert_eq!(padded["rows"], 6);
    assert!(positive(&packed, "/rows") < 6.0, "{packed}");
    let (a, b) = (
        positive(&padded, "/loss_first"),
        positive(&packed, "/loss_first"),
    );
    assert!((a - b).abs() <= 1e-5 * a, "padded loss {a} vs packed {b}");
}

#[test]
fn bench_matmul_prints_positive_gflops() {
    let v = one_json_line(&ok(&["bench", "matmul", "--size", "64", "--reps", "3"]));
    assert_eq!(v["bench"], "matmul");
    let median = positive(&v, "/gflops_median");
    let min = positive(&v, "/gflops_min");
    let max = positive(&v, "/gflops_max");
    assert!(min <= median && median <= max, "{v}");
}

#[test]
fn bench_train_rejects_a_missing_model_folder() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxalign"))
        .args(["bench", "train", "--model", "/nonexistent/oxalign-model"])
        .output()
        .expect("the oxalign binary runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/oxalign-model"), "{stderr}");
}

#[test]
fn bench_rl_step_times_every_phase_of_real_grpo_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let prompts = dir.path().join("prompts.jsonl");
    let lines: String = (0..8)
        .map(|i| format!("{{\"prompt\": \"{i}+1=\", \"answer\": \"{}\"}}\n", i + 1))
        .collect();
    std::fs::write(&prompts, lines).unwrap();
    let v = one_json_line(&ok(&[
        "bench",
        "rl-step",
        "--model",
        &model,
        "--prompts",
        prompts.to_str().unwrap(),
        "--prompts-per-step",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "4",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]));
    assert_eq!(v["bench"], "rl-step");
    assert_eq!(v["steps"], 2, "two timed steps after the warm-up: {v}");
    for phase in ["step", "generate", "score", "train", "refit"] {
        positive(&v, &format!("/{phase}_seconds/median"));
    }
    let step = positive(&v, "/step_seconds/median");
    let parts: f64 = ["generate", "score", "train", "refit"]
        .iter()
        .map(|p| v[format!("{p}_seconds")]["median"].as_f64().unwrap())
        .sum();
    assert!(
        parts <= step * 1.5,
        "phases {parts} s exceed the step {step} s: {v}"
    );
    let tokens = positive(&v, "/completion_tokens/median");
    assert!(
        tokens <= 2.0 * 2.0 * 4.0,
        "at most 16 completion tokens per step: {v}"
    );
}
