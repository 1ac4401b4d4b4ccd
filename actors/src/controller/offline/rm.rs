//! `run.kind = "rm"`: Bradley–Terry reward-model training on the preference rows of
//! `data.path`, `[rm]` settings. The model starts from the policy's folder (`model.path`, or
//! the fresh init) with a new `score` head, is trained by the reward-model trainer role, is
//! evaluated on the held-out pairs (pairwise accuracy and margin) at the start, every
//! `rm.eval_every` steps and the end, and is saved as an HF `*ForSequenceClassification`
//! folder `<run>/final/` that `[reward] kind = "model"` loads.

use super::cadence::{eval_progress, evaluates, schedule};
use super::eval::pairwise;
use super::eval_log::EvalLog;
use super::pairs::{encode_prefs, load_prefs, EncodedPairs};
use super::pairs::{sequences, step_rows};
use super::report::OfflineSummary;
use crate::controller::context::Ctx;
use crate::controller::error::DivergenceError;
use crate::controller::error::{At, RunError};
use crate::controller::run::saving;
use crate::error::{Cause, RoleError};
use crate::executor::ExecutorPool;
use crate::monitor::{ActorInfo, StepMetrics};
use crate::replicas::Replicas;
use crate::roles::{ask, RmTrainer, RmTrainerMsg, RmTrainerState};
use oxalign_models::RewardModel;
use oxalign_rlhf::data::PreferencePair;
use oxalign_rlhf::trainer::RewardTrainer;
use ractor::{Actor, ActorRef};

const KIND: &str = "RM";
const ROLE: &str = "reward_model";

/// Spawns the trainer: one replica per device of `placement.policy`.
async fn spawn(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<ActorRef<RmTrainerMsg>, RunError> {
    let r = ctx.recipe;
    let fail = |cause: Cause| RunError::role(At::Setup, RoleError::new(ROLE, "setup", cause));
    let g = crate::placement::DeviceGroup::parse(&r.placement.policy)
        .map_err(|e| fail(Cause::BadInput(format!("placement.policy: {e}"))))?;
    let devices = g
        .devices()
        .map_err(|e| fail(Cause::BadInput(format!("placement.policy: {e}"))))?;
    let mut trainers = Vec::new();
    for dev in devices {
        let m = RewardModel::load_with_new_head(ctx.policy_dir, r.run.seed ^ 0x5C0E, &dev)
            .map_err(|e| fail(e.into()))?;
        let mut t = RewardTrainer::new(m, r.rm.lr, 0.0).map_err(|e| fail(e.into()))?;
        t.max_loss = r.guard.max_policy_loss;
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
    Ok(actor)
}

/// Held-out pairwise accuracy and mean margin of the reward model.
async fn evaluate(
    ctx: &Ctx<'_>,
    rm: &ActorRef<RmTrainerMsg>,
    eval: &EncodedPairs,
) -> Result<(f64, f64), RunError> {
    let mut scores = Vec::new();
    for side in [&eval.0, &eval.1] {
        let mut all = Vec::new();
        for chunk in side.chunks(64) {
            let seqs = sequences(ctx, chunk.to_vec());
            let s = ask(ROLE, "rm_score", rm, ctx.timeout, |reply| {
                RmTrainerMsg::Score { seqs, reply }
            })
            .await
            .map_err(RunError::at(At::Eval("eval")))?;
            all.extend(s);
        }
        scores.push(all);
    }
    Ok(pairwise(&scores[0], &scores[1]))
}

/// One update on `rows`; its metrics, or the divergence that stopped it.
async fn train_step(
    ctx: &Ctx<'_>,
    rm: &ActorRef<RmTrainerMsg>,
    rows: &[PreferencePair],
    step: u64,
    lr: f64,
) -> Result<StepMetrics, RunError> {
    let at = At::Train { kind: KIND, step };
    let (c, rj) = encode_prefs(ctx, at, rows)?;
    let (chosen, rejected) = (sequences(ctx, c), sequences(ctx, rj));
    let done = ask(ROLE, "rm_train", rm, ctx.timeout, |reply| {
        RmTrainerMsg::Train {
            chosen,
            rejected,
            lr,
            max_grad_norm: ctx.recipe.rl.max_grad_norm,
            reply,
        }
    })
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

/// Runs the reward-model steps and saves the model.
pub(crate) async fn run(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<OfflineSummary, RunError> {
    let r = ctx.recipe;
    let data = load_prefs(ctx)?;
    let eval = encode_prefs(ctx, At::Eval("eval"), data.eval_items())?;
    let rm = spawn(ctx, pool).await?;
    let s = &r.rm;
    let lr_at = schedule(s.lr, s.warmup_steps, s.steps);
    let mut log = EvalLog::default();
    for step in 0..=s.steps {
        let mut m = StepMetrics::new(step);
        if step > 0 {
            let at = At::Train { kind: KIND, step };
            let rows = step_rows(&data, step, s.batch_size, at)?;
            m = train_step(ctx, &rm, &rows, step, lr_at.lr_at(step - 1)).await?;
        }
        if !eval.0.is_empty() && (step == 0 || evaluates(step, s.steps, s.eval_every)) {
            let (acc, margin) = evaluate(ctx, &rm, &eval).await?;
            m = log.record(step, &[("eval_accuracy", acc), ("eval_margin", margin)], m);
            eval_progress(
                ctx,
                "rm",
                (step, s.steps),
                &m,
                format!("held-out accuracy {acc:.3}  margin {margin:.3}"),
            );
        }
        if step > 0 {
            ctx.monitor.report(m);
        }
    }
    let dir = saving::final_dir(ctx.run_dir)?;
    ask(ROLE, "save", &rm, ctx.timeout, |reply| RmTrainerMsg::Save {
        dir: dir.clone(),
        reply,
    })
    .await
    .map_err(RunError::at(At::Setup))?;
    saving::seal_model(ctx, &dir)?;
    rm.stop(None);
    Ok(OfflineSummary {
        kind: "rm".into(),
        steps: s.steps,
        eval_first: log.first,
        eval_last: log.last,
        data: data.report().clone(),
        model_dir: dir,
    })
}
