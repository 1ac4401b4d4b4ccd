//! The supervised warm-up: prompt → answer + eos, loss on the answer only, linear warm-up
//! then cosine decay of the learning rate. It resumes from `state.sft_step`, saves an SFT
//! checkpoint every `sft.checkpoint_every` steps and stops on a divergence.

use crate::controller::clock::WallClock;
use crate::controller::context::Ctx;
use crate::controller::error::DivergenceError;
use crate::controller::error::{At, RunError};
use crate::controller::lengths::{check_context, quoted};
use crate::controller::offline::pairs::TokenPair;
use crate::controller::run::checkpoint::LoopState;
use crate::controller::run::checkpoint::Phase;
use crate::controller::run::retry::save_checkpoint_retried as save_checkpoint;
use crate::error::Cause;
use crate::roles::{PolicyRole, Sequences};
use oxalign_data::PromptSource;
use oxalign_rlhf::optim::LrSchedule;
use std::time::Instant;

/// `prompt ids, answer ids + eos` for each item (items without an answer are skipped).
/// `step` is the 1-based SFT step, for errors.
pub(crate) fn sft_pairs(
    ctx: &Ctx<'_>,
    step: u64,
    items: &[oxalign_data::PromptItem],
) -> Result<Vec<TokenPair>, RunError> {
    let eos = ctx.tok.eos_token_id();
    let encode_failed = |e| RunError::controller(At::Sft(step), "encode", e);
    let mut out = Vec::new();
    for it in items {
        let Some(answer) = &it.answer else { continue };
        let p = ctx.tok.encode(&it.prompt, true).map_err(encode_failed)?;
        let mut a = ctx.tok.encode(answer, false).map_err(encode_failed)?;
        a.extend(eos);
        let what = format!("SFT prompt {}", quoted(&it.prompt));
        check_context(ctx, &what, p.len(), a.len(), "its answer")?;
        out.push((p, a));
    }
    Ok(out)
}

/// The stream position of row `i` of SFT step `step` (0-based): fresh rows from
/// `data_position`, or, with `sft.examples = n`, the first `n` rows cycled.
fn warmup_row(s: &crate::recipe::SftSection, state: &LoopState, step: u64, i: u64) -> u64 {
    match s.examples {
        0 => state.data_position + i,
        n => (step * s.batch_size as u64 + i) % n,
    }
}

/// Runs the supervised steps `state.sft_step + 1 ..= recipe.sft.steps` from the current
/// data position, checkpointing every `sft.checkpoint_every` steps (not the last one: the
/// RL-start checkpoint follows it).
pub(crate) async fn run_sft(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    data: &dyn PromptSource,
    state: &mut LoopState,
    clock: WallClock,
) -> Result<(), RunError> {
    let s = &ctx.recipe.sft;
    let schedule = LrSchedule::WarmupCosine {
        peak_lr: s.lr,
        min_lr: s.lr * 0.1,
        warmup_steps: s.warmup_steps.min(s.steps),
        total_steps: s.steps,
    };
    let started = Instant::now();
    let report_every = (s.steps / 10).max(1);
    for step in state.sft_step..s.steps {
        let items = (0..s.batch_size as u64)
            .map(|i| data.train_item(warmup_row(s, state, step, i)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RunError::controller(At::Sft(step + 1), "data", e))?;
        if s.examples == 0 {
            state.data_position += s.batch_size as u64;
        }
        let at = At::Sft(step + 1);
        let pairs = sft_pairs(ctx, step + 1, &items)?;
        if pairs.is_empty() {
            let e = Cause::Missing(crate::error::Missing::SftAnswers);
            return Err(RunError::controller(at, "sft", e));
        }
        let seqs = Sequences {
            pairs,
            pad_id: ctx.pad_id,
            routing: None,
            observations: None,
        };
        let lr = schedule.lr_at(step);
        let timer = ctx.monitor.time("policy", "sft", 0);
        let done = policy
            .sft(seqs, lr, ctx.recipe.rl.max_grad_norm)
            .await
            .map_err(RunError::at(at))?;
        drop(timer);
        if let Some(cause) = done.diverged {
            let e = DivergenceError {
                role: "policy",
                phase: "sft",
                kind: crate::recipe::RunKind::Sft,
                step: step + 1,
                cause,
                lower: "sft.lr",
            };
            return Err(e.into());
        }
        let (nll, grad_norm) = (done.nll, done.grad_norm);
        state.sft_step = step + 1;
        let every = s.checkpoint_every;
        if every > 0 && state.sft_step.is_multiple_of(every) && state.sft_step < s.steps {
            state.phase = Phase::Sft;
            state.wall_seconds = clock.now();
            save_checkpoint(ctx, policy, None, state).await?;
        }
        if !ctx.quiet && ((step + 1) % report_every == 0 || step + 1 == s.steps) {
            println!(
                "sft {:>5}/{}  nll {:.4}  grad_norm {:.3}  lr {:.2e}  {:.1}s",
                step + 1,
                s.steps,
                nll,
                grad_norm,
                lr,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
