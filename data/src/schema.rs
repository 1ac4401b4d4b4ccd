//! The row schemas of the dataset files and how a row becomes text.
//!
//! * prompts: `{"prompt": str|messages, "answer": str?}` or `{"messages": [{"role", "content"}...],
//!   "answer": str?}` (messages rendered with the tokenizer's chat template and its generation
//!   prompt; the answer column is [`RowContext::answer_field`]);
//! * SFT: TRL's formats, in `sft_schema.rs`;
//! * preferences: `{"prompt": str|messages?, "chosen": str|messages, "rejected": str|messages}`;
//!   message lists end with the assistant turn, and the prompt may instead be their shared
//!   leading turns.
//!
//! Other columns (an `id`, a `source`) are ignored. It does not tokenize.

use oxalign_models::text::chat_template::ChatMessage;
use oxalign_models::text::tokenizer::Tokenizer;
use serde_json::Value;

use crate::RowError;

/// The reference-answer column of prompt rows unless the recipe names another
/// (`data.answer_field`).
pub const DEFAULT_ANSWER_FIELD: &str = "answer";

/// What a row is parsed with.
#[derive(Clone, Copy)]
pub struct RowContext<'a> {
    /// Renders chat messages (rows with message lists are malformed without one).
    pub tok: Option<&'a Tokenizer>,
    /// The reference-answer column of prompt rows (`data.answer_field`).
    pub answer_field: &'a str,
}

impl<'a> RowContext<'a> {
    /// `tok` and the default answer column.
    pub fn new(tok: Option<&'a Tokenizer>) -> Self {
        Self {
            tok,
            answer_field: DEFAULT_ANSWER_FIELD,
        }
    }
}

/// A row type of a dataset file.
pub trait RowSchema: Sized + Clone + Send + Sync + 'static {
    /// The accepted schemas, as named in error messages.
    const EXPECTED: &'static str;
    /// Parses (and renders) one row; `Err` says what is wrong with it.
    fn from_row(row: &Value, cx: &RowContext<'_>) -> Result<Self, RowError>;
    /// True for a row without the reference answer a rule-based reward needs (only prompt
    /// rows have one).
    fn lacks_answer(&self) -> bool {
        false
    }
}

/// A prompt and, where the row has one, its reference answer.
pub use crate::PromptItem;

/// One preference pair as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferencePair {
    /// The shared context.
    pub prompt: String,
    /// The preferred response.
    pub chosen: String,
    /// The dispreferred response.
    pub rejected: String,
}

/// A field that is plain text or a list of chat messages.
pub(super) enum TextOrChat {
    /// Plain text.
    Text(String),
    /// Chat messages.
    Chat(Vec<ChatMessage>),
}

pub(super) fn field<'a>(row: &'a Value, key: &str) -> Option<&'a Value> {
    row.get(key).filter(|v| !v.is_null())
}

