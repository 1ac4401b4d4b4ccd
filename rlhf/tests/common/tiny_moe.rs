//! A tiny mixture-of-experts policy for the trainer tests, and a plain PPO loss for it.

use candle_core::Device;
use oxalign_models::{CausalLm, Family, ModelConfig, Preset};
use oxalign_rlhf::losses::{KlEstimator, PolicyObjective, PpoConfig, RolloutCorrection};
use oxalign_rlhf::trainer::PolicyLossConfig;

/// A two-layer Qwen3-MoE with 8 experts, top-2, widths int8 accepts (multiples of 32), and
/// its matrices scaled ×4 so routers are far from uniform.
pub fn tiny_moe(seed: u64) -> CausalLm {
    tiny_moe_with(seed, |_| {})
}

/// [`tiny_moe`] after `edit` changed its config.
pub fn tiny_moe_with(seed: u64, edit: impl FnOnce(&mut ModelConfig)) -> CausalLm {
    let mut c = ModelConfig::preset(Family::Qwen3Moe, Preset::Tiny, 96);
    c.hidden_size = 64;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    let m = c.moe.as_mut().unwrap();
    m.num_experts = 8;
    m.num_experts_per_tok = 2;
    m.moe_intermediate_size = 32;
    edit(&mut c);
    let model = CausalLm::init_random(&c, seed, &Device::Cpu).unwrap();
    for (_, v) in model.vars() {
        if v.rank() == 2 {
            v.set(&(v.as_tensor() * 4.0).unwrap()).unwrap();
        }
    }
    model
}

/// PPO's clipped surrogate (ε = 0.2), no KL, entropy or rollout correction, clip norm 1.
pub fn ppo_loss() -> PolicyLossConfig {
    PolicyLossConfig {
        objective: PolicyObjective::Ppo,
        ppo: PpoConfig::symmetric(0.2),
        kl_loss_coef: 0.0,
        kl_estimator: KlEstimator::K1,
        entropy_coef: 0.0,
        rollout_correction: RolloutCorrection::None,
        max_grad_norm: 1.0,
    }
}
