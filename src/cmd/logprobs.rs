//! `oxalign logprobs`: log-probabilities (nats) of every next token of each input sequence under
//! a causal LM, batched with right padding and an attention mask. It reports per-token values
//! only; summing or masking prompt tokens is left to the reader.

use std::path::PathBuf;

use clap::Parser;
use oxalign_models::CausalLm;
use serde::Serialize;

use crate::jsonl::JsonlWriter;
use crate::model_dir::{check_model_dir, load_tokenizer, model_error, open_device};
use crate::prompt_input::{padded_batch, read_records, scoring_sequences};

/// Arguments of `oxalign logprobs`.
#[derive(Debug, Parser)]
#[command(
    about = "Per-token log-probabilities of sequences under a causal LM",
    long_about = "Per-token log-probabilities of sequences under a causal LM.\n\n\
Each input line is {\"text\": \"...\"} (tokenized with the model's tokenizer, special tokens \
added), {\"input_ids\": [...]} or {\"messages\": [{\"role\", \"content\"}, ...]} (rendered with \
the chat template). Each output line is {\"input_ids\": [...], \"logprobs\": [...]} where \
logprobs[i] = log p(input_ids[i+1] | input_ids[..=i]) in nats (T-1 values for T ids)."
)]
pub struct Args {
    /// Model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Input JSONL file; `-` reads standard input.
    #[arg(long)]
    pub input: PathBuf,
    /// Output JSONL file (stdout when omitted).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_size: u64,
    /// Upper bound on batch rows x padded length per forward pass.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch_tokens: u64,
    /// Device: cpu, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Record {
    input_ids: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Runs `oxalign logprobs`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let device = open_device(&args.device)?;
    let records = read_records(&args.input)?;
    let tokenizer = load_tokenizer(&args.model)?;
    let model = CausalLm::load(&args.model, &device).map_err(|e| model_error(e, &args.model))?;
    let seqs = scoring_sequences(
        &args.input,
        &records,
        tokenizer.as_ref(),
        model.config(),
        "logprobs needs at least one",
    )?;
    let pad = model.config().pad_token_id.unwrap_or(0);
    let logprobs = batched_logprobs(
        &model,
        &seqs,
        pad,
        args.batch_size as usize,
        args.max_batch_tokens as usize,
    )?;
    let mut out = JsonlWriter::create(args.output.as_deref())?;
    for (input_ids, logprobs) in seqs.into_iter().zip(logprobs) {
        out.write(&Record {
            input_ids,
            logprobs,
        })?;
    }
    out.finish()
}

/// Next-token log-probs of every sequence (`seqs[i].len() - 1` values each), computed in
/// batches of similar length: at most `batch_size` rows and `max_tokens` padded ids per batch,
/// right-padded with `pad` under an attention mask.
pub fn batched_logprobs(
    model: &CausalLm,
    seqs: &[Vec<u32>],
    pad: u32,
    batch_size: usize,
    max_tokens: usize,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].len()));
    let mut out = vec![Vec::new(); seqs.len()];
    let mut start = 0;
    while start < order.len() {
        // Longest first, so the first row fixes the padded length of the batch.
        let t = seqs[order[start]].len();
        let rows = batch_size.min((max_tokens / t.max(1)).max(1));
        let batch = &order[start..(start + rows).min(order.len())];
        start += batch.len();
        if t < 2 {
            continue; // single tokens have no next-token log-prob
        }
        let (ids, mask) = padded_batch(seqs, batch, t, pad, model.device())?;
        let lp = model
            .next_token_logprobs(&ids, Some(&mask))?
            .to_dtype(candle_core::DType::F32)?
            .to_vec2::<f32>()?;
        for (row, &i) in lp.into_iter().zip(batch) {
            let n = seqs[i].len() - 1;
            out[i] = row[..n].to_vec();
        }
    }
    Ok(out)
}
