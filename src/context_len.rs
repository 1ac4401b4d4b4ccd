//! The model's context (`max_position_embeddings`) as a bound on what a command runs: a
//! sequence longer than the context is refused with the input file and line, and a
//! generation whose prompt plus `--max-new-tokens` would pass it is refused, or truncated
//! when `--truncate` asks for it. It reads no files.

use std::path::Path;

use crate::jsonl::line_error;

/// Refuses a sequence of `len` tokens (input file `path`, line `line`) longer than the
/// model's context `ctx`.
pub fn check_fits(path: &Path, line: usize, len: usize, ctx: usize) -> anyhow::Result<()> {
    if len <= ctx {
        return Ok(());
    }
    Err(line_error(
        path,
        line,
        format!(
            "the sequence has {len} tokens, more than the model's context of {ctx} (max_position_embeddings in its config.json)"
        ),
    ))
}

/// Fits a generation into the context `ctx`: returns the `max_new_tokens` to use.
///
/// Without `truncate`, a prompt that leaves no room for `max_new_tokens` is refused. With
/// it, a prompt of `ctx` tokens or more keeps its last `ctx - 1` tokens, and the completion
/// is capped at what is left of the context (it then ends with finish reason "length").
pub fn fit_generation(
    path: &Path,
    line: usize,
    prompt: &mut Vec<u32>,
    max_new_tokens: usize,
    ctx: usize,
    truncate: bool,
) -> anyhow::Result<usize> {
    // Checked: `--max-new-tokens 18446744073709551615` must be refused, not wrap around.
    let total = prompt.len().checked_add(max_new_tokens);
    if total.is_some_and(|t| t <= ctx) {
        return Ok(max_new_tokens);
    }
    if !truncate {
        return Err(line_error(
            path,
            line,
            format!(
                "the prompt ({} tokens) plus --max-new-tokens {max_new_tokens} exceeds the model's context of {ctx} tokens (max_position_embeddings in its config.json); lower --max-new-tokens, shorten the prompt, or pass --truncate",
                prompt.len()
            ),
        ));
    }
    if prompt.len() >= ctx {
        let cut = prompt.len() - (ctx - 1);
        prompt.drain(..cut);
    }
    Ok(max_new_tokens.min(ctx - prompt.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_refused_or_truncated_to_the_context() {
        let p = Path::new("in.jsonl");
        let mut prompt = vec![1u32; 10];
        assert_eq!(fit_generation(p, 1, &mut prompt, 6, 16, false).unwrap(), 6);
        let err = fit_generation(p, 2, &mut prompt, 7, 16, false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("in.jsonl:2") && msg.contains("16"), "{msg}");
        assert_eq!(fit_generation(p, 2, &mut prompt, 7, 16, true).unwrap(), 6);
        let mut long: Vec<u32> = (0..40).collect();
        assert_eq!(fit_generation(p, 3, &mut long, 8, 16, true).unwrap(), 1);
        assert_eq!(long, (25..40).collect::<Vec<u32>>());
        assert!(check_fits(p, 1, 16, 16).is_ok());
        assert!(check_fits(p, 1, 17, 16).is_err());
    }

    #[test]
    fn an_absurd_max_new_tokens_is_refused_or_capped_not_wrapped() {
        let p = Path::new("in.jsonl");
        let mut prompt = vec![1u32; 10];
        let err = fit_generation(p, 1, &mut prompt, usize::MAX, 16, false).unwrap_err();
        assert!(err.to_string().contains(&usize::MAX.to_string()), "{err}");
        assert_eq!(
            fit_generation(p, 1, &mut prompt, usize::MAX, 16, true).unwrap(),
            6
        );
    }
}
