//! `run.kind = "sft"`: supervised fine-tuning on the SFT rows of `data.path` (loss on the
//! response only), `[sft]` settings, with the held-out NLL per response token measured at
//! the start, every `sft.eval_every` steps and at the end (no mid-run checkpoints).
//! The model is saved as `<run>/final/`.

use super::driver::{drive, Steps};
use super::eval::mean_nll;
use super::pairs::{encode_pair, sequences, TokenPair};
use super::report::{print_data_report, OfflineSummary};
use super::task::{HeldOut, OfflineTask};
use crate::controller::context::Ctx;
use crate::controller::error::{At, DivergenceError, RunError};
use crate::controller::run::saving::save_final_policy;
use crate::controller::setup;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::monitor::StepMetrics;
use crate::roles::PolicyRole;
use async_trait::async_trait;
use oxalign_data::{Dataset, SftRow};
use std::path::PathBuf;
use std::sync::Arc;

const KIND: &str = "SFT";

/// Supervised fine-tuning of the policy; held out: the mean NLL per response token.
struct Sft {
    policy: Arc<dyn PolicyRole>,
    eval: Vec<TokenPair>,
}

#[async_trait]
impl OfflineTask for Sft {
    type Row = SftRow;

    fn name(&self) -> &'static str {
        "sft"
    }

    async fn train(
        &self,
        ctx: &Ctx<'_>,
        rows: &[SftRow],
        step: u64,
        lr: f64,
    ) -> Result<StepMetrics, RunError> {
        let at = At::Train { kind: KIND, step };
        let seqs = sequences(ctx, encode_all(ctx, at, rows)?);
        let done = self
            .policy
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

    async fn evaluate(&self, ctx: &Ctx<'_>) -> Result<Option<HeldOut>, RunError> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let nll = mean_nll(ctx, &*self.policy, At::Eval("eval"), &self.eval).await?;
        Ok(Some((
            vec![("eval_loss", nll)],
            format!("held-out loss {nll:.4}"),
        )))
    }

    async fn save(&self, ctx: &Ctx<'_>) -> Result<PathBuf, RunError> {
        save_final_policy(ctx, &*self.policy).await
    }

    fn shutdown(&self) {
        self.policy.shutdown();
    }
}

/// Runs the SFT steps and saves the model.
pub(crate) async fn run(ctx: &Ctx<'_>, pool: &ExecutorPool) -> Result<OfflineSummary, RunError> {
    let r = ctx.recipe;
    let data = Dataset::<SftRow>::load(&setup::data_spec(r)?, Some(ctx.tok))
        .map_err(|e| RunError::controller(At::Setup, "data", Cause::from(e)))?;
    print_data_report(r, data.report());
    let eval = encode_all(ctx, At::Eval("eval"), data.eval_items())?;
    let policy = setup::spawn_policy(r, ctx.policy_dir, ctx.monitor, pool).await?;
    let s = &r.sft;
    let steps = Steps {
        steps: s.steps,
        batch_size: s.batch_size,
        lr: s.lr,
        warmup_steps: s.warmup_steps,
        eval_every: s.eval_every,
    };
    drive(ctx, &Sft { policy, eval }, &data, KIND, steps).await
}

/// The examples of `rows` (one per assistant turn) as token pairs.
fn encode_all(ctx: &Ctx<'_>, at: At, rows: &[SftRow]) -> Result<Vec<TokenPair>, RunError> {
    rows.iter()
        .flat_map(|r| &r.examples)
        .map(|p| encode_pair(ctx, at, &p.prompt, &p.response))
        .collect()
}
