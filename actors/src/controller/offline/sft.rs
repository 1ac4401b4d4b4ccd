//! `run.kind = "sft"`: supervised fine-tuning on the SFT rows of `data.path` (loss on the
//! response only), `[sft]` settings, with the held-out NLL per response token measured at
//! the start, every `sft.eval_every` steps and at the end (no mid-run checkpoints).
//! The model is saved as `<run>/final/`.

use super::cadence::{eval_progress, evaluates, schedule};
use super::eval::mean_nll;
use super::eval_log::EvalLog;
use super::pairs::TokenPair;
use super::pairs::{encode_pair, sequences, step_rows};
use super::report::{print_data_report, OfflineSummary};
use crate::controller::context::Ctx;
use crate::controller::error::DivergenceError;
use crate::controller::error::{At, RunError};
use crate::controller::run::saving::save_final_policy;
use crate::controller::setup;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::monitor::StepMetrics;
use crate::roles::PolicyRole;
use oxalign_rlhf::data::{Dataset, SftRow};
use oxalign_rlhf::RlhfError;

const KIND: &str = "SFT";

/// One SFT step on `rows`; its metrics, or the divergence that stopped it.
async fn train_step(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    rows: &[SftRow],
    step: u64,
    lr: f64,
) -> Result<StepMetrics, RunError> {
    let at = At::Train { kind: KIND, step };
    let seqs = sequences(ctx, encode_all(ctx, at, rows)?);
    let done = policy
        .sft(seqs, lr, ctx.recipe.rl.max_grad_norm)
        .await
        .map_err(RunError::at(at))?;
    if let Some(cause) = done.diverged {
        let e = DivergenceError {
            role: "policy",
            phase: "sft",
            kind: crate::recipe::RunKind::Sft,
            step,
            cause,
            lower: "sft.lr",
        };
        return Err(e.into());
    }
    Ok(StepMetrics::new(step)
        .with("loss", done.nll)
        .with("grad_norm", done.grad_norm)
        .with("lr", lr))
}

/// Runs the SFT steps and saves the model.
pub(crate) async fn run(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<OfflineSummary, RunError> {
    let r = ctx.recipe;
    let data = Dataset::<SftRow>::load(&setup::data_spec(r)?, Some(ctx.tok))
        .map_err(|e| RunError::controller(At::Setup, "data", Cause::from(RlhfError::from(e))))?;
    print_data_report(r, data.report());
    let eval = encode_all(ctx, At::Eval("eval"), data.eval_items())?;
    let policy = setup::spawn_policy(r, ctx.policy_dir, ctx.monitor, pool).await?;
    let s = &r.sft;
    let lr_at = schedule(s.lr, s.warmup_steps, s.steps);
    let mut log = EvalLog::default();
    for step in 0..=s.steps {
        let mut m = StepMetrics::new(step);
        if step > 0 {
            let at = At::Train { kind: KIND, step };
            let rows = step_rows(&data, step, s.batch_size, at)?;
            m = train_step(ctx, &*policy, &rows, step, lr_at.lr_at(step - 1)).await?;
        }
        if !eval.is_empty() && (step == 0 || evaluates(step, s.steps, s.eval_every)) {
            let nll = mean_nll(ctx, &*policy, At::Eval("eval"), &eval).await?;
            m = log.record(step, &[("eval_loss", nll)], m);
            eval_progress(
                ctx,
                "sft",
                (step, s.steps),
                &m,
                format!("held-out loss {nll:.4}"),
            );
        }
        if step > 0 {
            ctx.monitor.report(m);
        }
    }
    let dir = save_final_policy(ctx, &*policy).await?;
    policy.shutdown();
    Ok(OfflineSummary {
        kind: "sft".into(),
        steps: s.steps,
        eval_first: log.first,
        eval_last: log.last,
        data: data.report().clone(),
        model_dir: dir,
    })
}

/// The examples of `rows` (one per assistant turn) as token pairs.
fn encode_all(ctx: &Ctx<'_>, at: At, rows: &[SftRow]) -> Result<Vec<TokenPair>, RunError> {
    rows.iter()
        .flat_map(|r| &r.examples)
        .map(|p| encode_pair(ctx, at, &p.prompt, &p.response))
        .collect()
}
