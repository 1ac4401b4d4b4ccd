//! `oxalign tokenize`: token ids of each input line with a model folder's tokenizer (and chat
//! template for `"messages"` or `--chat`), for checking tokenizers against transformers. It
//! loads no weights.

use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;

use crate::jsonl::JsonlWriter;
use crate::model_dir::{check_model_dir, load_tokenizer};
use crate::prompt_input::{read_records, record_ids, EncodeMode};
use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign tokenize`.
#[derive(Debug, Parser)]
#[command(
    about = "Tokenize text (or a chat) with a model folder's tokenizer",
    long_about = "Tokenize text (or a chat) with a model folder's tokenizer.\n\n\
Each input line is {\"text\": \"...\"} (special tokens added, like transformers' \
tokenizer(text)), {\"input_ids\": [...]} (decoded back) or {\"messages\": [...]} (rendered with \
the chat template, then encoded without adding special tokens). Each output line is \
{\"input_ids\": [...], \"text\": \"...\"} where text is the decoded ids, special tokens kept."
)]
pub struct Args {
    /// Model or tokenizer folder (tokenizer.json, tokenizer_config.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Input JSONL file; `-` reads standard input.
    #[arg(long)]
    pub input: PathBuf,
    /// Output JSONL file (stdout when omitted).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Wrap "text" inputs as a user message and apply the chat template.
    #[arg(long)]
    pub chat: bool,
    /// End rendered chats with the assistant header.
    #[arg(long)]
    pub add_generation_prompt: bool,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Record {
    input_ids: Vec<u32>,
    text: String,
}

/// Runs `oxalign tokenize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let records = read_records(&args.input)?;
    let Some(tokenizer) = load_tokenizer(&args.model)? else {
        return user_error(format!("{} has no tokenizer.json", args.model.display()));
    };
    let mode = EncodeMode {
        chat: args.chat,
        add_generation_prompt: args.add_generation_prompt,
    };
    let mut out = JsonlWriter::create(args.output.as_deref())?;
    for rec in &records {
        let input_ids = record_ids(
            &args.input,
            rec,
            Some(&tokenizer),
            tokenizer.vocab_len(),
            mode,
        )?;
        let text = tokenizer.decode(&input_ids, false).user_err(format!(
            "{}:{}",
            args.input.display(),
            rec.line
        ))?;
        out.write(&Record { input_ids, text })?;
    }
    out.finish()
}
