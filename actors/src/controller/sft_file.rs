//! `run.kind = "sft"`: supervised fine-tuning on the SFT rows of `data.path` (loss on the
//! response only), `[sft]` settings, with the held-out NLL per response token measured at
//! the start, every `sft.eval_every` steps and at the end (no mid-run checkpoints).
//! The model is saved as `<run>/final/`.

use super::divergence::DivergenceError;
use super::offline::{self, encode_pair, evaluates, schedule};
use super::offline_eval::mean_nll;
use super::offline_report::{print_data_report, OfflineSummary};
use super::run_error::{At, RunError};
use super::sft::TokenPair;
use super::{setup, Ctx};
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::monitor::StepMetrics;
use crate::roles::{ask, PolicyMsg};
use oxalign_rlhf::data::{Dataset, SftRow};
use oxalign_rlhf::RlhfError;
use std::collections::BTreeMap;

const KIND: &str = "SFT";

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
    let mut eval_first = BTreeMap::new();
    let mut eval_last = BTreeMap::new();
    if !eval.is_empty() {
        let nll = mean_nll(ctx, &policy, At::Eval("eval init"), &eval).await?;
        eval_first.insert("eval_loss".to_string(), nll);
        offline::progress(
            ctx,
            format!("sft     0/{}  held-out loss {nll:.4}", s.steps),
        );
    }
    for step in 1..=s.steps {
        let at = At::Train { kind: KIND, step };
        let rows = (0..s.batch_size as u64)
            .map(|i| data.train_item((step - 1) * s.batch_size as u64 + i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RunError::controller(at, "data", Cause::from(RlhfError::from(e))))?;
        let seqs = offline::sequences(ctx, encode_all(ctx, at, &rows)?);
        let lr = lr_at.lr_at(step - 1);
        let done = ask("policy", "sft", &policy, ctx.timeout, |reply| {
            PolicyMsg::Sft {
                seqs,
                lr,
                max_grad_norm: r.rl.max_grad_norm,
                reply,
            }
        })
        .await
        .map_err(RunError::at(at))?;
        if let Some(cause) = done.diverged {
            let e = DivergenceError {
                role: "policy",
                phase: "sft",
                sft: true,
                step,
                cause,
                lower: "sft.lr",
            };
            return Err(e.into());
        }
        let mut m = StepMetrics::new(step)
            .with("loss", done.nll)
            .with("grad_norm", done.grad_norm)
            .with("lr", lr);
        if !eval.is_empty() && evaluates(step, s.steps, s.eval_every) {
            let nll = mean_nll(ctx, &policy, At::Eval("eval"), &eval).await?;
            m = m.with("eval_loss", nll);
            eval_last.insert("eval_loss".to_string(), nll);
            offline::progress(
                ctx,
                format!(
                    "sft {step:>5}/{}  loss {:.4}  held-out loss {nll:.4}",
                    s.steps, done.nll
                ),
            );
        }
        ctx.monitor.report(m);
    }
    let dir = offline::final_dir(ctx.run_dir)?;
    ask("policy", "save", &policy, ctx.timeout, |reply| {
        PolicyMsg::Save {
            dir: dir.clone(),
            optimizer: false,
            reply,
        }
    })
    .await
    .map_err(RunError::at(At::Setup))?;
    offline::seal_model(ctx, &dir)?;
    policy.stop(None);
    Ok(OfflineSummary {
        kind: "sft".into(),
        steps: s.steps,
        eval_first,
        eval_last,
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
