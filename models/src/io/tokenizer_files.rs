//! The files beside an HF model's weights that make the folder a whole model (tokenizer,
//! chat template, special tokens, generation defaults), and copying them to another folder.

use std::path::Path;

/// Tokenizer files copied next to saved weights, so the folder is a whole HF model: the
/// fast tokenizer and its config, the chat template where transformers 5 keeps it
/// (`chat_template.jinja`; older processors wrote `chat_template.json`), the special-token
/// map, the slow tokenizer's vocabularies and the generation defaults.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
];

/// Copies the [`TOKENIZER_FILES`] present in `from` into `to`. On error, the file that
/// failed is returned with the error.
pub fn copy_tokenizer_files(
    from: &Path,
    to: &Path,
) -> Result<(), (std::path::PathBuf, std::io::Error)> {
    for f in TOKENIZER_FILES {
        let src = from.join(f);
        if src.is_file() {
            std::fs::copy(&src, to.join(f)).map_err(|e| (src.clone(), e))?;
        }
    }
    Ok(())
}
