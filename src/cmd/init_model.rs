//! `oxalign init-model`: writes a randomly initialised, HF-loadable model folder (config.json,
//! model.safetensors, generation_config.json, tokenizer files) for a family and size preset.
//! Seeded and reproducible; it trains nothing.

use std::path::{Path, PathBuf};

use candle_core::Device;
use clap::{Parser, ValueEnum};
use oxalign_models::tokenizer::{
    Tokenizer, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use oxalign_models::{
    byte_tokenizer, CausalLm, Family, ModelConfig, Preset, RewardModel, ValueModel,
};

use crate::model_dir::model_error;
use crate::user_error::{user_error, IntoUserError};

/// Vocabulary sizes of `small` models are rounded up to a multiple of this.
const VOCAB_MULTIPLE: usize = 64;
/// The `small` preset's vocabulary size (when the tokenizer fits in it).
const SMALL_VOCAB: usize = 32_000;

/// Arguments of `oxalign init-model`.
#[derive(Debug, Parser)]
#[command(
    about = "Write a randomly initialised HF model folder (config, weights, tokenizer)",
    long_about = "Write a randomly initialised HF model folder: config.json, model.safetensors, \
generation_config.json, tokenizer.json and tokenizer_config.json. The folder loads with \
transformers' AutoModelForCausalLM/AutoTokenizer. The same --seed gives the same weights.\n\n\
Vocabulary size: `tiny` uses the tokenizer's size exactly; `small` uses 32000, or the \
tokenizer's size rounded up to a multiple of 64 when that is larger."
)]
pub struct Args {
    /// Model family (HF model_type): llama, qwen2 or mistral.
    #[arg(long)]
    pub family: Family,
    /// Size preset: tiny (~1M parameters) or small (~56M parameters with vocab 32000).
    #[arg(long)]
    pub preset: Preset,
    /// Output folder (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// `byte` for the built-in byte-level tokenizer (260 ids, ChatML template), or a path to a
    /// tokenizer folder (or its tokenizer.json) whose tokenizer files are copied.
    #[arg(long, default_value = "byte")]
    pub tokenizer: String,
    /// Which head: `lm` (*ForCausalLM), `reward` (*ForSequenceClassification, num_labels 1)
    /// or `value` (*ForTokenClassification, num_labels 1, the PPO critic).
    #[arg(long, value_enum, default_value_t = Head::Lm)]
    pub head: Head,
    /// Seed of the random initialisation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Overwrite a folder that already holds a config.json.
    #[arg(long)]
    pub force: bool,
}

/// The head put on the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Head {
    /// Language-model head (`lm_head`), for policies and references.
    Lm,
    /// Sequence score (`score.weight` [1, H], no bias), for reward models.
    Reward,
    /// Per-token value (`score` Linear(H, 1) with bias), for critics.
    Value,
}

/// Runs `oxalign init-model`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.out.join("config.json").exists() && !args.force {
        return user_error(format!(
            "{} already holds a model (config.json); pass --force to overwrite it",
            args.out.display()
        ));
    }
    let (source, tokenizer) = resolve_tokenizer(&args.tokenizer)?;
    std::fs::create_dir_all(&args.out).user_err(format!(
        "cannot create output folder {}",
        args.out.display()
    ))?;
    write_tokenizer(&source, &args.out)?;
    let vocab_size = model_vocab_size(args.preset, tokenizer.vocab_len());
    let mut config = ModelConfig::preset(args.family, args.preset, vocab_size);
    config.bos_token_id = tokenizer.bos_token_id();
    config.eos_token_id = tokenizer.stop_token_ids().to_vec();
    config.pad_token_id = tokenizer.pad_token_id();

    let saved = match args.head {
        Head::Lm => {
            CausalLm::init_random(&config, args.seed, &Device::Cpu).and_then(|m| m.save(&args.out))
        }
        Head::Reward => RewardModel::init_random(&config, args.seed, &Device::Cpu)
            .and_then(|m| m.save(&args.out)),
        Head::Value => ValueModel::init_random(&config, args.seed, &Device::Cpu)
            .and_then(|m| m.save(&args.out)),
    };
    saved.map_err(|e| model_error(e, &args.out))?;
    eprintln!(
        "wrote {} {} model, {:?} head ({} parameters in decoder + LM head, vocab_size {}) to {}",
        args.family,
        args.preset,
        args.head,
        config.num_parameters(),
        vocab_size,
        args.out.display()
    );
    Ok(())
}

/// `tiny`: the tokenizer's size. `small`: max(32000, tokenizer size rounded up to 64).
pub fn model_vocab_size(preset: Preset, tokenizer_len: usize) -> usize {
    match preset {
        Preset::Tiny => tokenizer_len,
        Preset::Small => (tokenizer_len.div_ceil(VOCAB_MULTIPLE) * VOCAB_MULTIPLE).max(SMALL_VOCAB),
    }
}

/// Where the new folder's tokenizer comes from.
enum TokenizerSource {
    /// The built-in byte-level tokenizer.
    Byte,
    /// Files copied as they are: (source path, file name in the new folder).
    Files(Vec<(PathBuf, &'static str)>),
}

/// Loads the tokenizer named by `--tokenizer` (before anything is written, so a bad one
/// leaves no half-made folder) and says which files to copy. The loaded tokenizer carries the
/// stop ids the model's generation_config.json should hold.
fn resolve_tokenizer(spec: &str) -> anyhow::Result<(TokenizerSource, Tokenizer)> {
    if spec == "byte" {
        return Ok((TokenizerSource::Byte, byte_tokenizer::build()));
    }
    let src = Path::new(spec);
    let (src_dir, tokenizer_json) = if src.is_file() {
        let dir = src.parent().unwrap_or(Path::new(".")).to_path_buf();
        (dir, src.to_path_buf())
    } else if src.is_dir() {
        (src.to_path_buf(), src.join(TOKENIZER_FILE))
    } else {
        return user_error(format!(
            "--tokenizer {spec}: no such file or folder (expected `byte`, a folder with tokenizer.json, or a tokenizer.json file)"
        ));
    };
    if !tokenizer_json.is_file() {
        return user_error(format!(
            "--tokenizer {spec}: {} not found",
            tokenizer_json.display()
        ));
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
    .user_err(format!("--tokenizer {spec}"))?;
    let mut files = vec![(tokenizer_json, TOKENIZER_FILE)];
    for name in [TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE] {
        let from = src_dir.join(name);
        if from.is_file() {
            files.push((from, name));
        }
    }
    Ok((TokenizerSource::Files(files), tokenizer))
}

/// Writes the tokenizer files into `out`.
fn write_tokenizer(source: &TokenizerSource, out: &Path) -> anyhow::Result<()> {
    match source {
        TokenizerSource::Byte => {
            byte_tokenizer::write(out).user_err("cannot write the byte tokenizer")
        }
        TokenizerSource::Files(files) => {
            for (from, name) in files {
                let to = out.join(name);
                let same = to.exists() && from.canonicalize().ok() == to.canonicalize().ok();
                if !same {
                    std::fs::copy(from, &to).user_err(format!(
                        "cannot copy {} to {}",
                        from.display(),
                        to.display()
                    ))?;
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_rules() {
        assert_eq!(model_vocab_size(Preset::Tiny, 260), 260);
        assert_eq!(model_vocab_size(Preset::Small, 260), 32_000);
        assert_eq!(model_vocab_size(Preset::Small, 32_000), 32_000);
        assert_eq!(model_vocab_size(Preset::Small, 32_001), 32_064);
        assert_eq!(model_vocab_size(Preset::Small, 151_665), 151_680);
    }
}
