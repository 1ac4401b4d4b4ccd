//! A small batched generation helper over the contiguous KV cache: left-pads the prompts,
//! prefills once, then decodes one token per live row, dropping finished rows from the cache.
//! It is the reference the paged-cache engine is tested against, not a serving engine.

use crate::engine::sampler::{Sampler, SamplingParams};
use crate::error::{ModelError, Result};
use crate::nn::causal_lm::CausalLm;
use crate::nn::kv_cache::KvCache;
use candle_core::{DType, Tensor};

/// One prompt to complete.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Maximum number of tokens to generate (the stop token counts).
    pub max_new_tokens: usize,
    /// Temperature / top-k / top-p / seed of this request.
    pub sampling: SamplingParams,
    /// Extra token ids that end the completion (in addition to the config's eos ids).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the config's `eos_token_id`s (the extra stop ids still apply).
    pub ignore_eos: bool,
}

impl GenerationRequest {
    /// A request with default sampling (temperature 1, seed 0) that stops at eos.
    pub fn new(prompt: Vec<u32>, max_new_tokens: usize) -> GenerationRequest {
        GenerationRequest {
            prompt,
            max_new_tokens,
            sampling: SamplingParams::default(),
            stop_token_ids: vec![],
            ignore_eos: false,
        }
    }
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (eos or a request stop id) was generated; it is the last token.
    Stop,
    /// `max_new_tokens` was reached.
    Length,
}

/// The result of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// Generated token ids (excluding the prompt; including the stop token, if any).
    pub tokens: Vec<u32>,
    /// Log-prob in nats of each generated token under the distribution it was sampled from
    /// (`softmax(logits / T)` over the top-k / top-p kept set; `T = 1` for greedy), what a
    /// trainer recomputes from the same weights under the same `TokenDistribution`.
    pub logprobs: Vec<f32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
}

impl CausalLm {
    /// Completes every request (batched, left-padded prompts, contiguous KV cache).
    ///
    /// Each request has its own seeded RNG, so its completion does not depend on the other
    /// requests of the batch (up to float rounding of batched matmuls).
    pub fn generate(&self, requests: &[GenerationRequest]) -> Result<Vec<Completion>> {
        self.validate_requests(requests)?;
        let mut out: Vec<Completion> = requests
            .iter()
            .map(|_| Completion {
                tokens: vec![],
                logprobs: vec![],
                finish_reason: FinishReason::Length,
            })
            .collect();
        if requests.is_empty() {
            return Ok(out);
        }
        let stops: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| {
                let mut s = r.stop_token_ids.clone();
                if !r.ignore_eos {
                    s.extend_from_slice(&self.config().eos_token_id);
                }
                s
            })
            .collect();
        let mut samplers: Vec<Sampler> = requests
            .iter()
            .map(|r| Sampler::new(r.sampling.clone()))
            .collect();
        let mut decode = Decode {
            requests,
            stops: &stops,
            samplers: &mut samplers,
            out: &mut out,
        };
        let device = self.device();
        let mut cache = self.new_cache();
        let mut logits = self.prefill_left_padded(requests, &mut cache)?;
        // Rows currently in the cache, as request indices.
        let mut live: Vec<usize> = (0..requests.len()).collect();
        loop {
            let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
            let (keep, next) = decode.sample_step(&live, &rows);
            if keep.is_empty() {
                break;
            }
            if keep.len() != live.len() {
                cache.select_rows(&keep)?;
                live = keep.iter().map(|&s| live[s]).collect();
            }
            let n = next.len();
            let step = Tensor::from_vec(next, (n, 1), device)?;
            logits = self.forward_cached_last(&step, None, &mut cache)?;
        }
        Ok(out)
    }

    /// Checks every request: a non-empty prompt of in-vocabulary ids and valid sampling
    /// parameters. The first bad request is reported by index.
    fn validate_requests(&self, requests: &[GenerationRequest]) -> Result<()> {
        let vocab = self.config().vocab_size;
        for (index, r) in requests.iter().enumerate() {
            let bad = |message: String| ModelError::InvalidRequest { index, message };
            if r.prompt.is_empty() {
                return Err(bad("prompt is empty".into()));
            }
            if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
                return Err(bad(format!(
                    "prompt token {t} is not below vocab_size {vocab}"
                )));
            }
            r.sampling.validate().map_err(|e| bad(e.to_string()))?;
        }
        Ok(())
    }

    /// Runs all (non-empty) prompts through the model at once, left-padded to the longest
    /// (`[B, P]` ids with a 0/1 attention mask), filling `cache`; returns the last position's
    /// logits `[B, V]`.
    fn prefill_left_padded(
        &self,
        requests: &[GenerationRequest],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let b = requests.len();
        let p = requests.iter().map(|r| r.prompt.len()).max().unwrap_or(0);
        let pad = self.config().pad_token_id.unwrap_or(0);
        let mut ids = Vec::with_capacity(b * p);
        let mut mask = Vec::with_capacity(b * p);
        for r in requests {
            let n_pad = p - r.prompt.len();
            ids.extend(std::iter::repeat_n(pad, n_pad).chain(r.prompt.iter().copied()));
            mask.extend(
                std::iter::repeat_n(0u32, n_pad).chain(std::iter::repeat_n(1, r.prompt.len())),
            );
        }
        let device = self.device();
        let ids = Tensor::from_vec(ids, (b, p), device)?;
        let mask = Tensor::from_vec(mask, (b, p), device)?;
        Ok(self.forward_cached_last(&ids, Some(&mask), cache)?)
    }
}

/// The per-request decoding state of one [`CausalLm::generate`] call.
struct Decode<'a> {
    requests: &'a [GenerationRequest],
    /// Token ids that end each request's completion (its stop ids, then eos unless ignored).
    stops: &'a [Vec<u32>],
    /// Each request's seeded sampler.
    samplers: &'a mut [Sampler],
    /// The completions being built, by request.
    out: &'a mut [Completion],
}

impl Decode<'_> {
    /// Samples one token for every live cache row that still has budget (`rows[slot]` are
    /// the `[V]` f32 logits of `live[slot]`'s request) and appends it with its log-prob.
    /// Returns the slots that continue (not stopped, budget left) and their sampled tokens,
    /// the next step's input.
    fn sample_step(&mut self, live: &[usize], rows: &[Vec<f32>]) -> (Vec<usize>, Vec<u32>) {
        let mut keep = vec![];
        let mut next = vec![];
        for (slot, &req) in live.iter().enumerate() {
            let c = &mut self.out[req];
            if c.tokens.len() >= self.requests[req].max_new_tokens {
                continue;
            }
            let (tok, lp) = self.samplers[req].sample(&rows[slot]);
            c.tokens.push(tok);
            c.logprobs.push(lp);
            if self.stops[req].contains(&tok) {
                c.finish_reason = FinishReason::Stop;
            } else if c.tokens.len() < self.requests[req].max_new_tokens {
                keep.push(slot);
                next.push(tok);
            }
        }
        (keep, next)
    }
}
