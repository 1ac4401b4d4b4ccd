//! Rollout routing replay in the policy trainer: a [`TokenBatch`] carrying the engine's
//! expert choices ([`TokenBatch::with_routing`]) makes the trainer's log-probs the engine's
//! sampling log-probs to 1e-5 on a mixture-of-experts policy, padded and packed, and the
//! replayed rows survive minibatch selection. Under int8 rollout weights the engine routes
//! differently from the f32 trainer; the PPO update reports how often the replay overrode
//! the trainer's router, and the router still learns (its weights move).

mod common;

use candle_core::Device;
use oxalign_kernels::ops::TokenDistribution;
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::moe::routing::ExpertChoices;
use oxalign_models::{CausalLm, Completion};
use oxalign_rlhf::trainer::{Packing, PolicyLossConfig, PolicyTrainer, TokenBatch};

fn model(seed: u64) -> CausalLm {
    common::tiny_moe::tiny_moe(seed)
}

fn rollout(m: &CausalLm, quant: QuantMode) -> Vec<(Completion, ExpertChoices)> {
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: Some(256),
        quant,
        ..EngineConfig::default()
    };
    let mut engine = Engine::from_model(m, cfg).unwrap();
    engine
        .generate_with_routing(&common::seeded_requests(6, 8, 900))
        .unwrap()
}

/// The rollout as a right-padded trainer batch, with its routing when `replay`.
fn batch(rollouts: &[(Completion, ExpertChoices)], replay: bool) -> TokenBatch {
    let reqs = common::seeded_requests(6, 8, 900);
    let pairs: Vec<(&[u32], &[u32])> = reqs
        .iter()
        .zip(rollouts)
        .map(|(r, (c, _))| (r.prompt.as_slice(), c.tokens.as_slice()))
        .collect();
    let b = TokenBatch::new(&pairs, 0, &Device::Cpu).unwrap();
    if !replay {
        return b;
    }
    b.with_routing(rollouts.iter().map(|(_, r)| r.clone()).collect())
        .unwrap()
}

/// Max |trainer − engine| over the sampled tokens.
fn mismatch(t: &PolicyTrainer, b: &TokenBatch, rollouts: &[(Completion, ExpertChoices)]) -> f32 {
    let lp = t.logprobs(b).unwrap().to_vec2::<f32>().unwrap();
    let mut worst = 0f32;
    for ((req, (c, _)), row) in common::seeded_requests(6, 8, 900)
        .iter()
        .zip(rollouts)
        .zip(&lp)
    {
        let start = req.prompt.len() - 1;
        for (i, e) in c.logprobs.iter().enumerate() {
            worst = worst.max((e - row[start + i]).abs());
        }
    }
    worst
}

#[test]
fn replayed_trainer_logprobs_are_the_engines_padded_and_packed() {
    let m = model(31);
    let rollouts = rollout(&m, QuantMode::None);
    let mut t = PolicyTrainer::new(m, 1e-3, 0.0).unwrap();
    t.rollout_distribution = TokenDistribution::MODEL;
    let without = mismatch(&t, &batch(&rollouts, false), &rollouts);
    let padded = mismatch(&t, &batch(&rollouts, true), &rollouts);
    t.packing = Packing {
        sft: false,
        rl: true,
    };
    let packed = mismatch(&t, &batch(&rollouts, true), &rollouts);
    println!(
        "f32 rollout: trainer vs engine max |Δ log-prob| without replay {without:.2e}, \
         replayed padded {padded:.2e}, replayed packed {packed:.2e}"
    );
    assert!(padded <= 1e-5, "padded replay {padded}");
    assert!(packed <= 1e-5, "packed replay {packed}");
    let rows = batch(&rollouts, true).select_rows(&[4, 1]).unwrap();
    let r = rows.routing.as_ref().unwrap();
    assert_eq!(r[0], rollouts[4].1);
    assert_eq!(r[1], rollouts[1].1);
}

