//! The input records of `logprobs`, `generate`, `score` and `tokenize`: one JSON object per line
//! holding `"text"`, `"input_ids"` or `"messages"`, turned into token ids with the model's
//! tokenizer and checked against the model's vocabulary. It does not batch or run models.

use std::path::Path;

use oxalign_models::text::chat_template::ChatMessage;
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::ModelConfig;
use serde_json::Value;

use crate::context_len::check_fits;
use crate::jsonl::{line_error, read_jsonl};
use crate::user_error::user_error;

/// What one input line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// `{"text": "..."}`: raw text, tokenized with the tokenizer's special tokens (e.g. BOS),
    /// or wrapped as a user message when `--chat` is given.
    Text(String),
    /// `{"input_ids": [1, 2, 3]}`: token ids used as they are.
    Ids(Vec<u32>),
    /// `{"messages": [{"role": ..., "content": ...}, ...]}`: a chat rendered with the
    /// tokenizer's chat template.
    Messages(Vec<ChatMessage>),
}

/// One parsed input line.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRecord {
    /// 1-based line number in the input file.
    pub line: usize,
    /// What the line holds.
    pub prompt: Prompt,
}

/// A malformed input line: what is wrong with it and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct RecordError(pub String);

/// `Err(RecordError(message))`.
fn bad<T>(message: String) -> Result<T, RecordError> {
    Err(RecordError(message))
}

const EXPECTED: &str = "expected a JSON object with \"text\" (a string), \"input_ids\" (an array of token ids) or \"messages\" (an array of {\"role\", \"content\"} objects)";

/// Reads and validates every line of `path`. An empty file is an error too.
pub fn read_records(path: &Path) -> anyhow::Result<Vec<InputRecord>> {
    let lines = read_jsonl(path)?;
    if lines.is_empty() {
        return user_error(format!(
            "input file {} has no records; {EXPECTED}",
            path.display()
        ));
    }
    lines
        .into_iter()
        .map(|l| {
            parse_prompt(&l.value)
                .map(|prompt| InputRecord {
                    line: l.line,
                    prompt,
                })
                .map_err(|msg| line_error(path, l.line, msg))
        })
        .collect()
}

/// One `{"text": ...}` record per text, numbered from 1 in order (`generate --prompt`).
pub fn text_records(texts: &[String]) -> Vec<InputRecord> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| InputRecord {
            line: i + 1,
            prompt: Prompt::Text(text.clone()),
        })
        .collect()
}

