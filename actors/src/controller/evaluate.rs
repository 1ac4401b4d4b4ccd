//! Held-out accuracy: greedy completions of the evaluation prompts, judged by exact match
//! with their reference answers.

use super::Ctx;
use crate::roles::{ask, PolicyMsg};
use oxalign_models::{GenerationRequest, SamplingParams};
use oxalign_rlhf::data::PromptItem;
use oxalign_rlhf::reward::ExactMatch;
use ractor::ActorRef;
use std::sync::Arc;

/// Fraction of `items` whose greedy completion matches the answer (0 when there are none).
pub(crate) async fn accuracy(
    ctx: &Ctx<'_>,
    policy: &ActorRef<PolicyMsg>,
    items: &[PromptItem],
    label: &str,
) -> Result<f64, String> {
    if items.is_empty() {
        return Ok(0.0);
    }
    let mut requests = Vec::with_capacity(items.len());
    for it in items {
        let prompt = ctx
            .tok
            .encode(&it.prompt, true)
            .map_err(|e| e.to_string())?;
        let mut r = GenerationRequest::new(prompt, ctx.recipe.rl.max_new_tokens);
        r.sampling = SamplingParams::greedy();
        requests.push(r);
    }
    let requests = Arc::new(requests);
    let out = ask("policy", policy, |reply| PolicyMsg::Generate {
        requests,
        label: label.to_string(),
        reply,
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut correct = 0usize;
    for (it, c) in items.iter().zip(&out) {
        let text = ctx.tok.decode(&c.tokens, true).map_err(|e| e.to_string())?;
        if it
            .answer
            .as_deref()
            .is_some_and(|a| ExactMatch::is_correct(&text, a))
        {
            correct += 1;
        }
    }
    Ok(correct as f64 / items.len() as f64)
}
