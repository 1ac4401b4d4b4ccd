//! `run.kind = "rm"`: Bradley–Terry reward-model training on the preference rows of
//! `data.path`, `[rm]` settings. The model starts from the policy's folder (`model.path`, or
//! the fresh init) with a new `score` head, is trained by the reward-model trainer role, is
//! evaluated on the held-out pairs (pairwise accuracy and margin) at the start, every
//! `rm.eval_every` steps and the end, and is saved as an HF `*ForSequenceClassification`
//! folder `<run>/final/` that `[reward] kind = "model"` loads.

use super::driver::{drive, Steps};
use super::eval::pairwise;
use super::pairs::{encode_prefs, load_prefs, sequences, EncodedPairs};
use super::report::OfflineSummary;
use super::task::{HeldOut, OfflineTask};
use crate::controller::activations::Activations;
use crate::controller::context::Ctx;
use crate::controller::error::{At, DivergenceError, RunError};
use crate::controller::lora_models::load_trained;
use crate::controller::run::saving;
use crate::error::{Cause, RoleError};
use crate::executor::ExecutorPool;
use crate::monitor::{ActorInfo, StepMetrics};
use crate::replicas::Replicas;
use crate::roles::{Local, RewardModelRole, RmTrainer, RmTrainerState};
use async_trait::async_trait;
use oxalign_data::PreferencePair;
use oxalign_models::RewardModel;
use oxalign_rlhf::trainer::RewardTrainer;
use ractor::Actor;
use std::path::PathBuf;

const KIND: &str = "RM";
const ROLE: &str = "reward_model";

/// Spawns the trainer: one replica per device of `placement.policy`.
async fn spawn(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<Box<dyn RewardModelRole>, RunError> {
    let r = ctx.recipe;
    let fail = |cause: Cause| RunError::role(At::Setup, RoleError::new(ROLE, "setup", cause));
    let g = crate::placement::DeviceGroup::parse(&r.placement.policy)
        .map_err(|e| fail(Cause::placement("policy", e)))?;
    let devices = g
        .devices()
        .map_err(|e| fail(Cause::placement("policy", e)))?;
    let mut trainers = Vec::new();
    for dev in devices {
        let seed = r.run.seed ^ 0x5C0E;
        let mut m = load_trained(r, ctx.policy_dir, None, seed, |d| {
            Ok(RewardModel::load_with_new_head(d, seed, &dev)?)
        })
        .map_err(&fail)?;
        m.set_precision(r.model.precision);
        let mut t = RewardTrainer::new(m, r.rm.lr, 0.0).map_err(|e| fail(e.into()))?;
        t.max_loss = r.guard.max_policy_loss;
        match Activations::of(r, dev.is_cpu()) {
            Activations::Recompute => t.checkpoint_activations(),
            Activations::Layerwise => t.layerwise_backward(),
            Activations::Plain => {}
        }
        trainers.push(t);
    }
    ctx.monitor.report(ActorInfo::new(ROLE, ROLE, g.names()));
    let state = RmTrainerState::new(
        Replicas::new(ROLE, g.specs.clone(), trainers, pool.clone()).map_err(&fail)?,
        ctx.monitor.clone(),
    );
    let (actor, _) = Actor::spawn(Some(ROLE.into()), RmTrainer, state)
        .await
        .map_err(|e| fail(e.into()))?;
    Ok(Box::new(Local::new(ROLE, actor, ctx.timeout)))
}

/// Bradley–Terry training of a reward model; held out: pairwise accuracy and margin.
struct Rm {
    rm: Box<dyn RewardModelRole>,
    eval: EncodedPairs,
}

#[async_trait]
impl OfflineTask for Rm {
    type Row = PreferencePair;

    fn name(&self) -> &'static str {
        "rm"
    }

    async fn train(
        &self,
        ctx: &Ctx<'_>,
        rows: &[PreferencePair],
        step: u64,
        lr: f64,
    ) -> Result<StepMetrics, RunError> {
        let at = At::Train { kind: KIND, step };
        let (c, rj) = encode_prefs(ctx, at, rows)?;
        let (chosen, rejected) = (sequences(ctx, c), sequences(ctx, rj));
        let max_grad_norm = ctx.recipe.rl.max_grad_norm;
        let done = self
            .rm
            .train(chosen, rejected, lr, max_grad_norm)
            .await
            .map_err(RunError::at(at))?;
        if let Some(cause) = done.diverged {
            let e = DivergenceError {
                role: ROLE,
                phase: "rm_train",
                kind: crate::recipe::RunKind::Rm,
                step,
                cause,
                lower: "rm.lr",
            };
            return Err(e.into());
        }
        Ok(StepMetrics::new(step)
            .with("loss", done.stats.loss)
            .with("accuracy", done.stats.accuracy)
            .with("margin", done.stats.reward_margin)
            .with("grad_norm", done.grad_norm)
            .with("lr", lr))
    }

    async fn evaluate(&self, ctx: &Ctx<'_>) -> Result<Option<HeldOut>, RunError> {
        if self.eval.0.is_empty() {
            return Ok(None);
        }
        let mut scores = Vec::new();
        for side in [&self.eval.0, &self.eval.1] {
            let mut all = Vec::new();
            for chunk in side.chunks(64) {
                let seqs = sequences(ctx, chunk.to_vec());
                let s = self.rm.score(seqs).await;
                all.extend(s.map_err(RunError::at(At::Eval("eval")))?);
            }
            scores.push(all);
        }
        let (acc, margin) = pairwise(&scores[0], &scores[1]);
        Ok(Some((
            vec![("eval_accuracy", acc), ("eval_margin", margin)],
            format!("held-out accuracy {acc:.3}  margin {margin:.3}"),
        )))
    }

    async fn save(&self, ctx: &Ctx<'_>) -> Result<PathBuf, RunError> {
        let dir = saving::final_dir(ctx.run_dir)?;
        let saved = self.rm.save_model(dir.clone()).await;
        saved.map_err(RunError::at(At::Setup))?;
        saving::seal_model(ctx, &dir)?;
        Ok(dir)
    }

    fn shutdown(&self) {
        self.rm.shutdown();
    }
}

/// Runs the reward-model steps and saves the model.
pub(crate) async fn run(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<OfflineSummary, RunError> {
    let data = load_prefs(ctx)?;
    let eval = encode_prefs(ctx, At::Eval("eval"), data.eval_items())?;
    let rm = spawn(ctx, pool).await?;
    let s = &ctx.recipe.rm;
    let steps = Steps {
        steps: s.steps,
        batch_size: s.batch_size,
        lr: s.lr,
        warmup_steps: s.warmup_steps,
        eval_every: s.eval_every,
    };
    drive(ctx, &Rm { rm, eval }, &data, KIND, steps).await
}
