//! Building a run from its recipe: the policy model folder (loaded, or freshly initialised
//! inside the run folder), the tokenizer, the prompt source, and the role actors on their
//! device groups. A role whose placement names a node (`"node1:cpu"`) is built by that
//! node's worker instead and reached through [`Remote`].

use crate::cluster::{Remote, RemoteSources, RoleKind};
use crate::controller::activations::Activations;
use crate::controller::error::{At, RunError};
use crate::controller::lora_models::{load_trained, policy_model};
use crate::controller::shared_reference::{base_as_reference, start_reference};
use crate::error::{Cause, Missing, RoleError};
use crate::executor::ExecutorPool;
use crate::monitor::{ActorInfo, MonitorHandle};
use crate::placement::{DeviceGroup, PlacementError, RolePlacement};
use crate::recipe::{Recipe, RewardKeyError, RewardKind, Sharding, TaskKind};
use crate::replicas::Replicas;
use crate::roles::reward::http::HttpReward;
use crate::roles::{
    spawn_local_policy, Critic, CriticRole, CriticState, EngineReplica, EngineRole, Local,
    PolicyReplica, PolicyRole, ReferenceModel, ReferenceRole, Reward, RewardRole, RewardState,
    Scorer, Scoring, ENGINE_LANE,
};
use candle_core::{DType, Tensor};
use oxalign_data::{ArithmeticTask, DataSpec, PromptFile, PromptSource};
use oxalign_kernels::collective::Collective;
use oxalign_kernels::device::DeviceSpec;
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::{
    init_model_dir, CausalLm, Family, InitError, InitHead, InitSpec, InitTokenizer, Preset,
    RewardModel, ValueModel,
};
use oxalign_rlhf::reward::ExactMatch;
use oxalign_rlhf::trainer::{CriticTrainer, Packing, PolicyTrainer, Sharded};
use ractor::Actor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The running roles of one run, behind their traits (`roles/api.rs`): the loop does not
/// know how a role is served (a local actor over executors, [`Local`], or a role on a
/// worker node, [`Remote`]).
pub struct Roles {
    /// Policy.
    pub policy: Arc<dyn PolicyRole>,
    /// Reference.
    pub reference: Arc<dyn ReferenceRole>,
    /// Reward.
    pub reward: Arc<dyn RewardRole>,
    /// Critic (PPO only).
    pub critic: Option<Arc<dyn CriticRole>>,
    /// The policy's rollout engine as a role of its own (`placement.engine`); `None` when
    /// the policy's engine lives with its trainers.
    pub engine: Option<Arc<dyn EngineRole>>,
}

impl Roles {
    /// Who generates rollouts: the engine role, or the policy.
    pub fn generator(&self) -> crate::controller::generator::Generator<'_> {
        crate::controller::generator::Generator::new(&*self.policy, self.engine.as_deref())
    }

    /// Stops every role at the end of the run (together); their last reports reach the
    /// monitor first.
    pub async fn finish(&self) {
        let engine = async {
            if let Some(e) = &self.engine {
                e.finish().await;
            }
        };
        let critic = async {
            if let Some(c) = &self.critic {
                c.finish().await;
            }
        };
        futures::join!(
            self.policy.finish(),
            self.reference.finish(),
            self.reward.finish(),
            engine,
            critic
        );
    }
}

/// The policy's model folder: the recipe's `model.path`, or a fresh model written to
/// `<run>/init` by `oxalign_models::init_model_dir` (created once; a resumed run reuses it).
/// The byte tokenizer stops at eos only here (`InitTokenizer::BytePlainText`), as the tuned
/// recipes expect; with `[env]` it also stops at `<|im_end|>`, the end of a chat turn, so an
/// episode's turn ends where its chat template ends one.
pub fn policy_dir(recipe: &Recipe, run_dir: &Path) -> Result<PathBuf, RunError> {
    if let Some(p) = &recipe.model.path {
        return Ok(PathBuf::from(p));
    }
    let dir = run_dir.join("init");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let fail = |cause: Cause| RunError::controller(At::Setup, "init_model", cause);
    let bad = |key, source| fail(Cause::UnknownName { key, source });
    let family: Family = recipe
        .model
        .init_family
        .parse()
        .map_err(|e| bad("model.init_family", e))?;
    let preset: Preset = recipe
        .model
        .init_preset
        .parse()
        .map_err(|e| bad("model.init_preset", e))?;
    let spec = InitSpec {
        family,
        preset,
        head: InitHead::Lm,
        seed: recipe.run.seed,
        tokenizer: match recipe.env {
            Some(_) => InitTokenizer::Byte,
            None => InitTokenizer::BytePlainText,
        },
    };
    init_model_dir(&dir, &spec).map_err(|e| match e {
        InitError::Model(e) => fail(e.into()),
        InitError::Io {
            action,
            path,
            source,
        } => fail(Cause::io(action, &path, source)),
        other => fail(Cause::InitModel(other)),
    })?;
    Ok(dir)
}

