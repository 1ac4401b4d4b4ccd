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
use oxalign_models::text::tokenizer::{Tokenizer, TokenizerError};

/// Prompt ids and target ids of one SFT example.
pub(crate) type TokenPair = (Vec<u32>, Vec<u32>);

/// `(prompt ids, response ids + eos)` of one text pair, refused when longer than the context.
pub(crate) fn encode_pair(
    ctx: &Ctx<'_>,
    at: At,
    prompt: &str,
    response: &str,
) -> Result<TokenPair, RunError> {
    let (p, r) =
        encode_ids(ctx.tok, prompt, response).map_err(|e| RunError::controller(at, "encode", e))?;
    let what = format!("{at}: prompt {}", quoted(prompt));
    check_context(ctx, &what, p.len(), r.len(), "its response")?;
    Ok((p, r))
}

/// `(prompt ids, response ids + eos)` of one text pair: the trainer's loss covers the
/// response ids only. An empty prompt that encodes to nothing (a `text` row with a
/// tokenizer that adds no BOS) takes the response's first token, as a causal LM's loss
/// never predicts the first token (the trainer needs one token of context).
pub(crate) fn encode_ids(
    tok: &Tokenizer,
    prompt: &str,
    response: &str,
) -> Result<TokenPair, TokenizerError> {
    let mut p = tok.encode(prompt, true)?;
    let mut r = tok.encode(response, false)?;
    r.extend(tok.eos_token_id());
    if p.is_empty() && r.len() > 1 {
        p.push(r.remove(0));
    }
    Ok((p, r))
}

/// The rows as [`Sequences`] padded with the tokenizer's pad id.
pub(crate) fn sequences(ctx: &Ctx<'_>, pairs: Vec<TokenPair>) -> Sequences {
    Sequences {
        pairs,
        pad_id: ctx.pad_id,
        routing: None,
        observations: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use oxalign_data::{RowContext, SftRow};
    use oxalign_rlhf::trainer::TokenBatch;
    use serde_json::{json, Value};

    /// The response mask `[T-1]` of `row`'s only example, encoded as a run encodes it, and
    /// the prompt's length in tokens.
    fn mask_of(tok: &Tokenizer, row: Value) -> (Vec<f32>, usize) {
        let row = SftRow::from_row(&row, &RowContext::new(Some(tok))).unwrap();
        assert_eq!(row.examples.len(), 1);
        let ex = &row.examples[0];
        let (p, r) = encode_ids(tok, &ex.prompt, &ex.response).unwrap();
        let batch = TokenBatch::new(&[(&p, &r)], 0, &candle_core::Device::Cpu).unwrap();
        let mask = batch.response_mask.squeeze(0).unwrap().to_vec1().unwrap();
        (mask, p.len())
    }

    #[test]
    fn the_loss_covers_the_completion_of_a_prompt_completion_row_and_all_of_a_text_row() {
        let tok = oxalign_models::text::byte_tokenizer::build();
        // "1+1=" is 4 byte tokens: targets 1..3 are prompt tokens, then "2" and eos.
        let (mask, p) = mask_of(&tok, json!({"prompt": "1+1=", "completion": "2"}));
        assert_eq!(p, 4);
        assert_eq!(mask, [0.0, 0.0, 0.0, 1.0, 1.0]);

        let chat = json!({
            "prompt": [{"role": "user", "content": "1+1="}],
            "completion": [{"role": "assistant", "content": "2"}]
        });
        let (mask, p) = mask_of(&tok, chat);
        let prompt_targets = p - 1;
        assert!(mask[..prompt_targets].iter().all(|&m| m == 0.0), "{mask:?}");
        assert!(mask[prompt_targets..].iter().all(|&m| m == 1.0), "{mask:?}");
        // The completion is "2<|im_end|>\n" and eos: the template's end of turn is trained.
        assert_eq!(mask.len() - prompt_targets, 4);

        // A text row: every token is a target but the first, which is the context.
        let (mask, p) = mask_of(&tok, json!({"text": "1+1=2"}));
        assert_eq!(p, 1);
        assert_eq!(mask, [1.0; 5], "1+1=2 has 5 tokens: 4 targets and eos");
    }
}
