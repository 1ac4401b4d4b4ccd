//! Tool calls in a model's turn, in the two formats the chat templates of the common open
//! models teach:
//! * [`ToolCallFormat::Hermes`] (Qwen2.5, Qwen3, Hermes): one `<tool_call>{json}</tool_call>`
//!   block per call, the JSON `{"name": ..., "arguments": {...}}`;
//! * [`ToolCallFormat::Llama3`] (Llama 3.1-3.3 JSON tool calling): the turn is the JSON
//!   `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`), several calls
//!   separated by `;`.
//!
//! A block that does not parse is returned as a [`ToolCallError`] in its place, so the
//! environment can answer the model with the error instead of dropping the turn.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which tool-call syntax the model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>` (Qwen2.5/Qwen3, Hermes).
    #[default]
    Hermes,
    /// A bare JSON `{"name": .., "parameters": {..}}` turn (Llama 3.x).
    Llama3,
}

/// One call: the tool's name and its arguments (a JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments.
    pub arguments: Map<String, Value>,
}

/// A call block that is not a valid call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed tool call {text:?}: {reason}")]
pub struct ToolCallError {
    /// The block as the model wrote it (cut to 200 characters).
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

// Braces as constants: a brace in a char literal miscounts some tools' function spans.
const OBJECT_OPEN: char = 0x7B as char;
const OBJECT_CLOSE: char = 0x7D as char;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolCallFormat {
    /// The calls in `turn` (the model's decoded turn, special tokens kept), in order; empty
    /// when the turn calls no tool (it is then a final answer).
    pub fn parse(self, turn: &str) -> Vec<Result<ToolCall, ToolCallError>> {
        match self {
            ToolCallFormat::Hermes => parse_hermes(turn),
            ToolCallFormat::Llama3 => parse_llama3(turn),
        }
    }
}

fn parse_hermes(turn: &str) -> Vec<Result<ToolCall, ToolCallError>> {
    let mut calls = Vec::new();
    let mut rest = turn;
    while let Some(open) = rest.find(HERMES_OPEN) {
        let body = &rest[open + HERMES_OPEN.len()..];
        let (block, next) = match body.find(HERMES_CLOSE) {
            Some(close) => (&body[..close], &body[close + HERMES_CLOSE.len()..]),
            None => {
                calls.push(Err(malformed(body, "no closing </tool_call>")));
                break;
            }
        };
        calls.push(call_from_json(block, "arguments"));
        rest = next;
    }
    calls
}

fn parse_llama3(turn: &str) -> Vec<Result<ToolCall, ToolCallError>> {
    let text = turn.trim();
    let text = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim();
    let text = strip_end_markers(text);
    if !text.starts_with(OBJECT_OPEN) {
        return Vec::new();
    }
    split_top_level(text, ';')
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .map(|part| call_from_json(part, "parameters"))
        .collect()
}

/// `text` without trailing Llama 3 end-of-turn tokens.
fn strip_end_markers(mut text: &str) -> &str {
    loop {
        let before = text;
        for end in ["<|eom_id|>", "<|eot_id|>", "<|end_of_text|>"] {
            text = text.strip_suffix(end).unwrap_or(text).trim_end();
        }
        if text == before {
            return text;
        }
    }
}

/// Splits `text` at `sep` outside JSON strings, objects and arrays.
fn split_top_level(text: &str, sep: char) -> Vec<&str> {
    let (mut parts, mut depth, mut in_str, mut escaped, mut start) =
        (vec![], 0i32, false, false, 0);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_str => escaped = true,
            '"' => in_str = !in_str,
            c if !in_str && (c == OBJECT_OPEN || c == '[') => depth += 1,
            c if !in_str && (c == OBJECT_CLOSE || c == ']') => depth -= 1,
            c if c == sep && !in_str && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `{"name": .., <args_key>: {..}}` as a call; `arguments` given as a JSON string (as some
/// models write them) is parsed too.
fn call_from_json(block: &str, args_key: &str) -> Result<ToolCall, ToolCallError> {
    let value: Value = serde_json::from_str(block.trim())
        .map_err(|e| malformed(block, &format!("not JSON ({e})")))?;
    let Value::Object(mut obj) = value else {
        return Err(malformed(block, "expected a JSON object"));
    };
    let name = match obj.remove("name") {
        Some(Value::String(n)) if !n.is_empty() => n,
        _ => return Err(malformed(block, "expected a non-empty string \"name\"")),
    };
    let args = obj
        .remove(args_key)
        .or_else(|| obj.remove("arguments"))
        .or_else(|| obj.remove("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(Value::String(s)) => match serde_json::from_str(&s) {
            Ok(Value::Object(m)) => m,
            _ => {
                return Err(malformed(
                    block,
                    &format!("\"{args_key}\" is not an object"),
                ))
            }
        },
        Some(_) => {
            return Err(malformed(
                block,
                &format!("\"{args_key}\" is not an object"),
            ))
        }
    };
    Ok(ToolCall { name, arguments })
}

fn malformed(text: &str, reason: &str) -> ToolCallError {
    let text: String = text.trim().chars().take(200).collect();
    ToolCallError {
        text,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: Value) -> ToolCall {
        let Value::Object(arguments) = args else {
            panic!("object")
        };
        ToolCall {
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn hermes_blocks_parse_in_order_and_bad_ones_stay_in_place() {
        let turn = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \
                    {\"expression\": \"12*7\"}}\n</tool_call>\n<tool_call>{\"name\": 3}</tool_call>\
                    <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call><|im_end|>";
        let calls = ToolCallFormat::Hermes.parse(turn);
        assert_eq!(calls.len(), 3);
        assert_eq!(
            calls[0].as_ref().unwrap(),
            &call("calculator", json!({"expression": "12*7"}))
        );
        assert!(calls[1].as_ref().unwrap_err().reason.contains("name"));
        assert_eq!(calls[2].as_ref().unwrap(), &call("f", json!({"x": 1})));
        assert!(ToolCallFormat::Hermes.parse("The answer is 84.").is_empty());
        let open = ToolCallFormat::Hermes.parse("<tool_call>{\"name\": \"f\"");
        assert!(open[0].as_ref().unwrap_err().reason.contains("closing"));
    }

    #[test]
    fn llama3_json_calls_parse_with_or_without_the_python_tag() {
        let one = "{\"name\": \"calculator\", \"parameters\": {\"expression\": \"1;2\"}}<|eom_id|>";
        assert_eq!(
            ToolCallFormat::Llama3.parse(one),
            vec![Ok(call("calculator", json!({"expression": "1;2"})))]
        );
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\"}";
        let calls = ToolCallFormat::Llama3.parse(two);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].as_ref().unwrap().name, "b");
        assert!(ToolCallFormat::Llama3
            .parse("It is 4.<|eot_id|>")
            .is_empty());
        assert!(ToolCallFormat::Llama3
            .parse("{not json")
            .pop()
            .unwrap()
            .is_err());
    }
}
