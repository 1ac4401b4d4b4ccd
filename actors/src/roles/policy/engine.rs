//! One replica of the policy's rollout engine: generates the samples of a
//! [`RolloutRequest`] and takes the trainer's weights at a refit, verified. It lives apart
//! from the trainer (its own state, its own executor lane on the CPU, [`ENGINE_LANE`]), so
//! the engine can generate the next batch while the trainer updates (`rl.max_staleness`).

use crate::batch::{Arrived, Finish, RolloutBatch, RolloutRequest, Sample};
use crate::error::{Cause, RoleError};
use crate::replicas::{shard_ranges, Replicas};
use oxalign_models::engine::{Engine, EngineConfig, Probe, RefitReport, WeightUpdate};
use oxalign_models::moe::routing::ExpertChoices;
use oxalign_models::{
    CausalLm, Completion, ExpertParallel, FinishReason, GenerationRequest, SamplingParams,
};
use std::ops::Range;
use std::sync::Arc;

/// The executor lane of the policy's engines: on the CPU, threads of their own
/// (`cpu:0/policy-engine`) beside the trainer's (`cpu:0/policy`).
pub const ENGINE_LANE: &str = "policy-engine";

/// One replica's engine. It holds its own copy of the weights; a training step reaches it
/// only through a refit ([`super::PolicyMsg::Refit`]).
pub struct EngineReplica {
    /// The generation engine.
    pub engine: Engine,
    /// Record the experts every token is routed to (rollout routing replay,
    /// `rl.routing_replay`); the samples carry them to the trainer.
    pub record_routing: bool,
    /// With `[lora]`, an engine role's copy of the trainer's model (the same frozen base
    /// and adapters): an update then carries only the adapters, loaded into it and merged
    /// here (see [`EngineReplica::refit_arrived`]).
    adapted: Option<CausalLm>,
}

impl EngineReplica {
    /// An engine serving `model`'s current weights.
    pub fn new(model: &CausalLm, config: EngineConfig) -> Result<Self, Cause> {
        Ok(Self {
            engine: Engine::from_model(model, config)?,
            record_routing: false,
            adapted: None,
        })
    }

    /// An engine serving the LoRA model `model` (base + adapters, merged), which it keeps:
    /// its refits take adapters only.
    pub fn with_adapters(model: CausalLm, config: EngineConfig) -> Result<Self, Cause> {
        Ok(Self {
            engine: Engine::from_model(&model, config)?,
            record_routing: false,
            adapted: Some(model),
        })
    }

    /// An expert-parallel engine over `model`'s experts of rank `ep.rank()` (every rank of
    /// `ep` then generates its share of the requests together with the others, exchanging
    /// token rows with them in every sparse layer; see [`EngineReplica::is_expert_parallel`]).
    pub fn with_experts(
        model: &CausalLm,
        config: EngineConfig,
        ep: ExpertParallel,
    ) -> Result<Self, Cause> {
        Ok(Self {
            engine: Engine::from_model_with_experts(model, config, ep)?,
            record_routing: false,
            adapted: None,
        })
    }

    /// True when this engine holds only its rank's experts: the ranks then step together
    /// (each on its own share of the requests) until every share is done.
    pub fn is_expert_parallel(&self) -> bool {
        self.engine.expert_parallel().is_some()
    }

    /// Completes samples `range` of `request`; returns them with the weight version that
    /// generated them.
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
                q.stop_token_ids = r.stop_token_ids.clone();
                q
            })
            .collect();
        // An expert-parallel rank without rows still steps with its peers (they need its
        // experts), so only a plain engine may skip the call.
        let skip = rows.is_empty() && !self.is_expert_parallel();
        let completions: Vec<(Completion, Option<ExpertChoices>)> = if skip {
            Vec::new()
        } else if self.record_routing {
            let out = self.engine.generate_with_routing(&engine_requests)?;
            out.into_iter().map(|(c, r)| (c, Some(r))).collect()
        } else {
            let out = self.engine.generate(&engine_requests)?;
            out.into_iter().map(|c| (c, None)).collect()
        };
        let samples = rows
            .iter()
            .zip(completions)
            .map(|(r, (c, routing))| Sample {
                sample_id: r.sample_id,
                observations: Vec::new(),
                group_id: r.group_id,
                prompt: r.prompt.clone(),
                response: c.tokens,
                logprobs: c.logprobs,
                finish: match c.finish_reason {
                    FinishReason::Stop => Finish::Stop,
                    FinishReason::Length => Finish::Length,
                },
                routing,
            })
            .collect();
        Ok((self.engine.version(), samples))
    }

    /// Takes `update` (the trainer's weights), verified by its per-tensor checksums and
    /// `probe` (the trainer's log-probs of a fixed sequence).
    pub(crate) fn refit(
        &mut self,
        update: &WeightUpdate,
        probe: &Probe,
    ) -> Result<RefitReport, Cause> {
        Ok(self.engine.refit(update, Some(probe))?)
    }

    /// Takes the weights an engine role received (`arrived`, already checked bucket by
    /// bucket against the sender's checksums) as `version`: onto this engine's device, then
    /// [`Engine::refit`]'s own verification (checksums of its copy, the probe). With LoRA
    /// they are the adapters: loaded into the kept model (every adapter required, shapes
    /// checked) and merged onto its frozen base here, so the checksums the engine checks its
    /// copy against are this merge's, and the probe (the trainer's log-probs) verifies that
    /// the merged weights compute the trainer's function.
    pub(crate) fn refit_arrived(
        &mut self,
        version: u64,
        arrived: &Arrived,
        probe: &Probe,
    ) -> Result<RefitReport, Cause> {
        let device = self.engine.device().clone();
        let tensors = arrived
            .tensors
            .iter()
            .map(|t| {
                let x = candle_core::Tensor::from_slice(&t.values, t.shape.as_slice(), &device)?;
                Ok((t.name.clone(), x))
            })
            .collect::<Result<_, candle_core::Error>>()?;
        let update = match &self.adapted {
            Some(model) => {
                model.load_weights_from(&tensors)?;
                WeightUpdate::from_model(version, model)?
            }
            None => WeightUpdate {
                version,
                tensors,
                checksums: arrived.checksums.clone(),
                merge: None,
            },
        };
        self.refit(&update, probe)
    }
}

/// Generates `request` on `engines`, each replica a contiguous share of the samples. Expert-
/// parallel engines generate their shares together (each rank's tokens visit the experts of
/// every rank), stepping until the last share is done.
pub(crate) async fn generate(
    engines: &Replicas<EngineReplica>,
    request: RolloutRequest,
) -> Result<RolloutBatch, RoleError> {
    let request = Arc::new(request);
    let parts = engines
        .each("generate", move |ctx, rep| {
            let range = shard_ranges(request.samples.len(), ctx.world)[ctx.rank].clone();
            rep.generate(&request, range)
        })
        .await?;
    let policy_version = parts.first().map_or(0, |p| p.0);
    let samples = parts.into_iter().flat_map(|p| p.1).collect();
    Ok(RolloutBatch {
        policy_version,
        samples,
    })
}
