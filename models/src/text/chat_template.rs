//! HF chat templates (`tokenizer_config.json` `chat_template`) rendered with minijinja, set up
//! like transformers' sandboxed Jinja2 environment: `trim_blocks`, `lstrip_blocks`, loop controls,
//! `raise_exception`, `strftime_now` (chrono), a Python-compatible `tojson` and the `str`/`dict`
//! methods of minijinja-contrib's `pycompat`.
//! It renders text only; turning the text into ids is [`crate::text::tokenizer::Tokenizer`]'s job.

use std::fmt::Write as _;
use std::sync::Arc;

use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, Utc};

use minijinja::value::{from_args, Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

/// Name under which the template is stored in its private environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation, as HF's `{"role": ..., "content": ...}` dicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ... (the template decides which it accepts).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `user` turn.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` turn.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A `system` turn.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
}

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source is not valid Jinja (as minijinja reads it).
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(msg)`: the conversation is not one it accepts.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Any other failure while rendering (unknown filter, bad operation, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The rendering took more than [`MAX_RENDER_STEPS`] template steps (a runaway loop).
    #[error("chat template ran past its limit of {MAX_RENDER_STEPS} steps (nested loops?)")]
    TooManySteps,
    /// The rendered text grew past [`MAX_RENDER_BYTES`].
    #[error("chat template output passed its limit of {MAX_RENDER_BYTES} bytes")]
    TooLong,
}

/// Most template steps (minijinja fuel) one rendering may take; a chat of thousands of turns
/// takes well under a million.
pub(crate) const MAX_RENDER_STEPS: u64 = 20_000_000;
/// Most bytes one rendering may produce.
pub(crate) const MAX_RENDER_BYTES: usize = 32 << 20;

/// Collects rendered text, refusing to grow past [`MAX_RENDER_BYTES`].
#[derive(Default)]
struct CappedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDER_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Special-token strings a template may refer to (`bos_token`, `eos_token`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    /// `bos_token` in the template, when the tokenizer has one.
    pub bos_token: Option<String>,
    /// `eos_token` in the template, when the tokenizer has one.
    pub eos_token: Option<String>,
    /// `pad_token` in the template, when the tokenizer has one.
    pub pad_token: Option<String>,
    /// `unk_token` in the template, when the tokenizer has one.
    pub unk_token: Option<String>,
}

/// A compiled chat template (cheap to clone: the compiled form is shared).
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (the Jinja text of `chat_template`).
    pub fn new(source: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_unknown_method_callback(python_method);
        env.set_fuel(Some(MAX_RENDER_STEPS));
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env: Arc::new(env),
            source: source.to_string(),
        })
    }

    /// The Jinja source this template was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` like transformers' `apply_chat_template(..., tokenize=False)`.
    /// With `add_generation_prompt` the text ends with the header of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt, tokens)
    }

    /// [`Self::render`] with transformers' `tools=`: a list of JSON tool schemas
    /// (`{"type": "function", "function": {...}}`) the template declares to the model.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let mut ctx = std::collections::BTreeMap::<&str, Value>::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        if let Some(tools) = tools {
            ctx.insert("tools", Value::from_serialize(tools));
        }
        for (name, token) in [
            ("bos_token", &tokens.bos_token),
            ("eos_token", &tokens.eos_token),
            ("pad_token", &tokens.pad_token),
            ("unk_token", &tokens.unk_token),
        ] {
            if let Some(t) = token {
                ctx.insert(name, Value::from(t.as_str()));
            }
        }
        let mut out = CappedOutput::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|e| ChatTemplateError::Render(format!("output is not UTF-8: {e}"))),
            Err(_) if out.overflowed => Err(ChatTemplateError::TooLong),
            Err(e) => Err(render_error(&e)),
        }
    }
}

/// A rendering error as a [`ChatTemplateError`]: the template's own `raise_exception`, the
/// step limit, or any other failure.
fn render_error(e: &Error) -> ChatTemplateError {
    if e.kind() == ErrorKind::OutOfFuel {
        return ChatTemplateError::TooManySteps;
    }
    if e.kind() == ErrorKind::InvalidOperation {
        if let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
            return ChatTemplateError::Raised(msg.to_string());
        }
    }
    ChatTemplateError::Render(describe(e))
}

/// Marks errors raised by the template itself, so `render` can tell them apart.
const RAISED_PREFIX: &str = "raise_exception: ";

