//! Load/save tests: bit-exact round trips for all three model kinds, sharded checkpoints,
//! config.json parsing (HF v4 and v5 spellings) and every load error variant.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{batch, ids, tiny};
use oxalign_models::io::checkpoint::{CONFIG_FILE, INDEX_FILE, WEIGHTS_FILE};
use oxalign_models::io::param_store::write_safetensors;
use oxalign_models::{
    CausalLm, Family, ModelConfig, ModelError, Preset, RewardModel, RopeScaling, ValueModel,
};
use std::collections::HashMap;
use std::path::Path;

fn assert_bit_exact(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) {
    assert_eq!(a.len(), b.len());
    for (name, ta) in a {
        let tb = &b[name];
        assert_eq!(ta.dims(), tb.dims(), "{name}");
        let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let vb = tb.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name} differs"
        );
    }
}

#[test]
fn causal_lm_save_load_round_trip_is_bit_exact() {
    for family in Family::ALL {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny(family);
        let m = CausalLm::init_random(&cfg, 31, &Device::Cpu).unwrap();
        m.save(dir.path()).unwrap();
        assert!(dir.path().join("generation_config.json").is_file());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap())
                .unwrap();
        assert_eq!(json["architectures"][0], family.architecture("ForCausalLM"));
        assert_eq!(json["model_type"], family.model_type());
        assert_eq!(json["torch_dtype"], "float32");
        let back = CausalLm::load(dir.path(), &Device::Cpu).unwrap();
        assert_eq!(back.config(), m.config());
        assert_bit_exact(&m.weights().unwrap(), &back.weights().unwrap());
        let x = batch(&[ids(1, 6, 64)]);
        let (a, b) = (
            m.forward(&x, None).unwrap(),
            back.forward(&x, None).unwrap(),
        );
        assert_eq!(common::max_abs_diff(&a, &b), 0.0);
        // Tied embeddings are saved once, like HF.
        let names: Vec<String> = back.vars().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names.contains(&"lm_head.weight".to_string()),
            !cfg.tie_word_embeddings
        );
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "vars() must be sorted by name");
    }
}

#[test]
fn heads_save_load_round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(Family::Qwen2);
    let v = ValueModel::init_random(&cfg, 32, &Device::Cpu).unwrap();
    v.save(&dir.path().join("critic")).unwrap();
    let v2 = ValueModel::load(&dir.path().join("critic"), &Device::Cpu).unwrap();
    assert_bit_exact(&v.weights().unwrap(), &v2.weights().unwrap());
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("critic").join(CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(json["architectures"][0], "Qwen2ForTokenClassification");
    assert_eq!(json["id2label"].as_object().unwrap().len(), 1);

    let r = RewardModel::init_random(&tiny(Family::Llama), 33, &Device::Cpu).unwrap();
    r.save(&dir.path().join("rm")).unwrap();
    let r2 = RewardModel::load(&dir.path().join("rm"), &Device::Cpu).unwrap();
    assert_bit_exact(&r.weights().unwrap(), &r2.weights().unwrap());

    // A critic can start from a policy checkpoint (new head) and from a reward model.
    let policy = CausalLm::init_random(&cfg, 34, &Device::Cpu).unwrap();
    policy.save(&dir.path().join("policy")).unwrap();
    let critic =
        ValueModel::load_with_new_head(&dir.path().join("policy"), 7, &Device::Cpu).unwrap();
    let pw = policy.weights().unwrap();
    let cw = critic.weights().unwrap();
    let emb = "model.embed_tokens.weight";
    assert_eq!(common::max_abs_diff(&pw[emb], &cw[emb]), 0.0);
    assert!(ValueModel::load(&dir.path().join("policy"), &Device::Cpu).is_err());
    let from_rm = ValueModel::load_with_new_head(&dir.path().join("rm"), 7, &Device::Cpu).unwrap();
    let rw = r.weights().unwrap();
    assert_eq!(
        common::max_abs_diff(
            &rw["score.weight"],
            &from_rm.weights().unwrap()["score.weight"]
        ),
        0.0
    );
}

