//! Sequence lengths against the policy's context (`max_position_embeddings`): a training
//! prompt whose tokens plus the tokens to generate (or its SFT answer) would not fit is an
//! error naming the prompt and the keys to change, before anything is generated or trained.

use super::Ctx;

/// Refuses a sequence of `prompt_len + extra_len` tokens longer than the policy's context.
/// `what` names the prompt (e.g. `RL step 3, prompt "7+8="`), `extra_key` the recipe key or
/// data that `extra_len` comes from.
pub(crate) fn check_context(
    ctx: &Ctx<'_>,
    what: &str,
    prompt_len: usize,
    extra_len: usize,
    extra_key: &str,
) -> Result<(), String> {
    if prompt_len + extra_len <= ctx.context {
        return Ok(());
    }
    Err(format!(
        "{what}: the prompt ({prompt_len} tokens) plus {extra_key} ({extra_len} tokens) exceeds the policy's context of {} tokens (max_position_embeddings); lower {extra_key} or shorten the prompts",
        ctx.context
    ))
}

/// Encodes a prompt to generate from (special tokens added) and refuses it when it plus
/// `rl.max_new_tokens` would not fit the policy's context. `what` names the prompt in the
/// error (built only on failure).
pub(crate) fn encode_rollout_prompt(
    ctx: &Ctx<'_>,
    text: &str,
    what: impl FnOnce() -> String,
) -> Result<Vec<u32>, String> {
    let prompt = ctx.tok.encode(text, true).map_err(|e| e.to_string())?;
    let max_new = ctx.recipe.rl.max_new_tokens;
    if prompt.len() + max_new > ctx.context {
        check_context(ctx, &what(), prompt.len(), max_new, "rl.max_new_tokens")?;
    }
    Ok(prompt)
}
