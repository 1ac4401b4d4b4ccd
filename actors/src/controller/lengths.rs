//! Sequence lengths against the policy's context (`max_position_embeddings`): a training
//! prompt whose tokens plus the tokens to generate (or its SFT answer) would not fit is an
//! error naming the prompt and the keys to change, before anything is generated or trained.

use crate::controller::context::Ctx;
use crate::controller::error::{At, ContextError, RunError};

/// `text` quoted for an error message, cut to its first 80 characters (a prompt too long for
/// the context is usually far too long to print).
pub(crate) fn quoted(text: &str) -> String {
    const SHOWN: usize = 80;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}… ({} characters)", &text[..cut], text.chars().count()),
        None => format!("{text:?}"),
    }
}

/// Refuses a sequence of `prompt_len + extra_len` tokens longer than the policy's context.
/// `what` names the prompt (e.g. `RL step 3, prompt "7+8="`), `extra_key` the recipe key or
/// data that `extra_len` comes from.
pub(crate) fn check_context(
    ctx: &Ctx<'_>,
    what: &str,
    prompt_len: usize,
    extra_len: usize,
    extra_key: &'static str,
) -> Result<(), ContextError> {
    if prompt_len + extra_len <= ctx.context {
        return Ok(());
    }
    Err(ContextError {
        what: what.to_string(),
        prompt_len,
        extra_key,
        extra_len,
        context: ctx.context,
    })
}

/// Encodes a prompt to generate from (special tokens added) and refuses it when it plus
/// `rl.max_new_tokens` would not fit the policy's context. `at` is where the prompt is used
/// and `what` names the prompt in the error (built only on failure).
pub(crate) fn encode_rollout_prompt(
    ctx: &Ctx<'_>,
    at: At,
    text: &str,
    what: impl FnOnce() -> String,
) -> Result<Vec<u32>, RunError> {
    let prompt = ctx
        .tok
        .encode(text, true)
        .map_err(|e| RunError::controller(at, "encode", e))?;
    let (max_new, key) = match &ctx.recipe.env {
        Some(env) => (env.max_tokens, "env.max_tokens"),
        None => (ctx.recipe.rl.max_new_tokens, "rl.max_new_tokens"),
    };
    if prompt.len() + max_new > ctx.context {
        check_context(ctx, &what(), prompt.len(), max_new, key)?;
    }
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_prompts_are_cut_when_quoted() {
        assert_eq!(super::quoted("7+8="), "\"7+8=\"");
        let q = super::quoted(&"é".repeat(300));
        assert!(
            q.ends_with("… (300 characters)") && q.chars().count() < 110,
            "{q}"
        );
    }
}
