//! The text an environment's reply adds after a model's turn, as the model's own chat template
//! writes it, so a multi-turn episode can append it to the sampled tokens instead of rendering
//! the whole conversation again.
//!
//! The conversation is never re-rendered: earlier turns keep the exact ids the engine sampled
//! (a template that strips earlier `<think>` blocks or normalises whitespace cannot change
//! them). Only the reply is rendered, by difference: the template renders a stand-in exchange
//! `[user, assistant]` without the generation prompt, and again with the reply's messages and
//! the generation prompt. The reply is what the second adds to the first, preceded by what the
//! template writes after the assistant's text beyond the stop token the model itself produced
//! (for ChatML, the `\n` after `<|im_end|>`).
//!
//! Without a chat template (raw prompts), [`raw_observation`] wraps tool results as
//! `<tool_response>…</tool_response>` lines.

use crate::text::chat_template::ChatMessage;
use crate::text::tokenizer::{Tokenizer, TokenizerError};

/// Why a reply cannot be written after a turn.
#[derive(Debug, thiserror::Error)]
pub enum TurnWrapError {
    /// The template failed to render the stand-in exchange.
    #[error(transparent)]
    Template(#[from] TokenizerError),
    /// The template renders the earlier turns differently once a reply follows.
    #[error("the chat template re-renders earlier turns when a {role:?} message follows, so a reply cannot be appended")]
    NotAppendOnly {
        /// Role of the reply's first message.
        role: String,
    },
    /// The template ends an assistant turn with something other than the model's stop token.
    #[error("the chat template ends an assistant turn with {template_end:?}, which does not start with the model's stop token {stop:?}")]
    StopMismatch {
        /// What the template writes after the assistant's text.
        template_end: String,
        /// The stop token the model produced.
        stop: String,
    },
}

const USER_STANDIN: &str = "oxalign-user-turn";
const ASSISTANT_STANDIN: &str = "oxalign-assistant-turn";

/// The text that follows a model turn ended by `stop` (the stop token's text, e.g.
/// `<|im_end|>`) when the environment answers with `reply`, up to and including the
/// generation prompt of the model's next turn; rendered by `tok`'s chat template with its
/// tools.
pub fn observation_text(
    tok: &Tokenizer,
    reply: &[ChatMessage],
    stop: &str,
) -> Result<String, TurnWrapError> {
    let mut exchange = vec![
        ChatMessage::user(USER_STANDIN),
        ChatMessage::assistant(ASSISTANT_STANDIN),
    ];
    let before = tok.apply_chat_template(&exchange, false)?;
    exchange.extend_from_slice(reply);
    let after = tok.apply_chat_template(&exchange, true)?;
    let Some(added) = after.strip_prefix(before.as_str()) else {
        let role = reply.first().map_or("", |m| m.role.as_str());
        return Err(TurnWrapError::NotAppendOnly { role: role.into() });
    };
    let end_at = before
        .rfind(ASSISTANT_STANDIN)
        .map(|i| i + ASSISTANT_STANDIN.len())
        .ok_or_else(|| TurnWrapError::NotAppendOnly {
            role: "assistant".into(),
        })?;
    let template_end = &before[end_at..];
    let Some(after_stop) = template_end.strip_prefix(stop) else {
        return Err(TurnWrapError::StopMismatch {
            template_end: template_end.into(),
            stop: stop.into(),
        });
    };
    Ok(format!("{after_stop}{added}"))
}

/// The special token with which `tok`'s chat template ends an assistant turn (`<|im_end|>`
/// for ChatML, `<|eot_id|>` for Llama 3), when it ends one with a special token: a model's
/// turn in an episode stops there.
pub fn turn_end_token(tok: &Tokenizer) -> Option<u32> {
    let exchange = [
        ChatMessage::user(USER_STANDIN),
        ChatMessage::assistant(ASSISTANT_STANDIN),
    ];
    let text = tok.apply_chat_template(&exchange, false).ok()?;
    let end = &text[text.rfind(ASSISTANT_STANDIN)? + ASSISTANT_STANDIN.len()..];
    let first = *tok.encode(end, false).ok()?.first()?;
    let as_text = tok.decode(&[first], false).ok()?;
    let special = tok.decode(&[first], true).ok()?.is_empty();
    (special && !as_text.is_empty() && end.starts_with(&as_text)).then_some(first)
}

/// Tool results after a raw (template-less) turn: one `<tool_response>…</tool_response>`
/// line per message.
pub fn raw_observation(reply: &[ChatMessage]) -> String {
    reply
        .iter()
        .map(|m| format!("<tool_response>{}</tool_response>\n", m.content))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::byte_tokenizer;
    use crate::text::chat_template::ChatTemplate;

    const QWEN2_5: &str = include_str!("../../tests/fixtures/chat_templates/qwen2_5.jinja");

    fn tokenizer(template: &str) -> Tokenizer {
        let mut tok = byte_tokenizer::build();
        tok.set_chat_template(Some(ChatTemplate::new(template).unwrap()));
        tok
    }

    #[test]
    fn qwen2_5_wraps_tool_results_in_a_user_turn_after_im_end() {
        let tok = tokenizer(QWEN2_5);
        let reply = [
            ChatMessage::new("tool", "84"),
            ChatMessage::new("tool", "5"),
        ];
        let text = observation_text(&tok, &reply, "<|im_end|>").unwrap();
        assert_eq!(
            text,
            "\n<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n5\n\
             </tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        let err = observation_text(&tok, &reply, "<|endoftext|>").unwrap_err();
        assert!(matches!(err, TurnWrapError::StopMismatch { .. }), "{err}");
    }

    #[test]
    fn chatml_and_raw_replies() {
        let tok = byte_tokenizer::build();
        let text = observation_text(&tok, &[ChatMessage::new("tool", "7")], "<|im_end|>");
        assert_eq!(
            text.unwrap(),
            "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(turn_end_token(&tok), Some(byte_tokenizer::IM_END_ID));
        assert_eq!(
            raw_observation(&[ChatMessage::new("tool", "7")]),
            "<tool_response>7</tool_response>\n"
        );
    }
}