/// The folder the reference role loads: the teacher of `rl.algorithm = "distill"`, after
/// checking that it has the policy's vocabulary (a bad-input error naming
/// `model.teacher_path` if not); else the policy as RL starts, `<run>/reference/`.
pub(crate) fn reference_weights(ctx: &super::Ctx<'_>) -> Result<PathBuf, RunError> {
    let Some(teacher) = &ctx.recipe.model.teacher_path else {
        return Ok(ctx.run_dir.join("reference"));
    };
    crate::recipe::same_vocabulary(ctx.policy_dir, Path::new(teacher)).map_err(|source| {
        let path = teacher.clone();
        RunError::controller(At::Setup, "teacher", Cause::Teacher { path, source })
    })?;
    Ok(PathBuf::from(teacher))
}

/// Where the recipe's data file comes from and how it is split and checked.
pub fn data_spec(recipe: &Recipe) -> Result<DataSpec, RunError> {
    let path = recipe.data.path.as_deref().ok_or_else(|| {
        RunError::controller(
            At::Setup,
            "data",
            Missing::Key {
                key: "data.path",
                detail: "(a JSONL or Parquet file)",
            },
        )
    })?;
    Ok(DataSpec {
        path: PathBuf::from(path),
        eval_path: recipe.data.eval_path.as_ref().map(PathBuf::from),
        eval_fraction: recipe.data.eval_fraction,
        seed: recipe.run.seed,
        on_bad_row: recipe.data.on_bad_row,
        answer_field: recipe.data.answer_field.clone(),
    })
}

/// The prompt source of the recipe; `tok` renders chat-message prompts. A prompts file must
/// carry the reference answers the recipe needs (`data_check.rs`).
pub fn prompt_source(recipe: &Recipe, tok: &Tokenizer) -> Result<Arc<dyn PromptSource>, RunError> {
    let fail = |cause: Cause| RunError::controller(At::Setup, "data", cause);
    Ok(match recipe.data.task {
        TaskKind::Arithmetic => Arc::new(ArithmeticTask::new(
            recipe.run.seed,
            recipe.data.max_operand,
            recipe.data.eval_size,
        )),
        TaskKind::Jsonl | TaskKind::File => {
            let spec = data_spec(recipe)?;
            let file = PromptFile::load(&spec, Some(tok)).map_err(|e| fail(Cause::from(e)))?;
            crate::controller::offline::report::print_data_report(recipe, file.report());
            crate::controller::data_check::require_answers(recipe, &spec.path, file.answers())?;
            Arc::new(file)
        }
    })
}

/// The device group of `role` (`placement.<role>`), with its devices opened.
fn group(
    spec: &str,
    role: &'static str,
) -> Result<(DeviceGroup, Vec<candle_core::Device>), RoleError> {
    let bad = |e: PlacementError| RoleError::new(role, "setup", Cause::placement(role, e));
    let g = DeviceGroup::parse(spec).map_err(bad)?;
    let devices = g.devices().map_err(|e| bad(e.into()))?;
    Ok((g, devices))
}

/// A failure while building `role`'s replicas.
fn setup_failed(role: &'static str) -> impl Fn(Cause) -> RunError {
    move |cause| RunError::role(At::Setup, RoleError::new(role, "setup", cause))
}

/// Where the weights of each role come from when the actors start.
pub(crate) struct RoleSources {
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
        prefix_cache: e.prefix_cache,
        quant: e.quant,
    }
}

/// The engine settings of a role that only scores (the reference): the recipe's KV budget
/// and token budget, always f32 (reference log-probs are exact, never quantized).
pub(crate) fn scoring_engine_config(recipe: &Recipe) -> EngineConfig {
    EngineConfig {
        quant: QuantMode::None,
        prefix_sharing: false,
        prefix_cache: false,
        ..engine_config(recipe)
    }
}

