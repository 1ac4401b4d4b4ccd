//! The data-file pipeline from a fresh folder, with the recipes in configs/: `oxalign data
//! arithmetic`, then SFT (held-out loss falls), a Bradley–Terry reward model on the SFT model
//! (held-out pairwise accuracy rises well above 0.5, saved as an HF
//! `*ForSequenceClassification` folder), DPO (held-out margin and accuracy rise) and PPO
//! against that reward model with the critic initialised from it; the reward model and DPO
//! with LoRA adapters on the SFT model. Also: malformed rows are named or skipped and
//! counted. Seeded; about a minute on 2 cores.

mod cli_support;
use cli_support::{ok, oxalign};
use serde_json::Value;
use std::path::Path;

fn config(name: &str) -> String {
    format!("{}/configs/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn summary(dir: &Path, run: &str) -> Value {
    let p = dir.join("runs").join(run).join("summary.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn eval(s: &Value, when: &str, key: &str) -> f64 {
    s["offline"][when][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{when}.{key} in {s}"))
}

#[test]
fn sft_then_reward_model_then_dpo_and_ppo_against_the_reward_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(dir, &["data", "arithmetic", "--out", "data/arithmetic"]);

    ok(dir, &["train", &config("sft.toml"), "--quiet"]);
    let s = summary(dir, "sft");
    let (first, last) = (
        eval(&s, "eval_first", "eval_loss"),
        eval(&s, "eval_last", "eval_loss"),
    );
    eprintln!("SFT held-out loss {first:.4} -> {last:.4}");
    assert!(
        last < 0.3 * first,
        "held-out loss did not fall: {first} -> {last}"
    );
    assert!(dir.join("runs/sft/final/checksums.json").is_file());

    ok(dir, &["train", &config("rm.toml"), "--quiet"]);
    let s = summary(dir, "rm");
    let (a0, a1) = (
        eval(&s, "eval_first", "eval_accuracy"),
        eval(&s, "eval_last", "eval_accuracy"),
    );
    eprintln!("RM held-out pairwise accuracy {a0:.3} -> {a1:.3}");
    assert!(a1 >= 0.65 && a1 > a0 + 0.1, "RM accuracy {a0} -> {a1}");
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("runs/rm/final/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["architectures"][0], "LlamaForSequenceClassification");
    for f in ["model.safetensors", "tokenizer.json", "checksums.json"] {
        assert!(dir.join("runs/rm/final").join(f).is_file(), "{f}");
    }

    ok(dir, &["train", &config("dpo.toml"), "--quiet"]);
    let s = summary(dir, "dpo");
    let ((m0, m1), (a0, a1)) = margin_and_accuracy(&s);
    eprintln!("DPO held-out margin {m0:.4} -> {m1:.4}, accuracy {a0:.3} -> {a1:.3}");
    assert!(
        m1 > m0 + 0.1 && a1 > a0,
        "DPO margin {m0} -> {m1}, accuracy {a0} -> {a1}"
    );
    let dpo = config("dpo.toml");
    for loss in [
        &["--set", "dpo.loss=\"ipo\""][..],
        &["--set", "dpo.label_smoothing=0.1"],
    ] {
        let mut args = vec!["train", &dpo, "--quiet", "--set", "dpo.steps=3"];
        args.extend_from_slice(loss);
        args.extend_from_slice(&["--set", "run.name=\"dpo-variant\"", "--overwrite"]);
        ok(dir, &args);
    }
    // Without --overwrite the finished variant (whose final/ a next stage may read) stays.
    let rerun = [
        "train",
        &dpo,
        "--quiet",
        "--set",
        "run.name=\"dpo-variant\"",
    ];
    let out = oxalign(dir, &rerun);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("finished run") && err.contains("--overwrite"),
        "{err}"
    );
    assert!(dir
        .join("runs/dpo-variant/final/model.safetensors")
        .is_file());

    // DPO scores policy and reference under the model's own distribution: at the first step
    // they are the same model, so the implicit reward margin is 0 and the loss is ln 2. The
    // rollout sampling of `[rl]` is not DPO's: setting it in a DPO recipe is refused.
    let line = std::fs::read_to_string(dir.join("runs/dpo/metrics.jsonl")).unwrap();
    let first: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let (margin, loss) = (
        first["margin"].as_f64().unwrap(),
        first["loss"].as_f64().unwrap(),
    );
    assert!(
        margin.abs() < 1e-6 && (loss - std::f64::consts::LN_2).abs() < 1e-5,
        "DPO starts with margin {margin}, loss {loss}: policy and reference disagree"
    );
    let tempered = ["train", &dpo, "--check", "--set", "rl.temperature=0.7"];
    let out = oxalign(dir, &tempered);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("key `rl.temperature`")
            && err.contains("run.kind = \"dpo\" does not read [rl]"),
        "{err}"
    );

    // The critic starts from the reward model (score.weight, no bias).
    ok(dir, &["train", &config("ppo-rm.toml"), "--check"]);
    ok(dir, &["train", &config("ppo-rm.toml"), "--quiet"]);
    let text = std::fs::read_to_string(dir.join("runs/ppo-rm/metrics.jsonl")).unwrap();
    let m: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(m.len(), 40);
    let mean = |rows: &[Value], k: &str| {
        rows.iter().map(|r| r[k].as_f64().unwrap()).sum::<f64>() / rows.len() as f64
    };
    let (r0, r1) = (mean(&m[..10], "reward_mean"), mean(&m[30..], "reward_mean"));
    let kl_max = m
        .iter()
        .map(|r| r["kl"].as_f64().unwrap())
        .fold(0.0, f64::max);
    eprintln!(
        "PPO-RM reward-model score (mean of 10 steps) {r0:.3} -> {r1:.3}, max KL {kl_max:.3}"
    );
    assert!(r1 > r0 + 0.3, "RM score did not rise: {r0} -> {r1}");
    assert!(kl_max < 1.0, "KL {kl_max} nats (mean per response token)");
}

#[test]
fn a_causal_lm_as_reward_model_is_refused_by_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(
        dir,
        &[
            "init-model",
            "--family",
            "llama",
            "--preset",
            "tiny",
            "--out",
            "lm",
        ],
    );
    std::fs::write(
        dir.join("p.jsonl"),
        "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n",
    )
    .unwrap();
    let recipe = "[model]\npath = \"lm\"\nreward_path = \"lm\"\n[data]\ntask = \"file\"\npath = \"p.jsonl\"\n[reward]\nkind = \"model\"\n";
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    let out = oxalign(dir, &["train", "r.toml", "--check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("model.reward_path") && err.contains("ForSequenceClassification"),
        "{err}"
    );
}

#[test]
fn a_malformed_row_is_named_or_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows = "{\"prompt\": \"1+1=\", \"response\": \"2\"}\n{\"prompt\": \"2+2=\"}\n{\"prompt\": \"3+3=\", \"response\": \"6\"}\n";
    std::fs::write(dir.join("sft.jsonl"), rows).unwrap();
    let recipe = "[run]\nkind = \"sft\"\n[data]\ntask = \"file\"\npath = \"sft.jsonl\"\n[sft]\nsteps = 2\nbatch_size = 2\n";
    std::fs::write(dir.join("r.toml"), recipe).unwrap();
    let out = oxalign(dir, &["train", "r.toml", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sft.jsonl: line 2") && err.contains("response"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let text = ok(
        dir,
        &[
            "train",
            "r.toml",
            "--quiet",
            "--set",
            "data.on_bad_row=\"skip\"",
        ],
    );
    assert!(text.contains("skipped 1 malformed row"), "{text}");
    assert_eq!(summary(dir, "run")["offline"]["data"]["skipped"], 1);
}

/// The tensors of `dir/model.safetensors`.
fn tensors(dir: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
        .unwrap()
}

fn same(a: &candle_core::Tensor, b: &candle_core::Tensor) -> bool {
    a.eq(b)
        .unwrap()
        .min_all()
        .unwrap()
        .to_scalar::<u8>()
        .unwrap()
        == 1
}

/// Issue 30: with `[lora]` the reward model and DPO stages train adapters on the SFT model
/// and still learn with `lora_dropout = 0.1` (held-out pairwise accuracy; DPO's margin and
/// accuracy), the base stays
/// the SFT model's bits (embeddings), the reward model's `score` head is trained whole and
/// saved in its PEFT file (`SEQ_CLS`), and `oxalign merge-lora` of the DPO adapter gives
/// exactly the merged folder the run wrote.
#[test]
fn lora_reward_model_and_dpo_learn_on_the_frozen_sft_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(dir, &["data", "arithmetic", "--out", "data/arithmetic"]);
    ok(dir, &["train", &config("sft.toml"), "--quiet"]);
    let lora = ["--set", "lora.r=8", "--set", "lora.dropout=0.1", "--quiet"];
    ok(dir, &[&["train", &config("rm.toml")][..], &lora].concat());
    let s = summary(dir, "rm");
    let (a0, a1) = (
        eval(&s, "eval_first", "eval_accuracy"),
        eval(&s, "eval_last", "eval_accuracy"),
    );
    assert!(a1 >= 0.6 && a1 > a0 + 0.1, "LoRA RM accuracy {a0} -> {a1}");
    let adapter = dir.join("runs/rm/final/adapter");
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["task_type"], "SEQ_CLS");
    let saved = candle_core::safetensors::load(
        adapter.join("adapter_model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert!(saved.contains_key("base_model.model.score.weight"));
    let (sft, rm) = (
        tensors(&dir.join("runs/sft/final")),
        tensors(&dir.join("runs/rm/final")),
    );
    let embed = "model.embed_tokens.weight";
    assert!(
        same(&sft[embed], &rm[embed]),
        "the reward model's base moved"
    );

    ok(dir, &[&["train", &config("dpo.toml")][..], &lora].concat());
    let s = summary(dir, "dpo");
    let ((m0, m1), (a0, a1)) = margin_and_accuracy(&s);
    assert!(
        m1 > m0 + 0.1 && a1 > a0,
        "LoRA DPO margin {m0} -> {m1}, accuracy {a0} -> {a1}"
    );
    ok(
        dir,
        &[
            "merge-lora",
            "--adapter",
            "runs/dpo/final/adapter",
            "--out",
            "merged",
        ],
    );
    let (run, merged) = (
        tensors(&dir.join("runs/dpo/final")),
        tensors(&dir.join("merged")),
    );
    assert_eq!(run.len(), merged.len());
    for (name, t) in &run {
        assert!(
            same(t, &merged[name]),
            "{name}: merge-lora differs from the run's merge"
        );
    }
}

/// A DPO or reward-model summary's held-out `(first, last)` margin and accuracy.
fn margin_and_accuracy(s: &Value) -> ((f64, f64), (f64, f64)) {
    let first_last = |k: &str| (eval(s, "eval_first", k), eval(s, "eval_last", k));
    (first_last("eval_margin"), first_last("eval_accuracy"))
}
