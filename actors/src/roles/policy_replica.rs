//! One replica of the policy: its trainer and the engine that generates its rollouts, with
//! the work each does on its executor — generating samples of a [`RolloutRequest`], scoring
//! old log-probs and refitting the engine from the trainer, verified. Requests arrive and
//! answers leave as host data; tensors live only here.

use crate::batch::{Finish, RolloutRequest, Sample, Sequences, TokenArray};
use crate::error::Cause;
use oxalign_models::engine::{Engine, EngineConfig, Probe, RefitReport, WeightUpdate};
use oxalign_models::{FinishReason, GenerationRequest, SamplingParams};
use oxalign_rlhf::trainer::PolicyTrainer;
use std::ops::Range;

/// One replica of the policy: the trainer and the engine that generates its rollouts.
///
/// The engine holds its own copy of the weights; a training step reaches it only through
/// [`super::PolicyMsg::Refit`].
pub struct PolicyReplica {
    /// Model + optimizer.
    pub trainer: PolicyTrainer,
    /// Generation engine.
    pub engine: Engine,
    refit_tolerance: f32,
}

impl PolicyReplica {
    /// A replica whose engine starts from the trainer's current weights.
    pub fn new(
        trainer: PolicyTrainer,
        engine: EngineConfig,
        refit_tolerance: f32,
    ) -> Result<Self, Cause> {
        let engine = Engine::from_model(&trainer.model, engine)?;
        Ok(Self {
            trainer,
            engine,
            refit_tolerance,
        })
    }

    /// Completes samples `range` of `request` with the engine; returns them with the weight
    /// version that generated them.
    pub(crate) fn generate(
        &mut self,
        request: &RolloutRequest,
        range: Range<usize>,
    ) -> Result<(u64, Vec<Sample>), Cause> {
        let rows = &request.samples[range];
        let engine_requests: Vec<GenerationRequest> = rows
            .iter()
            .map(|r| {
                let mut q = GenerationRequest::new(r.prompt.clone(), r.max_new_tokens);
                q.sampling = SamplingParams {
                    temperature: r.sampling.temperature,
                    top_k: r.sampling.top_k,
                    top_p: r.sampling.top_p,
                    seed: r.sampling.seed,
                };
                q
            })
            .collect();
        let completions = if rows.is_empty() {
            Vec::new()
        } else {
            self.engine.generate(&engine_requests)?
        };
        let samples = rows
            .iter()
            .zip(completions)
            .map(|(r, c)| Sample {
                sample_id: r.sample_id,
                group_id: r.group_id,
                prompt: r.prompt.clone(),
                response: c.tokens,
                logprobs: c.logprobs,
                finish: match c.finish_reason {
                    FinishReason::Stop => Finish::Stop,
                    FinishReason::Length => Finish::Length,
                },
            })
            .collect();
        Ok((self.engine.version(), samples))
    }

    /// Trainer log-probs `[rows, T-1]` of rows `range` under the current weights (fused
    /// head: no `[B, T, V]` logits). The controller asks for them only when the engine is
    /// quantized; an f32 engine's sampling log-probs already are π_old's.
    pub(crate) fn logprobs(
        &mut self,
        seqs: &Sequences,
        range: Range<usize>,
    ) -> Result<TokenArray, Cause> {
        let b = seqs.batch_rows(range, self.trainer.model.device())?;
        Ok(TokenArray::from_tensor(&self.trainer.logprobs(&b)?)?)
    }

    /// Copies the trainer's weights into the engine as `version`, verified by per-tensor
    /// checksums and a log-prob probe.
    pub(crate) fn refit(&mut self, version: u64) -> Result<RefitReport, Cause> {
        let model = &self.trainer.model;
        let vocab = model.config().vocab_size as u32;
        // A fixed probe sequence: the engine's log-probs on it must match the trainer's.
        let probe_tokens: Vec<u32> = (0..16u32).map(|i| (i * 37 + 11) % vocab.max(1)).collect();
        let probe = Probe::from_model(model, probe_tokens, self.refit_tolerance)?;
        let update = WeightUpdate::from_model(version, model)?;
        Ok(self.engine.refit(&update, Some(&probe))?)
    }
}
