//! Held-out accuracy of the policy, judged by the reward's exact-match check (its answer
//! extraction included) against the reference answers: greedy (the policy's single best
//! answer) and sampled (the mean over several samples at the rollout temperature, the
//! quantity RL optimises). A reward without an exact-match check defines no accuracy, and
//! nothing is evaluated.

use crate::batch::{RolloutRequest, SampleRequest, Sampling};
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::lengths::{encode_rollout_prompt, quoted};
use crate::controller::rl::episodes;
use crate::roles::Generate;
use oxalign_data::PromptItem;

/// Samples per prompt for the sampled accuracy.
const SAMPLES: usize = 8;

/// Held-out accuracies in `[0, 1]`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Accuracy {
    /// Fraction of prompts whose greedy completion is correct.
    pub greedy: f64,
    /// Fraction of correct completions among `SAMPLES` seeded samples per prompt.
    pub sampled: f64,
}

/// Greedy and sampled accuracy on `items`, or `None` when there are none or the
/// reward defines no accuracy. Seeds are fixed, so the same weights give the same numbers.
pub(crate) async fn accuracy<G: Generate + ?Sized>(
    ctx: &Ctx<'_>,
    policy: &G,
    items: &[PromptItem],
    label: &'static str,
) -> Result<Option<Accuracy>, RunError> {
    let Some(check) = &ctx.answer_check else {
        return Ok(None);
    };
    if items.is_empty() {
        // No held-out prompts: nothing measured (a 0 would read as a measurement).
        return Ok(None);
    }
    let rl = &ctx.recipe.rl;
    let mut request = RolloutRequest::default();
    for (i, it) in items.iter().enumerate() {
        let prompt = encode_rollout_prompt(ctx, At::Eval(label), &it.prompt, || {
            format!("{label}, held-out prompt {}", quoted(&it.prompt))
        })?;
        let mut r = SampleRequest {
            sample_id: request.samples.len() as u64,
            group_id: i as u64,
            prompt,
            max_new_tokens: rl.max_new_tokens,
            sampling: Sampling::greedy(),
            stop_token_ids: match ctx.env {
                Some(env) => env.stop_ids.clone(),
                None => Vec::new(),
            },
        };
        request.samples.push(r.clone());
        for k in 0..SAMPLES {
            r.sample_id = request.samples.len() as u64;
            r.sampling = Sampling {
                temperature: rl.temperature as f32,
                top_k: rl.top_k,
                top_p: rl.top_p as f32,
                seed: ctx.recipe.run.seed
                    ^ ((i * SAMPLES + k) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            };
            request.samples.push(r.clone());
        }
    }
    let texts = judged_texts(ctx, policy, request, items, label).await?;
    let (mut greedy, mut sampled) = (0usize, 0usize);
    for (i, it) in items.iter().enumerate() {
        for (k, text) in texts[i * (1 + SAMPLES)..(i + 1) * (1 + SAMPLES)]
            .iter()
            .enumerate()
        {
            match (k, check.is_correct(text, it.answer.as_deref())) {
                (0, true) => greedy += 1,
                (_, true) => sampled += 1,
                _ => {}
            }
        }
    }
    let n = items.len() as f64;
    Ok(Some(Accuracy {
        greedy: greedy as f64 / n,
        sampled: sampled as f64 / (n * SAMPLES as f64),
    }))
}

/// The text judged for each sample of `request` (`1 + SAMPLES` per item, in order): the
/// completion, or with `[env]` the last turn of the sample's episode.
async fn judged_texts<G: Generate + ?Sized>(
    ctx: &Ctx<'_>,
    policy: &G,
    request: RolloutRequest,
    items: &[PromptItem],
    label: &'static str,
) -> Result<Vec<String>, RunError> {
    let at = At::Eval(label);
    let Some(env) = ctx.env else {
        let out = policy.generate(request, label.to_string()).await;
        let samples = out.map_err(RunError::at(at))?.samples;
        return samples
            .iter()
            .map(|c| ctx.tok.decode_generated(&c.response, true))
            .collect::<Result<_, _>>()
            .map_err(|e| RunError::controller(at, "decode", e));
    };
    let per_item = |f: fn(&PromptItem) -> Option<String>| -> Vec<Option<String>> {
        items
            .iter()
            .flat_map(|it| vec![f(it); 1 + SAMPLES])
            .collect()
    };
    let prompts: Vec<String> = items
        .iter()
        .flat_map(|it| vec![it.prompt.clone(); 1 + SAMPLES])
        .collect();
    let answers = per_item(|it| it.answer.clone());
    let columns = per_item(|it| it.columns.clone());
    let rows = (&prompts[..], &answers[..], &columns[..]);
    let (batch, records) = episodes::generate(policy, env, ctx.tok, &request, rows, label)
        .await
        .map_err(RunError::at(at))?;
    batch
        .samples
        .iter()
        .zip(&records)
        .map(|(s, r)| {
            ctx.tok
                .decode_generated(&s.response[r.last_turn.clone()], true)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| RunError::controller(at, "decode", e))
}
