//! Parity with HF transformers on the committed fixtures written by `tools/hf_parity.py`:
//! per-token log-probs (alone and left-padded) within 1e-4, identical 16-token greedy
//! continuations, reward scores within 1e-4. An ignored test also round-trips oxalign-saved
//! models through transformers (needs python3 with torch + transformers).

mod common;

use candle_core::{Device, Tensor};
use common::{batch, batch1};
use oxalign_models::{CausalLm, GenerationRequest, RewardModel, SamplingParams, ValueModel};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden(dir: &Path, file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
}

fn u32_rows(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// A JSON array of token ids.
fn u32_list(v: &Value) -> Vec<u32> {
    let items = v.as_array().unwrap().iter();
    items.map(|x| x.as_u64().unwrap() as u32).collect()
}

fn f64_rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn logprobs_of(m: &CausalLm, ids: &Tensor, mask: Option<&Tensor>) -> Vec<Vec<f32>> {
    m.next_token_logprobs(ids, mask)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

fn greedy(m: &CausalLm, prompt: &[u32], n: usize) -> Vec<u32> {
    let req = GenerationRequest {
        prompt: prompt.to_vec(),
        max_new_tokens: n,
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![],
        ignore_eos: true,
    };
    m.generate(&[req]).unwrap().remove(0).tokens
}

/// Each of `g["sequences"]`, scored alone by `rm`, within 1e-4 of `g["scores"]`.
fn assert_scores(rm: &RewardModel, g: &Value, what: &str) {
    let rows = u32_rows(&g["sequences"]);
    for (row, expect) in rows.iter().zip(g["scores"].as_array().unwrap()) {
        let got = rm
            .forward(&batch1(row), None)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0];
        let expect = expect.as_f64().unwrap();
        assert!(
            (got as f64 - expect).abs() <= 1e-4,
            "{what} {got} vs {expect}"
        );
    }
}

fn check_causal_fixture(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir, "golden.json");
    let m = CausalLm::load(&dir, &Device::Cpu).unwrap();
    let mut worst = 0f64;
    for (row, expect) in u32_rows(&g["sequences"])
        .iter()
        .zip(f64_rows(&g["logprobs"]))
    {
        let got = &logprobs_of(&m, &batch1(row), None)[0];
        for (a, b) in got.iter().zip(&expect) {
            worst = worst.max((*a as f64 - b).abs());
        }
    }
    println!("{name}: unpadded log-prob max abs diff vs transformers {worst:.2e}");
    assert!(
        worst <= 1e-4,
        "{name}: unpadded log-prob max abs diff {worst}"
    );

    let ids = batch(&u32_rows(&g["padded_ids"]));
    let mask_rows = u32_rows(&g["padded_mask"]);
    let mask = batch(&mask_rows);
    let got = logprobs_of(&m, &ids, Some(&mask));
    let mut worst = 0f64;
    for ((got, expect), mrow) in got
        .iter()
        .zip(f64_rows(&g["padded_logprobs"]))
        .zip(&mask_rows)
    {
        for t in 0..got.len() {
            if mrow[t] == 1 {
                worst = worst.max((got[t] as f64 - expect[t]).abs());
            }
        }
    }
    println!("{name}: left-padded log-prob max abs diff vs transformers {worst:.2e}");
    assert!(
        worst <= 1e-4,
        "{name}: left-padded log-prob max abs diff {worst}"
    );

    let prompt = u32_list(&g["greedy_prompt"]);
    let expect = u32_list(&g["greedy_tokens"]);
    assert_eq!(expect.len(), 16);
    assert_eq!(
        greedy(&m, &prompt, 16),
        expect,
        "{name}: greedy continuation"
    );
}

#[test]
fn llama_with_llama3_rope_and_bias_matches_transformers() {
    check_causal_fixture("llama_tiny");
}

#[test]
fn qwen2_with_tied_embeddings_matches_transformers() {
    check_causal_fixture("qwen2_tiny");
}

/// Dense Qwen3: per-head q/k RMSNorm before RoPE and a `head_dim` (32) that is not
/// `hidden_size / num_attention_heads` (16), tied embeddings, rope_parameters of transformers 5.
#[test]
fn qwen3_with_qk_norm_and_its_own_head_dim_matches_transformers() {
    check_causal_fixture("qwen3_tiny");
}

#[test]
fn phi3_with_fused_projections_and_a_sliding_window_matches_transformers() {
    check_causal_fixture("phi3_tiny");
}

