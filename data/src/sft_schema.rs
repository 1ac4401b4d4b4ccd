//! The SFT row schema: TRL's dataset formats as they are.
//!
//! * prompt-completion: `{"prompt": str, "completion": str}` (`response` is an alias of
//!   `completion`; both in one row is ambiguous and refused);
//! * conversational prompt-completion: `{"prompt": [messages], "completion": [messages]}`:
//!   prompt and completion are rendered together with the chat template and split at each
//!   assistant turn of the completion (see [`assistant_turns`]), so the loss covers exactly the
//!   completion's assistant turns; a chat prompt with a text completion renders the prompt
//!   with the generation prompt;
//! * language modeling: `{"text": str}`: the loss covers the whole text (the prompt is empty;
//!   `text` with `prompt`, `completion` or `response` is ambiguous and refused);
//! * conversational language modeling: `{"messages": [...]}` ending with an assistant turn:
//!   each assistant turn is one example, its prompt everything before it (so the loss covers
//!   every assistant turn and nothing else). It wins over the other columns, as TRL's own
//!   datasets carry `messages` beside a `prompt` column.

use crate::schema::{
    field, need_object, render, split_last_turn, string, text_or_chat, RowContext, RowSchema,
    TextOrChat,
};
use crate::RowError;
use oxalign_models::text::chat_template::ChatMessage;
use oxalign_models::text::tokenizer::Tokenizer;
use serde_json::Value;

/// One SFT example as text: the loss is on `response` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftPair {
    /// The context (rendered with the chat template for message rows; empty for `text`).
    pub prompt: String,
    /// The target.
    pub response: String,
}

/// One SFT row: one example per assistant turn (one for a prompt-completion or text row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftRow {
    /// The row's examples, in conversation order.
    pub examples: Vec<SftPair>,
}

impl SftRow {
    fn one(prompt: String, response: String) -> Self {
        Self {
            examples: vec![SftPair { prompt, response }],
        }
    }
}

/// One example per assistant turn of `msgs[from..]`, which ends with one; each example's
/// prompt is every turn before its assistant turn.
fn assistant_turns(
    tok: Option<&Tokenizer>,
    msgs: &[ChatMessage],
    from: usize,
) -> Result<Vec<SftPair>, RowError> {
    let mut out = Vec::new();
    for k in from..msgs.len() {
        if msgs[k].role == "assistant" || k + 1 == msgs.len() {
            let (prompt, response) = split_last_turn(tok, &msgs[..=k])?;
            out.push(SftPair { prompt, response });
        }
    }
    Ok(out)
}

/// The completion: `completion` or its alias `response`, never both.
fn completion(row: &Value) -> Result<Option<TextOrChat>, RowError> {
    match (text_or_chat(row, "completion")?, field(row, "response")) {
        (Some(_), Some(_)) => Err(RowError::CompletionAndResponse),
        (Some(c), None) => Ok(Some(c)),
        (None, _) => Ok(string(row, "response")?.map(TextOrChat::Text)),
    }
}

/// A language-modeling row's text, refusing the columns that would make it ambiguous.
fn text(row: &Value) -> Result<Option<String>, RowError> {
    let Some(text) = string(row, "text")? else {
        return Ok(None);
    };
    for other in ["prompt", "completion", "response"] {
        if field(row, other).is_some() {
            return Err(RowError::TextAndPrompt { other });
        }
    }
    Ok(Some(text))
}

impl RowSchema for SftRow {
    const EXPECTED: &'static str =
        "{\"prompt\": string, \"completion\": string} (`response` is an \
         alias of `completion`), {\"prompt\": messages, \"completion\": messages}, \
         {\"text\": string} or {\"messages\": [..., {\"role\": \"assistant\", \"content\"}]}";

