//! The engine's own copy of the rollout weights: f32, bf16 or quantized (W8A8 int8 on the
//! host, ggml Q8_0 / Q4_0 through candle's `QMatMul`) linear layers with q/k/v and gate/up fused, plus embedding and norms.
//! Inference only (no gradients); it never aliases the trainer's `Var` storage.

use crate::config::layout::{
    lm_head_param, FeedForwardParams, LayerParams, LinearParams, MlpParams,
};
use crate::config::model_config::{Activation, ModelConfig};
use crate::config::param_spec::{DtypePolicy, ParamSpec};
use crate::engine::config::QuantMode;
use crate::engine::embed_table::EmbedTable;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::expert::ExpertWeights;
use crate::engine::linear::{host, Linear};
use crate::engine::moe_forward::MoeWeights;
use crate::engine::weight_source::WeightSource;
use crate::lora::AdapterMerge;
use crate::moe::expert_parallel::ExpertParallel;
use crate::nn::rope::RotaryEmbedding;
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// The feed-forward block of one layer.
#[derive(Clone, Debug)]
pub(crate) enum FfnWeights {
    /// Fused `[gate; up]` projection (output `[T, 2 * intermediate]`) and `down`.
    Dense { gate_up: Linear, down: Linear },
    /// Routed experts.
    Sparse(MoeWeights),
}

/// Weights of one decoder layer (norm weights on the host).
#[derive(Clone, Debug)]
pub(crate) struct LayerWeights {
    pub input_norm: Vec<f32>,
    /// Fused `[q; k; v]` projection: output `[T, (heads + 2 kv_heads) * head_dim]`.
    pub qkv: Linear,
    pub o: Linear,
    /// Per-head RMSNorm of q and k before RoPE `[head_dim]` each (Qwen3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub post_norm: Vec<f32>,
    /// Gemma's norms before and after the feed-forward block (`post_norm` then normalises
    /// the attention's output).
    pub feedforward_norms: Option<(Vec<f32>, Vec<f32>)>,
    pub ffn: FfnWeights,
    pub window: Option<usize>,
    /// Whether the layer takes the local RoPE frequencies (Gemma 3's sliding layers).
    pub local_rope: bool,
}

/// All weights the engine's forward needs.
#[derive(Clone, Debug)]
pub(crate) struct EngineWeights {
    /// Token embeddings `[vocab, hidden]`, host, row-major.
    pub embed: EmbedTable,
    pub hidden: usize,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    pub lm_head: Linear,
    pub eps: f64,
    pub intermediate: usize,
    /// What the embedding rows are multiplied by (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// The gate's activation.
    pub activation: Activation,
    /// What q is multiplied by before RoPE so the attention's `head_dim^-0.5` gives the
    /// model's score scale (Gemma's `query_pre_attn_scalar`).
    pub q_rescale: Option<f32>,
    /// The sliding layers' RoPE frequencies, when they have their own base (Gemma 3).
    pub local_inv_freq: Option<Vec<f32>>,
    /// The LM head's logits become `c · tanh(z / c)` (Gemma 2).
    pub final_softcap: Option<f32>,
}

/// One engine linear layer over the declared `parts`, concatenated along the output axis
/// (q/k/v and gate/up are fused), with their biases when declared. The weight is quantized
/// when its declared dtype policy allows it.
fn fused(
    parts: &[&LinearParams],
    get: &dyn Fn(&ParamSpec) -> EngineResult<Tensor>,
    quant: QuantMode,
) -> EngineResult<Linear> {
    let cat = |ts: Vec<Tensor>| -> EngineResult<Tensor> {
        match ts.as_slice() {
            [one] => Ok(one.clone()),
            _ => Ok(Tensor::cat(&ts, 0)?),
        }
    };
    let w = cat(parts
        .iter()
        .map(|p| get(&p.weight))
        .collect::<EngineResult<_>>()?)?;
    let b = match parts
        .iter()
        .map(|p| p.bias.as_ref())
        .collect::<Option<Vec<_>>>()
    {
        Some(biases) => Some(cat(biases
            .into_iter()
            .map(get)
            .collect::<EngineResult<_>>()?)?),
        None => None,
    };
    let quant = match parts[0].weight.kind.dtype_policy() {
        DtypePolicy::Quantizable => quant,
        DtypePolicy::F32 => QuantMode::None,
    };
    Linear::new(w, b, quant)
}

/// One expert (or dense MLP) with gate/up fused.
fn expert(
    m: &MlpParams,
    get: &dyn Fn(&ParamSpec) -> EngineResult<Tensor>,
    quant: QuantMode,
) -> EngineResult<ExpertWeights> {
    Ok(ExpertWeights {
        gate_up: fused(&[&m.gate, &m.up], get, quant)?,
        down: fused(&[&m.down], get, quant)?,
        inter: m.gate.weight.shape[0],
    })
}

