//! The tokenizer of a HF model folder: `tokenizer.json` (via the `tokenizers` crate) plus
//! `tokenizer_config.json` (special tokens, chat template) and, when present, `chat_template.jinja`
//! and `generation_config.json` (extra stop ids). It does not pad or batch: callers do.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::text::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError, TemplateTokens};

/// File names inside a model folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// See [`TOKENIZER_FILE`].
pub(crate) const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// transformers >= 4.43 may store the template here instead of in `tokenizer_config.json`.
pub(crate) const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// Optional; its `eos_token_id` (an id or a list) adds stop ids.
pub(crate) const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Why a tokenizer could not be loaded or used. Messages name the file and key at fault.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error, with line and column.
        source: serde_json::Error,
    },
    /// `tokenizer.json` is JSON but the `tokenizers` crate rejects it.
    #[error("{path} is not a tokenizer the `tokenizers` crate can load: {message}")]
    Load {
        /// The file.
        path: PathBuf,
        /// The crate's message.
        message: String,
    },
    /// A key of `tokenizer_config.json` holds something unexpected.
    #[error("{path}: key `{key}`: {message}")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What was expected.
        message: String,
    },
    /// A special token named in `tokenizer_config.json` is not in the vocabulary.
    #[error("{path}: `{key}` is {token:?}, which is not in the tokenizer's vocabulary")]
    UnknownSpecialToken {
        /// The file.
        path: PathBuf,
        /// `eos_token`, `pad_token`, ...
        key: String,
        /// The token text.
        token: String,
    },
    /// `apply_chat_template` on a tokenizer without one.
    #[error("the tokenizer has no chat template (no `chat_template` in tokenizer_config.json and no chat_template.jinja)")]
    NoChatTemplate,
    /// The chat template failed.
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    /// Encoding failed.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding failed (for instance an id outside the vocabulary).
    #[error("cannot decode ids: {0}")]
    Decode(String),
}

/// A special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token's text, e.g. `<|endoftext|>`.
    pub content: String,
    /// Its id.
    pub id: u32,
}

/// A loaded tokenizer with its special tokens and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
    pad: Option<SpecialToken>,
    unk: Option<SpecialToken>,
    chat_template: Option<ChatTemplate>,
    tools: Option<serde_json::Value>,
    stop_ids: Vec<u32>,
    vocab_len: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_len", &self.vocab_len)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn read_to_string(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json(path: &Path) -> Result<Json, TokenizerError> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A special token entry of `tokenizer_config.json`: a string, an `AddedToken` object
/// (`{"content": ..., ...}`) or null.
fn token_text(path: &Path, key: &str, v: Option<&Json>) -> Result<Option<String>, TokenizerError> {
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Object(map)) => match map.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::BadConfig {
                path: path.to_path_buf(),
                key: key.to_string(),
                message: "an AddedToken object needs a string `content`".into(),
            }),
        },
        Some(_) => Err(TokenizerError::BadConfig {
            path: path.to_path_buf(),
            key: key.to_string(),
            message: "expected a string, an AddedToken object or null".into(),
        }),
    }
}

