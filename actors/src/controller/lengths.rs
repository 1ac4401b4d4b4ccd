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