/// The engine's copy of one declared feed-forward block.
fn ffn_weights(
    cfg: &ModelConfig,
    decl: &FeedForwardParams,
    get: &dyn Fn(&ParamSpec) -> EngineResult<Tensor>,
    quant: QuantMode,
    ep: Option<&ExpertParallel>,
) -> EngineResult<FfnWeights> {
    let moe = match decl {
        FeedForwardParams::Dense(m) => {
            return Ok(FfnWeights::Dense {
                gate_up: fused(&[&m.gate, &m.up], get, quant)?,
                down: fused(&[&m.down], get, quant)?,
            })
        }
        FeedForwardParams::Sparse(moe) => moe,
    };
    let Some(mc) = &cfg.moe else {
        return Err(EngineError::Config {
            key: "moe",
            message: "a sparse layer needs the config's MoE keys".into(),
        });
    };
    let shared = match &moe.shared {
        Some(s) => Some((expert(&s.mlp, get, quant)?, fused(&[&s.gate], get, quant)?)),
        None => None,
    };
    Ok(FfnWeights::Sparse(MoeWeights {
        router: fused(&[&moe.router], get, quant)?,
        experts: moe
            .experts
            .iter()
            .enumerate()
            .map(|(e, m)| match ep.is_none_or(|p| p.owns(e)) {
                true => expert(m, get, quant).map(Some),
                false => Ok(None),
            })
            .collect::<EngineResult<_>>()?,
        shared,
        top_k: mc.num_experts_per_tok,
        norm_topk_prob: mc.norm_topk_prob,
        hidden: cfg.hidden_size,
        ep: ep.cloned(),
    }))
}

impl FfnWeights {
    fn bytes(&self) -> usize {
        match self {
            FfnWeights::Dense { gate_up, down } => gate_up.bytes() + down.bytes(),
            FfnWeights::Sparse(m) => m.bytes(),
        }
    }
}

/// The engine's weights of decoder layer `i` declared by `l`: host norms, fused q/k/v and
/// output projections, the feed-forward block and the layer's attention window. A linear
/// layer of `old` (the layer served now) whose tensors did not change is kept.
fn layer_weights(
    cfg: &ModelConfig,
    (i, l): (usize, &LayerParams),
    source: &WeightSource,
    quant: QuantMode,
    ep: Option<&ExpertParallel>,
    old: Option<&LayerWeights>,
) -> EngineResult<LayerWeights> {
    let get = |spec: &ParamSpec| source.tensor(spec);
    let a = &l.attn;
    let norm = |spec: &ParamSpec| host_norm(cfg, &get(spec)?);
    let qk_norm = match (&a.q_norm, &a.k_norm) {
        (Some(q), Some(k)) => Some((norm(q)?, norm(k)?)),
        _ => None,
    };
    let feedforward_norms = match &l.feedforward_norms {
        Some((pre, post)) => Some((norm(pre)?, norm(post)?)),
        None => None,
    };
    let linear = |parts: &[&LinearParams], served: Option<&Linear>| -> EngineResult<Linear> {
        match served {
            Some(kept) if source.unchanged(&linear_specs(parts))? => Ok(kept.clone()),
            _ => fused(parts, &get, quant),
        }
    };
    let ffn = match (&l.ffn, old.map(|o| &o.ffn)) {
        (
            FeedForwardParams::Dense(m),
            Some(FfnWeights::Dense {
                gate_up: kept_gate_up,
                down: kept_down,
            }),
        ) => FfnWeights::Dense {
            gate_up: linear(&[&m.gate, &m.up], Some(kept_gate_up))?,
            down: linear(&[&m.down], Some(kept_down))?,
        },
        (decl, _) => ffn_weights(cfg, decl, &get, quant, ep)?,
    };
    Ok(LayerWeights {
        input_norm: norm(&l.input_norm)?,
        qkv: linear(&[&a.q, &a.k, &a.v], old.map(|o| &o.qkv))?,
        o: linear(&[&a.o], old.map(|o| &o.o))?,
        qk_norm,
        post_norm: norm(&l.post_attention_norm)?,
        feedforward_norms,
        ffn,
        window: cfg.layer_window(i),
        local_rope: cfg.layer_uses_local_rope(i),
    })
}

/// The weight and bias declarations of `parts`.
fn linear_specs<'a>(parts: &[&'a LinearParams]) -> Vec<&'a ParamSpec> {
    parts
        .iter()
        .flat_map(|p| std::iter::once(&p.weight).chain(p.bias.as_ref()))
        .collect()
}

/// An RMSNorm weight on the host as the engine scales by it: `offset + w` (Gemma's `1 + w`,
/// added in f32 as the trainer does).
fn host_norm(cfg: &ModelConfig, w: &Tensor) -> EngineResult<Vec<f32>> {
    let offset = cfg.style.norm_offset;
    let mut v = host(w)?;
    if offset != 0.0 {
        v.iter_mut().for_each(|x| *x += offset);
    }
    Ok(v)
}