/// The `chat_template` entry: a string, or a list of `{"name", "template"}` (the `default` one
/// is used, else the first).
fn template_text(path: &Path, v: Option<&Json>) -> Result<Option<String>, TokenizerError> {
    let bad = |message: &str| TokenizerError::BadConfig {
        path: path.to_path_buf(),
        key: "chat_template".into(),
        message: message.into(),
    };
    match v {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(items)) => {
            let named: Vec<(&str, &str)> = items
                .iter()
                .map(|item| {
                    let name = item.get("name").and_then(Json::as_str);
                    let template = item.get("template").and_then(Json::as_str);
                    name.zip(template)
                        .ok_or_else(|| bad("list items must be {\"name\": str, \"template\": str}"))
                })
                .collect::<Result<_, _>>()?;
            Ok(named
                .iter()
                .find(|(n, _)| *n == "default")
                .or(named.first())
                .map(|(_, t)| t.to_string()))
        }
        Some(_) => Err(bad("expected a string or a list of named templates")),
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`,
    /// `dir/chat_template.jinja` and `dir/generation_config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        let config = dir.join(TOKENIZER_CONFIG_FILE);
        let mut tok = Self::from_files(
            dir.join(TOKENIZER_FILE),
            config.exists().then_some(config.as_path()),
        )?;
        let jinja = dir.join(CHAT_TEMPLATE_FILE);
        if jinja.exists() {
            tok.chat_template = Some(ChatTemplate::new(&read_to_string(&jinja)?)?);
        }
        let gen = dir.join(GENERATION_CONFIG_FILE);
        if gen.exists() {
            let json = read_json(&gen)?;
            let ids: Vec<u64> = match json.get("eos_token_id") {
                Some(Json::Number(n)) => n.as_u64().into_iter().collect(),
                Some(Json::Array(a)) => a.iter().filter_map(Json::as_u64).collect(),
                _ => Vec::new(),
            };
            for id in ids {
                let id = u32::try_from(id).map_err(|_| TokenizerError::BadConfig {
                    path: gen.clone(),
                    key: "eos_token_id".into(),
                    message: format!("id {id} does not fit in u32"),
                })?;
                if !tok.stop_ids.contains(&id) {
                    tok.stop_ids.push(id);
                }
            }
        }
        Ok(tok)
    }

    /// Loads a `tokenizer.json` and an optional `tokenizer_config.json`.
    pub fn from_files(
        tokenizer_json: impl AsRef<Path>,
        tokenizer_config: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let path = tokenizer_json.as_ref();
        let text = read_to_string(path)?;
        let inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
        let config = match tokenizer_config {
            Some(p) => Some((p.to_path_buf(), read_json(p)?)),
            None => None,
        };
        Self::from_parts(inner, config)
    }

    /// Wraps an already built `tokenizers::Tokenizer` with an optional parsed
    /// `tokenizer_config.json` (its path is used in error messages).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        config: Option<(PathBuf, Json)>,
    ) -> Result<Self, TokenizerError> {
        let vocab_len = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0)
            .max(inner.get_vocab_size(true));
        let mut tok = Self {
            inner,
            bos: None,
            eos: None,
            pad: None,
            unk: None,
            chat_template: None,
            tools: None,
            stop_ids: Vec::new(),
            vocab_len,
        };
        if let Some((path, json)) = config {
            if !json.is_object() {
                return Err(TokenizerError::BadConfig {
                    path,
                    key: "(top level)".into(),
                    message: "expected a JSON object".into(),
                });
            }
            let special = |key: &str| -> Result<Option<SpecialToken>, TokenizerError> {
                match token_text(&path, key, json.get(key))? {
                    None => Ok(None),
                    Some(content) => match tok.inner.token_to_id(&content) {
                        Some(id) => Ok(Some(SpecialToken { content, id })),
                        None => Err(TokenizerError::UnknownSpecialToken {
                            path: path.clone(),
                            key: key.to_string(),
                            token: content,
                        }),
                    },
                }
            };
            let (bos, eos, pad, unk) = (
                special("bos_token")?,
                special("eos_token")?,
                special("pad_token")?,
                special("unk_token")?,
            );
            tok.bos = bos;
            tok.eos = eos;
            tok.pad = pad;
            tok.unk = unk;
            if let Some(src) = template_text(&path, json.get("chat_template"))? {
                tok.chat_template = Some(ChatTemplate::new(&src)?);
            }
        }
        if let Some(eos) = &tok.eos {
            tok.stop_ids.push(eos.id);
        }
        Ok(tok)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Number of ids the tokenizer can produce (largest id + 1, added tokens included),
    /// like `len(tokenizer)` in transformers. A model's `vocab_size` must be at least this.
    pub fn vocab_len(&self) -> usize {
        self.vocab_len
    }

    /// Text to ids. `add_special_tokens` runs the post-processor (e.g. Llama's BOS); use
    /// `false` for text rendered by a chat template, which already holds its special tokens.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Text of model-generated ids: like [`Tokenizer::decode`], but ids beyond the
    /// tokenizer's vocabulary (a model's padded embedding rows, e.g. `vocab_size` 32000 over a
    /// 260-token tokenizer) decode to nothing, as in transformers, instead of failing.
    pub fn decode_generated(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<String, TokenizerError> {
        let known: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| (id as usize) < self.vocab_len)
            .collect();
        self.decode(&known, skip_special_tokens)
    }

    /// Ids to text; `skip_special_tokens` drops special tokens (EOS, pad, ...).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_len) {
            return Err(TokenizerError::Decode(format!(
                "id {bad} is outside the vocabulary (size {})",
                self.vocab_len
            )));
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The token text of `id`, if it has one.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token text, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// `bos_token` of `tokenizer_config.json`.
    pub fn bos_token(&self) -> Option<&SpecialToken> {
        self.bos.as_ref()
    }

    /// `eos_token` of `tokenizer_config.json`.
    pub fn eos_token(&self) -> Option<&SpecialToken> {
        self.eos.as_ref()
    }

    /// `pad_token` of `tokenizer_config.json`.
    pub fn pad_token(&self) -> Option<&SpecialToken> {
        self.pad.as_ref()
    }

    /// `unk_token` of `tokenizer_config.json`.
    pub fn unk_token(&self) -> Option<&SpecialToken> {
        self.unk.as_ref()
    }

    /// Id of `bos_token`.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|t| t.id)
    }

    /// Id of `eos_token`.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|t| t.id)
    }

    /// Id of `pad_token`.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad.as_ref().map(|t| t.id)
    }

    /// Ids that end a generation: `eos_token` plus `generation_config.json`'s `eos_token_id`s.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Adds a stop id (no-op if already there).
    pub fn add_stop_token_id(&mut self, id: u32) {
        if !self.stop_ids.contains(&id) {
            self.stop_ids.push(id);
        }
    }

    /// The chat template, when the tokenizer has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the chat template (e.g. one given on the command line).
    pub fn set_chat_template(&mut self, template: Option<ChatTemplate>) {
        self.chat_template = template;
    }

    /// Declares `tools` (a JSON list of tool schemas, transformers' `tools=`) to every
    /// later chat-template rendering; None renders without tools.
    pub fn set_tools(&mut self, tools: Option<serde_json::Value>) {
        self.tools = tools;
    }

    /// The tools every rendering declares (see [`Self::set_tools`]).
    pub fn tools(&self) -> Option<&serde_json::Value> {
        self.tools.as_ref()
    }

    /// The special-token strings a chat template sees (`bos_token`, `eos_token`, ...).
    pub fn template_tokens(&self) -> TemplateTokens {
        let text = |t: &Option<SpecialToken>| t.as_ref().map(|t| t.content.clone());
        TemplateTokens {
            bos_token: text(&self.bos),
            eos_token: text(&self.eos),
            pad_token: text(&self.pad),
            unk_token: text(&self.unk),
        }
    }

    /// Renders `messages` with the chat template, like transformers'
    /// `apply_chat_template(messages, tools=..., tokenize=False, add_generation_prompt=...)`
    /// with the tools of [`Self::set_tools`].
    /// Encode the result with `add_special_tokens = false`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        Ok(template.render_with_tools(
            messages,
            self.tools.as_ref(),
            add_generation_prompt,
            &self.template_tokens(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::byte_tokenizer;

    const LLAMA3: &str = include_str!("../../tests/fixtures/chat_templates/llama3.jinja");
    const QWEN2: &str = include_str!("../../tests/fixtures/chat_templates/qwen2.jinja");
    const QWEN2_5: &str = include_str!("../../tests/fixtures/chat_templates/qwen2_5.jinja");
    const MISTRAL: &str = include_str!("../../tests/fixtures/chat_templates/mistral.jinja");

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("  Hi there!  "),
            ChatMessage::assistant("Hello."),
            ChatMessage::user("2+2?"),
        ]
    }

    /// A folder with the byte tokenizer plus `extra` special tokens and the given config.
    fn folder_with(extra: &[&str], config: Json) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut tok = byte_tokenizer::tokenizer_json();
        let added = tok["added_tokens"].as_array_mut().unwrap();
        for (i, t) in extra.iter().enumerate() {
            added.push(serde_json::json!({
                "id": byte_tokenizer::VOCAB_LEN + i, "content": t, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true
            }));
        }
        std::fs::write(dir.path().join(TOKENIZER_FILE), tok.to_string()).unwrap();
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), config.to_string()).unwrap();
        dir
    }

    // Expected strings below were produced by transformers 5.24's `render_jinja_template`
    // (Jinja2 3.1.6) on the same fixture files and conversations.

    #[test]
    fn llama3_template_matches_transformers() {
        let dir = folder_with(
            &["<|begin_of_text|>", "<|eot_id|>"],
            serde_json::json!({
                "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": false},
                "eos_token": "<|eot_id|>",
                "chat_template": LLAMA3,
            }),
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.bos_token_id(), Some(260));
        assert_eq!(tok.eos_token_id(), Some(261));
        assert_eq!(tok.pad_token_id(), None);
        assert_eq!(
            tok.apply_chat_template(&conversation(), true).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            tok.apply_chat_template(&[ChatMessage::user("Hi")], false)
                .unwrap(),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        );
        // The rendered text encodes with its special tokens as single ids.
        let ids = tok
            .encode(
                &tok.apply_chat_template(&[ChatMessage::user("Hi")], false)
                    .unwrap(),
                false,
            )
            .unwrap();
        assert_eq!(ids.first(), Some(&260));
        assert_eq!(ids.last(), Some(&261));
    }

    #[test]
    fn qwen2_chatml_template_matches_transformers() {
        let dir = folder_with(
            &[],
            serde_json::json!({
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": null,
                "chat_template": QWEN2,
            }),
        );
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.eos_token_id(), Some(byte_tokenizer::IM_END_ID));
        assert_eq!(tok.pad_token_id(), Some(byte_tokenizer::ENDOFTEXT_ID));
        assert_eq!(
            tok.apply_chat_template(&conversation(), true).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there!  <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            tok.apply_chat_template(&[ChatMessage::user("Hi")], false).unwrap(),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn qwen2_5_whitespace_controlled_template_matches_transformers() {
        let t = ChatTemplate::new(QWEN2_5).unwrap();
        let tokens = TemplateTokens::default();
        assert_eq!(
            t.render(&conversation(), false, &tokens).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there!  <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        );
        assert_eq!(
            t.render(&[ChatMessage::user("Hi")], true, &tokens).unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn mistral_template_raises_on_bad_roles() {
        let t = ChatTemplate::new(MISTRAL).unwrap();
        let tokens = TemplateTokens {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..Default::default()
        };
        assert_eq!(
            t.render(&conversation()[1..], true, &tokens).unwrap(),
            "<s>[INST]   Hi there!   [/INST]Hello.</s>[INST] 2+2? [/INST]"
        );
        match t.render(&conversation(), true, &tokens).unwrap_err() {
            ChatTemplateError::Raised(msg) => assert_eq!(
                msg,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            ),
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn chat_template_jinja_file_and_generation_config_are_read() {
        let dir = folder_with(&[], serde_json::json!({"eos_token": "<|endoftext|>"}));
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), QWEN2).unwrap();
        std::fs::write(
            dir.path().join(GENERATION_CONFIG_FILE),
            r#"{"eos_token_id": [259, 256]}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.stop_token_ids(), &[256, 259]);
        assert!(tok
            .apply_chat_template(&[ChatMessage::user("x")], false)
            .unwrap()
            .ends_with("<|im_start|>user\nx<|im_end|>\n"));
    }

    #[test]
    fn config_errors_name_file_and_key() {
        let dir = folder_with(&[], serde_json::json!({"eos_token": "<|nope|>"}));
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json")
                && err.contains("eos_token")
                && err.contains("<|nope|>"),
            "{err}"
        );

        let dir = folder_with(&[], serde_json::json!({"pad_token": 5}));
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("pad_token") && err.contains("expected a string"),
            "{err}"
        );

        let dir = folder_with(&[], serde_json::json!({}));
        let err = Tokenizer::from_dir(dir.path())
            .unwrap()
            .apply_chat_template(&[ChatMessage::user("x")], true)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::NoChatTemplate), "{err}");

        let empty = tempfile::tempdir().unwrap();
        let err = Tokenizer::from_dir(empty.path()).unwrap_err().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
    }

    #[test]
    fn decode_rejects_out_of_range_ids() {
        let tok = byte_tokenizer::build();
        let err = tok.decode(&[1, 9999], false).unwrap_err().to_string();
        assert!(err.contains("9999") && err.contains("260"), "{err}");
    }
}