/// Gemma 3's text decoder: `(1 + w)` norms, four norms per layer, q/k norms, GeGLU, a
/// scaled embedding, `query_pre_attn_scalar` 24 against a `head_dim` of 32, sliding layers
/// (window 5) around a full one, their own RoPE base, and linear RoPE scaling on the full
/// layer (`rope_parameters` per layer type, transformers 5).
#[test]
fn gemma3_with_its_block_and_interleaved_sliding_layers_matches_transformers() {
    check_causal_fixture("gemma3_tiny");
}

/// Gemma 2: Gemma's block with soft-capped attention scores (2.0) and final logits (3.0),
/// every other layer sliding (window 5), `query_pre_attn_scalar` 20 against a `head_dim`
/// of 16.
#[test]
fn gemma2_with_soft_capped_scores_and_logits_matches_transformers() {
    check_causal_fixture("gemma2_tiny");
}

/// A multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`, `model_type: "gemma3"`,
/// decoder under `language_model.`, a vision tower): its text decoder loads, and scores text
/// as the multimodal model does.
#[test]
fn the_text_decoder_of_a_multimodal_gemma3_matches_transformers() {
    check_causal_fixture("gemma3_mm_tiny");
    let m = CausalLm::load(&fixture("gemma3_mm_tiny"), &Device::Cpu).unwrap();
    assert_eq!(m.config().family, oxalign_models::Family::Gemma3);
    let out = tempfile::tempdir().unwrap();
    m.save(out.path()).unwrap();
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["architectures"][0], "Gemma3ForCausalLM");
    assert_eq!(saved["model_type"], "gemma3_text");
}

