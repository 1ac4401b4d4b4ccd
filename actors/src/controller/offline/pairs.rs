//! The rows of a data-file run as token ids: SFT pairs and preference pairs encoded and
//! refused when longer than the context, padded into [`Sequences`], and the rows of a step.

use super::report::print_data_report;
use crate::batch::Sequences;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::lengths::{check_context, quoted};
use crate::controller::setup;
use crate::error::Cause;
use oxalign_data::{Dataset, PreferencePair, RowSchema};

/// Prompt ids and target ids of one SFT example.
pub(crate) type TokenPair = (Vec<u32>, Vec<u32>);

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
        .map_err(|e| RunError::controller(at, "data", Cause::from(e)))
}

/// Token ids of preference pairs: chosen rows and rejected rows.
pub(crate) type EncodedPairs = (Vec<TokenPair>, Vec<TokenPair>);

/// Encodes each pair's two sides.
pub(crate) fn encode_prefs(
    ctx: &Ctx<'_>,
    at: At,
    rows: &[PreferencePair],
) -> Result<EncodedPairs, RunError> {
    let mut out: EncodedPairs = (Vec::new(), Vec::new());
    for p in rows {
        out.0.push(encode_pair(ctx, at, &p.prompt, &p.chosen)?);
        out.1.push(encode_pair(ctx, at, &p.prompt, &p.rejected)?);
    }
    Ok(out)
}

/// Loads the preference rows of the recipe.
pub(crate) fn load_prefs(ctx: &Ctx<'_>) -> Result<Dataset<PreferencePair>, RunError> {
    let data = Dataset::<PreferencePair>::load(&setup::data_spec(ctx.recipe)?, Some(ctx.tok))
        .map_err(|e| RunError::controller(At::Setup, "data", Cause::from(e)))?;
    print_data_report(ctx.recipe, data.report());
    Ok(data)
}
