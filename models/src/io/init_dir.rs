//! `init_model_dir`: writes a randomly initialised, HF-loadable model folder (config.json,
//! model.safetensors, generation_config.json, tokenizer files) for a family, size preset and
//! head. `oxalign init-model` and a run without `model.path` both call it, so the two folders
//! follow the same rules. Seeded and reproducible; it trains nothing and does not decide
//! whether an existing folder may be overwritten (the caller does).
//!
//! The rules:
//! * vocabulary: [`Preset::vocab_size`] of the tokenizer's size;
//! * token ids: `bos`/`pad` from the tokenizer, `eos` = the tokenizer's stop ids, which for
//!   the byte tokenizer depend on the [`InitTokenizer`] variant (see there).

use crate::config::family::Family;
use crate::config::model_config::ModelConfig;
use crate::config::preset::Preset;
use crate::error::ModelError;
use crate::nn::head::{Head, LmHead, RewardHead, ValueHead};
use crate::nn::model::Model;
use crate::text::byte_tokenizer;
use crate::text::tokenizer::{
    Tokenizer, TokenizerError, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use candle_core::Device;
use std::path::{Path, PathBuf};

/// Where a new folder's tokenizer comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitTokenizer {
    /// The built-in byte tokenizer (260 ids, ChatML template). The model stops at
    /// `<|endoftext|>` and `<|im_end|>` (eos `[256, 259]`): a chat-ready folder, what
    /// `oxalign init-model --tokenizer byte` writes.
    Byte,
    /// The built-in byte tokenizer, stopping at `<|endoftext|>` only (eos `[256]`): what a
    /// run's own `<run>/init` folder has always held. The plain-text recipes were tuned with
    /// it, so it is kept as a separate, named choice rather than changed silently.
    BytePlainText,
    /// A tokenizer folder (tokenizer.json, optional tokenizer_config.json,
    /// chat_template.jinja, generation_config.json) or a tokenizer.json file; its files are
    /// copied and its stop ids (generation_config.json included) become the model's eos.
    Path(PathBuf),
}

/// The head the new folder's model wears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitHead {
    /// Language-model head (`*ForCausalLM`), for policies and references.
    Lm,
    /// Sequence score (`*ForSequenceClassification`, one label), for reward models.
    Reward,
    /// Per-token value (`*ForTokenClassification`, one label), for critics.
    Value,
}

/// What `init_model_dir` writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitSpec {
    /// Model family.
    pub family: Family,
    /// Size preset.
    pub preset: Preset,
    /// Head.
    pub head: InitHead,
    /// Seed of the random initialisation.
    pub seed: u64,
    /// Tokenizer source.
    pub tokenizer: InitTokenizer,
}

/// Why a model folder could not be initialised.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The tokenizer path does not exist.
    #[error("tokenizer {}: no such file or folder (expected `byte`, a folder with tokenizer.json, or a tokenizer.json file)", path.display())]
    NoTokenizer {
        /// The path given.
        path: PathBuf,
    },
    /// A tokenizer folder has no tokenizer.json.
    #[error("tokenizer {}: {} not found", path.display(), path.join(TOKENIZER_FILE).display())]
    NoTokenizerJson {
        /// The folder given.
        path: PathBuf,
    },
    /// The tokenizer files could not be loaded.
    #[error("tokenizer {}: {source}", path.display())]
    Tokenizer {
        /// The path given (`byte` for the built-in one).
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: TokenizerError,
    },
    /// A file of the new folder could not be written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Building or saving the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Writes a fresh model folder `dir` (created if needed) as `spec` says and returns its