    fn from_row(row: &Value, cx: &RowContext<'_>) -> Result<Self, RowError> {
        need_object(row)?;
        if let Some(TextOrChat::Chat(m)) = text_or_chat(row, "messages")? {
            return Ok(SftRow {
                examples: assistant_turns(cx.tok, &m, 0)?,
            });
        }
        if let Some(text) = text(row)? {
            return Ok(SftRow::one(String::new(), text));
        }
        let prompt = text_or_chat(row, "prompt")?
            .ok_or(RowError::Missing("`prompt` (or `text`, or `messages`)"))?;
        let completion =
            completion(row)?.ok_or(RowError::Missing("`completion` (or its alias `response`)"))?;
        match (prompt, completion) {
            (TextOrChat::Text(p), TextOrChat::Text(c)) => Ok(SftRow::one(p, c)),
            (TextOrChat::Chat(p), TextOrChat::Text(c)) => {
                Ok(SftRow::one(render(cx.tok, &p, true)?, c))
            }
            (TextOrChat::Chat(p), TextOrChat::Chat(c)) => {
                let from = p.len();
                let all: Vec<_> = p.into_iter().chain(c).collect();
                Ok(SftRow {
                    examples: assistant_turns(cx.tok, &all, from)?,
                })
            }
            (TextOrChat::Text(_), TextOrChat::Chat(_)) => Err(RowError::TextPromptChatAnswers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tokenizer_with(template: Option<&str>) -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().unwrap();
        oxalign_models::text::byte_tokenizer::write(dir.path()).unwrap();
        if let Some(t) = template {
            let p = dir.path().join("tokenizer_config.json");
            let mut cfg: Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            cfg["chat_template"] = json!(t);
            std::fs::write(&p, cfg.to_string()).unwrap();
        }
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        (dir, tok)
    }

    fn parse(row: Value, tok: Option<&Tokenizer>) -> Result<SftRow, RowError> {
        SftRow::from_row(&row, &RowContext::new(tok))
    }

    fn msgs(v: Value) -> Vec<ChatMessage> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_prompt_completion_row_is_one_example() {
        let row = parse(json!({"prompt": "1+1=", "completion": "2"}), None).unwrap();
        assert_eq!(row, SftRow::one("1+1=".into(), "2".into()));
    }

    #[test]
    fn response_is_an_alias_of_completion_and_both_together_are_refused() {
        let row = parse(json!({"prompt": "1+1=", "response": "2"}), None).unwrap();
        assert_eq!(row, SftRow::one("1+1=".into(), "2".into()));
        let e = parse(
            json!({"prompt": "a", "completion": "b", "response": "c"}),
            None,
        );
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("`completion`") && e.contains("`response`"),
            "{e}"
        );
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn a_text_row_trains_on_the_whole_text_with_an_empty_prompt() {
        let row = parse(json!({"text": "The sum of 1 and 1 is 2."}), None).unwrap();
        assert_eq!(
            row,
            SftRow::one(String::new(), "The sum of 1 and 1 is 2.".into())
        );
    }

    #[test]
    fn text_with_a_prompt_or_a_completion_is_refused_as_ambiguous() {
        for other in ["prompt", "completion", "response"] {
            let e = parse(json!({"text": "a", other: "b"}), None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("`text`") && e.contains(&format!("`{other}`")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_conversational_completion_trains_exactly_its_assistant_turns() {
        let (_d, tok) = tokenizer_with(None);
        let prompt = json!([
            {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "2+2="}
        ]);
        let completion = json!([{"role": "assistant", "content": "4"}]);
        let row = json!({"prompt": prompt, "completion": completion});
        let got = parse(row, Some(&tok)).unwrap();
        assert_eq!(
            got.examples.len(),
            1,
            "the prompt's assistant turn is not trained"
        );
        let ex = &got.examples[0];
        assert_eq!(
            ex.prompt,
            tok.apply_chat_template(&msgs(prompt.clone()), true)
                .unwrap()
        );
        let mut all = msgs(prompt);
        all.extend(msgs(completion));
        let whole = tok.apply_chat_template(&all, false).unwrap();
        assert_eq!(format!("{}{}", ex.prompt, ex.response), whole);
        assert!(ex.response.starts_with('4'), "{:?}", ex.response);
    }

    #[test]
    fn a_completion_with_two_assistant_turns_is_two_examples_and_a_tool_turn_is_not_trained() {
        let (_d, tok) = tokenizer_with(None);
        let row = json!({
            "prompt": [{"role": "user", "content": "q"}],
            "completion": [
                {"role": "assistant", "content": "call"},
                {"role": "tool", "content": "RESULT"},
                {"role": "assistant", "content": "done"}
            ]
        });
        let got = parse(row, Some(&tok)).unwrap();
        assert_eq!(got.examples.len(), 2);
        assert!(got.examples[0].response.starts_with("call"));
        assert!(got.examples[1].response.starts_with("done"));
        assert!(got.examples.iter().all(|e| !e.response.contains("RESULT")));
    }

    #[test]
    fn a_template_that_does_not_render_the_prompt_as_a_prefix_is_refused() {
        // Renders the generation prompt as `<gen>` but an assistant turn without it.
        let t = "{% for m in messages %}[{{ m.content }}]{% endfor %}\
                 {% if add_generation_prompt %}<gen>{% endif %}";
        let (_d, tok) = tokenizer_with(Some(t));
        let row = json!({
            "prompt": [{"role": "user", "content": "q"}],
            "completion": [{"role": "assistant", "content": "a"}]
        });
        let e = parse(row, Some(&tok)).unwrap_err().to_string();
        assert!(e.contains("not a prefix"), "{e}");
    }

    #[test]
    fn a_chat_prompt_with_a_text_completion_renders_the_generation_prompt() {
        let (_d, tok) = tokenizer_with(None);
        let prompt = json!([{"role": "user", "content": "1+1="}]);
        let got = parse(json!({"prompt": prompt, "completion": "2"}), Some(&tok)).unwrap();
        let want = tok.apply_chat_template(&msgs(prompt), true).unwrap();
        assert_eq!(got, SftRow::one(want, "2".into()));
        let e = parse(
            json!({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}),
            None,
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("give the prompt as messages"));
    }

    #[test]
    fn messages_are_split_at_every_assistant_turn() {
        let (_d, tok) = tokenizer_with(None);
        let m = json!([
            {"role": "user", "content": "1+1="},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "2+2="},
            {"role": "assistant", "content": "4"}
        ]);
        // A `prompt` column beside `messages` (as in TRL's own datasets) is ignored.
        let row = parse(json!({"messages": m, "prompt": "1+1="}), Some(&tok)).unwrap();
        assert_eq!(row.examples.len(), 2, "one example per assistant turn");
        let (first, last) = (&row.examples[0], &row.examples[1]);
        assert!(first.response.starts_with('2') && !first.response.contains("2+2="));
        let head = msgs(json!(m.as_array().unwrap()[..3].to_vec()));
        assert_eq!(last.prompt, tok.apply_chat_template(&head, true).unwrap());
        assert!(last.response.starts_with('4') && !last.response.contains("2+2="));
    }

    #[test]
    fn malformed_sft_rows_say_what_is_wrong() {
        let e = |v: Value| parse(v, None).unwrap_err().to_string();
        let m = e(json!({"prompt": "a"}));
        assert!(
            m.contains("no `completion` (or its alias `response`)"),
            "{m}"
        );
        assert!(e(json!({"completion": "a"})).contains("no `prompt` (or `text`"));
        assert!(e(json!([1])).contains("not an object"));
        let m = e(json!({"messages": [{"role": "user", "content": "a"}]}));
        assert!(m.contains("assistant turn"), "{m}");
        let chat = json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]});
        assert!(e(chat).contains("tokenizer"));
        let m = e(json!({"prompt": "1+1=", "response": 2}));
        assert!(m.contains("`response` is a number, not a string"), "{m}");
        let m = e(json!({"prompt": "1+1=", "completion": 2}));
        assert!(m.contains("`completion` is a number"), "{m}");
        let m = e(json!({"prompt": 7, "response": "2"}));
        assert!(m.contains("`prompt` is a number"), "{m}");
        let m = e(json!({"text": 7}));
        assert!(m.contains("`text` is a number"), "{m}");
        let m = e(json!({"messages": []}));
        assert!(m.contains("`messages`") && m.contains("empty"), "{m}");
    }
}