/// Parses one line's JSON value; the error says what is wrong and what was expected.
pub fn parse_prompt(value: &Value) -> Result<Prompt, RecordError> {
    let Some(obj) = value.as_object() else {
        return bad(format!("found {}; {EXPECTED}", kind_of(value)));
    };
    let present: Vec<&str> = ["text", "input_ids", "messages"]
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    match present.as_slice() {
        [] => bad(format!(
            "found an object with keys [{}]; {EXPECTED}",
            obj.keys()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        ["text"] => match &obj["text"] {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            other => bad(format!(
                "\"text\" must be a string, found {}",
                kind_of(other)
            )),
        },
        ["input_ids"] => parse_ids(&obj["input_ids"]).map(Prompt::Ids),
        ["messages"] => parse_messages(&obj["messages"]).map(Prompt::Messages),
        many => bad(format!(
            "has {}; give exactly one of \"text\", \"input_ids\", \"messages\"",
            many.iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(" and ")
        )),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_ids(v: &Value) -> Result<Vec<u32>, RecordError> {
    let Value::Array(items) = v else {
        return bad(format!(
            "\"input_ids\" must be an array of token ids, found {}",
            kind_of(v)
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    RecordError(format!(
                        "\"input_ids\"[{i}] is {item}, expected a non-negative integer token id"
                    ))
                })
        })
        .collect()
}

fn parse_messages(v: &Value) -> Result<Vec<ChatMessage>, RecordError> {
    let Value::Array(items) = v else {
        return bad(format!(
            "\"messages\" must be an array of {{\"role\", \"content\"}} objects, found {}",
            kind_of(v)
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let role = item.get("role").and_then(Value::as_str);
            let content = item.get("content").and_then(Value::as_str);
            match (role, content) {
                (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
                _ => bad(format!(
                    "\"messages\"[{i}] must be an object with string \"role\" and \"content\", found {item}"
                )),
            }
        })
        .collect()
}

/// How text becomes ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeMode {
    /// Wrap `{"text"}` inputs as a single user message and render the chat template.
    pub chat: bool,
    /// End rendered chats with the assistant header (for generation).
    pub add_generation_prompt: bool,
}

/// Token ids of `record`, each checked to be `< vocab_size` (the model's). Errors are user
/// errors naming the input file and line.
pub fn record_ids(
    path: &Path,
    record: &InputRecord,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
    mode: EncodeMode,
) -> anyhow::Result<Vec<u32>> {
    let line = record.line;
    let need_tokenizer = || {
        tokenizer.ok_or_else(|| {
            line_error(
                path,
                line,
                "this line has text, but the model folder has no tokenizer.json; give \"input_ids\" instead",
            )
        })
    };
    let render = |tok: &Tokenizer, messages: &[ChatMessage]| -> anyhow::Result<Vec<u32>> {
        let text = tok
            .apply_chat_template(messages, mode.add_generation_prompt)
            .map_err(|e| line_error(path, line, e))?;
        tok.encode(&text, false)
            .map_err(|e| line_error(path, line, e))
    };
    let ids = match &record.prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) if mode.chat => render(need_tokenizer()?, &[ChatMessage::user(text)])?,
        Prompt::Text(text) => need_tokenizer()?
            .encode(text, true)
            .map_err(|e| line_error(path, line, e))?,
        Prompt::Messages(messages) => render(need_tokenizer()?, messages)?,
    };
    if let Some((pos, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab_size)
    {
        return Err(line_error(
            path,
            line,
            format!(
                "token id {id} (position {pos}) is out of range: the model's vocab_size is {vocab_size}, so ids must be < {vocab_size}"
            ),
        ));
    }
    Ok(ids)
}

/// Every record as whole-sequence token ids (no chat template, no generation prompt) for a
/// scoring command; a record with no tokens or longer than `config`'s context is refused.
/// `need` finishes the message for an empty one (e.g. `"a score needs at least one"`).
pub fn scoring_sequences(
    input: &Path,
    records: &[InputRecord],
    tokenizer: Option<&Tokenizer>,
    config: &ModelConfig,
    need: &str,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let mode = EncodeMode {
        chat: false,
        add_generation_prompt: false,
    };
    let mut seqs = Vec::with_capacity(records.len());
    for rec in records {
        let ids = record_ids(input, rec, tokenizer, config.vocab_size, mode)?;
        if ids.is_empty() {
            return user_error(format!(
                "{}:{}: the sequence has no tokens; {need}",
                input.display(),
                rec.line
            ));
        }
        check_fits(input, rec.line, ids.len(), config.max_position_embeddings)?;
        seqs.push(ids);
    }
    Ok(seqs)
}

/// Rows `batch` of `seqs` as one right-padded batch of `t` tokens: ids `[b, t]` (padded with
/// `pad`) and the attention mask `[b, t]` (1 for real tokens), on `device`.
pub fn padded_batch(
    seqs: &[Vec<u32>],
    batch: &[usize],
    t: usize,
    pad: u32,
    device: &candle_core::Device,
) -> candle_core::Result<(candle_core::Tensor, candle_core::Tensor)> {
    let b = batch.len();
    let mut ids = Vec::with_capacity(b * t);
    let mut mask = Vec::with_capacity(b * t);
    for &i in batch {
        let s = &seqs[i];
        ids.extend(
            s.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, t - s.len())),
        );
        mask.extend(std::iter::repeat_n(1u32, s.len()).chain(std::iter::repeat_n(0, t - s.len())));
    }
    let ids = candle_core::Tensor::from_vec(ids, (b, t), device)?;
    let mask = candle_core::Tensor::from_vec(mask, (b, t), device)?;
    Ok((ids, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            parse_prompt(&json!({"text": "hi"})),
            Ok(Prompt::Text("hi".into()))
        );
        assert_eq!(
            parse_prompt(&json!({"input_ids": [1, 2], "id": 7})),
            Ok(Prompt::Ids(vec![1, 2]))
        );
        assert_eq!(
            parse_prompt(&json!({"messages": [{"role": "user", "content": "x"}]})),
            Ok(Prompt::Messages(vec![ChatMessage::user("x")]))
        );
    }

    #[test]
    fn rejects_bad_shapes_with_reasons() {
        let e = parse_prompt(&json!([1])).unwrap_err().to_string();
        assert!(
            e.contains("found an array") && e.contains("\"text\""),
            "{e}"
        );
        let e = parse_prompt(&json!({"prompt": "x"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"prompt\""), "{e}");
        let e = parse_prompt(&json!({"input_ids": [1, -2]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[1]") && e.contains("-2"), "{e}");
        let e = parse_prompt(&json!({"text": "a", "input_ids": []}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly one"), "{e}");
        let e = parse_prompt(&json!({"text": 3})).unwrap_err().to_string();
        assert!(e.contains("must be a string"), "{e}");
    }

    #[test]
    fn prompt_texts_are_text_records_numbered_in_order() {
        let r = text_records(&["a".into(), "b c".into()]);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].line, &r[0].prompt), (1, &Prompt::Text("a".into())));
        assert_eq!((r[1].line, &r[1].prompt), (2, &Prompt::Text("b c".into())));
    }

    #[test]
    fn ids_are_checked_against_vocab() {
        let rec = InputRecord {
            line: 3,
            prompt: Prompt::Ids(vec![1, 300]),
        };
        let mode = EncodeMode {
            chat: false,
            add_generation_prompt: false,
        };
        let err = record_ids(Path::new("in.jsonl"), &rec, None, 260, mode).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("in.jsonl:3") && msg.contains("300") && msg.contains("260"),
            "{msg}"
        );
    }

    #[test]
    fn chat_mode_renders_the_template() {
        let tok = oxalign_models::text::byte_tokenizer::build();
        let rec = InputRecord {
            line: 1,
            prompt: Prompt::Text("hi".into()),
        };
        let mode = EncodeMode {
            chat: true,
            add_generation_prompt: true,
        };
        let ids = record_ids(Path::new("x"), &rec, Some(&tok), 260, mode).unwrap();
        let text = tok.decode(&ids, false).unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