/// A Phi-3 model saves its projections fused again (`qkv_proj`, `gate_up_proj`, what
/// `Phi3ForCausalLM` reads), bit for bit the fixture's tensors, and loads back equal.
#[test]
fn phi3_saves_the_fused_projections_it_loaded() {
    let dir = fixture("phi3_tiny");
    let m = CausalLm::load(&dir, &Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    m.save(out.path()).unwrap();
    let read = |d: &Path| {
        candle_core::safetensors::load(d.join("model.safetensors"), &Device::Cpu).unwrap()
    };
    let (saved, original) = (read(out.path()), read(&dir));
    let mut names: Vec<&String> = saved.keys().collect();
    names.sort();
    let mut want: Vec<&String> = original.keys().collect();
    want.sort();
    assert_eq!(
        names, want,
        "the fixture's tensor names, fused ones included"
    );
    for (name, t) in &original {
        let diff = (t - &saved[name]).unwrap().abs().unwrap();
        let worst = diff.flatten_all().unwrap().max(0).unwrap();
        assert_eq!(worst.to_scalar::<f32>().unwrap(), 0.0, "{name}");
    }
    let back = CausalLm::load(out.path(), &Device::Cpu).unwrap();
    let row = batch1(&[5, 9, 77, 3, 120]);
    assert_eq!(logprobs_of(&m, &row, None), logprobs_of(&back, &row, None));
}

#[test]
fn mistral_with_sliding_window_matches_transformers() {
    check_causal_fixture("mistral_tiny");
}

#[test]
fn reward_model_matches_transformers() {
    let dir = fixture("llama_rm_tiny");
    let g = golden(&dir, "golden.json");
    let rm = RewardModel::load(&dir, &Device::Cpu).unwrap();
    assert_scores(&rm, &g, "score");
    let ids = batch(&u32_rows(&g["padded_ids"]));
    let mask = batch(&u32_rows(&g["padded_mask"]));
    let got = rm
        .forward(&ids, Some(&mask))
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for (a, b) in got.iter().zip(g["padded_scores"].as_array().unwrap()) {
        let b = b.as_f64().unwrap();
        assert!((*a as f64 - b).abs() <= 1e-4, "padded score {a} vs {b}");
    }
}

/// Saves random oxalign models, loads them in transformers via `tools/hf_parity.py
/// --check-oxalign-dir` and compares. Run with
/// `OXALIGN_PYTHON=/path/to/python cargo test -p oxalign-models --test hf_parity -- --ignored`.
#[test]
#[ignore = "needs python3 with torch + transformers"]
fn oxalign_saved_models_load_in_transformers() {
    use oxalign_models::{Family, ModelConfig, Preset};
    let python = std::env::var("OXALIGN_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/hf_parity.py");
    let root = tempfile::tempdir().unwrap();
    let run = |dir: &Path| -> Value {
        let out = dir.with_extension("golden.json");
        let status = std::process::Command::new(&python)
            .arg(&script)
            .arg("--check-oxalign-dir")
            .arg(dir)
            .arg("--golden")
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "hf_parity.py failed on {}", dir.display());
        golden(
            out.parent().unwrap(),
            out.file_name().unwrap().to_str().unwrap(),
        )
    };
    for family in Family::ALL {
        let mut cfg = ModelConfig::preset(family, Preset::Tiny, 300);
        cfg.bos_token_id = Some(1);
        cfg.eos_token_id = vec![2];
        cfg.pad_token_id = Some(0);
        if family == Family::Llama {
            cfg.rope_scaling = Some(oxalign_models::RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32,
            });
        }
        if matches!(family, Family::Mistral | Family::Phi3) {
            cfg.sliding_window = Some(6);
        }
        // Scale up the 0.02 init so the comparison is not between near-uniform distributions.
        let m = CausalLm::init_random(&cfg, 7, &Device::Cpu).unwrap();
        for (_, v) in m.vars() {
            if v.rank() == 2 {
                v.set(&(v.as_tensor() * 8.0).unwrap()).unwrap();
            }
        }
        let dir = root.path().join(format!("{family}_lm"));
        m.save(&dir).unwrap();
        let g = run(&dir);
        assert_eq!(
            g["num_parameters"].as_u64().unwrap() as usize,
            cfg.num_parameters()
        );
        let mut worst = 0f64;
        for (row, expect) in u32_rows(&g["sequences"])
            .iter()
            .zip(f64_rows(&g["logprobs"]))
        {
            let got = &logprobs_of(&m, &batch1(row), None)[0];
            for (a, b) in got.iter().zip(&expect) {
                worst = worst.max((*a as f64 - b).abs());
            }
        }
        println!(
            "{family}: oxalign-saved causal LM, transformers log-prob max abs diff {worst:.2e}"
        );
        assert!(worst <= 1e-4, "{family}: log-prob max abs diff {worst}");
        let prompt = u32_list(&g["greedy_prompt"]);
        let expect = u32_list(&g["greedy_tokens"]);
        assert_eq!(
            greedy(&m, &prompt, 16),
            expect,
            "{family}: greedy continuation"
        );

        let v = ValueModel::from_backbone(
            cfg.clone(),
            &m.weights().unwrap(),
            3,
            candle_core::DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let (_, bias) = v
            .vars()
            .into_iter()
            .find(|(n, _)| n == "score.bias")
            .unwrap();
        bias.set(&Tensor::new(&[0.25f32], &Device::Cpu).unwrap())
            .unwrap();
        let dir = root.path().join(format!("{family}_critic"));
        v.save(&dir).unwrap();
        // transformers has no token classifier for Gemma 3.
        if family != Family::Gemma3 {
            let g = run(&dir);
            for (row, expect) in u32_rows(&g["sequences"]).iter().zip(f64_rows(&g["values"])) {
                let got = v
                    .forward(&batch1(row), None)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap()
                    .remove(0);
                for (a, b) in got.iter().zip(&expect) {
                    assert!(
                        (*a as f64 - b).abs() <= 1e-4,
                        "{family} critic value {a} vs {b}"
                    );
                }
            }
        }

        let r = RewardModel::from_backbone(
            cfg.clone(),
            &m.weights().unwrap(),
            4,
            candle_core::DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let dir = root.path().join(format!("{family}_rm"));
        r.save(&dir).unwrap();
        let g = run(&dir);
        assert_scores(&r, &g, &format!("{family} reward"));
    }
}

/// A Phi-3 config with partial rotary embeddings (Phi-4-mini's 0.75) or long-context RoPE
/// is refused naming the key, never loaded with the wrong positions.
#[test]
fn phi3_variants_it_cannot_compute_are_refused() {
    let src = fixture("phi3_tiny");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (edit, key) in [
        (
            ("partial_rotary_factor", 0.75.into()),
            "partial_rotary_factor",
        ),
        (("rope_type", "longrope".into()), "rope_type"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            src.join("model.safetensors"),
            dir.path().join("model.safetensors"),
        )
        .unwrap();
        let mut c = config.clone();
        c["rope_parameters"][edit.0] = edit.1;
        std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
        let e = CausalLm::load(dir.path(), &Device::Cpu)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains(key), "{e}");
    }
}