/// Under int8 rollout weights, a trainer in the engine's numbers (fake int8) replaying the
/// rollout's experts runs the int8 engine's decoder bit for bit, so every sampled token's
/// log-prob is the engine's within 1e-5 (only the LM head's summation order differs), right-
/// padded and packed; the f32 trainer, replaying too, is printed for comparison.
#[test]
fn a_fake_int8_trainer_replaying_int8_rollouts_gives_their_logprobs_padded_and_packed() {
    for seed in [34, 35, 36] {
        let m = model(seed);
        let rollouts = rollout(&m, QuantMode::Int8);
        let b = batch(&rollouts, true);
        let mut plain = PolicyTrainer::new(m.clone(), 1e-3, 0.0).unwrap();
        plain.rollout_distribution = TokenDistribution::MODEL;
        let f32_gap = mismatch(&plain, &b, &rollouts);
        let mut fake = m;
        fake.set_precision(oxalign_models::Precision::FakeInt8);
        let mut t = PolicyTrainer::new(fake, 1e-3, 0.0).unwrap();
        t.rollout_distribution = TokenDistribution::MODEL;
        let padded = mismatch(&t, &b, &rollouts);
        t.packing = Packing {
            sft: false,
            rl: true,
        };
        let packed = mismatch(&t, &b, &rollouts);
        println!(
            "seed {seed}, int8 rollout with replay: trainer vs engine max |Δ log-prob| fake-int8 \
             padded {padded:.2e}, packed {packed:.2e}; f32 trainer {f32_gap:.2e}"
        );
        assert!(padded <= 1e-5, "seed {seed}: padded {padded:.2e}");
        assert!(packed <= 1e-5, "seed {seed}: packed {packed:.2e}");
    }
}

#[test]
fn a_record_per_row_no_longer_than_the_row_is_required() {
    let m = model(32);
    let rollouts = rollout(&m, QuantMode::None);
    let b = batch(&rollouts, false);
    let one = vec![rollouts[0].1.clone()];
    let e = b.clone().with_routing(one).unwrap_err().to_string();
    assert!(e.contains("one expert-choice record per row"), "{e}");
    let mut long: Vec<ExpertChoices> = rollouts.iter().map(|(_, r)| r.clone()).collect();
    long[2] = rollouts[5].1.clone();
    let e = b.with_routing(long).unwrap_err().to_string();
    assert!(e.contains("row 2"), "{e}");
}

/// The first sparse layer's router weight `[E, H]`.
fn router_weights(t: &PolicyTrainer) -> Vec<Vec<f32>> {
    let w = t.model.params().get("model.layers.0.mlp.gate.weight");
    w.unwrap().to_vec2::<f32>().unwrap()
}

fn loss_config() -> PolicyLossConfig {
    common::tiny_moe::ppo_loss()
}

#[test]
fn an_update_on_int8_rollouts_replays_their_experts_and_the_router_learns() {
    let m = model(33);
    let rollouts = rollout(&m, QuantMode::Int8);
    let mut t = PolicyTrainer::new(m, 1e-2, 0.0).unwrap();
    let b = batch(&rollouts, true);
    let old = t.logprobs(&b).unwrap();
    let (rows, cols) = old.dims2().unwrap();
    let adv: Vec<f32> = (0..rows * cols)
        .map(|i| if (i / cols) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let adv = candle_core::Tensor::from_vec(adv, (rows, cols), &Device::Cpu).unwrap();
    let before = router_weights(&t);
    let s = t
        .ppo_step(&b, &old, &adv, None, None, &loss_config(), 1e-2, 1.0, None)
        .unwrap();
    println!(
        "int8 rollout: the replay overrode the trainer's router on {:.2}% of token-layers",
        100.0 * s.routing_overridden
    );
    assert!(
        s.routing_overridden > 0.0 && s.routing_overridden < 0.5,
        "{}",
        s.routing_overridden
    );
    let after = router_weights(&t);
    let moved = before
        .iter()
        .flatten()
        .zip(after.iter().flatten())
        .any(|(a, b)| a != b);
    assert!(moved, "the router's weights moved under replay");
    let dense = batch(&rollouts, false);
    let s = t
        .ppo_step(
            &dense,
            &old,
            &adv,
            None,
            None,
            &loss_config(),
            1e-2,
            1.0,
            None,
        )
        .unwrap();
    assert_eq!(s.routing_overridden, 0.0, "no replay, nothing overridden");
}