/// config. The tokenizer is loaded before anything is written, so a bad one leaves no folder.
pub fn init_model_dir(dir: &Path, spec: &InitSpec) -> Result<ModelConfig, InitError> {
    let (files, tokenizer) = resolve_tokenizer(&spec.tokenizer)?;
    std::fs::create_dir_all(dir).map_err(|source| InitError::Io {
        action: "create folder",
        path: dir.to_path_buf(),
        source,
    })?;
    write_tokenizer(&files, dir)?;
    let mut config = ModelConfig::preset(
        spec.family,
        spec.preset,
        spec.preset.vocab_size(tokenizer.vocab_len()),
    );
    config.bos_token_id = tokenizer.bos_token_id();
    config.eos_token_id = tokenizer.stop_token_ids().to_vec();
    config.pad_token_id = tokenizer.pad_token_id();
    match spec.head {
        InitHead::Lm => save_random::<LmHead>(&config, spec.seed, dir)?,
        InitHead::Reward => save_random::<RewardHead>(&config, spec.seed, dir)?,
        InitHead::Value => save_random::<ValueHead>(&config, spec.seed, dir)?,
    }
    Ok(config)
}

fn save_random<H: Head>(config: &ModelConfig, seed: u64, dir: &Path) -> Result<(), ModelError> {
    Model::<H>::init_random(config, seed, &Device::Cpu)?.save(dir)
}

/// Tokenizer files to put in the new folder.
enum TokenizerFiles {
    /// The built-in byte tokenizer's.
    Byte,
    /// Copied as they are: (source path, file name in the new folder).
    Copy(Vec<(PathBuf, &'static str)>),
}

/// Loads the tokenizer of `source` and says which files to write.
fn resolve_tokenizer(source: &InitTokenizer) -> Result<(TokenizerFiles, Tokenizer), InitError> {
    let src = match source {
        InitTokenizer::Byte => return Ok((TokenizerFiles::Byte, byte_tokenizer::build())),
        InitTokenizer::BytePlainText => {
            return Ok((TokenizerFiles::Byte, byte_tokenizer::build_plain_text()))
        }
        InitTokenizer::Path(p) => p.as_path(),
    };
    let (src_dir, tokenizer_json) = if src.is_file() {
        let dir = src.parent().unwrap_or(Path::new(".")).to_path_buf();
        (dir, src.to_path_buf())
    } else if src.is_dir() {
        (src.to_path_buf(), src.join(TOKENIZER_FILE))
    } else {
        return Err(InitError::NoTokenizer {
            path: src.to_path_buf(),
        });
    };
    if !tokenizer_json.is_file() {
        return Err(InitError::NoTokenizerJson {
            path: src.to_path_buf(),
        });
    }
    // A folder's chat_template.jinja and generation_config.json (extra stop ids) count too.
    let tokenizer = if src.is_dir() {
        Tokenizer::from_dir(&src_dir)
    } else {
        let config = src_dir.join(TOKENIZER_CONFIG_FILE);
        Tokenizer::from_files(
            &tokenizer_json,
            config.is_file().then_some(config.as_path()),
        )
    }
    .map_err(|source| InitError::Tokenizer {
        path: src.to_path_buf(),
        source,
    })?;
    let mut files = vec![(tokenizer_json, TOKENIZER_FILE)];
    for name in [TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE] {
        let from = src_dir.join(name);
        if from.is_file() {
            files.push((from, name));
        }
    }
    Ok((TokenizerFiles::Copy(files), tokenizer))
}

/// Writes the tokenizer files into `out`.
fn write_tokenizer(files: &TokenizerFiles, out: &Path) -> Result<(), InitError> {
    match files {
        TokenizerFiles::Byte => byte_tokenizer::write(out).map_err(|source| InitError::Tokenizer {
            path: "byte".into(),
            source,
        }),
        TokenizerFiles::Copy(files) => {
            for (from, name) in files {
                let to = out.join(name);
                let same = to.exists() && from.canonicalize().ok() == to.canonicalize().ok();
                if !same {
                    std::fs::copy(from, &to).map_err(|source| InitError::Io {
                        action: "copy a tokenizer file to",
                        path: to.clone(),
                        source,
                    })?;
                }
            }
            Ok(())
        }
    }
}
