//! The parameter declaration of a model, as structured data: which tensors the backbone's
//! embedding, layers (attention, MLP or routed experts, norms) and final norm consist of, with
//! their HF names, shapes and kinds. The MoE variants are built in `moe/layout.rs`. Families
//! build it (`family/`), heads add their own (`nn/head.rs`); the training modules
//! (`attention.rs`, `mlp.rs`, `decoder*.rs`), load/save (`param_store.rs`), the engine
//! (`engine/weights.rs`) and the optimizer groups all read it, so a tensor name is spelled
//! once. No tensors live here.

use crate::config::model_config::ModelConfig;
use crate::config::param_spec::{ParamKind, ParamSpec};

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

    /// The same layer with its weight declared as `kind` (a router instead of a linear
    /// weight).
    pub fn with_kind(mut self, kind: ParamKind) -> LinearParams {
        self.weight.kind = kind;
        self
    }

    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        out.push(self.weight.clone());
        out.extend(self.bias.iter().cloned());
    }
}

/// An RMSNorm scale `name` `[dim]`.
pub(crate) fn norm_param(name: String, dim: usize) -> ParamSpec {
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
    /// RMSNorm over each query head `[head_dim]`, before RoPE (Qwen3 `q_norm`).
    pub q_norm: Option<ParamSpec>,
    /// RMSNorm over each key head `[head_dim]`, before RoPE (Qwen3 `k_norm`).
    pub k_norm: Option<ParamSpec>,
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

impl MlpParams {
    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        for l in [&self.gate, &self.up, &self.down] {
            l.push_to(out);
        }
    }
}

/// The always-on expert of a Qwen2-MoE block, scaled per token by
/// `sigmoid(gate(x))`.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedExpertParams {
    /// The expert's MLP (`shared_expert.{gate,up,down}_proj`, width
    /// `shared_expert_intermediate_size`).
    pub mlp: MlpParams,
    /// Its scalar gate `shared_expert_gate` `[1, H]` (a router kind).
    pub gate: LinearParams,
}

/// Tensor names of the packed checkpoint layout newer transformers keeps in memory (and some
/// checkpoints store): every expert of a layer in one tensor. Loading splits them into the
/// per-expert names ([`crate::moe::expert_layout`]); saving always writes per-expert names.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedExpertNames {
    /// `[E, 2 * I, H]`: per expert, the gate rows then the up rows.
    pub gate_up: String,
    /// `[E, H, I]`.
    pub down: String,
    /// The router weight `[E, H]` under the packed layout's module name.
    pub router: String,
}

/// The parameters of one sparse mixture-of-experts block.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeParams {
    /// The router `[E, H]` (no bias): logits over the experts.
    pub router: LinearParams,
    /// The routed experts, each a SiLU-gated MLP of width `moe_intermediate_size`.
    pub experts: Vec<MlpParams>,
    /// The shared expert (Qwen2-MoE), when the family has one.
    pub shared: Option<SharedExpertParams>,
    /// The packed-layout names of the same tensors (read only).
    pub packed: PackedExpertNames,
}

/// The feed-forward block of a decoder layer.
// A declaration is built once per model and read by reference; the size gap is harmless.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum FeedForwardParams {
    /// One SiLU-gated MLP.
    Dense(MlpParams),
    /// Routed experts (MoE).
    Sparse(MoeParams),
}

impl FeedForwardParams {
    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        match self {
            FeedForwardParams::Dense(m) => m.push_to(out),
            FeedForwardParams::Sparse(moe) => {
                moe.router.push_to(out);
                for e in &moe.experts {
                    e.push_to(out);
                }
                if let Some(s) = &moe.shared {
                    s.mlp.push_to(out);
                    s.gate.push_to(out);
                }
            }
        }
    }
}

/// The parameters of one pre-norm decoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerParams {
    /// RMSNorm before attention `[H]`.
    pub input_norm: ParamSpec,
    /// Self-attention.
    pub attn: AttentionParams,
    /// RMSNorm before the feed-forward block `[H]`.
    pub post_attention_norm: ParamSpec,
    /// Feed-forward block (dense MLP or routed experts).
    pub ffn: FeedForwardParams,
    /// Gemma's norms before and after the feed-forward block (`[H]` each); with them
    /// `post_attention_norm` normalises the attention's output instead of the MLP's input.
    pub feedforward_norms: Option<(ParamSpec, ParamSpec)>,
}

