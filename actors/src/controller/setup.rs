//! Building a run from its recipe: the policy model folder (loaded, or freshly initialised
//! inside the run folder), the tokenizer, the prompt source, and the role actors on their
//! device groups.

use crate::executor::ExecutorPool;
use crate::monitor::{ActorInfo, MonitorHandle};
use crate::placement::DeviceGroup;
use crate::recipe::{EngineQuant, Recipe, RewardKind, TaskKind};
use crate::replicas::Replicas;
use crate::roles::{
    Critic, CriticMsg, CriticState, Policy, PolicyMsg, PolicyReplica, PolicyState, Reference,
    ReferenceMsg, ReferenceState, Reward, RewardMsg, RewardState, Scorer,
};
use candle_core::{DType, Tensor};
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::tokenizer::Tokenizer;
use oxalign_models::{
    byte_tokenizer, CausalLm, Family, ModelConfig, Preset, RewardModel, ValueModel,
};
use oxalign_rlhf::data::{ArithmeticTask, PromptFile, PromptSource};
use oxalign_rlhf::reward::ExactMatch;
use oxalign_rlhf::trainer::{CriticTrainer, PolicyTrainer};
use ractor::{Actor, ActorRef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The running actors of one run.
pub struct Roles {
    /// Policy.
    pub policy: ActorRef<PolicyMsg>,
    /// Reference.
    pub reference: ActorRef<ReferenceMsg>,
    /// Reward.
    pub reward: ActorRef<RewardMsg>,
    /// Critic (PPO only).
    pub critic: Option<ActorRef<CriticMsg>>,
}

impl Roles {
    /// Stops every actor.
    pub fn stop(&self) {
        self.policy.stop(None);
        self.reference.stop(None);
        self.reward.stop(None);
        if let Some(c) = &self.critic {
            c.stop(None);
        }
    }
}

/// The policy's model folder: the recipe's `model.path`, or a fresh model written to
/// `<run>/init` (created once; a resumed run reuses it).
pub fn policy_dir(recipe: &Recipe, run_dir: &Path) -> Result<PathBuf, String> {
    if let Some(p) = &recipe.model.path {
        return Ok(PathBuf::from(p));
    }
    let dir = run_dir.join("init");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let family: Family = recipe
        .model
        .init_family
        .parse()
        .map_err(|e| format!("model.init_family: {e}"))?;
    let preset: Preset = recipe
        .model
        .init_preset
        .parse()
        .map_err(|e| format!("model.init_preset: {e}"))?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    byte_tokenizer::write(&dir).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_dir(&dir).map_err(|e| e.to_string())?;
    let vocab = match preset {
        Preset::Tiny => tok.vocab_len(),
        Preset::Small => tok.vocab_len().max(32_000),
    };
    let mut cfg = ModelConfig::preset(family, preset, vocab);
    cfg.bos_token_id = tok.bos_token_id();
    cfg.eos_token_id = tok.stop_token_ids().to_vec();
    cfg.pad_token_id = tok.pad_token_id();
    let model = CausalLm::init_random(&cfg, recipe.run.seed, &candle_core::Device::Cpu)
        .map_err(|e| e.to_string())?;
    model.save(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// The prompt source of the recipe.
pub fn prompt_source(recipe: &Recipe) -> Result<Arc<dyn PromptSource>, String> {
    Ok(match recipe.data.task {
        TaskKind::Arithmetic => Arc::new(ArithmeticTask::new(
            recipe.run.seed,
            recipe.data.max_operand,
            recipe.data.eval_size,
        )),
        TaskKind::Jsonl => {
            let path = recipe
                .data
                .path
                .as_deref()
                .ok_or("data.path is required for task = \"jsonl\"")?;
            Arc::new(
                PromptFile::load(
                    Path::new(path),
                    recipe.data.eval_path.as_deref().map(Path::new),
                    recipe.run.seed,
                )
                .map_err(|e| e.to_string())?,
            )
        }
    })
}

fn group(spec: &str, key: &str) -> Result<DeviceGroup, String> {
    DeviceGroup::parse(spec).map_err(|e| format!("placement.{key}: {e}"))
}

/// Where the weights of each role come from when the actors start.
pub struct RoleSources {
    /// Reference weights (HF folder).
    pub reference: PathBuf,
    /// Critic weights (HF token-classification folder); `None` = from the policy's backbone.
    pub critic: Option<PathBuf>,
}

/// The engine settings of the recipe's `[engine]` section.
pub fn engine_config(recipe: &Recipe) -> EngineConfig {
    let e = &recipe.engine;
    EngineConfig {
        block_size: e.block_size,
        num_blocks: None,
        kv_memory_bytes: e.kv_memory_mb << 20,
        max_batched_tokens: e.max_batched_tokens,
        max_running: e.max_running,
        prefix_sharing: true,
        quant: match e.quant {
            EngineQuant::None => QuantMode::None,
            EngineQuant::Int8 => QuantMode::Int8,
            EngineQuant::Q4 => QuantMode::Q4,
        },
    }
}

/// The engine settings of a role that only scores (the reference): the recipe's KV budget
/// and token budget, always f32 (reference log-probs are exact, never quantized).
pub fn scoring_engine_config(recipe: &Recipe) -> EngineConfig {
    EngineConfig {
        quant: QuantMode::None,
        prefix_sharing: false,
        ..engine_config(recipe)
    }
}

/// Spawns the policy actor with one trainer replica per device of its group.
pub async fn spawn_policy(
    recipe: &Recipe,
    weights: &Path,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<ActorRef<PolicyMsg>, String> {
    let pg = group(&recipe.placement.policy, "policy")?;
    let mut trainers = Vec::new();
    for dev in pg.devices().map_err(|e| e.to_string())? {
        let m = CausalLm::load(weights, &dev).map_err(|e| e.to_string())?;
        let mut trainer = PolicyTrainer::new(m, recipe.rl.lr, 0.0).map_err(|e| e.to_string())?;
        trainer.max_sft_loss = recipe.guard.max_sft_loss;
        trainer.max_policy_loss = recipe.guard.max_policy_loss;
        trainer.max_update_kl = recipe.guard.max_update_kl;
        trainers.push(PolicyReplica::new(
            trainer,
            engine_config(recipe),
            recipe.engine.refit_tolerance as f32,
        )?);
    }
    let policy_replicas = Replicas::new("policy", pg.specs.clone(), trainers, pool.clone());
    monitor.report(ActorInfo::new("policy", "policy", pg.names()));
    let (policy, _) = Actor::spawn(
        Some("policy".into()),
        Policy,
        PolicyState::new(policy_replicas, monitor.clone()),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(policy)
}

/// Spawns reference, reward and (for PPO) critic next to a running policy.
pub async fn spawn_others(
    recipe: &Recipe,
    src: &RoleSources,
    policy: ActorRef<PolicyMsg>,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Roles, String> {
    let e = |e: oxalign_models::ModelError| e.to_string();
    let rg = group(&recipe.placement.reference, "reference")?;
    let refs = rg
        .devices()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|d| {
            let model = CausalLm::load(&src.reference, d).map_err(e)?;
            Engine::from_model(&model, scoring_engine_config(recipe)).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    monitor.report(ActorInfo::new("reference", "reference", rg.names()));
    let (reference, _) = Actor::spawn(
        Some("reference".into()),
        Reference,
        ReferenceState::new(
            Replicas::new("reference", rg.specs.clone(), refs, pool.clone()),
            monitor.clone(),
        ),
    )
    .await
    .map_err(|e| e.to_string())?;

    let wg = group(&recipe.placement.reward, "reward")?;
    let mut scorers = Vec::new();
    for dev in wg.devices().map_err(|e| e.to_string())? {
        scorers.push(match recipe.reward.kind {
            RewardKind::ExactMatch => Scorer::ExactMatch(ExactMatch {
                correct: recipe.reward.correct,
                incorrect: recipe.reward.incorrect,
            }),
            RewardKind::Model => {
                let p = recipe
                    .model
                    .reward_path
                    .as_deref()
                    .ok_or("model.reward_path is required for reward.kind = \"model\"")?;
                Scorer::Model(Box::new(RewardModel::load(Path::new(p), &dev).map_err(e)?))
            }
        });
    }
    monitor.report(ActorInfo::new("reward", "reward", wg.names()));
    let (reward, _) = Actor::spawn(
        Some("reward".into()),
        Reward,
        RewardState::new(
            Replicas::new("reward", wg.specs.clone(), scorers, pool.clone()),
            monitor.clone(),
        ),
    )
    .await
    .map_err(|e| e.to_string())?;

    let critic = if recipe.rl.algorithm == crate::recipe::Algorithm::Ppo {
        let cg = group(&recipe.placement.critic, "critic")?;
        let mut ts = Vec::new();
        for dev in cg.devices().map_err(|e| e.to_string())? {
            let model = match &src.critic {
                Some(p) => ValueModel::load(p, &dev).map_err(e)?,
                None => {
                    let policy = CausalLm::load(&src.reference, &dev).map_err(e)?;
                    let w: HashMap<String, Tensor> = policy.weights().map_err(|e| e.to_string())?;
                    let mut vm = ValueModel::from_backbone(
                        policy.config().clone(),
                        &w,
                        recipe.run.seed ^ 0xC217,
                        DType::F32,
                        &dev,
                    )
                    .map_err(e)?;
                    zero_value_head(&mut vm)?;
                    vm
                }
            };
            let mut trainer =
                CriticTrainer::new(model, recipe.rl.critic_lr, 0.0).map_err(|e| e.to_string())?;
            trainer.max_value_loss = recipe.guard.max_value_loss;
            ts.push(trainer);
        }
        monitor.report(ActorInfo::new("critic", "critic", cg.names()));
        let (c, _) = Actor::spawn(
            Some("critic".into()),
            Critic,
            CriticState::new(
                Replicas::new("critic", cg.specs.clone(), ts, pool.clone()),
                monitor.clone(),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
        Some(c)
    } else {
        None
    };
    Ok(Roles {
        policy,
        reference,
        reward,
        critic,
    })
}

/// A new critic starts predicting 0 everywhere, so its first advantages are the raw returns.
fn zero_value_head(vm: &mut ValueModel) -> Result<(), String> {
    for (name, var) in vm.vars() {
        if name.starts_with("score.") {
            var.set(&var.as_tensor().zeros_like().map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