#[test]
fn load_weights_from_refits_in_place() {
    let cfg = tiny(Family::Llama);
    let a = CausalLm::init_random(&cfg, 35, &Device::Cpu).unwrap();
    let b = CausalLm::init_random(&cfg, 36, &Device::Cpu).unwrap();
    let b_clone = b.clone();
    let x = batch(&[ids(2, 5, 64)]);
    assert!(
        common::max_abs_diff(&a.forward(&x, None).unwrap(), &b.forward(&x, None).unwrap()) > 1e-4
    );
    b.load_weights_from(&a.weights().unwrap()).unwrap();
    assert_eq!(
        common::max_abs_diff(
            &a.forward(&x, None).unwrap(),
            &b_clone.forward(&x, None).unwrap()
        ),
        0.0
    );
    // Refit never aliases: changing `a` afterwards leaves `b` alone.
    let (_, var) = a
        .vars()
        .into_iter()
        .find(|(n, _)| n == "model.norm.weight")
        .unwrap();
    var.set(&(var.as_tensor() * 2.0).unwrap()).unwrap();
    assert!(
        common::max_abs_diff(&a.forward(&x, None).unwrap(), &b.forward(&x, None).unwrap()) > 1e-6
    );
    // deep_clone is independent of later updates.
    let frozen = a.deep_clone().unwrap();
    let before = frozen.forward(&x, None).unwrap();
    let (_, var) = a
        .vars()
        .into_iter()
        .find(|(n, _)| n == "model.embed_tokens.weight")
        .unwrap();
    var.set(&(var.as_tensor() * 3.0).unwrap()).unwrap();
    assert_eq!(
        common::max_abs_diff(&before, &frozen.forward(&x, None).unwrap()),
        0.0
    );
    // Missing tensor -> error naming it, nothing written.
    let mut partial = a.weights().unwrap();
    partial.remove("model.norm.weight");
    match b.load_weights_from(&partial) {
        Err(ModelError::MissingTensor { name, .. }) => assert_eq!(name, "model.norm.weight"),
        other => panic!("expected MissingTensor, got {:?}", other.err()),
    }
}

