//! The row schemas of the dataset files and how a row becomes text.
//!
//! * prompts: `{"prompt": str, "answer": str?}` or `{"messages": [{"role", "content"}...], "answer": str?}`
//!   (rendered with the tokenizer's chat template and its generation prompt);
//! * SFT: `{"prompt": str, "response": str}` or `{"messages": [...]}` ending with an assistant
//!   turn: each assistant turn is one example, its prompt everything before it, its loss on
//!   that turn only (so the loss covers every assistant turn and nothing else);
//! * preferences: `{"prompt": str|messages?, "chosen": str|messages, "rejected": str|messages}`;
//!   message lists end with the assistant turn, and the prompt may instead be their shared
//!   leading turns.
//!
//! Other columns (an `id`, a `source`) are ignored. It does not tokenize.

use oxalign_models::chat_template::ChatMessage;
use oxalign_models::tokenizer::Tokenizer;
use serde_json::Value;

use super::RowError;

/// A row type of a dataset file.
pub trait RowSchema: Sized + Clone + Send + Sync + 'static {
    /// The schema, as named in error messages.
    const EXPECTED: &'static str;
    /// Parses (and renders) one row; `Err` says what is wrong with it.
    fn from_row(row: &Value, tok: Option<&Tokenizer>) -> Result<Self, RowError>;
}

/// A prompt and, where the row has one, its reference answer.
pub use super::PromptItem;

/// One SFT example as text: the loss is on `response` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftPair {
    /// The context (rendered with the chat template for message rows).
    pub prompt: String,
    /// The target.
    pub response: String,
}

/// One SFT row: one example per assistant turn (one for a prompt/response row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftRow {
    /// The row's examples, in conversation order.
    pub examples: Vec<SftPair>,
}

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
enum TextOrChat {
    Text(String),
    Chat(Vec<ChatMessage>),
}

fn field<'a>(row: &'a Value, key: &str) -> Option<&'a Value> {
    row.get(key).filter(|v| !v.is_null())
}

