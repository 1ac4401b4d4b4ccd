//! The list of named parameters (exact HF tensor names and shapes) each model needs, and their
//! seeded random initialisation. This is the single source of truth used by init, load, save
//! and refit; it does no tensor math beyond creating the initial values.

use crate::config::ModelConfig;
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::collections::HashMap;

/// How a parameter is initialised by `init_random`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamInit {
    /// Normal(0, std) (linear and embedding weights; std 0.02).
    Normal(f64),
    /// All ones (RMSNorm weights).
    Ones,
    /// All zeros (biases).
    Zeros,
}

/// One named parameter: HF tensor name, shape and initialiser.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// HF tensor name, e.g. `model.layers.0.mlp.gate_proj.weight`.
    pub name: String,
    /// Shape, e.g. `[intermediate_size, hidden_size]`.
    pub shape: Vec<usize>,
    /// Initialiser for random init.
    pub init: ParamInit,
}

const STD: f64 = 0.02;

fn linear(specs: &mut Vec<ParamSpec>, prefix: &str, out_dim: usize, in_dim: usize, bias: bool) {
    specs.push(ParamSpec {
        name: format!("{prefix}.weight"),
        shape: vec![out_dim, in_dim],
        init: ParamInit::Normal(STD),
    });
    if bias {
        specs.push(ParamSpec {
            name: format!("{prefix}.bias"),
            shape: vec![out_dim],
            init: ParamInit::Zeros,
        });
    }
}

fn norm(specs: &mut Vec<ParamSpec>, name: String, dim: usize) {
    specs.push(ParamSpec {
        name,
        shape: vec![dim],
        init: ParamInit::Ones,
    });
}

/// Parameters of the decoder body (`model.*`): embeddings, layers, final norm.
pub fn backbone_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let h = cfg.hidden_size;
    let q_dim = cfg.num_attention_heads * cfg.head_dim;
    let kv_dim = cfg.num_key_value_heads * cfg.head_dim;
    let mut s = vec![ParamSpec {
        name: "model.embed_tokens.weight".into(),
        shape: vec![cfg.vocab_size, h],
        init: ParamInit::Normal(STD),
    }];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        norm(&mut s, format!("{p}.input_layernorm.weight"), h);
        linear(
            &mut s,
            &format!("{p}.self_attn.q_proj"),
            q_dim,
            h,
            cfg.qkv_bias(),
        );
        linear(
            &mut s,
            &format!("{p}.self_attn.k_proj"),
            kv_dim,
            h,
            cfg.qkv_bias(),
        );
        linear(
            &mut s,
            &format!("{p}.self_attn.v_proj"),
            kv_dim,
            h,
            cfg.qkv_bias(),
        );
        linear(
            &mut s,
            &format!("{p}.self_attn.o_proj"),
            h,
            q_dim,
            cfg.o_bias(),
        );
        norm(&mut s, format!("{p}.post_attention_layernorm.weight"), h);
        let ib = cfg.mlp_bias();
        linear(
            &mut s,
            &format!("{p}.mlp.gate_proj"),
            cfg.intermediate_size,
            h,
            ib,
        );
        linear(
            &mut s,
            &format!("{p}.mlp.up_proj"),
            cfg.intermediate_size,
            h,
            ib,
        );
        linear(
            &mut s,
            &format!("{p}.mlp.down_proj"),
            h,
            cfg.intermediate_size,
            ib,
        );
    }
    norm(&mut s, "model.norm.weight".into(), h);
    s
}

/// Parameters of `*ForCausalLM`: the backbone plus `lm_head.weight` unless embeddings are tied.
pub fn causal_lm_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let mut s = backbone_specs(cfg);
    if !cfg.tie_word_embeddings {
        linear(&mut s, "lm_head", cfg.vocab_size, cfg.hidden_size, false);
    }
    s
}

/// Parameters of the critic head (`*ForTokenClassification`, num_labels = 1): `score.weight`
/// `[1, H]` and `score.bias` `[1]`.
pub fn value_head_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let mut s = vec![];
    linear(&mut s, "score", 1, cfg.hidden_size, true);
    s
}

/// Parameters of the reward head (`*ForSequenceClassification`, num_labels = 1):
/// `score.weight` `[1, H]`, no bias.
pub fn reward_head_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let mut s = vec![];
    linear(&mut s, "score", 1, cfg.hidden_size, false);
    s
}

/// Draws every parameter of `specs` from a `StdRng` seeded with `seed`, in the order of
/// `specs` (so the same config and seed always give the same weights).
pub fn init_tensors(
    specs: &[ParamSpec],
    seed: u64,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = HashMap::with_capacity(specs.len());
    for spec in specs {
        let n: usize = spec.shape.iter().product();
        let t = match spec.init {
            ParamInit::Ones => Tensor::ones(spec.shape.as_slice(), dtype, device)?,
            ParamInit::Zeros => Tensor::zeros(spec.shape.as_slice(), dtype, device)?,
            ParamInit::Normal(std) => {
                let dist = Normal::new(0.0f32, std as f32)
                    .map_err(|e| candle_core::Error::Msg(format!("normal({std}): {e}")))?;
                let values: Vec<f32> = (0..n).map(|_| dist.sample(&mut rng)).collect();
                Tensor::from_vec(values, spec.shape.as_slice(), device)?.to_dtype(dtype)?
            }
        };
        out.insert(spec.name.clone(), t);
    }
    Ok(out)
}
