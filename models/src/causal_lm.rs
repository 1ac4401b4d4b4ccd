//! `CausalLm`: the decoder with its language-model head (HF `*ForCausalLM`) — training forward,
//! KV-cached inference, load/save in HF layout, random init, and weight access for optimizers
//! and refit. Sampling lives in `sampler.rs`/`generate.rs`; the value/reward heads elsewhere.

use crate::checkpoint::{read_checkpoint, write_checkpoint};
use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::layers::linear;
use crate::param_spec::{causal_lm_specs, init_tensors};
use crate::param_store::ParamStore;
use candle_core::{DType, Device, Tensor, Var};
use oxalign_kernels::ops::{lm_head_logprobs, HeadOutputs, TokenDistribution};
use std::collections::HashMap;
use std::path::Path;

/// A decoder-only language model with HF tensor names (`model.*`, `lm_head.weight`).
///
/// Weights are trainable `Var`s in a `candle_nn::VarMap` ([`CausalLm::params`]); every forward
/// is differentiable with respect to them. `clone()` shares those weights (same `Var`s); use
/// [`CausalLm::deep_clone`] for an independent copy (e.g. a frozen reference model).
#[derive(Clone)]
pub struct CausalLm {
    config: ModelConfig,
    params: ParamStore,
    decoder: Decoder,
    lm_head: Tensor,
}

impl CausalLm {
    /// Builds a model from named tensors (HF names), converted to `dtype` on `device`.
    /// Errors name any missing tensor or shape mismatch.
    pub fn from_weights(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<CausalLm> {
        Self::from_weights_at(config, tensors, Path::new("<weights map>"), dtype, device)
    }

    fn from_weights_at(
        config: ModelConfig,
        tensors: &HashMap<String, Tensor>,
        source: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<CausalLm> {
        config.validate()?;
        let params =
            ParamStore::from_tensors(&causal_lm_specs(&config), tensors, source, dtype, device)?;
        let decoder = Decoder::new(&config, &params)?;
        let lm_head = if config.tie_word_embeddings {
            decoder.embed_tokens().clone()
        } else {
            params.get("lm_head.weight")?
        };
        Ok(CausalLm {
            config,
            params,
            decoder,
            lm_head,
        })
    }

    /// An independent copy (own `Var`s, same values, same dtype and device).
    pub fn deep_clone(&self) -> Result<CausalLm> {
        Self::from_weights(
            self.config.clone(),
            &self.weights()?,
            self.dtype(),
            self.device(),
        )
    }

    /// Random init with seed `seed` in f32: Normal(0, 0.02) for linear/embedding weights, ones
    /// for norms, zeros for biases.
    pub fn init_random(config: &ModelConfig, seed: u64, device: &Device) -> Result<CausalLm> {
        Self::init_random_with_dtype(config, seed, DType::F32, device)
    }

    /// [`CausalLm::init_random`] in another dtype (f64 is used by gradient checks).
    pub fn init_random_with_dtype(
        config: &ModelConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<CausalLm> {
        config.validate()?;
        let tensors = init_tensors(&causal_lm_specs(config), seed, dtype, device)?;
        Self::from_weights(config.clone(), &tensors, dtype, device)
    }

    /// Loads an HF model folder: `config.json` + `model.safetensors` (or the shards of
    /// `model.safetensors.index.json`), as f32 on `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<CausalLm> {
        let (config, tensors) = read_checkpoint(dir, device)?;
        Self::from_weights_at(config, &tensors, dir, DType::F32, device)
    }

    /// Writes `config.json` (`architectures: [<Family>ForCausalLM]`), `model.safetensors`
    /// (f32) and `generation_config.json` into `dir` (created if needed), loadable by
    /// `transformers.AutoModelForCausalLM.from_pretrained`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let arch = self.config.family.architecture("ForCausalLM");
        write_checkpoint(dir, &self.config, &arch, &self.params)
    }

    /// The model config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The trainable parameters.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The underlying `VarMap` (HF names).
    pub fn varmap(&self) -> &candle_nn::VarMap {
        self.params.varmap()
    }

    /// `(name, Var)` for every trainable parameter, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.params.vars()
    }