impl EngineWeights {
    /// Copies (and optionally quantizes) the weights of `cfg` from `tensors` (HF names; extra
    /// entries ignored; LoRA adapters merged into them as each is read) onto `device`. Returns the weights and, per tensor, the checksum of
    /// the engine's f32 copy. With `ep`, only this rank's routed experts are taken. With
    /// `served` (a refit: the weights served now and their checksums), every linear layer,
    /// the embedding and the LM head whose tensors did not change are kept, not copied.
    pub(crate) fn build(
        cfg: &ModelConfig,
        tensors: (&HashMap<String, Tensor>, Option<&AdapterMerge>),
        quant: QuantMode,
        device: &Device,
        ep: Option<&ExpertParallel>,
        served: Option<(&EngineWeights, &HashMap<String, u64>)>,
    ) -> EngineResult<(EngineWeights, HashMap<String, u64>)> {
        let source = WeightSource::new(tensors, device, served.map(|(_, sums)| sums));
        let old = served.map(|(w, _)| w);
        let get = |spec: &ParamSpec| source.tensor(spec);
        let decl = cfg.backbone_params();
        let mut layers = Vec::with_capacity(decl.layers.len());
        for (i, l) in decl.layers.iter().enumerate() {
            let kept = old.and_then(|w| w.layers.get(i));
            layers.push(layer_weights(cfg, (i, l), &source, quant, ep, kept)?);
        }
        let head_spec = lm_head_param(cfg);
        let embed = match old {
            Some(w) if source.unchanged(&[&decl.embed_tokens])? => w.embed.clone(),
            _ => match source
                .frozen(&decl.embed_tokens)?
                .and_then(|t| EmbedTable::frozen(&t))
            {
                Some(shared) => shared,
                None => EmbedTable::Own(Arc::new(host(&get(&decl.embed_tokens)?)?)),
            },
        };
        // The LM head is a linear layer (quantizable) even when it reuses the embedding.
        let lm_head = match (old, &head_spec) {
            (Some(w), Some(spec)) if source.unchanged(&[spec])? => w.lm_head.clone(),
            (Some(w), None) if source.unchanged(&[&decl.embed_tokens])? => w.lm_head.clone(),
            (_, Some(spec)) => Linear::new(get(spec)?, None, quant)?,
            (_, None) => Linear::new(get(&decl.embed_tokens)?, None, quant)?,
        };
        let norm = host_norm(cfg, &get(&decl.norm)?)?;
        let weights = EngineWeights {
            embed,
            hidden: cfg.hidden_size,
            layers,
            norm,
            lm_head,
            eps: cfg.rms_norm_eps,
            intermediate: cfg.intermediate_size,
            embed_scale: cfg.embed_scale(),
            activation: cfg.style.activation,
            q_rescale: cfg
                .style
                .query_pre_attn_scalar
                .map(|s| (cfg.head_dim as f64 / s).sqrt() as f32)
                .filter(|&f| f != 1.0),
            local_inv_freq: RotaryEmbedding::local(cfg).map(|r| r.inv_freq().to_vec()),
            final_softcap: cfg.style.final_softcap.map(|c| c as f32),
        };
        Ok((weights, source.finish(cfg, ep)?))
    }

    /// Number of sparse (MoE) layers.
    pub(crate) fn num_sparse_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.ffn, FfnWeights::Sparse(_)))
            .count()
    }

    /// One engine step of an expert-parallel rank that has no tokens to run: every sparse
    /// layer's two exchanges, in layer order, serving this rank's experts to the ranks that
    /// still have tokens (`moe_dispatch.rs`).
    pub(crate) fn serve_experts_idle(&self) -> candle_core::Result<()> {
        for l in &self.layers {
            if let FfnWeights::Sparse(moe) = &l.ffn {
                moe.forward(&[], 0, None, None)?;
            }
        }
        Ok(())
    }

    /// Bytes of weights read by one decode step (all linear layers + norms; the embedding
    /// lookup reads one row per token and is not counted).
    pub(crate) fn linear_bytes(&self) -> usize {
        let norms = (self.norm.len()
            + self
                .layers
                .iter()
                .map(|l| {
                    let ffn_norms = l
                        .feedforward_norms
                        .as_ref()
                        .map_or(0, |(a, b)| a.len() + b.len());
                    l.input_norm.len() + l.post_norm.len() + ffn_norms
                })
                .sum::<usize>())
            * 4;
        norms
            + self.lm_head.bytes()
            + self
                .layers
                .iter()
                .map(|l| l.qkv.bytes() + l.o.bytes() + l.ffn.bytes())
                .sum::<usize>()
    }
}

#[cfg(test)]
#[path = "weights_tests.rs"]
mod tests;
