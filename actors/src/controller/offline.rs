//! Runs that train from a data file (`run.kind = "sft" | "rm" | "dpo"`): the dispatch, and
//! what they share — turning text pairs into token ids, the learning-rate schedule, saving
//! the trained model as `<run>/final/` (HF folder, tokenizer, `checksums.json`) and writing
//! `summary.json`. The loops themselves are in `sft_file.rs`, `rm.rs` and `dpo.rs`.

use super::lengths::{check_context, quoted};
use super::run_error::{At, RunError};
use super::saving::{final_dir, seal_model};
use super::sft::TokenPair;
use super::{dpo, rm, sft_file, Ctx, RunSummary};
use crate::batch::Sequences;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::monitor::StepMetrics;
use crate::recipe::RunKind;
use crate::roles::PolicyRole;
use oxalign_rlhf::data::{Dataset, RowSchema};
use oxalign_rlhf::optim::LrSchedule;
use oxalign_rlhf::RlhfError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// Runs the recipe's offline kind to the end and writes `summary.json`.
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    started: Instant,
) -> Result<RunSummary, RunError> {
    let offline = match ctx.recipe.run.kind {
        RunKind::Sft => sft_file::run(ctx, pool).await?,
        RunKind::Rm => rm::run(ctx, pool).await?,
        RunKind::Dpo => dpo::run(ctx, pool).await?,
        RunKind::Rl => {
            let e = Cause::BadInput("run.kind = \"rl\" is not a data-file run".into());
            return Err(RunError::controller(At::Setup, "run_kind", e));
        }
    };
    let summary = RunSummary {
        name: ctx.recipe.run.name.clone(),
        run_dir: ctx.run_dir.to_path_buf(),
        steps: offline.steps,
        accuracy_init: None,
        accuracy_sft: None,
        accuracy_final: None,
        sampled_accuracy_sft: None,
        sampled_accuracy_final: None,
        reward_first: None,
        reward_last: None,
        wall_seconds: started.elapsed().as_secs_f64(),
        last_checkpoint: Some(offline.model_dir.clone()),
        offline: Some(offline),
    };
    let path = ctx.run_dir.join("summary.json");
    let text = serde_json::to_string_pretty(&summary).map_err(std::io::Error::other);
    text.and_then(|t| std::fs::write(&path, t))
        .map_err(|source| RunError::Io {
            action: "write",
            path,
            source,
        })?;
    Ok(summary)
}

/// `(prompt ids, response ids + eos)` of one text pair, refused when longer than the context.
/// An empty prompt that encodes to nothing takes the response's first token (the trainer
/// needs one token of context).
pub(crate) fn encode_pair(
    ctx: &Ctx<'_>,
    at: At,
    prompt: &str,
    response: &str,
) -> Result<TokenPair, RunError> {
    let failed = |e| RunError::controller(at, "encode", e);
    let mut p = ctx.tok.encode(prompt, true).map_err(failed)?;
    let mut r = ctx.tok.encode(response, false).map_err(failed)?;
    r.extend(ctx.tok.eos_token_id());
    if p.is_empty() && r.len() > 1 {
        // An empty prompt (a `text` row) with a tokenizer that adds no BOS: the first token
        // is the context, as in a causal LM's loss, which never predicts the first token.
        p.push(r.remove(0));
    }
    let what = format!("{at}: prompt {}", quoted(prompt));
    check_context(ctx, &what, p.len(), r.len(), "its response")?;
    Ok((p, r))
}

/// The rows as [`Sequences`] padded with the tokenizer's pad id.
pub(crate) fn sequences(ctx: &Ctx<'_>, pairs: Vec<TokenPair>) -> Sequences {
    Sequences {
        pairs,
        pad_id: ctx.pad_id,
        routing: None,
    }
}

/// Linear warm-up to `lr`, then cosine decay to `lr / 10` at `steps`.
pub(crate) fn schedule(lr: f64, warmup: u64, steps: u64) -> LrSchedule {
    LrSchedule::WarmupCosine {
        peak_lr: lr,
        min_lr: lr * 0.1,
        warmup_steps: warmup.min(steps),
        total_steps: steps,
    }
}

/// True when step `step` (1-based) of `steps` evaluates: every `every` steps and the last.
pub(crate) fn evaluates(step: u64, steps: u64, every: u64) -> bool {
    step == steps || (every > 0 && step.is_multiple_of(every))
}

/// Prints one progress line unless quiet.
pub(crate) fn progress(ctx: &Ctx<'_>, line: String) {
    if !ctx.quiet {
        println!("{line}");
    }
}

/// Prints an evaluated step's line: `<kind> <step>/<steps>  loss <step loss or ->  <held_out>`.
pub(crate) fn eval_progress(
    ctx: &Ctx<'_>,
    kind: &str,
    (step, steps): (u64, u64),
    metrics: &StepMetrics,
    held_out: String,
) {
    let loss = metrics
        .values
        .get("loss")
        .map_or("-".into(), |l| format!("{l:.4}"));
    progress(
        ctx,
        format!("{kind} {step:>5}/{steps}  loss {loss}  {held_out}"),
    );
}

/// The `batch_size` training rows of step `step` (1-based): positions
/// `(step − 1) · batch_size ..`, epoch after epoch.
pub(crate) fn step_rows<T: RowSchema>(
    data: &Dataset<T>,
    step: u64,
    batch_size: usize,
    at: At,
) -> Result<Vec<T>, RunError> {
    let first = (step - 1) * batch_size as u64;
    (first..first + batch_size as u64)
        .map(|i| data.train_item(i))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RunError::controller(at, "data", Cause::from(RlhfError::from(e))))
}

/// Saves the policy's weights (no optimizer) as `<run>/final/`, sealed; returns the folder.
pub(crate) async fn save_final_policy(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
) -> Result<PathBuf, RunError> {
    let dir = final_dir(ctx.run_dir)?;
    policy
        .save("save", dir.clone(), false)
        .await
        .map_err(RunError::at(At::Setup))?;
    seal_model(ctx, &dir)?;
    Ok(dir)
}

/// Held-out metrics: the first evaluation's and the latest one's.
#[derive(Default)]
pub(crate) struct EvalLog {
    /// Before the first step.
    pub first: BTreeMap<String, f64>,
    /// After the latest evaluated step.
    pub last: BTreeMap<String, f64>,
}

impl EvalLog {
    /// Records `values` (step 0 is the first evaluation) and adds them to `metrics`.
    pub(crate) fn record(
        &mut self,
        step: u64,
        values: &[(&str, f64)],
        mut metrics: StepMetrics,
    ) -> StepMetrics {
        let into = if step == 0 {
            &mut self.first
        } else {
            &mut self.last
        };
        for (k, v) in values {
            into.insert(k.to_string(), *v);
            metrics = metrics.with(*k, *v);
        }
        metrics
    }
}
