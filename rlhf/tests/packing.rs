//! Sequence packing in the trainers against the padded path, on tiny llama and qwen2
//! models: the SFT loss and every parameter's gradient, the PPO update's loss terms (ratio,
//! clipping, KL, entropy) under all three aggregations, and the critic's value loss agree
//! to f32 rounding, and so do whole `sft_step` / `ppo_step` / critic `step` calls.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use oxalign_models::{CausalLm, Family, ModelConfig, TokenDistribution, ValueModel};
use oxalign_rlhf::losses::{
    entropy_bonus, kl_loss, ppo_policy_loss, sft_loss, KlEstimator, LossAgg, PpoConfig,
};
use oxalign_rlhf::trainer::{
    CriticTrainer, Packing, PolicyLossConfig, PolicyTrainer, StepStats, TokenBatch,
};

/// Vocab 64, hidden 32, 2 layers, 4 heads over 2 kv heads (fast in the dev profile).
fn tiny(family: Family) -> ModelConfig {
    common::tiny_dense(family, 64, 32, 48)
}

/// Seeded ids in `1..64`.
fn ids(seed: u64, n: usize) -> Vec<u32> {
    common::seeded_ids(seed, n, 64)
}

/// Seven (prompt, response) pairs of mixed lengths, one with an empty response.
fn batch() -> TokenBatch {
    let shapes = [(3, 5), (1, 9), (4, 2), (2, 0), (5, 6), (2, 3), (1, 1)];
    let seqs: Vec<(Vec<u32>, Vec<u32>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(p, r))| (ids(10 + i as u64, p), ids(30 + i as u64, r)))
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = seqs.iter().map(|(p, r)| (&p[..], &r[..])).collect();
    TokenBatch::new(&pairs, 0, &Device::Cpu).expect("batch")
}

/// `[B, T-1]` f32 values in `[-scale, scale)`.
fn noise(batch: &TokenBatch, scale: f32, seed: u64) -> Tensor {
    let dims = batch.response_mask.dims().to_vec();
    let n = dims.iter().product();
    let v: Vec<f32> = ids(seed, n)
        .into_iter()
        .map(|x| scale * (x as f32 / 32.0 - 1.0))
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).expect("noise")
}

fn value(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn assert_rel(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want.abs().max(1e-3),
        "{what}: packed {got} vs padded {want}"
    );
}

/// Every parameter's gradient of `packed` against `padded`: max |diff| within `tol` of the
/// gradient's own max magnitude.
fn assert_same_grads(what: &str, vars: &[(String, Var)], packed: &Tensor, padded: &Tensor) {
    let (gp, gq) = (packed.backward().unwrap(), padded.backward().unwrap());
    for (name, v) in vars {
        let a = gp.get(v.as_tensor()).expect("packed grad");
        let b = gq.get(v.as_tensor()).expect("padded grad");
        let scale = value(&b.abs().unwrap().max_all().unwrap()).max(1e-6);
        let diff = value(&(a - b).unwrap().abs().unwrap().max_all().unwrap());
        assert!(
            diff <= 1e-5 * scale,
            "{what}: d{name} differs by {diff:e} (gradient max {scale:e})"
        );
    }
}

fn policy(family: Family, packing: Packing) -> PolicyTrainer {
    let m = CausalLm::init_random(&tiny(family), 3, &Device::Cpu).unwrap();
    let mut t = PolicyTrainer::new(m, 1e-3, 0.0).unwrap();
    t.packing = packing;
    t
}

const SFT: Packing = Packing {
    sft: true,
    rl: false,
};
const RL: Packing = Packing {
    sft: false,
    rl: true,
};

#[test]
fn sft_loss_and_gradients_equal_the_padded_path() {
    let b = batch();
    for family in [Family::Llama, Family::Qwen2] {
        let t = policy(family, Packing::default());
        let vars = t.model.vars();
        let loss = |packed| {
            sft_loss(
                &t.head_outputs(&b, TokenDistribution::of_sampling(0.7, 20, 1.0), packed)
                    .unwrap()
                    .logprobs,
                &b.response_mask,
            )
        };
        let ((lp, sp), (lq, sq)) = (loss(true).unwrap(), loss(false).unwrap());
        assert_rel(&format!("{family} SFT loss"), sp.nll, sq.nll, 1e-5);
        assert_eq!(sp.num_tokens, sq.num_tokens);
        assert_same_grads(&format!("{family} SFT"), &vars, &lp, &lq);

        let (mut packed, mut padded) = (policy(family, SFT), policy(family, Packing::default()));
        let (np, StepStats { grad_norm: gp, .. }) =
            packed.sft_step(&b, 1e-3, 1.0, 1.0, None).unwrap();
        let (nq, StepStats { grad_norm: gq, .. }) =
            padded.sft_step(&b, 1e-3, 1.0, 1.0, None).unwrap();
        assert_rel(&format!("{family} sft_step loss"), np, nq, 1e-5);
        assert_rel(&format!("{family} sft_step grad norm"), gp, gq, 1e-5);
    }
}

