//! The parameter declaration of a model, as structured data: which tensors the backbone's
//! embedding, layers (attention, MLP, norms) and final norm consist of, with their HF names,
//! shapes and kinds. Families build it (`family/`), heads add their own (`head.rs`); the
//! training modules (`attention.rs`, `mlp.rs`, `decoder*.rs`), load/save (`param_store.rs`),
//! the engine (`engine/weights.rs`) and the optimizer groups all read it, so a tensor name is
//! spelled once. No tensors live here.

use crate::config::ModelConfig;
use crate::param_spec::{ParamKind, ParamSpec};

/// The parameters of one linear layer `{prefix}.weight` `[out, in]` and, optionally,
/// `{prefix}.bias` `[out]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearParams {
    /// The weight `[out, in]`.
    pub weight: ParamSpec,
    /// The bias `[out]`, when the layer has one.
    pub bias: Option<ParamSpec>,
}

impl LinearParams {
    /// `{prefix}.weight` `[out_dim, in_dim]` and, when `bias`, `{prefix}.bias` `[out_dim]`.
    pub fn new(prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> LinearParams {
        LinearParams {
            weight: ParamSpec::new(
                format!("{prefix}.weight"),
                vec![out_dim, in_dim],
                ParamKind::Linear,
            ),
            bias: bias
                .then(|| ParamSpec::new(format!("{prefix}.bias"), vec![out_dim], ParamKind::Bias)),
        }
    }

    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        out.push(self.weight.clone());
        out.extend(self.bias.iter().cloned());
    }
}

/// An RMSNorm scale `name` `[dim]`.
pub fn norm_param(name: String, dim: usize) -> ParamSpec {
    ParamSpec::new(name, vec![dim], ParamKind::Norm)
}

/// The projections of one grouped-query attention block.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query projection `[heads * head_dim, H]`.
    pub q: LinearParams,
    /// Key projection `[kv_heads * head_dim, H]`.
    pub k: LinearParams,
    /// Value projection `[kv_heads * head_dim, H]`.
    pub v: LinearParams,
    /// Output projection `[H, heads * head_dim]`.
    pub o: LinearParams,
}

/// The projections of one SiLU-gated MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpParams {
    /// Gate projection `[I, H]`.
    pub gate: LinearParams,
    /// Up projection `[I, H]`.
    pub up: LinearParams,
    /// Down projection `[H, I]`.
    pub down: LinearParams,
}

/// The parameters of one pre-norm decoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerParams {
    /// RMSNorm before attention `[H]`.
    pub input_norm: ParamSpec,
    /// Self-attention.
    pub attn: AttentionParams,
    /// RMSNorm before the MLP `[H]`.
    pub post_attention_norm: ParamSpec,
    /// Feed-forward block.
    pub mlp: MlpParams,
}

impl LayerParams {
    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        out.push(self.input_norm.clone());
        for l in [&self.attn.q, &self.attn.k, &self.attn.v, &self.attn.o] {
            l.push_to(out);
        }
        out.push(self.post_attention_norm.clone());
        for l in [&self.mlp.gate, &self.mlp.up, &self.mlp.down] {
            l.push_to(out);
        }
    }
}

/// The decoder body's parameters (`model.*`): embedding, layers, final norm.
#[derive(Clone, Debug, PartialEq)]
pub struct BackboneParams {
    /// Token embeddings `[V, H]`.
    pub embed_tokens: ParamSpec,
    /// One entry per decoder layer.
    pub layers: Vec<LayerParams>,
    /// Final RMSNorm `[H]`.
    pub norm: ParamSpec,
}

impl BackboneParams {
    /// Every parameter, in the canonical order (embedding; per layer: input norm, q, k, v, o,
    /// post-attention norm, gate, up, down, each weight before its bias; final norm). Random
    /// init draws in this order, so it fixes the weights a seed gives.
    pub fn specs(&self) -> Vec<ParamSpec> {
        let mut out = vec![self.embed_tokens.clone()];
        for layer in &self.layers {
            layer.push_to(&mut out);
        }
        out.push(self.norm.clone());
        out
    }
}

/// Which projections of a dense decoder layer carry a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Biases {
    /// q/k/v projections.
    pub qkv: bool,
    /// Attention output projection.
    pub o: bool,
    /// gate/up/down projections.
    pub mlp: bool,
}

/// The HF Llama-style dense backbone (`model.embed_tokens`, `model.layers.N.{input_layernorm,
/// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`,
/// `model.norm`) of `cfg`, with `biases`. Llama, Qwen2 and Mistral all use it.
pub fn dense_backbone(cfg: &ModelConfig, biases: Biases) -> BackboneParams {
    let h = cfg.hidden_size;
    let i_dim = cfg.intermediate_size;
    let q_dim = cfg.num_attention_heads * cfg.head_dim;
    let kv_dim = cfg.num_key_value_heads * cfg.head_dim;
    let layer = |i: usize| {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let m = format!("{p}.mlp");
        LayerParams {
            input_norm: norm_param(format!("{p}.input_layernorm.weight"), h),
            attn: AttentionParams {
                q: LinearParams::new(&format!("{a}.q_proj"), q_dim, h, biases.qkv),
                k: LinearParams::new(&format!("{a}.k_proj"), kv_dim, h, biases.qkv),
                v: LinearParams::new(&format!("{a}.v_proj"), kv_dim, h, biases.qkv),
                o: LinearParams::new(&format!("{a}.o_proj"), h, q_dim, biases.o),
            },
            post_attention_norm: norm_param(format!("{p}.post_attention_layernorm.weight"), h),
            mlp: MlpParams {
                gate: LinearParams::new(&format!("{m}.gate_proj"), i_dim, h, biases.mlp),
                up: LinearParams::new(&format!("{m}.up_proj"), i_dim, h, biases.mlp),
                down: LinearParams::new(&format!("{m}.down_proj"), h, i_dim, biases.mlp),
            },
        }
    };
    BackboneParams {
        embed_tokens: ParamSpec::new(
            "model.embed_tokens.weight",
            vec![cfg.vocab_size, h],
            ParamKind::Embedding,
        ),
        layers: (0..cfg.num_hidden_layers).map(layer).collect(),
        norm: norm_param("model.norm.weight".into(), h),
    }
}

/// The LM head's parameter: `lm_head.weight` `[V, H]`, or `None` when the embeddings are tied
/// (the head reuses `model.embed_tokens.weight`).
pub fn lm_head_param(cfg: &ModelConfig) -> Option<ParamSpec> {
    (!cfg.tie_word_embeddings)
        .then(|| LinearParams::new("lm_head", cfg.vocab_size, cfg.hidden_size, false).weight)
}

/// The parameters of `*ForCausalLM`: the backbone plus `lm_head.weight` unless tied.
pub fn causal_lm_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    crate::CausalLm::param_specs(cfg)
}
