//! The rollout correction's weights reach the policy gradient: a sequence that sequence
//! masking drops (weight 0) moves the weights exactly as if its advantage were 0, and token
//! TIS with a capped ratio scales its contribution. Reading the correction statistics alone
//! could not show this; dropping the weights from the loss fails this test.

mod common;

use candle_core::{Device, Tensor};
use common::max_weight_diff;
use oxalign_models::{CausalLm, Family, ModelConfig, Preset};
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PolicyObjective, PpoConfig, RolloutCorrection};
use oxalign_rlhf::trainer::{PolicyLossConfig, PolicyTrainer, TokenBatch};

fn trainer() -> PolicyTrainer {
    let mut cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
    cfg.vocab_size = 64;
    let model = CausalLm::init_random(&cfg, 11, &Device::Cpu).unwrap();
    PolicyTrainer::new(model, 1e-3, 0.0).unwrap()
}

fn batch() -> TokenBatch {
    let rows: [(&[u32], &[u32]); 2] = [(&[3, 9, 4], &[12, 7, 30]), (&[5, 2, 8], &[41, 16, 22])];
    TokenBatch::new(&rows, 0, &Device::Cpu).unwrap()
}

fn loss_config(correction: RolloutCorrection) -> PolicyLossConfig {
    PolicyLossConfig {
        objective: PolicyObjective::Ppo,
        ppo: PpoConfig {
            agg: LossAgg::TokenMean,
            ..PpoConfig::symmetric(0.2)
        },
        kl_loss_coef: 0.0,
        kl_estimator: KlEstimator::K1,
        entropy_coef: 0.0,
        rollout_correction: correction,
        max_grad_norm: 1e9,
    }
}

/// `[B, T-1]` advantages: `per_row[b]` on every column (only response tokens count).
fn advantages(per_row: [f32; 2], width: usize) -> Tensor {
    let v: Vec<f32> = per_row
        .iter()
        .flat_map(|a| std::iter::repeat_n(*a, width))
        .collect();
    Tensor::from_vec(v, (2, width), &Device::Cpu).unwrap()
}

/// One PPO step; returns the weights after it.
fn step(
    adv: [f32; 2],
    rollout: Option<&Tensor>,
    correction: RolloutCorrection,
) -> std::collections::HashMap<String, Tensor> {
    let mut t = trainer();
    let b = batch();
    let old = t.logprobs(&b).unwrap();
    let a = advantages(adv, old.dim(1).unwrap());
    let cfg = loss_config(correction);
    t.ppo_step(&b, &old, &a, None, rollout, &cfg, 1e-2, 1.0, None)
        .unwrap();
    t.model.weights().unwrap()
}

/// The trainer's own log-probs with row 1 moved by `shift` nats (an engine that sampled
/// row 1 from a far-off distribution).
fn rollout_with_row1_shifted(shift: f32) -> Tensor {
    let t = trainer();
    let old = t.logprobs(&batch()).unwrap();
    let width = old.dim(1).unwrap();
    let offset: Vec<f32> = (0..2 * width)
        .map(|i| if i >= width { shift } else { 0.0 })
        .collect();
    let offset = Tensor::from_vec(offset, (2, width), &Device::Cpu).unwrap();
    (old + offset).unwrap()
}

#[test]
fn a_sequence_masked_by_the_correction_contributes_no_gradient() {
    let init = trainer().model.weights().unwrap();
    // π_old/π_engine = e^{-3} on row 1: outside [0.5, 2], so the whole row is dropped.
    let rollout = rollout_with_row1_shifted(3.0);
    let mask = RolloutCorrection::SeqMask {
        lower: 0.5,
        upper: 2.0,
    };
    let masked = step([1.0, -2.0], Some(&rollout), mask);
    let without_row1 = step([1.0, 0.0], None, RolloutCorrection::None);
    let with_row1 = step([1.0, -2.0], None, RolloutCorrection::None);
    let moved = max_weight_diff(&with_row1, &init);
    assert!(moved > 1e-4, "the step must move the weights ({moved})");
    let d = max_weight_diff(&masked, &without_row1);
    assert!(d < 1e-6, "a masked row still moved the weights by {d}");
    assert!(
        max_weight_diff(&masked, &with_row1) > 1e-4,
        "the mask changed nothing"
    );
}

#[test]
fn token_tis_scales_a_rows_gradient_by_its_capped_weight() {
    // π_old/π_engine = e^{2} ≈ 7.4 on row 1, capped at 2: that row's surrogate counts twice,
    // as an uncorrected step with twice its advantage (ratio 1 in the first epoch).
    let rollout = rollout_with_row1_shifted(-2.0);
    let tis = RolloutCorrection::TokenTis { cap: 2.0 };
    let corrected = step([1.0, -2.0], Some(&rollout), tis);
    let doubled = step([1.0, -4.0], None, RolloutCorrection::None);
    let d = max_weight_diff(&corrected, &doubled);
    assert!(
        d < 1e-6,
        "token TIS differs from the doubled advantage by {d}"
    );
}