fn write_sharded(dir: &Path, weights: &HashMap<String, Tensor>) {
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let mut map = serde_json::Map::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(3)).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        let tensors: Vec<(String, Tensor)> = chunk
            .iter()
            .map(|n| ((*n).clone(), weights[*n].clone()))
            .collect();
        write_safetensors(&dir.join(&file), &tensors).unwrap();
        for n in chunk {
            map.insert((*n).clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
}

#[test]
fn sharded_checkpoint_loads() {
    let dir = tempfile::tempdir().unwrap();
    let m = CausalLm::init_random(&tiny(Family::Mistral), 37, &Device::Cpu).unwrap();
    m.save(dir.path()).unwrap();
    std::fs::remove_file(dir.path().join(WEIGHTS_FILE)).unwrap();
    write_sharded(dir.path(), &m.weights().unwrap());
    let back = CausalLm::load(dir.path(), &Device::Cpu).unwrap();
    assert_bit_exact(&m.weights().unwrap(), &back.weights().unwrap());

    // A shard listed in the index but absent is reported by path.
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    match CausalLm::load(dir.path(), &Device::Cpu) {
        Err(ModelError::MissingPath { path, .. }) => {
            assert!(path.ends_with("model-00002-of-00003.safetensors"))
        }
        other => panic!("expected MissingPath, got {:?}", other.err()),
    }
}

#[test]
fn load_errors_name_what_is_wrong() {
    let root = tempfile::tempdir().unwrap();
    let dev = Device::Cpu;

    // Missing folder.
    let missing = root.path().join("nope");
    let e = CausalLm::load(&missing, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::MissingPath { ref path, .. } if path == &missing),
        "{e}"
    );
    assert!(e.to_string().contains("nope"));

    // Folder without config.json.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = CausalLm::load(&empty, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::MissingPath { ref path, .. } if path.ends_with("config.json")),
        "{e}"
    );

    // Good model to corrupt.
    let good = root.path().join("good");
    let m = CausalLm::init_random(&tiny(Family::Llama), 38, &dev).unwrap();
    m.save(&good).unwrap();
    let cfg_text = std::fs::read_to_string(good.join(CONFIG_FILE)).unwrap();

    // No weights.
    let no_w = root.path().join("no_weights");
    std::fs::create_dir(&no_w).unwrap();
    std::fs::write(no_w.join(CONFIG_FILE), &cfg_text).unwrap();
    let e = CausalLm::load(&no_w, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::MissingPath { ref path, .. } if path.ends_with(WEIGHTS_FILE)),
        "{e}"
    );

    // Unknown model_type: names the file and the supported types.
    let gpt = root.path().join("gpt");
    std::fs::create_dir(&gpt).unwrap();
    std::fs::write(
        gpt.join(CONFIG_FILE),
        cfg_text.replace("\"llama\"", "\"gpt2\""),
    )
    .unwrap();
    let e = CausalLm::load(&gpt, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::UnsupportedModelType { ref model_type, .. } if model_type == "gpt2"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("gpt/config.json") && msg.contains("llama, qwen2, qwen3, mistral"),
        "{msg}"
    );

    // Broken JSON.
    let bad = root.path().join("bad_json");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join(CONFIG_FILE), "{ not json").unwrap();
    assert!(matches!(
        CausalLm::load(&bad, &dev),
        Err(ModelError::Json { .. })
    ));

    // Missing tensor.
    let mut w = m.weights().unwrap();
    w.remove("model.layers.1.mlp.up_proj.weight");
    let miss = root.path().join("missing_tensor");
    std::fs::create_dir(&miss).unwrap();
    std::fs::write(miss.join(CONFIG_FILE), &cfg_text).unwrap();
    let list: Vec<(String, Tensor)> = w.into_iter().collect();
    write_safetensors(&miss.join(WEIGHTS_FILE), &list).unwrap();
    let e = CausalLm::load(&miss, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::MissingTensor { ref name, .. } if name == "model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("missing_tensor"));

    // Shape mismatch: config says 3 layers' worth of width the file does not have.
    let shape = root.path().join("shape");
    std::fs::create_dir(&shape).unwrap();
    std::fs::write(
        shape.join(CONFIG_FILE),
        cfg_text.replace("\"intermediate_size\": 48", "\"intermediate_size\": 40"),
    )
    .unwrap();
    std::fs::copy(good.join(WEIGHTS_FILE), shape.join(WEIGHTS_FILE)).unwrap();
    let e = CausalLm::load(&shape, &dev).err().unwrap();
    match &e {
        ModelError::ShapeMismatch {
            name,
            expected,
            found,
            ..
        } => {
            assert!(name.contains("mlp"), "{name}");
            assert!(
                expected.contains(&40) && found.contains(&48),
                "{expected:?} {found:?}"
            );
        }
        other => panic!("expected ShapeMismatch, got {other}"),
    }
    assert!(e.to_string().contains("expected"));

    // Corrupt safetensors.
    let corrupt = root.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join(CONFIG_FILE), &cfg_text).unwrap();
    std::fs::write(corrupt.join(WEIGHTS_FILE), b"garbage").unwrap();
    assert!(matches!(
        CausalLm::load(&corrupt, &dev),
        Err(ModelError::Safetensors { .. })
    ));

    // Reward model from a causal LM folder: score.weight is missing.
    let e = RewardModel::load(&good, &dev).err().unwrap();
    assert!(
        matches!(e, ModelError::MissingTensor { ref name, .. } if name == "score.weight"),
        "{e}"
    );
}

