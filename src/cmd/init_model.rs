//! `oxalign init-model`: writes a randomly initialised, HF-loadable model folder (config.json,
//! model.safetensors, generation_config.json, tokenizer files) for a family and size preset,
//! through `oxalign_models::init_model_dir` (the same function a run uses for its own init).
//! This file only parses flags, refuses to overwrite without `--force`, and words errors.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use oxalign_models::{
    init_model_dir, Family, InitError, InitHead, InitSpec, InitTokenizer, Preset,
};

use crate::model_dir::model_error;
use crate::user_error::{user_error, UserError};

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
    /// Model family (HF model_type): llama, qwen2, qwen3, mistral, phi3, or the mixture-of-experts
    /// qwen3_moe, qwen2_moe, mixtral.
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
    let spec = InitSpec {
        family: args.family,
        preset: args.preset,
        head: match args.head {
            Head::Lm => InitHead::Lm,
            Head::Reward => InitHead::Reward,
            Head::Value => InitHead::Value,
        },
        seed: args.seed,
        tokenizer: match args.tokenizer.as_str() {
            "byte" => InitTokenizer::Byte,
            path => InitTokenizer::Path(PathBuf::from(path)),
        },
    };
    let config = init_model_dir(&args.out, &spec).map_err(|e| init_error(e, &args))?;
    eprintln!(
        "wrote {} {} model, {:?} head ({} parameters in decoder + LM head, vocab_size {}) to {}",
        args.family,
        args.preset,
        args.head,
        config.num_parameters(),
        config.vocab_size,
        args.out.display()
    );
    Ok(())
}

/// Maps an init failure to `anyhow`: tokenizer problems name `--tokenizer` and the value
/// given; everything but tensor math is a user error.
fn init_error(err: InitError, args: &Args) -> anyhow::Error {
    match err {
        InitError::Model(e) => model_error(e, &args.out),
        e @ (InitError::NoTokenizer { .. }
        | InitError::NoTokenizerJson { .. }
        | InitError::Tokenizer { .. }) => {
            // These messages read "tokenizer <as given>: ...", so "--" names the flag.
            UserError::new(format!("--{e}")).into()
        }
        e @ InitError::Io { .. } => UserError::new(e.to_string()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_rules() {
        assert_eq!(Preset::Tiny.vocab_size(260), 260);
        assert_eq!(Preset::Small.vocab_size(260), 32_000);
        assert_eq!(Preset::Small.vocab_size(32_000), 32_000);
        assert_eq!(Preset::Small.vocab_size(32_001), 32_064);
        assert_eq!(Preset::Small.vocab_size(151_665), 151_680);
    }
}