impl LayerParams {
    fn push_to(&self, out: &mut Vec<ParamSpec>) {
        out.push(self.input_norm.clone());
        for l in [&self.attn.q, &self.attn.k, &self.attn.v, &self.attn.o] {
            l.push_to(out);
        }
        out.extend(self.attn.q_norm.iter().cloned());
        out.extend(self.attn.k_norm.iter().cloned());
        out.push(self.post_attention_norm.clone());
        if let Some((pre, post)) = &self.feedforward_norms {
            out.push(pre.clone());
            out.push(post.clone());
        }
        self.ffn.push_to(out);
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
    /// q/k norms, post-attention norm, then gate, up, down, or the router, each expert's
    /// gate, up, down and the shared expert with its gate; each weight before its bias;
    /// final norm). Random
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
pub(crate) struct Biases {
    /// q/k/v projections.
    pub qkv: bool,
    /// Attention output projection.
    pub o: bool,
    /// gate/up/down projections.
    pub mlp: bool,
}

impl Biases {
    /// A bias on q/k/v/o when `attention_bias` (Qwen3's and Gemma's `attention_bias`),
    /// never on the MLP.
    pub(crate) fn attention_only(attention_bias: bool) -> Biases {
        Biases {
            qkv: attention_bias,
            o: attention_bias,
            mlp: false,
        }
    }
}

/// The HF Llama-style dense backbone (`model.embed_tokens`, `model.layers.N.{input_layernorm,
/// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`,
/// `model.norm`) of `cfg`, with `biases`. Llama, Qwen2 and Mistral all use it.
pub(crate) fn dense_backbone(cfg: &ModelConfig, biases: Biases) -> BackboneParams {
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
                q_norm: None,
                k_norm: None,
            },
            post_attention_norm: norm_param(format!("{p}.post_attention_layernorm.weight"), h),
            ffn: FeedForwardParams::Dense(mlp_params(
                &m,
                ["gate_proj", "up_proj", "down_proj"],
                i_dim,
                h,
                biases.mlp,
            )),
            feedforward_norms: None,
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

/// Gives every layer's attention Qwen3's per-head `q_norm` / `k_norm` (`[head_dim]` each).
pub(crate) fn add_qk_norms(backbone: &mut BackboneParams, head_dim: usize) {
    for (i, layer) in backbone.layers.iter_mut().enumerate() {
        let a = format!("model.layers.{i}.self_attn");
        layer.attn.q_norm = Some(norm_param(format!("{a}.q_norm.weight"), head_dim));
        layer.attn.k_norm = Some(norm_param(format!("{a}.k_norm.weight"), head_dim));
    }
}

/// A SiLU-gated MLP `{prefix}.{gate,up,down}` (the three names in that order) of width
/// `i_dim` over `h`.
pub(crate) fn mlp_params(
    prefix: &str,
    names: [&str; 3],
    i_dim: usize,
    h: usize,
    bias: bool,
) -> MlpParams {
    let [gate, up, down] = names;
    MlpParams {
        gate: LinearParams::new(&format!("{prefix}.{gate}"), i_dim, h, bias),
        up: LinearParams::new(&format!("{prefix}.{up}"), i_dim, h, bias),
        down: LinearParams::new(&format!("{prefix}.{down}"), h, i_dim, bias),
    }
}

/// The LM head's parameter: `lm_head.weight` `[V, H]`, or `None` when the embeddings are tied
/// (the head reuses `model.embed_tokens.weight`).
pub(crate) fn lm_head_param(cfg: &ModelConfig) -> Option<ParamSpec> {
    (!cfg.tie_word_embeddings)
        .then(|| LinearParams::new("lm_head", cfg.vocab_size, cfg.hidden_size, false).weight)
}

/// The parameters of `*ForCausalLM`: the backbone plus `lm_head.weight` unless tied.
pub fn causal_lm_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    crate::CausalLm::param_specs(cfg)
}
