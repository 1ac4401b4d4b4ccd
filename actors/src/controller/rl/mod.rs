//! The RL phase of a run, one folder read top to bottom: [`run_loop`] runs steps to `run.steps`
//! under supervision; [`step`] is one step's spine, calling the stages in order — [`rollout`]
//! (or a batch generated [`ahead`]), [`score`], [`experience`], [`update`], [`refit`],
//! [`report`]. The stages read their settings from [`loss_config`], [`shaping`] and [`seeds`];
//! none imports another stage. Between the stages travels host data only (`crate::batch`),
//! never a tensor.
//!
//! One step:
//! 1. **Rollout** ([`rollout`]). One request per prompt × sample, each seeded by a pure
//!    function of (run seed, step, index) ([`seeds`]). The generator completes them: the
//!    policy's engine, or the engine role when `placement.engine` places one
//!    (`controller/generator.rs`). With `rl.dynamic_sampling` the stage also asks the reward
//!    role for each round's rewards, drops the groups whose scores are all equal, and draws
//!    further rounds (round `r` reads the next `rl.prompts_per_step` prompts of the stream and
//!    seeds its samples from index `r · batch`) until the batch holds `rl.prompts_per_step`
//!    informative groups or the round cap is hit; the loop state's data position advances by
//!    every prompt drawn, so resume and replay stay exact. With `rl.max_staleness ≥ 1` the
//!    batch was generated during an earlier step instead ([`ahead`]).
//! 2. **Score** ([`score`]), concurrently: reference log-probs; rewards (unless dynamic
//!    sampling already has them); values (PPO); and, with a quantized engine or a stale batch
//!    only, the trainer's log-probs of the rollout (π_old). Otherwise π_old is the engine's own
//!    sampling log-probs.
//! 3. **Experience** ([`experience`]). Advantages for the recipe's algorithm, and KL in the
//!    reward or in the loss (`oxalign_rlhf::trainer::experience`). With a quantized engine and
//!    `rl.rollout_correction`, the correction's weights are measured here over the whole batch
//!    for the report; each policy minibatch recomputes them from the same rows
//!    (`PolicyLossConfig::rollout_correction`). The rollout's KL is then checked against
//!    `guard.max_kl`.
//! 4. **Update** ([`update`]). Policy and critic train concurrently; data-parallel replicas
//!    average gradients through the `Collective` (all-reduce), or, sharded, reduce-scatter them
//!    and step AdamW on their shards. Divergence guards check losses, gradients and weights
//!    before anything is applied. While the trainers update, the engine generates the batches
//!    of later steps ([`ahead`]).
//! 5. **Refit** ([`refit`]). The engine takes the new weights as the next policy version,
//!    verified: inside the policy, or, with `placement.engine`, as buckets sent to the engine
//!    role (the step's metrics then carry `refit_bytes`, `refit_buckets` and
//!    `refit_transfer_seconds`).
//! 6. **Report** ([`report`]). Metrics, spans and health go to the monitor. [`run_loop`] sends
//!    the step's metrics and its first `rl.log_samples` samples as text ([`logged_samples`],
//!    `samples.jsonl`), so a replayed step is reported once, and writes a checkpoint, with a
//!    SHA-256 per file, every `run.checkpoint_every` steps and after the last step. With
//!    group-relative advantages it also watches the fraction of groups whose rewards were all
//!    equal ([`zero_variance`]) and warns when no group carried a signal for 5 steps in a row.

pub(crate) mod ahead;
pub(crate) mod episodes;
pub(crate) mod experience;
pub(crate) mod heldout;
pub(crate) mod logged_samples;
pub(crate) mod loss_config;
pub(crate) mod refit;
pub(crate) mod report;
pub(crate) mod rollout;
pub(crate) mod run_loop;
pub(crate) mod score;
pub(crate) mod seeds;
pub(crate) mod shaping;
pub(crate) mod step;
pub(crate) mod update;
pub(crate) mod zero_variance;
