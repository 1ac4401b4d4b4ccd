//! config.json through serde: type errors name the file and the key, defaults and the
//! families' own keys, and the round trip through `to_hf_json`.

use oxalign_models::{Family, ModelConfig, ModelError};
use std::path::Path;

const BASE: &str = r#"{"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4"#;

fn parse(extra: &str) -> Result<ModelConfig, ModelError> {
    let text = format!("{BASE}{extra}}}");
    ModelConfig::from_json_str(&text, Path::new("dir/config.json"))
}

fn bad_key(extra: &str) -> (String, String) {
    match parse(extra) {
        Err(e @ ModelError::InvalidConfig { .. }) => {
            let msg = e.to_string();
            let ModelError::InvalidConfig { key, .. } = e else {
                unreachable!()
            };
            (key, msg)
        }
        other => panic!("expected InvalidConfig for {extra}, got {other:?}"),
    }
}

#[test]
fn wrong_types_name_the_key_and_the_file() {
    for (extra, key) in [
        (r#", "num_key_value_heads": -2"#, "num_key_value_heads"),
        (r#", "rms_norm_eps": "small""#, "rms_norm_eps"),
        (r#", "tie_word_embeddings": 1"#, "tie_word_embeddings"),
        (r#", "eos_token_id": "x""#, "eos_token_id"),
        (r#", "eos_token_id": [1, 5000000000]"#, "eos_token_id[1]"),
        (r#", "bos_token_id": 1.5"#, "bos_token_id"),
        (
            r#", "rope_scaling": {"rope_type": "linear", "factor": "2"}"#,
            "rope_scaling.factor",
        ),
        (r#", "rope_scaling": 3"#, "rope_scaling"),
        (
            r#", "layer_types": ["full_attention", 3, "x", "y"]"#,
            "layer_types[1]",
        ),
    ] {
        let (got, msg) = bad_key(extra);
        assert_eq!(got, key, "{msg}");
        assert!(msg.contains("dir/config.json"), "{msg}");
    }
    let (key, msg) = bad_key(r#", "rope_scaling": {"rope_type": "linear"}"#);
    assert_eq!(key, "rope_scaling.factor", "{msg}");
    assert!(msg.contains("required"), "{msg}");
    let (key, _) = bad_key(r#", "layer_types": ["full_attention"]"#);
    assert_eq!(key, "layer_types");
    let e = ModelConfig::from_json_str(
        r#"{"model_type": "llama", "hidden_size": 32}"#,
        Path::new("c.json"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("num_attention_heads"), "{e}");
}

#[test]
fn defaults_nulls_and_family_keys() {
    let c = parse(r#", "head_dim": null, "rope_theta": null, "eos_token_id": null"#).unwrap();
    assert_eq!(
        (c.head_dim, c.rope_theta, c.rms_norm_eps),
        (8, 10000.0, 1e-6)
    );
    assert_eq!(c.max_position_embeddings, 2048);
    assert!(c.eos_token_id.is_empty() && !c.tie_word_embeddings);
    // qwen2: the window only with use_sliding_window; max_window_layers defaults to 28.
    let c = parse(r#", "use_sliding_window": true, "sliding_window": 16"#).unwrap();
    assert_eq!((c.sliding_window, c.max_window_layers), (Some(16), 28));
    let c = parse(r#", "sliding_window": 16, "attention_bias": true"#).unwrap();
    assert_eq!(c.sliding_window, None);
    assert!(!c.attention_bias && c.qkv_bias() && !c.o_bias());
    // layer_types sets where the window starts.
    let c = parse(
        r#", "sliding_window": 16, "layer_types": ["full_attention", "full_attention",
        "sliding_attention", "sliding_attention"]"#,
    )
    .unwrap();
    assert_eq!((c.layer_window(1), c.layer_window(2)), (None, Some(16)));
    let (key, msg) = bad_key(
        r#", "layer_types": ["sliding_attention", "full_attention", "full_attention",
        "full_attention"]"#,
    );
    assert!(key == "layer_types" && msg.contains("interleaved"), "{msg}");
    // Llama keeps its bias keys; unknown keys survive the round trip.
    let llama = BASE.replace("qwen2", "llama");
    let text = format!("{llama}, \"attention_bias\": true, \"my_key\": [1, null]}}");
    let c = ModelConfig::from_json_str(&text, Path::new("c.json")).unwrap();
    assert_eq!(c.family, Family::Llama);
    assert!(c.qkv_bias() && c.o_bias() && !c.mlp_bias());
    assert_eq!(c.extra.get("my_key"), Some(&serde_json::json!([1, null])));
    assert!(!c.extra.contains_key("attention_bias"));
    let again =
        ModelConfig::from_json_value(&c.to_hf_json("LlamaForCausalLM"), Path::new("c")).unwrap();
    assert_eq!(again, c);
}

const GEMMA2: &str = r#"{"model_type": "gemma2", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 8"#;

fn gemma2(extra: &str) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json_str(&format!("{GEMMA2}{extra}}}"), Path::new("g/config.json"))
}

/// Gemma 2 without its own keys takes HF's defaults (soft-caps 50 and 30, every other layer
/// sliding over 4096, `query_pre_attn_scalar` 256, tied embeddings); `null` soft-caps mean
/// none; what it cannot compute is refused naming the key; the keys survive the round trip.
#[test]
fn gemma_keys_default_as_hf_and_round_trip() {
    let c = gemma2("").unwrap();
    assert_eq!(c.style.attn_softcap, Some(50.0));
    assert_eq!(c.style.final_softcap, Some(30.0));
    assert_eq!(c.style.query_pre_attn_scalar, Some(256.0));
    assert!(c.tie_word_embeddings);
    let windows: Vec<_> = (0..4).map(|i| c.layer_window(i)).collect();
    assert_eq!(windows, [Some(4096), None, Some(4096), None]);
    let none = gemma2(r#", "attn_logit_softcapping": null, "final_logit_softcapping": null"#);
    let none = none.unwrap();
    assert_eq!(
        (none.style.attn_softcap, none.style.final_softcap),
        (None, None)
    );
    for (extra, key) in [
        (r#", "hidden_activation": "relu""#, "hidden_activation"),
        (
            r#", "final_logit_softcapping": -1.0"#,
            "final_logit_softcapping",
        ),
        (r#", "layer_types": ["full_attention"]"#, "layer_types"),
        (
            r#", "use_bidirectional_attention": true"#,
            "use_bidirectional_attention",
        ),
    ] {
        match gemma2(extra) {
            Err(ModelError::InvalidConfig { key: got, .. }) => assert_eq!(got, key, "{extra}"),
            other => panic!("{extra}: expected a refusal naming {key}, got {other:?}"),
        }
    }
    // Saved, the pattern is written out as `layer_types`; read back, it is the same model.
    let text = serde_json::to_string(&c.to_hf_json("Gemma2ForCausalLM")).unwrap();
    let back = ModelConfig::from_json_str(&text, Path::new("g/config.json")).unwrap();
    let back_windows: Vec<_> = (0..4).map(|i| back.layer_window(i)).collect();
    assert_eq!(back_windows, windows);
    assert_eq!(
        ModelConfig {
            sliding_layers: c.sliding_layers.clone(),
            ..back
        },
        c
    );
    assert_eq!(
        Family::Gemma3.architecture("ForSequenceClassification"),
        "Gemma3TextForSequenceClassification"
    );
    // A multimodal Gemma 3 config is read through its `text_config`, the top level's tie
    // carried in; without one it is refused naming the key.
    let mm = r#"{"model_type": "gemma3", "tie_word_embeddings": false, "text_config": {
        "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8}}"#;
    let c = ModelConfig::from_json_str(mm, Path::new("m/config.json")).unwrap();
    assert_eq!(c.family, Family::Gemma3);
    assert!(!c.tie_word_embeddings);
    match ModelConfig::from_json_str(r#"{"model_type": "gemma3"}"#, Path::new("m/config.json")) {
        Err(ModelError::InvalidConfig { key, .. }) => assert_eq!(key, "text_config"),
        other => panic!("expected a refusal naming text_config, got {other:?}"),
    }
}
