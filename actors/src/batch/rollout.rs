//! What the policy is asked to generate ([`RolloutRequest`]) and what it returns
//! ([`RolloutBatch`]): prompt and response token ids, the engine's per-token log-probs, why
//! each completion ended, the sample and group ids and the policy version that generated
//! them. Plain data; the policy turns requests into engine requests on its own device.

use super::Sequences;
use oxalign_models::moe::routing::ExpertChoices;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// How one sample is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Softmax temperature (0 = greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Nucleus mass (1 = off).
    pub top_p: f32,
    /// Seed of this sample's RNG.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// One completion to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRequest {
    /// Index of the sample within its batch.
    pub sample_id: u64,
    /// The group it belongs to (the prompt's index: samples of one prompt share it).
    pub group_id: u64,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (the stop token counts).
    pub max_new_tokens: usize,
    /// How to sample.
    pub sampling: Sampling,
    /// Ids that also end the completion besides the model's `eos_token_id`s (a chat turn's
    /// end, e.g. `<|im_end|>`, for multi-turn episodes). Empty: the eos ids only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
}

/// Completions to generate, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutRequest {
    /// One entry per completion.
    pub samples: Vec<SampleRequest>,
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finish {
    /// A stop token was generated (it is the response's last token).
    Stop,
    /// `max_new_tokens` was reached.
    Length,
}

/// One generated sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Index of the sample within its batch.
    pub sample_id: u64,
    /// The group it belongs to.
    pub group_id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generated token ids (with the stop token, if any).
    pub response: Vec<u32>,
    /// The engine's log-prob of each response token (nats) under the distribution sampled
    /// (the request's temperature, top-k and top-p).
    pub logprobs: Vec<f32>,
    /// Why generation ended.
    pub finish: Finish,
    /// With rollout routing replay (`rl.routing_replay`): the experts each fed token of
    /// `prompt ++ response` (all but the last response token) was routed to. None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<ExpertChoices>,
    /// A multi-turn episode's environment tokens: ranges of `response` positions the
    /// environment wrote (their `logprobs` are 0 and nothing trains on them). Empty for a
    /// single turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<Range<usize>>,
}

/// The policy's answer to a [`RolloutRequest`]: one sample per request, in request order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutBatch {
    /// The weight version of the engine that generated every sample.
    pub policy_version: u64,
    /// The samples.
    pub samples: Vec<Sample>,
}

impl RolloutBatch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Prompt and response ids of every sample, padded with `pad_id` when packed, with the
    /// samples' routing records when every sample has one.
    pub fn sequences(&self, pad_id: u32) -> Sequences {
        let routing: Option<Vec<ExpertChoices>> =
            self.samples.iter().map(|s| s.routing.clone()).collect();
        let multi_turn = self.samples.iter().any(|s| !s.observations.is_empty());
        Sequences {
            pairs: self
                .samples
                .iter()
                .map(|s| (s.prompt.clone(), s.response.clone()))
                .collect(),
            pad_id,
            routing: routing.filter(|r| !r.is_empty()),
            observations: multi_turn.then(|| {
                self.samples
                    .iter()
                    .map(|s| s.observations.clone())
                    .collect()
            }),
        }
    }

    /// Response tokens over all samples (an episode's environment tokens included).
    pub fn response_tokens(&self) -> usize {
        self.samples.iter().map(|s| s.response.len()).sum()
    }

    /// Tokens the policy generated over all samples (an episode's environment tokens left
    /// out).
    pub fn generated_tokens(&self) -> usize {
        let observed: usize = self
            .samples
            .iter()
            .flat_map(|s| &s.observations)
            .map(|r| r.len())
            .sum();
        self.response_tokens() - observed
    }
}
