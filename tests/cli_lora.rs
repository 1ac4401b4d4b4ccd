//! `oxalign merge-lora`: PEFT's own adapter (the committed fixture of
//! `tools/peft_parity.py`) merged into its base gives a plain HF folder computing PEFT's
//! log-probs; the base defaults to the one the adapter records; bad input exits 2.

mod cli_support;

use candle_core::{Device, Tensor};
use cli_support::{ok, oxalign};
use oxalign_models::CausalLm;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tests/fixtures/lora_llama_tiny")
}

#[test]
fn a_peft_adapter_merges_into_a_plain_folder_with_peft_logprobs() {
    let out = tempfile::tempdir().unwrap();
    let merged = out.path().join("merged");
    // Run in the fixture folder: the adapter records its base as the relative "base".
    let text = ok(
        &fixture(),
        &[
            "merge-lora",
            "--adapter",
            "adapter",
            "--out",
            merged.to_str().unwrap(),
        ],
    );
    assert!(text.contains("merged 28 adapters"), "{text}");
    assert!(
        !merged.join("adapter").exists(),
        "a merged folder carries no adapter"
    );
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("golden.json")).unwrap())
            .unwrap();
    let model = CausalLm::load(&merged, &Device::Cpu).unwrap();
    let rows: Vec<Vec<u32>> = serde_json::from_value(golden["rows"].clone()).unwrap();
    for (i, row) in rows.iter().enumerate() {
        let x = Tensor::new(&row[..row.len() - 1], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let y = Tensor::new(&row[1..], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let lp = oxalign_models::nn::layers::token_logprobs(&model.forward(&x, None).unwrap(), &y);
        let got: Vec<f32> = lp.unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<f64> = serde_json::from_value(golden["logprobs"][i].clone()).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-4, "row {i}: {g} vs PEFT {w}");
        }
    }
}

#[test]
fn merge_lora_refuses_bad_input_with_exit_2() {
    let out = tempfile::tempdir().unwrap();
    let adapter = fixture().join("adapter");
    let base = fixture().join("base");
    let dst = out.path().to_str().unwrap();
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec![
                "merge-lora",
                "--adapter",
                base.to_str().unwrap(),
                "--out",
                dst,
            ],
            "no adapter_config.json",
        ),
        (
            vec![
                "merge-lora",
                "--adapter",
                adapter.to_str().unwrap(),
                "--base",
                "nowhere",
                "--out",
                dst,
            ],
            "nowhere",
        ),
        (
            vec![
                "merge-lora",
                "--adapter",
                adapter.to_str().unwrap(),
                "--base",
                base.to_str().unwrap(),
                "--out",
                base.to_str().unwrap(),
            ],
            "--force",
        ),
    ];
    for (args, want) in cases {
        let o = oxalign(out.path(), &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(want) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}
