//! `CausalLm`: the backbone with its language-model head (HF `*ForCausalLM`): the training
//! forward, fused next-token log-probs, and KV-cached inference. Constructors, load/save and
//! weight access are shared by every head (`model.rs`); sampling lives in
//! `engine/sampler.rs` and `generate.rs`.

use crate::moe::routing::RouterTrace;
use crate::nn::fake_quant::{fake_quant, quantized_input};
use crate::nn::head::LmHead;
use crate::nn::kv_cache::KvCache;
use crate::nn::model::Model;
use crate::nn::precision::Precision;
use candle_core::{DType, Tensor};
use oxalign_kernels::linear::Int8Operand;
use oxalign_kernels::ops::{
    lm_head_logprobs_softcapped, lm_head_logprobs_with, softcap, HeadOutputs, HeadProducts,
    TokenDistribution,
};

/// A decoder-only language model with HF tensor names (`model.*`, `lm_head.weight`): the
/// shared [`Model`] wearing the [`LmHead`].
pub type CausalLm = Model<LmHead>;

impl CausalLm {
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
        let h = self.decoder().forward(input_ids, attention_mask, None)?;
        self.lm_logits(&h)
    }

    /// Final-normed hidden states `[B, T, H]` (same masking/positions as [`CausalLm::forward`]).
    pub fn hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        self.decoder().forward(input_ids, attention_mask, None)
    }

    /// LM head: hidden `[..., H]` -> logits `[..., V]` (f32 logits of bf16 products under
    /// bf16 mixed precision, as the fused log-prob head computes them).
    pub fn lm_logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        let logits = crate::nn::fake_quant::quantizable_linear(
            hidden,
            &self.head.weight,
            None,
            self.precision,
        )?;
        match self.config.style.final_softcap {
            Some(c) => softcap(&logits, c),
            None => Ok(logits),
        }
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

    /// [`CausalLm::next_token_outputs`] that records the routing of every sparse layer in
    /// `trace` (router logits for [`Model::router_aux_loss`], the chosen experts), or replays
    /// the choices it holds ([`RouterTrace::replaying`], rollout routing replay). The tokens
    /// are the `[B, T]` input ids in row-major order, padding included.
    pub fn next_token_outputs_traced(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        dist: TokenDistribution,
        trace: &mut RouterTrace,
    ) -> candle_core::Result<HeadOutputs> {
        let hidden = self
            .decoder()
            .forward_traced(input_ids, attention_mask, None, trace)?;
        self.head_outputs(&hidden, input_ids, dist)
    }

    /// [`CausalLm::next_token_outputs_traced`] with the LM head run only at `positions`: u32
    /// indices into the row-major `[B, T-1]` next-token grid (a masked loss's kept targets,
    /// the response tokens). The outputs are `[B, T-1]` with 0 elsewhere, and those entries
    /// take no gradient. The decoder still runs over every token, since the kept positions
    /// attend to the rest; the head, with a 32k vocabulary most of a small model's
    /// arithmetic, skips the prompt positions a masked loss throws away. An empty
    /// `positions` runs the head everywhere.
    pub fn next_token_outputs_at_traced(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        dist: TokenDistribution,
        trace: &mut RouterTrace,
        positions: &Tensor,
    ) -> candle_core::Result<HeadOutputs> {
        let hidden = self
            .decoder()
            .forward_traced(input_ids, attention_mask, None, trace)?;
        if positions.elem_count() == 0 {
            return self.head_outputs(&hidden, input_ids, dist);
        }
        let t = next_token_positions(input_ids)?;
        let (b, _, h) = hidden.dims3()?;
        let grid = b * t;
        let hidden = hidden.narrow(1, 0, t)?.contiguous()?.reshape((grid, h))?;
        let targets = input_ids.narrow(1, 1, t)?.contiguous()?.reshape(grid)?;
        let out = self.fused_head(
            &hidden.index_select(positions, 0)?,
            &targets.index_select(positions, 0)?,
            dist,
        )?;
        let spread = |x: &Tensor| {
            Tensor::zeros(grid, x.dtype(), x.device())?
                .index_add(positions, x, 0)?
                .reshape((b, t))
        };
        Ok(HeadOutputs {
            logprobs: spread(&out.logprobs)?,
            entropy: spread(&out.entropy)?,
        })
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
        let hidden = self.decoder().forward_packed(input_ids, segments)?;
        self.head_outputs(&hidden, input_ids, dist)
    }

    /// [`CausalLm::next_token_outputs_packed`] recording (or replaying) the routing in
    /// `trace`, over the packed `[B, T]` tokens in row-major order (see
    /// [`crate::moe::routing::ExpertChoices::for_packed`]).
    pub fn next_token_outputs_packed_traced(
        &self,
        input_ids: &Tensor,
        segments: &[u32],
        dist: TokenDistribution,
        trace: &mut RouterTrace,
    ) -> candle_core::Result<HeadOutputs> {
        let hidden = self
            .decoder()
            .forward_packed_traced(input_ids, segments, trace)?;
        self.head_outputs(&hidden, input_ids, dist)
    }

    /// The fused head over hidden states `[B, T, H]` against the next tokens of `input_ids`.
    fn head_outputs(
        &self,
        hidden: &Tensor,
        input_ids: &Tensor,
        dist: TokenDistribution,
    ) -> candle_core::Result<HeadOutputs> {
        let t = next_token_positions(input_ids)?;
        let hidden = hidden.narrow(1, 0, t)?.contiguous()?;
        let targets = input_ids.narrow(1, 1, t)?.contiguous()?;
        self.fused_head(&hidden, &targets, dist)
    }

    /// The fused head over hidden states `[..., H]` against `targets` `[...]`.
    fn fused_head(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        dist: TokenDistribution,
    ) -> candle_core::Result<HeadOutputs> {
        let weight = match self.head.weight.dtype() {
            DType::F32 | DType::F64 => self.head.weight.clone(),
            _ => self.head.weight.to_dtype(DType::F32)?,
        };
        let weight = fake_quant(&weight, Int8Operand::Weight, self.precision)?;
        let hidden = quantized_input(&hidden.to_dtype(weight.dtype())?, self.precision)?;
        let products = match self.precision {
            Precision::Bf16Mixed => HeadProducts::Bf16,
            _ => HeadProducts::F32,
        };
        match self.config.style.final_softcap {
            Some(c) => lm_head_logprobs_softcapped(&hidden, &weight, targets, dist, c),
            None => {
                let sink = self.decoder.gradient_sink();
                lm_head_logprobs_with(&hidden, &weight, targets, dist, products, sink)
            }
        }
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.config().num_hidden_layers)
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
            .decoder()
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
            .decoder()
            .forward(input_ids, attention_mask, Some(cache))?;
        let t = h.dim(1)?;
        let last = h.narrow(1, t - 1, 1)?.squeeze(1)?.detach();
        self.lm_logits(&last)
    }
}

/// `T - 1`, the next-token positions of `[B, T]` ids; at least 2 tokens are needed.
fn next_token_positions(input_ids: &Tensor) -> candle_core::Result<usize> {
    let t = input_ids.dim(1)?;
    if t < 2 {
        candle_core::bail!("next_token_logprobs needs at least 2 positions, got {t}")
    }
    Ok(t - 1)
}
