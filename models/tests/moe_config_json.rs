//! The MoE families' config.json keys through serde: HF's defaults, the two spellings of the
//! expert count, which layers are sparse, errors that name the key, and the round trip
//! through `to_hf_json`.

use oxalign_models::config::layout::FeedForwardParams;
use oxalign_models::{Family, ModelConfig, ModelError};
use std::path::Path;

fn parse(model_type: &str, extra: &str) -> Result<ModelConfig, ModelError> {
    let text = format!(
        r#"{{"model_type": "{model_type}", "vocab_size": 100, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4{extra}}}"#
    );
    ModelConfig::from_json_str(&text, Path::new("dir/config.json"))
}

fn bad_key(model_type: &str, extra: &str) -> (String, String) {
    match parse(model_type, extra) {
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
fn moe_defaults_follow_transformers() {
    let q3 = parse("qwen3_moe", "").unwrap();
    let m = q3.moe.as_ref().unwrap();
    assert_eq!(q3.family, Family::Qwen3Moe);
    assert_eq!((m.num_experts, m.num_experts_per_tok), (128, 8));
    assert_eq!(m.moe_intermediate_size, 768);
    assert!(!m.norm_topk_prob && m.shared_expert_intermediate_size.is_none());
    assert_eq!(m.router_aux_loss_coef, 0.001);
    let q2 = parse("qwen2_moe", "").unwrap();
    let m = q2.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok), (60, 4));
    assert_eq!(m.shared_expert_intermediate_size, Some(5632));
    assert!(
        q2.qkv_bias() && !q2.o_bias(),
        "qwen2_moe: q/k/v bias by default"
    );
    let mx = parse("mixtral", "").unwrap();
    let m = mx.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok), (8, 2));
    assert_eq!(
        m.moe_intermediate_size, 64,
        "mixtral experts are intermediate_size wide"
    );
    assert!(m.norm_topk_prob, "mixtral always renormalises");
}

#[test]
fn expert_count_has_two_spellings() {
    let a = parse(
        "qwen3_moe",
        r#", "num_local_experts": 6, "num_experts_per_tok": 2"#,
    )
    .unwrap();
    assert_eq!(a.moe.unwrap().num_experts, 6);
    let b = parse("mixtral", r#", "num_experts": 6"#).unwrap();
    assert_eq!(b.moe.unwrap().num_experts, 6);
    let (key, msg) = bad_key("qwen3_moe", r#", "num_experts": 4, "num_local_experts": 6"#);
    assert_eq!(key, "num_local_experts", "{msg}");
}

#[test]
fn sparse_layers_follow_step_and_mlp_only_layers() {
    let extra = r#", "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
        "mlp_only_layers": [3]"#;
    let cfg = parse("qwen3_moe", extra).unwrap();
    let sparse: Vec<bool> = (0..4).map(|i| cfg.is_sparse_layer(i)).collect();
    assert_eq!(sparse, [false, true, false, false]);
    let decl = cfg.backbone_params();
    assert!(matches!(decl.layers[1].ffn, FeedForwardParams::Sparse(_)));
    assert!(matches!(decl.layers[3].ffn, FeedForwardParams::Dense(_)));
    assert!(
        decl.layers[0].attn.q_norm.is_some(),
        "qwen3_moe has q/k norms"
    );
}

#[test]
fn bad_moe_keys_name_the_key_and_the_file() {
    for (model_type, extra, key) in [
        (
            "qwen3_moe",
            r#", "norm_topk_prob": "yes""#,
            "norm_topk_prob",
        ),
        (
            "qwen3_moe",
            r#", "mlp_only_layers": [1, "x"]"#,
            "mlp_only_layers[1]",
        ),
        (
            "qwen2_moe",
            r#", "router_aux_loss_coef": "big""#,
            "router_aux_loss_coef",
        ),
        ("qwen3_moe", r#", "num_experts": 4"#, "num_experts_per_tok"),
        (
            "qwen3_moe",
            r#", "mlp_only_layers": [4]"#,
            "mlp_only_layers",
        ),
        (
            "qwen3_moe",
            r#", "decoder_sparse_step": 0"#,
            "decoder_sparse_step",
        ),
        (
            "qwen2_moe",
            r#", "shared_expert_intermediate_size": 0"#,
            "shared_expert_intermediate_size",
        ),
        (
            "qwen3_moe",
            r#", "router_aux_loss_coef": -1.0"#,
            "router_aux_loss_coef",
        ),
    ] {
        let (got, msg) = bad_key(model_type, extra);
        assert_eq!(got, key, "{msg}");
        assert!(msg.contains("dir/config.json"), "{msg}");
    }
}

#[test]
fn moe_configs_round_trip() {
    for (model_type, extra) in [
        (
            "qwen3_moe",
            r#", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1], "norm_topk_prob": true, "attention_bias": true"#,
        ),
        (
            "qwen2_moe",
            r#", "num_experts": 4, "num_experts_per_tok": 2, "qkv_bias": false, "shared_expert_intermediate_size": 24, "output_router_logits": true"#,
        ),
        (
            "mixtral",
            r#", "num_local_experts": 4, "sliding_window": 8, "router_aux_loss_coef": 0.02"#,
        ),
    ] {
        let cfg = parse(model_type, extra).unwrap();
        let json = cfg.to_hf_json(&cfg.family.architecture("ForCausalLM"));
        let back = ModelConfig::from_json_value(&json, Path::new("x")).unwrap();
        assert_eq!(back, cfg, "{model_type}");
    }
}