#[test]
fn config_parses_hf_spellings() {
    let p = Path::new("test/config.json");
    // Llama 3 style (v4 spelling) with eos list and llama3 rope scaling.
    let llama = r#"{"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "bos_token_id": 1, "eos_token_id": [2, 3], "tie_word_embeddings": false,
        "initializer_range": 0.02, "hidden_act": "silu", "head_dim": null}"#;
    let c = ModelConfig::from_json_str(llama, p).unwrap();
    assert_eq!(c.family, Family::Llama);
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.eos_token_id, vec![2, 3]);
    assert_eq!(c.pad_token_id, None);
    assert!(matches!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            original_max_position_embeddings: 8192,
            ..
        })
    ));
    assert_eq!(
        c.extra.get("initializer_range"),
        Some(&serde_json::json!(0.02))
    );
    // Round trip through to_hf_json.
    let again = ModelConfig::from_json_value(&c.to_hf_json("LlamaForCausalLM"), p).unwrap();
    assert_eq!(again, c);

    // v5 spelling: rope_parameters; defaults for kv heads.
    let qwen = r#"{"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "use_sliding_window": false, "sliding_window": 4096, "eos_token_id": 7,
        "tie_word_embeddings": true}"#;
    let c = ModelConfig::from_json_str(qwen, p).unwrap();
    assert_eq!(c.num_key_value_heads, 4);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.sliding_window, None);
    assert!(c.qkv_bias() && !c.o_bias());
    assert_eq!(c.eos_token_id, vec![7]);

    let mistral = r#"{"model_type": "mistral", "vocab_size": 100, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "sliding_window": 8}"#;
    let c = ModelConfig::from_json_str(mistral, p).unwrap();
    assert_eq!(c.layer_window(0), Some(8));

    // Bad values name the key.
    let e = ModelConfig::from_json_str(
        &mistral.replace("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3"),
        p,
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, ModelError::InvalidConfig { ref key, .. } if key == "num_key_value_heads"),
        "{e}"
    );
    let e = ModelConfig::from_json_str(&mistral.replace("\"vocab_size\": 100,", ""), p)
        .err()
        .unwrap();
    assert!(e.to_string().contains("vocab_size"), "{e}");
    let e = ModelConfig::from_json_str(&llama.replace("\"llama3\"", "\"yarn\""), p)
        .err()
        .unwrap();
    assert!(e.to_string().contains("yarn"), "{e}");
    let e = ModelConfig::from_json_str(&llama.replace("\"silu\"", "\"gelu\""), p)
        .err()
        .unwrap();
    assert!(
        matches!(e, ModelError::InvalidConfig { ref key, .. } if key == "hidden_act"),
        "{e}"
    );
}

#[test]
fn presets_have_the_documented_sizes() {
    let small = ModelConfig::preset(Family::Llama, Preset::Small, 32000);
    assert_eq!(
        (
            small.vocab_size,
            small.hidden_size,
            small.intermediate_size,
            small.num_hidden_layers
        ),
        (32000, 512, 1408, 8)
    );
    assert_eq!(
        (small.num_attention_heads, small.num_key_value_heads),
        (8, 4)
    );
    let n = small.num_parameters();
    assert!(
        (55_000_000..58_000_000).contains(&n),
        "small llama has {n} parameters"
    );
    let q = ModelConfig::preset(Family::Qwen2, Preset::Small, 32000);
    assert!(q.tie_word_embeddings && q.qkv_bias());
    let tiny = ModelConfig::preset(Family::Llama, Preset::Tiny, 300);
    let n = tiny.num_parameters();
    assert!(
        (500_000..1_500_000).contains(&n),
        "tiny llama has {n} parameters"
    );
    // Seeded init is deterministic and f32.
    let a = CausalLm::init_random(&tiny, 1, &Device::Cpu).unwrap();
    let b = CausalLm::init_random(&tiny, 1, &Device::Cpu).unwrap();
    assert_eq!(a.dtype(), DType::F32);
    assert_bit_exact(&a.weights().unwrap(), &b.weights().unwrap());
    assert_eq!(a.params().num_parameters(), n);
}

#[test]
fn models_can_move_between_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<CausalLm>();
    assert_send_sync::<ValueModel>();
    assert_send_sync::<RewardModel>();
    assert_send_sync::<oxalign_models::KvCache>();
    assert_send_sync::<ModelError>();
    let m = CausalLm::init_random(&tiny(Family::Qwen2), 39, &Device::Cpu).unwrap();
    let x = batch(&[ids(3, 4, 64)]);
    let here = m.forward(&x, None).unwrap();
    let there = std::thread::spawn(move || m.forward(&x, None).unwrap())
        .join()
        .unwrap();
    assert_eq!(common::max_abs_diff(&here, &there), 0.0);
}