/// A minijinja error with its line number and causes, on one line.
fn describe(e: &Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted like Python's `strftime` (chrono's
/// directives: C's and a few more); an unknown directive is an error naming the format.
fn strftime_now(format: String) -> Result<Value, Error> {
    Ok(Value::from(format_utc(Utc::now(), &format)?))
}

/// `t` formatted with `format`.
fn format_utc(t: DateTime<Utc>, format: &str) -> Result<String, Error> {
    let items = StrftimeItems::new(format);
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format with {format:?}"),
        )
    };
    if items.clone().any(|i| matches!(i, Item::Error)) {
        return Err(bad());
    }
    let mut out = String::new();
    write!(out, "{}", t.format_with_items(items)).map_err(|_| bad())?;
    Ok(out)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, so `", "`/`": "` separators by default and
/// no HTML escaping (minijinja's own `tojson` is compact and HTML-safe).
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent_kw: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent.or(indent_kw) {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 0 => Some(" ".repeat(n as usize)),
            Some(_) => Some(String::new()),
            None => match v.as_str() {
                Some(s) => Some(s.to_string()),
                None => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    ))
                }
            },
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Python `json.dumps` layout options.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    /// Writes `v`, walking maps in their own order (insertion order, like Python dicts).
    fn write(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.write_container('[', ']', items.len(), level, out, |i, out| {
                    self.write(&items[i], level + 1, out)
                })
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for k in v.try_iter()? {
                    let item = v.get_item(&k)?;
                    let key = match k.as_str() {
                        Some(s) => s.to_string(),
                        None => k.to_string(),
                    };
                    entries.push((key, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container('{', '}', entries.len(), level, out, |i, out| {
                    let (k, item) = &entries[i];
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push_str(&self.key_sep);
                    self.write(item, level + 1, out)
                })
            }
            ValueKind::Undefined | ValueKind::None => {
                out.push_str("null");
                Ok(())
            }
            _ => {
                let leaf = serde_json::to_string(v).map_err(|e| {
                    Error::new(
                        ErrorKind::BadSerialization,
                        format!("tojson: value is not JSON: {e}"),
                    )
                })?;
                out.push_str(&leaf);
                Ok(())
            }
        }
    }

    fn write_container(
        &self,
        open: char,
        close: char,
        len: usize,
        level: usize,
        out: &mut String,
        mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len > 0 {
            for i in 0..len {
                if i > 0 {
                    out.push_str(&self.item_sep);
                }
                self.newline(level + 1, out);
                item(i, out)?;
            }
            self.newline(level, out);
        }
        out.push(close);
        Ok(())
    }
}

/// Python `str` and `dict` methods that HF templates call (`.strip()`, `.startswith()`,
/// `.items()`, `.get()`, ...), for minijinja's unknown-method hook: minijinja-contrib's
/// `pycompat`, except where Python answers otherwise than it does — `find` counts
/// characters, not bytes; `count("")` is `len + 1`; `isdigit` (ASCII digits) and `isspace`
/// are false on an empty string; and `rsplit`, which it lacks.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        if let Some(v) = python_str_method(s, method, args)? {
            return Ok(v);
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The `str` methods `pycompat` answers differently from Python; `None` for the others.
fn python_str_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let needle = || -> Result<String, Error> {
        let (needle,): (&str,) = from_args(args)?;
        Ok(needle.to_string())
    };
    let v = match method {
        "find" => {
            let needle = needle()?;
            Value::from(match s.find(&needle) {
                Some(byte) => s[..byte].chars().count() as i64,
                None => -1,
            })
        }
        "count" => {
            let needle = needle()?;
            Value::from(if needle.is_empty() {
                s.chars().count() + 1
            } else {
                s.matches(needle.as_str()).count()
            })
        }
        "isdigit" => Value::from(!s.is_empty() && s.chars().all(|c| c.is_ascii_digit())),
        "isspace" => Value::from(!s.is_empty() && s.chars().all(char::is_whitespace)),
        "rsplit" => rsplit(s, args)?,
        _ => return Ok(None),
    };
    Ok(Some(v))
}