fn text_or_chat(row: &Value, key: &str) -> Result<Option<TextOrChat>, RowError> {
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
fn string(row: &Value, key: &str) -> Result<Option<String>, RowError> {
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

fn need_object(row: &Value) -> Result<(), RowError> {
    match row {
        Value::Object(_) => Ok(()),
        other => Err(RowError::NotObject(kind(other))),
    }
}

fn render(tok: Option<&Tokenizer>, msgs: &[ChatMessage], gen: bool) -> Result<String, RowError> {
    let tok = tok.ok_or(RowError::NoTokenizer)?;
    Ok(tok.apply_chat_template(msgs, gen)?)
}

/// `(prompt, response)` of a conversation that ends with an assistant turn: the prompt is
/// the rendering of the turns before it with the generation prompt, the response the rest.
fn split_last_turn(
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
    const EXPECTED: &'static str =
        "{\"prompt\": string, \"answer\": string?} or {\"messages\": [{\"role\", \"content\"}, ...], \"answer\": string?}";

    fn from_row(row: &Value, tok: Option<&Tokenizer>) -> Result<Self, RowError> {
        need_object(row)?;
        let answer = answer(row, "answer")?;
        let prompt = match (text_or_chat(row, "prompt")?, text_or_chat(row, "messages")?) {
            (Some(TextOrChat::Text(p)), None) => p,
            (Some(TextOrChat::Chat(m)), None) | (None, Some(TextOrChat::Chat(m))) => {
                render(tok, &m, true)?
            }
            (None, None) => return Err(RowError::Missing("`prompt` or `messages`")),
            _ => return Err(RowError::PromptAndMessages),
        };
        Ok(PromptItem { prompt, answer })
    }
}

/// One example per assistant turn of a conversation that ends with one.
fn assistant_turns(
    tok: Option<&Tokenizer>,
    msgs: &[ChatMessage],
) -> Result<Vec<SftPair>, RowError> {
    let mut out = Vec::new();
    for k in 0..msgs.len() {
        if msgs[k].role == "assistant" || k + 1 == msgs.len() {
            let (prompt, response) = split_last_turn(tok, &msgs[..=k])?;
            out.push(SftPair { prompt, response });
        }
    }
    Ok(out)
}

impl RowSchema for SftRow {
    const EXPECTED: &'static str =
        "{\"prompt\": string, \"response\": string} or {\"messages\": [..., {\"role\": \"assistant\", \"content\"}]}";

    fn from_row(row: &Value, tok: Option<&Tokenizer>) -> Result<Self, RowError> {
        need_object(row)?;
        if let Some(TextOrChat::Chat(m)) = text_or_chat(row, "messages")? {
            return Ok(SftRow {
                examples: assistant_turns(tok, &m)?,
            });
        }
        let prompt = string(row, "prompt")?.ok_or(RowError::Missing("`prompt` (or `messages`)"))?;
        let response = string(row, "response")?.ok_or(RowError::Missing("`response`"))?;
        Ok(SftRow {
            examples: vec![SftPair { prompt, response }],
        })
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

    fn from_row(row: &Value, tok: Option<&Tokenizer>) -> Result<Self, RowError> {
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
        oxalign_models::byte_tokenizer::write(dir.path()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        (dir, tok)
    }

    #[test]
    fn messages_are_rendered_and_split_at_the_last_assistant_turn() {
        let (_d, tok) = chat_tokenizer();
        let msgs = json!([
            {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "2+2="},
            {"role": "assistant", "content": "4"}
        ]);
        let row = SftRow::from_row(&json!({ "messages": msgs }), Some(&tok)).unwrap();
        assert_eq!(row.examples.len(), 2, "one example per assistant turn");
        let (first, sft) = (&row.examples[0], &row.examples[1]);
        assert!(first.response.starts_with('2') && !first.response.contains("2+2="));
        let head = msgs.as_array().unwrap()[..3].to_vec();
        let head: Vec<ChatMessage> = serde_json::from_value(json!(head)).unwrap();
        assert_eq!(sft.prompt, tok.apply_chat_template(&head, true).unwrap());
        assert!(sft.response.starts_with('4'), "{:?}", sft.response);
        assert!(!sft.response.contains("2+2="));

        let p = PromptItem::from_row(
            &json!({"messages": [{"role": "user", "content": "3+3="}], "answer": 6}),
            Some(&tok),
        )
        .unwrap();
        assert!(p.prompt.contains("3+3=") && p.prompt.len() > 4);
        assert_eq!(p.answer.as_deref(), Some("6"));

        let pref = json!({
            "chosen": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "5"}]
        });
        let pair = PreferencePair::from_row(&pref, Some(&tok)).unwrap();
        assert!(pair.chosen.starts_with('4') && pair.rejected.starts_with('5'));
        assert!(pair.prompt.contains("2+2="));
    }

    #[test]
    fn malformed_rows_say_what_is_wrong() {
        let e = |v: Value| SftRow::from_row(&v, None).unwrap_err().to_string();
        assert!(e(json!({"prompt": "a"})).contains("no `response`"));
        assert!(e(json!([1])).contains("not an object"));
        assert!(
            e(json!({"messages": [{"role": "user", "content": "a"}]})).contains("assistant turn")
        );
        let chat = json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]});
        assert!(e(chat).contains("tokenizer"));
        let p = |v: Value| PreferencePair::from_row(&v, None).unwrap_err().to_string();
        assert!(p(json!({"prompt": "a", "chosen": "b"})).contains("no `rejected`"));
        assert!(p(json!({"prompt": "a", "chosen": true, "rejected": "c"})).contains("a boolean"));
    }

    #[test]
    fn numbers_and_empty_message_lists_are_not_sft_rows() {
        let e = |v: Value| SftRow::from_row(&v, None).unwrap_err().to_string();
        let m = e(json!({"prompt": "1+1=", "response": 2}));
        assert!(m.contains("`response` is a number, not a string"), "{m}");
        let m = e(json!({"prompt": 7, "response": "2"}));
        assert!(m.contains("`prompt` is a number"), "{m}");
        let m = e(json!({"messages": []}));
        assert!(m.contains("`messages`") && m.contains("empty"), "{m}");
        let p = PromptItem::from_row(&json!({"messages": []}), None).unwrap_err();
        assert!(p.to_string().contains("empty"), "{p}");
    }
}