/// Shards `trainer` as `rank` of `world` when the recipe says `placement.sharding =
/// "sharded"`, its layers streamed over `group` (the role's collective group, `None` for a
/// group of one).
fn shard_if(
    recipe: &Recipe,
    trainer: &mut impl Sharded,
    rank: usize,
    world: usize,
    group: Option<&[Arc<dyn Collective>]>,
) -> Result<(), Cause> {
    if recipe.placement.sharding == Sharding::Sharded {
        let handle = group.and_then(|g| g.get(rank)).cloned();
        trainer.shard(rank, world, handle)?;
    }
    Ok(())
}

/// The collective group of a role's replicas over `specs`: `None` for one replica.
fn replica_group(
    specs: &[DeviceSpec],
    pool: &ExecutorPool,
) -> Result<Option<Vec<Arc<dyn Collective>>>, Cause> {
    match specs.len() > 1 {
        true => crate::replicas::collective_group(specs, pool).map(Some),
        false => Ok(None),
    }
}

/// The role `kind` built by the worker of the node its placement names, or `None` when the
/// placement names no node (the role lives in this process).
async fn on_node(
    recipe: &Recipe,
    kind: RoleKind,
    placement: &str,
    src: RemoteSources<'_>,
    monitor: &MonitorHandle,
) -> Result<Option<Remote>, RunError> {
    let Some(node) = RolePlacement::parse(placement).node else {
        return Ok(None);
    };
    let remote = Remote::spawn(recipe, kind, node, src, monitor).await;
    remote.map(Some).map_err(RunError::at(At::Setup))
}

/// The policy's trainer for one device: the model at `weights`, with the recipe's guards,
/// packing, router loss and precision.
fn policy_trainer(
    recipe: &Recipe,
    weights: &Path,
    dev: &candle_core::Device,
) -> Result<PolicyTrainer, Cause> {
    let m = policy_model(recipe, weights, dev)?;
    if recipe.rl.routing_replay && m.config().moe.is_none() {
        return Err(Cause::RoutingReplayDense {
            weights: weights.to_path_buf(),
        });
    }
    let mut trainer = PolicyTrainer::new(m, recipe.rl.lr, 0.0)?;
    trainer.max_sft_loss = recipe.guard.max_sft_loss;
    trainer.max_policy_loss = recipe.guard.max_policy_loss;
    trainer.max_update_kl = recipe.guard.max_update_kl;
    trainer.rollout_distribution = recipe.scoring_distribution();
    trainer.packing = Packing {
        sft: recipe.sft.packing,
        rl: recipe.rl.packing,
    };
    if let Some(coef) = recipe.model.router_aux_loss_coef {
        trainer.router_aux_loss_coef = coef;
    }
    trainer.model.set_precision(recipe.policy_precision());
    match Activations::of(recipe, dev.is_cpu()) {
        Activations::Recompute => trainer.checkpoint_activations()?,
        Activations::Layerwise => trainer.layerwise_backward()?,
        Activations::Plain => {}
    }
    Ok(trainer)
}