/// Python's `str.rsplit(sep=None, maxsplit=-1)`.
fn rsplit(s: &str, args: &[Value]) -> Result<Value, Error> {
    let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
    let maxsplit = maxsplit.filter(|n| *n >= 0).map(|n| n as usize);
    let parts: Vec<String> = match (sep, maxsplit) {
        (Some(""), _) => return Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        (Some(sep), Some(n)) => s.rsplitn(n + 1, sep).map(str::to_string).collect(),
        (Some(sep), None) => s.rsplit(sep).map(str::to_string).collect(),
        // Whitespace: every run is a separator (the maximum split is not applied).
        (None, _) => s.split_whitespace().rev().map(str::to_string).collect(),
    };
    let mut parts = parts;
    parts.reverse();
    Ok(Value::from(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(src)?.render(messages, false, &TemplateTokens::default())
    }

    #[test]
    fn raise_exception_becomes_raised_error() {
        let err = render(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
            &[ChatMessage::assistant("hi")],
        )
        .unwrap_err();
        match err {
            ChatTemplateError::Raised(msg) => assert_eq!(msg, "first must be user"),
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn runaway_templates_are_stopped_by_steps_and_by_output_size() {
        let nested =
            "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}";
        let err = render(nested, &[]).unwrap_err();
        assert!(matches!(err, ChatTemplateError::TooManySteps), "{err:?}");
        let wide = "{% for a in range(10000) %}{% for b in range(10) %}{{ messages[0].content }}{% endfor %}{% endfor %}";
        let big = ChatMessage::user("x".repeat(1000));
        let err = render(wide, &[big]).unwrap_err();
        assert!(matches!(err, ChatTemplateError::TooLong), "{err:?}");
        assert!(err.to_string().contains(&MAX_RENDER_BYTES.to_string()));
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err:?}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let src = "{{ {'b': [1, 2.5, 'é\"'], 'a': none} | tojson }}|{{ [1] | tojson(indent=2) }}|{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}";
        let out = render(src, &[]).unwrap();
        // minijinja maps keep insertion order; Python's json.dumps prints the same.
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, \"é\\\"\"], \"a\": null}|[\n  1\n]|{\"a\": 2, \"z\": 1}"
        );
    }

    #[test]
    fn python_string_and_dict_methods() {
        let src = "{{ '  x  '.strip() }}|{{ 'abc'.startswith(('x', 'ab')) }}|{{ 'a,b'.split(',') | join('+') }}|{% for k, v in {'k': 1}.items() %}{{ k }}={{ v }}{% endfor %}|{{ {'k': 1}.get('m', 'dflt') }}|{{ 'Hi'.upper() }}";
        assert_eq!(render(src, &[]).unwrap(), "x|True|a+b|k=1|dflt|HI");
    }

    #[test]
    fn methods_answer_as_python_where_pycompat_differs() {
        // Python: 'héllo'.find('l') == 2 (characters, not bytes), 'ab'.count('') == 3,
        // ''.isdigit() == ''.isspace() == False, 'a,b,c'.rsplit(',', 1) == ['a,b', 'c'].
        let src = "{{ 'héllo'.find('l') }}|{{ 'ab'.count('') }}|{{ ''.isdigit() }}|{{ ''.isspace() }}|{{ 'a,b,c'.rsplit(',', 1) | join('+') }}|{{ ' a  b '.rsplit() | join('+') }}";
        assert_eq!(render(src, &[]).unwrap(), "2|3|False|False|a,b+c|a+b");
    }

    #[test]
    fn loop_controls_and_trim_blocks() {
        let src = "{% for m in messages %}\n{% if m.role == 'system' %}{% continue %}{% endif %}\n{{ m.content }};\n{% if loop.index >= 2 %}{% break %}{% endif %}\n{% endfor %}";
        let msgs = [
            ChatMessage::system("s"),
            ChatMessage::user("u"),
            ChatMessage::assistant("a"),
        ];
        assert_eq!(render(src, &msgs).unwrap(), "u;\n");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 00:00:00 UTC, the date Llama 3.1's template hard-codes.
        let at = |secs| DateTime::from_timestamp(secs, 0).unwrap();
        assert_eq!(
            format_utc(at(1_721_952_000), "%d %b %Y").unwrap(),
            "26 Jul 2024"
        );
        assert_eq!(
            format_utc(at(0), "%Y-%m-%d %H:%M:%S %A %j").unwrap(),
            "1970-01-01 00:00:00 Thursday 001"
        );
        assert_eq!(
            format_utc(at(951_782_400), "%d %B %y").unwrap(),
            "29 February 00"
        );
        assert!(format_utc(at(0), "%Q").is_err());
    }
}
