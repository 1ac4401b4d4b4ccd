//! The tiny recipe the training tests start from: a fresh Llama (`tiny` preset) on sums of
//! 0..=9 with 8 held out, a short SFT warm-up, then RL; each test adds or changes sections.
#![allow(dead_code)] // each test file uses a different subset

/// `[run]` (`name`, seed 5, `steps` RL steps, a checkpoint every `every` steps, all kept),
/// `[model]`, `[data]` and `[sft]` (`sft_steps` steps; `sft_extra` lines appended to it).
pub fn tiny_start(name: &str, steps: &str, every: u64, sft_steps: u64, sft_extra: &str) -> String {
    format!(
        r#"
[run]
name = "{name}"
seed = 5
steps = {steps}
checkpoint_every = {every}
keep_checkpoints = 20

[model]
init_family = "llama"
init_preset = "tiny"

[data]
max_operand = 9
eval_size = 8

[sft]
steps = {sft_steps}
batch_size = 16
lr = 3e-3
warmup_steps = 2
{sft_extra}"#
    )
}

/// `[rl]` and `[reward]` of the tiny PPO runs: a critic, KL in the reward, advantages not
/// whitened (so every step has non-zero policy and critic gradients), 3 new tokens.
pub const TINY_PPO: &str = r#"
[rl]
prompts_per_step = 16
minibatch_size = 8
ppo_epochs = 1
lr = 3e-4
critic_lr = 1e-3
kl_coef = 0.02
whiten_advantages = false
max_new_tokens = 3

[reward]
incorrect = -0.5
"#;

/// Metrics that must repeat exactly; timings, throughput and `restarts` are left out.
pub const EXACT: &[&str] = &[
    "step",
    "reward_mean",
    "reward_std",
    "accuracy",
    "kl",
    "kl_coef",
    "policy_loss",
    "value_loss",
    "entropy",
    "clip_frac",
    "approx_kl",
    "grad_norm",
    "adv_mean",
    "adv_std",
    "response_len",
    "logprob_mismatch_max",
    "data_position",
    "policy_version",
];
