//! One replica of the policy's trainer: the model and its optimizer, with the work it does
//! on its executor besides training — scoring old log-probs, and exporting its weights for
//! a refit of the engine (`engine.rs`) with the probe that verifies it. Requests
//! arrive and answers leave as host data; tensors live only here and in the engine.

use crate::batch::{pack, HostTensor, Sequences, TokenArray, WeightExport};
use crate::error::Cause;
use oxalign_models::engine::{Probe, WeightUpdate};
use oxalign_rlhf::trainer::PolicyTrainer;
use std::ops::Range;

/// One replica of the policy's trainer.
pub struct PolicyReplica {
    /// Model + optimizer.
    pub trainer: PolicyTrainer,
    refit_tolerance: f32,
}

impl PolicyReplica {
    /// A replica of `trainer` whose refits are probed at `refit_tolerance`.
    pub fn new(trainer: PolicyTrainer, refit_tolerance: f32) -> Self {
        Self {
            trainer,
            refit_tolerance,
        }
    }

    /// Trainer log-probs `[rows, T-1]` of rows `range` under the current weights (fused
    /// head: no `[B, T, V]` logits). The controller asks for them when the engine is
    /// quantized or the batch is stale; an f32 engine's sampling log-probs of an on-policy
    /// batch already are π_old's.
    pub(crate) fn logprobs(
        &mut self,
        seqs: &Sequences,
        range: Range<usize>,
    ) -> Result<TokenArray, Cause> {
        let b = seqs.batch_rows(range, self.trainer.model.device())?;
        Ok(TokenArray::from_tensor(&self.trainer.logprobs(&b)?)?)
    }

    /// The trainer's weights as update `version` (checksummed here), and the probe the
    /// engine must reproduce after taking them.
    pub(crate) fn refit_update(&self, version: u64) -> Result<(WeightUpdate, Probe), Cause> {
        let update = WeightUpdate::from_model(version, &self.trainer.model)?;
        Ok((update, self.probe()?))
    }

    /// The trainer's log-probs of a fixed sequence: the engine's on it must match them.
    fn probe(&self) -> Result<Probe, Cause> {
        let model = &self.trainer.model;
        let vocab = model.config().vocab_size as u32;
        let probe_tokens: Vec<u32> = (0..16u32).map(|i| (i * 37 + 11) % vocab.max(1)).collect();
        Ok(Probe::from_model(
            model,
            probe_tokens,
            self.refit_tolerance,
        )?)
    }

    /// The trainer's weights as update `version` for an engine role: host f32 copies packed
    /// into buckets of at most `bucket_bytes` (`cluster.refit_bucket_mb`), in name order,
    /// each piece checksummed, with the probe. A LoRA model sends only what it trains (the
    /// adapters and any module trained whole): the engine role holds the same frozen base
    /// and merges them itself (`EngineReplica::refit_arrived`).
    pub(crate) fn export(&self, version: u64, bucket_bytes: usize) -> Result<WeightExport, Cause> {
        let model = &self.trainer.model;
        let (tensors, probe) = match model.lora() {
            Some(_) => (model.params().snapshot()?, self.probe()?),
            None => {
                let (update, probe) = self.refit_update(version)?;
                (update.tensors, probe)
            }
        };
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        let tensors = names
            .into_iter()
            .map(|name| {
                let t = &tensors[name];
                Ok(HostTensor {
                    name: name.clone(),
                    shape: t.dims().to_vec(),
                    values: t
                        .to_dtype(candle_core::DType::F32)?
                        .flatten_all()?
                        .to_device(&candle_core::Device::Cpu)?
                        .to_vec1::<f32>()?,
                })
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()?;
        Ok(WeightExport {
            version,
            buckets: pack(&tensors, bucket_bytes)?,
            probe,
        })
    }
}
