//! Log-probs are taken under the distribution the rollout sampled from (issue: with any
//! temperature other than 1, or top-k / top-p, the ratio, KL and entropy used to be computed
//! under the untempered, untruncated distribution). With T = 0.7 and top-k 20:
//! * the engine's sampling log-probs equal the trainer's within 1e-5;
//! * the first PPO minibatch of the first epoch, with the engine's sampling log-probs as π_old,
//!   has a ratio of 1 up to f32 rounding (the trainer scores under the sampled distribution),
//!   so its approximate KL is below 1e-5 and nothing is clipped; under T = 1 it would not be.

use candle_core::{Device, Tensor};
use oxalign_models::engine::{Engine, EngineConfig};
use oxalign_models::{
    CausalLm, Family, GenerationRequest, ModelConfig, Preset, SamplingParams, TokenDistribution,
};
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PpoConfig};
use oxalign_rlhf::trainer::{PolicyLossConfig, PolicyTrainer, TokenBatch};

const T: f32 = 0.7;
const TOP_K: usize = 20;

/// `(prompt, response)` token ids per row.
type Pairs = Vec<(Vec<u32>, Vec<u32>)>;

fn rollouts(model: &CausalLm) -> (Pairs, Vec<Vec<f32>>) {
    let mut engine = Engine::from_model(model, EngineConfig::default()).unwrap();
    let requests: Vec<GenerationRequest> = (0..6u32)
        .map(|i| {
            let prompt: Vec<u32> = (0..3 + i).map(|j| (7 * i + 3 * j + 1) % 64).collect();
            let mut r = GenerationRequest::new(prompt, 8);
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                temperature: T,
                top_k: TOP_K,
                top_p: 1.0,
                seed: 40 + i as u64,
            };
            r
        })
        .collect();
    let out = engine.generate(&requests).unwrap();
    let pairs = requests
        .iter()
        .zip(&out)
        .map(|(r, c)| (r.prompt.clone(), c.tokens.clone()))
        .collect();
    (pairs, out.into_iter().map(|c| c.logprobs).collect())
}

/// The engine's per-token log-probs laid out like the trainer's `[B, T-1]` next-token arrays.
fn place(pairs: &[(Vec<u32>, Vec<u32>)], lps: &[Vec<f32>], width: usize) -> Tensor {
    let mut out = vec![0f32; pairs.len() * width];
    for (b, ((p, _), lp)) in pairs.iter().zip(lps).enumerate() {
        // Right padding: response token j is predicted at column len(prompt) - 1 + j.
        let start = p.len() - 1;
        out[b * width + start..b * width + start + lp.len()].copy_from_slice(lp);
    }
    Tensor::from_vec(out, (pairs.len(), width), &Device::Cpu).unwrap()
}

#[test]
fn tempered_top_k_rollouts_give_ratio_one_and_match_the_engine() {
    let mut cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    cfg.vocab_size = 64;
    let model = CausalLm::init_random(&cfg, 5, &Device::Cpu).unwrap();
    let (pairs, engine_lps) = rollouts(&model);
    let mut trainer = PolicyTrainer::new(model, 1e-3, 0.0).unwrap();
    trainer.rollout_distribution = TokenDistribution::of_sampling(T as f64, TOP_K, 1.0);
    let refs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    let batch = TokenBatch::new(&refs, 0, &Device::Cpu).unwrap();
    let old = trainer.logprobs(&batch).unwrap();
    let width = old.dim(1).unwrap();
    let engine = place(&pairs, &engine_lps, width);
    let mask = &batch.response_mask;
    let (mean, max) = oxalign_rlhf::masked_abs_diff(&old, &engine, mask).unwrap();
    assert!(max <= 1e-5, "engine vs trainer: mean {mean:e}, max {max:e}");
    // The T = 1 log-probs (what both sides used before) differ from the sampled ones.
    let plain = trainer
        .model
        .next_token_logprobs(&batch.ids, Some(&batch.attention_mask))
        .unwrap();
    let (_, plain_max) = oxalign_rlhf::masked_abs_diff(&plain, &engine, mask).unwrap();
    assert!(
        plain_max > 1e-2,
        "T = 1 log-probs should differ: {plain_max}"
    );

    let advantages = Tensor::ones(old.shape(), old.dtype(), &Device::Cpu).unwrap();
    let cfg = PolicyLossConfig {
        objective: oxalign_rlhf::losses::PolicyObjective::Ppo,
        ppo: PpoConfig {
            agg: LossAgg::TokenMean,
            ..PpoConfig::symmetric(0.2)
        },
        kl_loss_coef: 0.0,
        kl_estimator: KlEstimator::K1,
        entropy_coef: 0.0,
        rollout_correction: oxalign_rlhf::losses::RolloutCorrection::None,
        max_grad_norm: 1.0,
    };
    // π_old is the engine's sampling log-probs, as in an on-policy step with an f32 engine
    // (the rollout is not scored again): the first minibatch's ratio is 1 only if the trainer
    // scores under the distribution the engine sampled from.
    let stats = trainer
        .ppo_step(
            &batch,
            &engine,
            &advantages,
            None,
            Some(&engine),
            &cfg,
            1e-3,
            1.0,
            None,
        )
        .unwrap();
    assert!(
        stats.approx_kl.abs() <= 1e-5,
        "first-epoch ratio is 1 up to f32 rounding: approx_kl {}",
        stats.approx_kl
    );
    assert_eq!(stats.clip_frac, 0.0);
    assert!(stats.rollout_mismatch_max <= 1e-5);
    // The entropy is the truncated distribution's: at most ln 20.
    assert!(
        stats.entropy <= (TOP_K as f64).ln() + 1e-6,
        "{}",
        stats.entropy
    );
}
