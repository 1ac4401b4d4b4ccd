//! The supervised warm-up: prompt → answer + eos, loss on the answer only, linear warm-up
//! then cosine decay of the learning rate.

use super::{Ctx, LoopState};
use crate::roles::{ask, PolicyMsg, Sequences};
use oxalign_rlhf::data::PromptSource;
use oxalign_rlhf::optim::LrSchedule;
use ractor::ActorRef;
use std::sync::Arc;
use std::time::Instant;

/// Prompt ids and target ids of one SFT example.
pub(crate) type TokenPair = (Vec<u32>, Vec<u32>);

/// `prompt ids, answer ids + eos` for each item (items without an answer are skipped).
pub(crate) fn sft_pairs(
    ctx: &Ctx<'_>,
    items: &[oxalign_rlhf::data::PromptItem],
) -> Result<Vec<TokenPair>, String> {
    let eos = ctx.tok.eos_token_id();
    let mut out = Vec::new();
    for it in items {
        let Some(answer) = &it.answer else { continue };
        let p = ctx
            .tok
            .encode(&it.prompt, true)
            .map_err(|e| e.to_string())?;
        let mut a = ctx.tok.encode(answer, false).map_err(|e| e.to_string())?;
        a.extend(eos);
        out.push((p, a));
    }
    Ok(out)
}

/// Runs `recipe.sft.steps` supervised steps from the current data position.
pub(crate) async fn run_sft(
    ctx: &Ctx<'_>,
    policy: &ActorRef<PolicyMsg>,
    data: &dyn PromptSource,
    state: &mut LoopState,
) -> Result<(), String> {
    let s = &ctx.recipe.sft;
    let schedule = LrSchedule::WarmupCosine {
        peak_lr: s.lr,
        min_lr: s.lr * 0.1,
        warmup_steps: s.warmup_steps.min(s.steps),
        total_steps: s.steps,
    };
    let started = Instant::now();
    let report_every = (s.steps / 10).max(1);
    for step in 0..s.steps {
        let items: Vec<_> = (0..s.batch_size as u64)
            .map(|i| data.train_item(state.data_position + i))
            .collect();
        state.data_position += s.batch_size as u64;
        let pairs = sft_pairs(ctx, &items)?;
        if pairs.is_empty() {
            return Err("SFT needs prompts with answers; this batch had none".into());
        }
        let seqs = Arc::new(Sequences {
            pairs,
            pad_id: ctx.pad_id,
        });
        let lr = schedule.lr_at(step);
        let timer = ctx.monitor.time("policy", "sft", 0);
        let (nll, grad_norm) = ask("policy", policy, |reply| PolicyMsg::Sft {
            seqs,
            lr,
            max_grad_norm: ctx.recipe.rl.max_grad_norm,
            reply,
        })
        .await
        .map_err(|e| e.to_string())?;
        drop(timer);
        if !nll.is_finite() {
            return Err(format!(
                "SFT step {}: the loss is {nll}; lower sft.lr",
                step + 1
            ));
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
