//! Refit messages and their verification results: a versioned weight update carrying the
//! sender's per-tensor checksums, a fixed probe with the trainer's expected log-probs, and the
//! report the engine returns. Applying a refit is `Engine::refit`; nothing here touches disk.

use crate::engine::checksum::tensor_checksum;
use crate::engine::error::EngineResult;
use crate::lora::AdapterMerge;
use crate::moe::routing::{ExpertChoices, RouterTrace};
use crate::nn::causal_lm::CausalLm;
use crate::nn::precision::Precision;
use candle_core::Tensor;
use oxalign_kernels::ops::TokenDistribution;
use std::collections::HashMap;

/// New weights for the engine, computed by the trainer, with the trainer-side checksum of
/// every tensor (see [`crate::engine::tensor_checksum`]).
#[derive(Clone, Debug)]
pub struct WeightUpdate {
    /// Policy version these weights are (must be above the engine's current version).
    pub version: u64,
    /// Weights by HF name (every `CausalLm` parameter; extra entries ignored); with
    /// `merge`, the base weights the adapters are merged into.
    pub tensors: HashMap<String, Tensor>,
    /// Checksum of each weight as the sender saw it (merged, with `merge`).
    pub checksums: HashMap<String, u64>,
    /// LoRA adapters the engine merges into `tensors` as it reads each weight, so that no
    /// merged copy of every adapted layer exists at once; `None`: `tensors` are the weights.
    pub merge: Option<AdapterMerge>,
}

impl WeightUpdate {
    /// An update of `tensors`, checksummed here (on the sender's side).
    pub fn new(version: u64, tensors: HashMap<String, Tensor>) -> EngineResult<WeightUpdate> {
        WeightUpdate::merging(version, tensors, None)
    }

    /// An update of `tensors` with `merge`'s adapters merged into them, checksummed here
    /// (each merged weight made, summed and dropped in turn).
    pub fn merging(
        version: u64,
        tensors: HashMap<String, Tensor>,
        merge: Option<AdapterMerge>,
    ) -> EngineResult<WeightUpdate> {
        let checksums = tensors
            .iter()
            .map(|(n, t)| {
                let sum = match &merge {
                    Some(m) => tensor_checksum(&m.weight(n, t)?)?,
                    None => tensor_checksum(t)?,
                };
                Ok((n.clone(), sum))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(WeightUpdate {
            version,
            tensors,
            checksums,
            merge,
        })
    }

    /// An update from a trainer model's current weights (detached copies; a LoRA model's
    /// frozen base shared and its adapters merged as the engine reads them).
    pub fn from_model(version: u64, model: &CausalLm) -> EngineResult<WeightUpdate> {
        let (tensors, merge) = model.weights_to_merge()?;
        WeightUpdate::merging(version, tensors, merge)
    }
}

/// A fixed token sequence and the log-probs the trainer computes for it; after a refit the
/// engine recomputes them and compares.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// Probe tokens (at least 2).
    pub tokens: Vec<u32>,
    /// `log p(tokens[t+1] | tokens[..=t])` in nats from the trainer, `tokens.len() - 1` values.
    pub expected_logprobs: Vec<f32>,
    /// Largest accepted difference, relative to the log-prob's magnitude: a probe token
    /// passes when `|engine − trainer| ≤ tolerance · max(1, |trainer|)` (nats); e.g. 1e-4
    /// in f32, larger for quantized engines, whose mismatch this measures.
    pub tolerance: f32,
    /// A mixture-of-experts trainer's experts for each probe token: the engine scores the
    /// probe with them, so the probe compares weights, not routing (a quantized engine's
    /// router may pick another expert on a near tie, a discrete jump that no refit error
    /// causes). The engine's routing weights are still its own, and the checksums cover the
    /// routers. None for dense models.
    pub routing: Option<ExpertChoices>,
}

impl Probe {
    /// A probe whose expected log-probs come from `model`'s training forward
    /// ([`CausalLm::next_token_logprobs`]), with the experts that forward chose when the
    /// model has sparse layers. A bf16 mixed-precision trainer's probe is computed in f32:
    /// the engine receives the f32 master weights, and the probe checks those weights, not
    /// the trainer's rounding (which the rollout corrections see as the engine/trainer gap).
    pub fn from_model(model: &CausalLm, tokens: Vec<u32>, tolerance: f32) -> EngineResult<Probe> {
        let f32_twin;
        let model = match model.precision() {
            Precision::Bf16Mixed => {
                let mut twin = model.clone();
                twin.set_precision(Precision::F32);
                f32_twin = twin;
                &f32_twin
            }
            _ => model,
        };
        let ids = Tensor::from_vec(tokens.clone(), (1, tokens.len()), model.device())?;
        let mut trace = RouterTrace::new();
        let expected_logprobs = model
            .next_token_outputs_traced(&ids, None, TokenDistribution::MODEL, &mut trace)?
            .logprobs
            .squeeze(0)?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?;
        let routing = (!trace.chosen.layers.is_empty()).then_some(trace.chosen);
        Ok(Probe {
            tokens,
            expected_logprobs,
            tolerance,
            routing,
        })
    }
}

/// What a successful refit did and measured (for the monitor).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RefitReport {
    /// Version now served.
    pub version: u64,
    /// Version served before.
    pub previous_version: u64,
    /// Tensors copied and verified.
    pub tensors: usize,
    /// Bytes received (f32).
    pub bytes: usize,
    /// Tensors whose checksum matched the sender's (= `tensors` on success).
    pub checksums_ok: usize,
    /// Largest |engine - trainer| log-prob on the probe (nats), when a probe was given.
    pub probe_max_abs_diff: Option<f32>,
    /// Mean |engine - trainer| log-prob on the probe (nats), when a probe was given.
    pub probe_mean_abs_diff: Option<f32>,
    /// Wall time of the whole refit (copy, quantize, verify), seconds.
    pub seconds: f64,
    /// Of which verification (checksums + probe), seconds.
    pub verify_seconds: f64,
}
