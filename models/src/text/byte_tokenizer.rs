//! A byte-level tokenizer written as HF files: GPT-2 ByteLevel pre-tokenizer/decoder and a BPE
//! model whose vocabulary is the 256 byte symbols (id = byte value) with no merges, plus
//! special tokens and a ChatML chat template. Both `tokenizers` (Rust) and transformers'
//! `AutoTokenizer` load it, and it round-trips any UTF-8 text. It learns no merges.

use std::path::Path;

use serde_json::{json, Value as Json};

use crate::text::tokenizer::{Tokenizer, TokenizerError, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};

/// Special tokens, in id order after the 256 bytes.
pub const SPECIAL_TOKENS: [&str; 4] = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"];
/// Id of `<|endoftext|>` (the EOS token).
pub const ENDOFTEXT_ID: u32 = 256;
/// Id of `<|pad|>`.
pub const PAD_ID: u32 = 257;
/// Id of `<|im_start|>`.
pub const IM_START_ID: u32 = 258;
/// Id of `<|im_end|>` (ends a chat turn; also a stop id in `generation_config.json`).
pub const IM_END_ID: u32 = 259;
/// Total number of ids: 256 bytes + the special tokens.
pub const VOCAB_LEN: usize = 256 + SPECIAL_TOKENS.len();

/// ChatML, as Qwen2 uses it (without a default system prompt).
pub(crate) const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// GPT-2's reversible map from bytes to printable characters (`bytes_to_unicode`): printable
/// Latin-1 bytes map to themselves, the others to U+0100 onwards in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are valid chars");
            next += 1;
            c
        };
    }
    table
}

/// The `tokenizer.json` document.
pub(crate) fn tokenizer_json() -> Json {
    let table = byte_to_char_table();
    let mut vocab = serde_json::Map::new();
    for (id, c) in table.iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let added: Vec<Json> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({
                "id": 256 + i,
                "content": t,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": true
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": true,
            "use_regex": true
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": false,
            "use_regex": true
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": true,
            "use_regex": true
        },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": []
        }
    })
}

/// The `tokenizer_config.json` document: EOS `<|endoftext|>`, pad `<|pad|>`, no BOS,
/// ChatML template. `added_tokens_decoder` is spelled out so transformers marks them special.
pub(crate) fn tokenizer_config_json() -> Json {
    let mut decoder = serde_json::Map::new();
    for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
        decoder.insert(
            (256 + i).to_string(),
            json!({
                "content": t,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": false,
                "special": true
            }),
        );
    }
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[1],
        "unk_token": null,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 1_000_000_000_000_000_000u64,
        "chat_template": CHATML_TEMPLATE
    })
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (which must exist).
pub fn write(dir: impl AsRef<Path>) -> Result<(), TokenizerError> {
    let dir = dir.as_ref();
    for (name, doc) in [
        (TOKENIZER_FILE, tokenizer_json()),
        (TOKENIZER_CONFIG_FILE, tokenizer_config_json()),
    ] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&doc).expect("a json! value serializes");
        std::fs::write(&path, text + "\n").map_err(|source| TokenizerError::Io { path, source })?;
    }
    Ok(())
}

/// The byte tokenizer, built in memory (no files). `<|im_end|>` is an extra stop id.
pub fn build() -> Tokenizer {
    let mut tok = build_plain_text();
    tok.add_stop_token_id(IM_END_ID);
    tok
}

/// The byte tokenizer as its two files load back (no `generation_config.json`): the only
/// stop id is the eos `<|endoftext|>`.
pub fn build_plain_text() -> Tokenizer {
    let text = tokenizer_json().to_string();
    let inner: tokenizers::Tokenizer = text
        .parse()
        .expect("the byte tokenizer's JSON is a valid tokenizer");
    Tokenizer::from_parts(
        inner,
        Some((TOKENIZER_CONFIG_FILE.into(), tokenizer_config_json())),
    )
    .expect("the byte tokenizer's config names tokens it has")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::chat_template::ChatMessage;

    #[test]
    fn table_is_a_bijection_onto_distinct_chars() {
        let table = byte_to_char_table();
        let set: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(table[b'A' as usize], 'A');
        assert_eq!(table[b' ' as usize], '\u{120}'); // GPT-2's 'Ġ'
        assert_eq!(table[b'\n' as usize], '\u{10A}'); // 'Ċ'
    }

    #[test]
    fn ids_are_bytes_and_text_round_trips() {
        let tok = build();
        assert_eq!(tok.vocab_len(), VOCAB_LEN);
        for text in [
            "hello world",
            "  leading spaces\tand\ttabs\r\n",
            "naïve café — 日本語 🦀 \u{0}\u{7f}",
            "<|im_start|>user\nhi<|im_end|>\n",
            "",
        ] {
            let ids = tok.encode(text, true).unwrap();
            let plain: Vec<u32> = text.bytes().map(u32::from).collect();
            if !text.contains("<|") {
                assert_eq!(ids, plain, "ids of {text:?}");
            }
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        assert_eq!(
            tok.encode("<|im_start|>x<|im_end|>", false).unwrap(),
            vec![IM_START_ID, b'x' as u32, IM_END_ID]
        );
    }

    #[test]
    fn special_tokens_and_template() {
        let tok = build();
        assert_eq!(tok.eos_token_id(), Some(ENDOFTEXT_ID));
        assert_eq!(tok.pad_token_id(), Some(PAD_ID));
        assert_eq!(tok.bos_token_id(), None);
        assert_eq!(tok.stop_token_ids(), &[ENDOFTEXT_ID, IM_END_ID]);
        let text = tok
            .apply_chat_template(&[ChatMessage::user("Hi")], true)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            tok.decode(&tok.encode("a<|pad|>b", false).unwrap(), true)
                .unwrap(),
            "ab"
        );
    }

    #[test]
    fn plain_text_build_is_what_the_written_files_load_as() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path()).unwrap();
        let loaded = Tokenizer::from_dir(dir.path()).unwrap();
        let built = build_plain_text();
        assert_eq!(built.stop_token_ids(), loaded.stop_token_ids());
        assert_eq!(built.stop_token_ids(), &[256]);
        assert_eq!(built.vocab_len(), loaded.vocab_len());
        assert_eq!(built.bos_token_id(), loaded.bos_token_id());
        assert_eq!(built.pad_token_id(), loaded.pad_token_id());
        assert_eq!(build().stop_token_ids(), &[256, IM_END_ID]);
    }

    #[test]
    fn written_files_load_back() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.vocab_len(), VOCAB_LEN);
        assert_eq!(tok.encode("é", false).unwrap(), vec![0xC3, 0xA9]);
        assert!(tok.chat_template().is_some());
    }
}