    /// Detached copies of all weights, keyed by HF name (for refit / checkpoints).
    pub fn weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        self.params.snapshot()
    }

    /// Overwrites all weights in place from `tensors` (every parameter required, shapes
    /// checked, extra entries ignored). Existing clones of this model see the new values.
    pub fn load_weights_from(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.params.load_from(tensors)
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        self.params.device()
    }

    /// Dtype of the weights (f32 unless built with `init_random_with_dtype`).
    pub fn dtype(&self) -> DType {
        self.params.dtype()
    }

    /// The decoder body.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Training forward: logits `[B, T, V]` (in the weights' dtype, f32 by default) for
    /// `input_ids` `[B, T]` u32.
    ///
    /// `attention_mask` `[B, T]` u32 (1 = real, 0 = pad): padded keys are hidden and position
    /// ids are `cumsum(mask) - 1` clamped at 0, so left-padded rows match their unpadded
    /// versions. Logits at pad positions are finite but meaningless. Differentiable.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let h = self.decoder.forward(input_ids, attention_mask, None)?;
        self.lm_logits(&h)
    }

    /// Final-normed hidden states `[B, T, H]` (same masking/positions as [`CausalLm::forward`]).
    pub fn hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        self.decoder.forward(input_ids, attention_mask, None)
    }

    /// LM head: hidden `[..., H]` -> logits `[..., V]`.
    pub fn lm_logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        linear(hidden, &self.lm_head, None)
    }

    /// Log-prob (nats) of each next token: `[B, T]` ids -> `[B, T-1]` where entry `t` is
    /// `log p(ids[t+1] | ids[..=t])` at temperature 1. Differentiable; pad entries are
    /// meaningless (mask them with `attention_mask[:, 1:]`). Uses the fused head, so the
    /// `[B, T, V]` logits are never built.
    pub fn next_token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        Ok(self
            .next_token_outputs(input_ids, attention_mask, TokenDistribution::MODEL)?
            .logprobs)
    }

    /// Log-prob of each next token and the entropy of each next-token distribution, both
    /// `[B, T-1]` in nats, under `dist`: `softmax(logits / T)` over its top-k / top-p kept set
    /// (the distribution a rollout sampled from; see [`TokenDistribution`]), from the fused LM head
    /// ([`oxalign_kernels::ops::lm_head_logprobs`]): the `[B, T, V]` logits and their
    /// gradient are never materialised. Differentiable in every weight; pad entries are
    /// meaningless (mask them with `attention_mask[:, 1:]`).
    pub fn next_token_outputs(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        dist: TokenDistribution,
    ) -> candle_core::Result<HeadOutputs> {
        let hidden = self.hidden(input_ids, attention_mask)?;
        self.head_outputs(&hidden, input_ids, dist)
    }

    /// [`CausalLm::next_token_outputs`] over packed rows (see [`Decoder::forward_packed`]):
    /// `segments` row-major `[B, T]` segment ids. Returns `[B, T-1]` log-probs and entropies
    /// in the packed layout; entry `t` of a segment's last token predicts the next segment's
    /// first token and is meaningless (the caller masks it, as it masks padding).
    pub fn next_token_outputs_packed(
        &self,
        input_ids: &Tensor,
        segments: &[u32],
        dist: TokenDistribution,
    ) -> candle_core::Result<HeadOutputs> {
        let hidden = self.decoder.forward_packed(input_ids, segments)?;
        self.head_outputs(&hidden, input_ids, dist)
    }

    /// The fused head over hidden states `[B, T, H]` against the next tokens of `input_ids`.
    fn head_outputs(
        &self,
        hidden: &Tensor,
        input_ids: &Tensor,
        dist: TokenDistribution,
    ) -> candle_core::Result<HeadOutputs> {
        let t = input_ids.dim(1)?;
        if t < 2 {
            candle_core::bail!("next_token_logprobs needs at least 2 positions, got {t}")
        }
        let hidden = hidden.narrow(1, 0, t - 1)?.contiguous()?;
        let targets = input_ids.narrow(1, 1, t - 1)?.contiguous()?;
        let weight = match self.lm_head.dtype() {
            DType::F32 | DType::F64 => self.lm_head.clone(),
            _ => self.lm_head.to_dtype(DType::F32)?,
        };
        lm_head_logprobs(&hidden.to_dtype(weight.dtype())?, &weight, &targets, dist)
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config.num_hidden_layers)
    }

    /// Inference forward with a KV cache: feeds `input_ids` `[B, T]` (the prompt on the first
    /// call, then e.g. one token per row), appends them to `cache` and returns logits for all
    /// `T` new positions `[B, T, V]`. `attention_mask` `[B, T]` marks pads among the *new*
    /// tokens (left padding of a prompt); earlier pads are remembered by the cache.
    /// Equal to [`CausalLm::forward`] on the concatenated sequence.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> candle_core::Result<Tensor> {
        let h = self
            .decoder
            .forward(input_ids, attention_mask, Some(cache))?;
        self.lm_logits(&h.detach())
    }

    /// Like [`CausalLm::forward_cached`] but returns only the last position's logits `[B, V]`
    /// (skips the LM head for the rest of a prompt).
    pub fn forward_cached_last(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> candle_core::Result<Tensor> {
        let h = self
            .decoder
            .forward(input_ids, attention_mask, Some(cache))?;
        let t = h.dim(1)?;
        let last = h.narrow(1, t - 1, 1)?.squeeze(1)?.detach();
        self.lm_logits(&last)
    }
}