pub(super) fn text_or_chat(row: &Value, key: &str) -> Result<Option<TextOrChat>, RowError> {
    match field(row, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(TextOrChat::Text(s.clone()))),
        Some(Value::Array(a)) if a.is_empty() => Err(RowError::NoMessages { key: key.into() }),
        Some(v @ Value::Array(_)) => serde_json::from_value(v.clone())
            .map(|m| Some(TextOrChat::Chat(m)))
            .map_err(|source| RowError::NotMessages {
                key: key.into(),
                source,
            }),
        Some(other) => Err(RowError::WrongType {
            key: key.into(),
            found: kind(other),
            expected: "a string or a list of messages",
        }),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A text field (`prompt`, `response`): a string, nothing else (a number or an integer
/// Parquet column is refused, not turned into text).
pub(super) fn string(row: &Value, key: &str) -> Result<Option<String>, RowError> {
    match field(row, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(RowError::WrongType {
            key: key.into(),
            found: kind(other),
            expected: "a string",
        }),
    }
}

/// A reference answer: a string, or a number written as text (`"answer": 15`).
fn answer(row: &Value, key: &str) -> Result<Option<String>, RowError> {
    match field(row, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(RowError::WrongType {
            key: key.into(),
            found: kind(other),
            expected: "a string or a number",
        }),
    }
}

/// The JSON text of a prompt row's columns other than the prompt itself; `None` when
/// there are none.
fn other_columns(row: &Value) -> Option<String> {
    let Value::Object(map) = row else { return None };
    let rest: serde_json::Map<String, Value> = map
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "prompt" | "messages"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!rest.is_empty()).then(|| Value::Object(rest).to_string())
}

pub(super) fn need_object(row: &Value) -> Result<(), RowError> {
    match row {
        Value::Object(_) => Ok(()),
        other => Err(RowError::NotObject(kind(other))),
    }
}

pub(super) fn render(
    tok: Option<&Tokenizer>,
    msgs: &[ChatMessage],
    gen: bool,
) -> Result<String, RowError> {
    let tok = tok.ok_or(RowError::NoTokenizer)?;
    Ok(tok.apply_chat_template(msgs, gen)?)
}

/// `(prompt, response)` of a conversation that ends with an assistant turn: the prompt is
/// the rendering of the turns before it with the generation prompt, the response the rest.
pub(super) fn split_last_turn(
    tok: Option<&Tokenizer>,
    msgs: &[ChatMessage],
) -> Result<(String, String), RowError> {
    match msgs.last() {
        Some(m) if m.role == "assistant" => {}
        _ => return Err(RowError::NoFinalAssistantTurn),
    }
    let prompt = render(tok, &msgs[..msgs.len() - 1], true)?;
    let full = render(tok, msgs, false)?;
    match full.strip_prefix(&prompt) {
        Some(rest) => Ok((prompt, rest.to_string())),
        None => Err(RowError::PromptNotPrefix),
    }
}

impl RowSchema for PromptItem {
    const EXPECTED: &'static str = "{\"prompt\": string or messages, \"answer\": string?} or \
         {\"messages\": [{\"role\", \"content\"}, ...], \"answer\": string?} (the answer column \
         is data.answer_field)";

    fn from_row(row: &Value, cx: &RowContext<'_>) -> Result<Self, RowError> {
        need_object(row)?;
        let answer = answer(row, cx.answer_field)?;
        let prompt = match (text_or_chat(row, "prompt")?, text_or_chat(row, "messages")?) {
            (Some(TextOrChat::Text(p)), None) => p,
            (Some(TextOrChat::Chat(m)), None) | (None, Some(TextOrChat::Chat(m))) => {
                render(cx.tok, &m, true)?
            }
            (None, None) => return Err(RowError::Missing("`prompt` or `messages`")),
            _ => return Err(RowError::PromptAndMessages),
        };
        Ok(PromptItem {
            prompt,
            answer,
            columns: other_columns(row),
        })
    }

    fn lacks_answer(&self) -> bool {
        self.answer.is_none()
    }
}

/// `(prompt, response)` of one side of a preference pair.
fn side(
    tok: Option<&Tokenizer>,
    prompt: &Option<TextOrChat>,
    answer: TextOrChat,
) -> Result<(String, String), RowError> {
    match (prompt, answer) {
        (Some(TextOrChat::Text(p)), TextOrChat::Text(a)) => Ok((p.clone(), a)),
        (Some(TextOrChat::Chat(p)), TextOrChat::Text(a)) => Ok((render(tok, p, true)?, a)),
        (Some(TextOrChat::Chat(p)), TextOrChat::Chat(a)) => {
            let all: Vec<ChatMessage> = p.iter().cloned().chain(a).collect();
            split_last_turn(tok, &all)
        }
        (None, TextOrChat::Chat(a)) => split_last_turn(tok, &a),
        (None, TextOrChat::Text(_)) => Err(RowError::Missing("`prompt` (text answers need one)")),
        (Some(TextOrChat::Text(_)), TextOrChat::Chat(_)) => Err(RowError::TextPromptChatAnswers),
    }
}

impl RowSchema for PreferencePair {
    const EXPECTED: &'static str =
        "{\"prompt\": string or messages, \"chosen\": string or messages, \"rejected\": string or messages}";

    fn from_row(row: &Value, cx: &RowContext<'_>) -> Result<Self, RowError> {
        let tok = cx.tok;
        need_object(row)?;
        let prompt = text_or_chat(row, "prompt")?;
        let chosen = text_or_chat(row, "chosen")?.ok_or(RowError::Missing("`chosen`"))?;
        let rejected = text_or_chat(row, "rejected")?.ok_or(RowError::Missing("`rejected`"))?;
        let (pc, chosen) = side(tok, &prompt, chosen)?;
        let (pr, rejected) = side(tok, &prompt, rejected)?;
        if pc != pr {
            return Err(RowError::PromptsDiffer);
        }
        Ok(PreferencePair {
            prompt: pc,
            chosen,
            rejected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_tokenizer() -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().unwrap();
        oxalign_models::text::byte_tokenizer::write(dir.path()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        (dir, tok)
    }

    #[test]
    fn prompt_messages_are_rendered_with_the_generation_prompt() {
        let (_d, tok) = chat_tokenizer();
        let cx = RowContext::new(Some(&tok));
        let msgs = json!([{"role": "user", "content": "3+3="}]);
        let want = tok
            .apply_chat_template(
                &serde_json::from_value::<Vec<ChatMessage>>(msgs.clone()).unwrap(),
                true,
            )
            .unwrap();
        for key in ["messages", "prompt"] {
            let p = PromptItem::from_row(&json!({ key: msgs, "answer": 6 }), &cx).unwrap();
            assert_eq!(p.prompt, want, "`{key}` as a message list");
            assert_eq!(p.answer.as_deref(), Some("6"));
        }
    }

    #[test]
    fn the_answer_is_read_from_the_named_column() {
        let row = json!({"prompt": "2+2=", "solution": "4", "answer": "x"});
        let default = PromptItem::from_row(&row, &RowContext::new(None)).unwrap();
        assert_eq!(default.answer.as_deref(), Some("x"));
        let cx = RowContext {
            tok: None,
            answer_field: "solution",
        };
        let named = PromptItem::from_row(&row, &cx).unwrap();
        assert_eq!(named.answer.as_deref(), Some("4"));
        assert!(!named.lacks_answer());
        let none = PromptItem::from_row(&json!({"prompt": "2+2="}), &cx).unwrap();
        assert!(none.lacks_answer());
        let e = PromptItem::from_row(&json!({"prompt": "a", "solution": [1]}), &cx).unwrap_err();
        assert!(e.to_string().contains("`solution` is a list"), "{e}");
    }

    #[test]
    fn every_column_but_the_prompt_is_kept_for_the_rewards() {
        let row = json!({"prompt": "2+2=", "solution": "4", "tests": [{"in": 1, "out": 2}]});
        let item = PromptItem::from_row(&row, &RowContext::new(None)).unwrap();
        let columns: serde_json::Value =
            serde_json::from_str(item.columns.as_deref().unwrap()).unwrap();
        assert_eq!(
            columns,
            json!({"solution": "4", "tests": [{"in": 1, "out": 2}]})
        );
        let bare =
            PromptItem::from_row(&json!({"prompt": "2+2="}), &RowContext::new(None)).unwrap();
        assert_eq!(bare.columns, None);
    }

    #[test]
    fn preference_message_lists_share_their_prompt_turns() {
        let (_d, tok) = chat_tokenizer();
        let pref = json!({
            "chosen": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "5"}]
        });
        let pair = PreferencePair::from_row(&pref, &RowContext::new(Some(&tok))).unwrap();
        assert!(pair.chosen.starts_with('4') && pair.rejected.starts_with('5'));
        assert!(pair.prompt.contains("2+2="));
    }

    #[test]
    fn malformed_preference_and_prompt_rows_say_what_is_wrong() {
        let cx = RowContext::new(None);
        let p = |v: Value| PreferencePair::from_row(&v, &cx).unwrap_err().to_string();
        assert!(p(json!({"prompt": "a", "chosen": "b"})).contains("no `rejected`"));
        assert!(p(json!({"prompt": "a", "chosen": true, "rejected": "c"})).contains("a boolean"));
        let e = PromptItem::from_row(&json!({"messages": []}), &cx).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}