#[test]
fn ppo_loss_terms_equal_the_padded_path_for_every_aggregation() {
    let b = batch();
    let mask = &b.response_mask;
    for family in [Family::Llama, Family::Qwen2] {
        let t = policy(family, Packing::default());
        let vars = t.model.vars();
        let base = t.logprobs(&b).unwrap();
        let old = (&base + noise(&b, 0.3, 1)).unwrap();
        let reference = (&base + noise(&b, 0.2, 2)).unwrap();
        let adv = noise(&b, 1.0, 3);
        for agg in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean,
        ] {
            let cfg = PpoConfig {
                agg,
                ..PpoConfig::symmetric(0.2)
            };
            let loss = |packed| -> (Tensor, f64, f64) {
                let out = t
                    .head_outputs(&b, TokenDistribution::of_sampling(0.7, 20, 1.0), packed)
                    .unwrap();
                let (l, ppo) =
                    ppo_policy_loss(&out.logprobs, &old, &adv, mask, &cfg, None).unwrap();
                let (kl, _) =
                    kl_loss(&out.logprobs, &reference, mask, KlEstimator::K3, 0.1, agg).unwrap();
                let (ent, _) = entropy_bonus(&out.entropy, mask, 0.01, agg).unwrap();
                (
                    (l + kl).unwrap().add(&ent).unwrap(),
                    ppo.clip_frac,
                    ppo.approx_kl,
                )
            };
            let ((lp, cp, kp), (lq, cq, kq)) = (loss(true), loss(false));
            let what = format!("{family} {agg:?}");
            assert_rel(&format!("{what} loss"), value(&lp), value(&lq), 1e-5);
            assert_eq!(cp, cq, "{what}: clip fraction");
            assert_rel(&format!("{what} approx KL"), kp, kq, 1e-4);
            assert_same_grads(&what, &vars, &lp, &lq);
        }
        let cfg = PolicyLossConfig {
            objective: oxalign_rlhf::losses::PolicyObjective::Ppo,
            ppo: PpoConfig {
                agg: LossAgg::SeqMeanTokenMean,
                ..PpoConfig::symmetric(0.2)
            },
            kl_loss_coef: 0.1,
            kl_estimator: KlEstimator::K1,
            entropy_coef: 0.01,
            rollout_correction: oxalign_rlhf::losses::RolloutCorrection::TokenTis { cap: 2.0 },
            max_grad_norm: 1.0,
        };
        let (mut packed, mut padded) = (policy(family, RL), policy(family, Packing::default()));
        let step = |t: &mut PolicyTrainer| {
            let r = Some(&reference);
            t.ppo_step(&b, &old, &adv, r, Some(&base), &cfg, 1e-3, 1.0, None)
                .unwrap()
        };
        let (sp, sq) = (step(&mut packed), step(&mut padded));
        assert_rel("ppo_step loss", sp.policy_loss, sq.policy_loss, 1e-5);
        assert_rel("ppo_step entropy", sp.entropy, sq.entropy, 1e-5);
        assert_rel(
            "ppo_step grad norm",
            sp.step.grad_norm,
            sq.step.grad_norm,
            1e-5,
        );
        assert!(
            sp.rollout_mismatch_max < 1e-5,
            "{}",
            sp.rollout_mismatch_max
        );
    }
}

#[test]
fn critic_value_loss_equals_the_padded_path() {
    let b = batch();
    let critic = |packing| {
        let m = ValueModel::init_random(&tiny(Family::Llama), 5, &Device::Cpu).unwrap();
        let mut t = CriticTrainer::new(m, 1e-3, 0.0).unwrap();
        t.packing = packing;
        t
    };
    let (mut packed, mut padded) = (critic(true), critic(false));
    let vars = padded.model.vars();
    let v = padded.values(&b).unwrap();
    let (vp, vq) = (
        padded.forward(&b, true).unwrap(),
        padded.forward(&b, false).unwrap(),
    );
    let masked = |x: &Tensor| (x * &b.response_mask).unwrap().sum_all().unwrap();
    assert_same_grads("critic values", &vars, &masked(&vp), &masked(&vq));
    let old = (&v + noise(&b, 0.1, 4)).unwrap();
    let returns = noise(&b, 1.0, 5);
    let agg = LossAgg::SeqMeanTokenSum;
    let step = |t: &mut CriticTrainer| {
        t.step(&b, &old, &returns, Some(0.2), agg, 1e-3, 1.0, 1.0, None)
            .unwrap()
    };
    let ((lp, sp), (lq, sq)) = (step(&mut packed), step(&mut padded));
    assert_rel("critic loss", lp, lq, 1e-5);
    assert_rel("critic grad norm", sp.grad_norm, sq.grad_norm, 1e-5);
}