/// Spawns the policy actor with one trainer replica per device of its group.
pub(crate) async fn spawn_policy(
    recipe: &Recipe,
    weights: &Path,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Arc<dyn PolicyRole>, RunError> {
    let src = RemoteSources {
        weights: Some(weights),
        critic: None,
    };
    let p = &recipe.placement.policy;
    if let Some(r) = on_node(recipe, RoleKind::Policy, p, src, monitor).await? {
        return Ok(Arc::new(r));
    }
    let fail = setup_failed("policy");
    let (pg, devices) =
        group(&recipe.placement.policy, "policy").map_err(RunError::at(At::Setup))?;
    let (mut trainers, mut engines) = (Vec::new(), Vec::new());
    let world = devices.len();
    let experts =
        crate::controller::expert_setup::ExpertGroups::for_recipe(recipe, &pg.specs, pool)
            .map_err(&fail)?;
    // The trainers' group exists before the trainers: a sharded trainer streams its layers
    // over it.
    let dp_group = match &experts {
        Some(_) => None,
        None => replica_group(&pg.specs, pool).map_err(&fail)?,
    };
    for (rank, dev) in devices.into_iter().enumerate() {
        let mut trainer = policy_trainer(recipe, weights, &dev).map_err(&fail)?;
        // With `placement.engine` the engine is a role of its own (`spawn_engine`).
        if recipe.placement.engine.is_none() {
            let mut engine = match &experts {
                Some(g) => g.spread(rank, &mut trainer, weights, engine_config(recipe)),
                None => EngineReplica::new(&trainer.model, engine_config(recipe)),
            }
            .map_err(&fail)?;
            engine.record_routing = recipe.rl.routing_replay;
            engines.push(engine);
        }
        let mut replica = PolicyReplica::new(trainer, recipe.engine.refit_tolerance as f32);
        // After the engine took its copy: a sharded trainer frees its full weights here.
        shard_if(
            recipe,
            &mut replica.trainer,
            rank,
            world,
            dp_group.as_deref(),
        )
        .map_err(&fail)?;
        trainers.push(replica);
    }
    let (trainer_group, engine_group) = match experts {
        Some(g) => (Some(g.trainers), Some(g.engines)),
        None if world > 1 => (
            dp_group,
            Some(crate::replicas::collective_group(&pg.specs, pool).map_err(&fail)?),
        ),
        None => (None, None),
    };
    let (specs, p) = (pg.specs.clone(), pool.clone());
    let policy_replicas =
        Replicas::with_group("policy", specs.clone(), trainers, p.clone(), trainer_group);
    let engines = (!engines.is_empty()).then(|| {
        Replicas::with_group("policy", specs, engines, p, engine_group).on_lane(ENGINE_LANE)
    });
    monitor.report(ActorInfo::new("policy", "policy", pg.names()));
    let timeout = recipe.supervision.call_timeout();
    let name = Some("policy".to_string());
    spawn_local_policy(name, policy_replicas, engines, monitor.clone(), timeout)
        .await
        .map_err(RunError::at(At::Setup))
}

/// The engine role of `placement.engine`, serving the weights in `weights` (the policy's
/// folder), or `None` when the recipe has none: one engine per device of its group, or a
/// [`Remote`] one when the placement names a node.
pub(crate) async fn spawn_engine(
    recipe: &Recipe,
    weights: &Path,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Option<Arc<dyn EngineRole>>, RunError> {
    let Some(p) = &recipe.placement.engine else {
        return Ok(None);
    };
    let src = RemoteSources {
        weights: Some(weights),
        critic: None,
    };
    if let Some(r) = on_node(recipe, RoleKind::Engine, p, src, monitor).await? {
        return Ok(Some(Arc::new(r)));
    }
    let name = crate::roles::ENGINE_ROLE;
    let fail = setup_failed(name);
    let (eg, devices) = group(p, name).map_err(RunError::at(At::Setup))?;
    // With LoRA the engine role keeps the policy's model as the trainer builds it (frozen
    // base and adapters) and takes the adapters alone at each refit.
    let engines = devices
        .iter()
        .map(|d| match recipe.lora {
            Some(_) => EngineReplica::with_adapters(
                policy_model(recipe, weights, d)?,
                engine_config(recipe),
            ),
            None => EngineReplica::new(&CausalLm::load(weights, d)?, engine_config(recipe)),
        })
        .collect::<Result<Vec<_>, Cause>>()
        .map_err(&fail)?;
    let replicas = Replicas::new(name, eg.specs.clone(), engines, pool.clone()).map_err(&fail)?;
    monitor.report(ActorInfo::new(name, name, eg.names()));
    let state = crate::roles::EngineState::new(replicas.on_lane(ENGINE_LANE), monitor.clone());
    let (engine, _) = Actor::spawn(Some(name.into()), crate::roles::RolloutEngine, state)
        .await
        .map_err(|e| fail(e.into()))?;
    let timeout = recipe.supervision.call_timeout();
    Ok(Some(Arc::new(Local::new(name, engine, timeout))))
}

/// Spawns reference, reward and (for PPO) critic next to a running policy (and its engine
/// role, when the recipe places one).
pub(crate) async fn spawn_others(
    recipe: &Recipe,
    src: &RoleSources,
    policy: Arc<dyn PolicyRole>,
    engine: Option<Arc<dyn EngineRole>>,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Roles, RunError> {
    let shared = base_as_reference(recipe, policy.as_ref(), &src.reference, monitor, pool);
    let reference = match shared.await? {
        Some(r) => r,
        None => spawn_reference(recipe, &src.reference, monitor, pool).await?,
    };
    let reward = spawn_reward(recipe, monitor, pool).await?;
    let critic = if recipe.rl.algorithm == crate::recipe::Algorithm::Ppo {
        Some(spawn_critic(recipe, src, monitor, pool).await?)
    } else {
        None
    };
    Ok(Roles {
        policy,
        reference,
        reward,
        critic,
        engine,
    })
}

/// The frozen reference: one f32 scoring engine per device of its group.
pub(crate) async fn spawn_reference(
    recipe: &Recipe,
    weights: &Path,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Arc<dyn ReferenceRole>, RunError> {
    let src = RemoteSources {
        weights: Some(weights),
        critic: None,
    };
    let p = &recipe.placement.reference;
    if let Some(r) = on_node(recipe, RoleKind::Reference, p, src, monitor).await? {
        return Ok(Arc::new(r));
    }
    let fail = setup_failed("reference");
    let (rg, devices) =
        group(&recipe.placement.reference, "reference").map_err(RunError::at(At::Setup))?;
    let refs = devices
        .iter()
        .map(|d| {
            let model = CausalLm::load(weights, d)?;
            let engine = Engine::from_model(&model, scoring_engine_config(recipe))?;
            Ok(ReferenceModel::Engine(engine))
        })
        .collect::<Result<Vec<_>, Cause>>()
        .map_err(&fail)?;
    start_reference(recipe, &rg, refs, monitor, pool).await
}

/// The reward: verifiers or a reward model per device of its group, or the client of a
/// reward service (which needs no device).
pub(crate) async fn spawn_reward(
    recipe: &Recipe,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Arc<dyn RewardRole>, RunError> {
    let (p, src) = (&recipe.placement.reward, RemoteSources::default());
    if let Some(r) = on_node(recipe, RoleKind::Reward, p, src, monitor).await? {
        return Ok(Arc::new(r));
    }
    let fail = setup_failed("reward");
    let (wg, devices) =
        group(&recipe.placement.reward, "reward").map_err(RunError::at(At::Setup))?;
    let w = &recipe.reward;
    let bad_key = |e: RewardKeyError| fail(e.into());
    let one_per_device = |make: &dyn Fn() -> Scorer| devices.iter().map(|_| make()).collect();
    let scorers: Vec<Scorer> = match w.kind {
        RewardKind::ExactMatch => one_per_device(&|| {
            Scorer::ExactMatch(ExactMatch {
                correct: w.correct,
                incorrect: w.incorrect,
            })
        }),
        RewardKind::Verifiers => {
            let v = w.build_verifiers().map_err(bad_key)?;
            one_per_device(&|| Scorer::Verifiers(v.clone()))
        }
        RewardKind::Model => {
            let p = recipe.model.reward_path.as_deref().ok_or_else(|| {
                fail(Cause::Missing(Missing::Key {
                    key: "model.reward_path",
                    detail: "for reward.kind = \"model\"",
                }))
            })?;
            let load = |dev| RewardModel::load(Path::new(p), dev).map_err(|e| fail(e.into()));
            let models: Result<Vec<_>, _> = devices.iter().map(load).collect();
            models?
                .into_iter()
                .map(|m| Scorer::Model(Box::new(m)))
                .collect()
        }
        RewardKind::Http | RewardKind::Python => Vec::new(),
    };
    let mut server = None;
    let scoring = match w.kind {
        RewardKind::Http | RewardKind::Python => {
            let mut cfg = w.service_config().map_err(bad_key)?;
            if let Some(section) = &w.python {
                let (child, url) = crate::roles::reward::python::start(section)
                    .await
                    .map_err(bad_key)?;
                cfg.url = url;
                server = Some(child);
            }
            Scoring::Service(Arc::new(HttpReward::new(cfg).map_err(|e| fail(e.into()))?))
        }
        _ => Scoring::Local(
            Replicas::new("reward", wg.specs.clone(), scorers, pool.clone()).map_err(&fail)?,
        ),
    };
    monitor.report(ActorInfo::new("reward", "reward", wg.names()));
    let (reward, _) = Actor::spawn(
        Some("reward".into()),
        Reward,
        RewardState::with(scoring, monitor.clone()).serving(server),
    )
    .await
    .map_err(|e| fail(e.into()))?;
    let timeout = recipe.supervision.call_timeout();
    Ok(Arc::new(Local::new("reward", reward, timeout)))
}

/// The critic (PPO): a value model and its trainer per device of its group, from
/// `src.critic` or from the reference's backbone with a zeroed value head.
pub(crate) async fn spawn_critic(
    recipe: &Recipe,
    src: &RoleSources,
    monitor: &MonitorHandle,
    pool: &ExecutorPool,
) -> Result<Arc<dyn CriticRole>, RunError> {
    let remote_src = RemoteSources {
        weights: Some(&src.reference),
        critic: src.critic.as_deref(),
    };
    let p = &recipe.placement.critic;
    if let Some(r) = on_node(recipe, RoleKind::Critic, p, remote_src, monitor).await? {
        return Ok(Arc::new(r));
    }
    let fail = setup_failed("critic");
    let (cg, devices) =
        group(&recipe.placement.critic, "critic").map_err(RunError::at(At::Setup))?;
    let mut ts = Vec::new();
    let world = devices.len();
    let cgroup = replica_group(&cg.specs, pool).map_err(&fail)?;
    for (rank, dev) in devices.into_iter().enumerate() {
        let mut model = critic_model(recipe, src, &dev).map_err(&fail)?;
        model.set_precision(recipe.model.precision);
        let mut trainer =
            CriticTrainer::new(model, recipe.rl.critic_lr, 0.0).map_err(|e| fail(e.into()))?;
        trainer.max_value_loss = recipe.guard.max_value_loss;
        trainer.packing = recipe.rl.packing;
        match Activations::of(recipe, dev.is_cpu()) {
            Activations::Recompute => trainer.checkpoint_activations(),
            Activations::Layerwise => trainer.layerwise_backward(),
            Activations::Plain => Ok(()),
        }
        .map_err(|e| fail(e.into()))?;
        shard_if(recipe, &mut trainer, rank, world, cgroup.as_deref()).map_err(&fail)?;
        ts.push(trainer);
    }
    monitor.report(ActorInfo::new("critic", "critic", cg.names()));
    let (c, _) = Actor::spawn(
        Some("critic".into()),
        Critic,
        CriticState::new(
            Replicas::with_group("critic", cg.specs.clone(), ts, pool.clone(), cgroup),
            monitor.clone(),
        ),
    )
    .await
    .map_err(|e| fail(e.into()))?;
    let timeout = recipe.supervision.call_timeout();
    Ok(Arc::new(Local::new("critic", c, timeout)))
}

/// A value model on the backbone of the policy at `weights`, predicting 0 everywhere.
/// The critic of one device: `model.critic_path` (a reward model has `score.weight` but no
/// bias: the bias starts at zero) or the policy's backbone, with `[lora]`'s adapters.
fn critic_model(
    recipe: &Recipe,
    src: &RoleSources,
    dev: &candle_core::Device,
) -> Result<ValueModel, Cause> {
    let seed = recipe.run.seed ^ 0xC217;
    match &src.critic {
        Some(p) => load_trained(recipe, p, None, seed, |d| {
            Ok(ValueModel::load_with_new_head(d, seed, dev)?)
        }),
        None => load_trained(recipe, &src.reference, None, seed, |d| {
            critic_from_backbone(recipe, d, dev)
        }),
    }
}

fn critic_from_backbone(
    recipe: &Recipe,
    weights: &Path,
    dev: &candle_core::Device,
) -> Result<ValueModel, Cause> {
    let policy = CausalLm::load(weights, dev)?;
    let w: HashMap<String, Tensor> = policy.weights()?;
    let mut vm = ValueModel::from_backbone(
        policy.config().clone(),
        &w,
        recipe.run.seed ^ 0xC217,
        DType::F32,
        dev,
    )?;
    zero_value_head(&mut vm)?;
    Ok(vm)
}

/// A new critic starts predicting 0 everywhere, so its first advantages are the raw returns.
fn zero_value_head(vm: &mut ValueModel) -> Result<(), Cause> {
    for (name, var) in vm.vars() {
        if name.starts_with("score.") {
            var.set(&var.as_tensor().zeros_like()?)?;
        }
    }
    Ok(())
}
