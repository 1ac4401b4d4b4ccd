//! `oxalign score`: one scalar reward per input sequence from an HF `*ForSequenceClassification`
//! reward model (score at the last real token), batched with right padding. It does not train
//! or normalise rewards.

use std::path::PathBuf;

use clap::Parser;
use oxalign_models::{ModelError, RewardModel};
use serde::Serialize;

use crate::jsonl::JsonlWriter;
use crate::model_dir::{check_model_dir, load_tokenizer, model_error, open_device};
use crate::prompt_input::{padded_batch, read_records, scoring_sequences};
use crate::user_error::UserError;

/// Arguments of `oxalign score`.
#[derive(Debug, Parser)]
#[command(
    about = "Score sequences with a reward model",
    long_about = "Score sequences with a reward model (an HF *ForSequenceClassification folder with \
num_labels = 1, e.g. from `oxalign init-model --head reward`).\n\n\
Each input line is {\"text\": \"...\"}, {\"input_ids\": [...]} or {\"messages\": [...]} (a whole \
conversation, rendered with the chat template). Each output line is {\"score\": x}: the reward \
model's output at the last token."
)]
pub struct Args {
    /// Reward model folder.
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
    /// Device: cpu, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Record {
    score: f32,
}

/// Runs `oxalign score`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let device = open_device(&args.device)?;
    let records = read_records(&args.input)?;
    let tokenizer = load_tokenizer(&args.model)?;
    let model = RewardModel::load(&args.model, &device).map_err(|e| {
        let hint = matches!(&e, ModelError::MissingTensor { name, .. } if name == "score.weight");
        let err = model_error(e, &args.model);
        if hint {
            UserError::new(format!(
                "{err} (is it a reward model? `oxalign init-model --head reward` writes one)"
            ))
            .into()
        } else {
            err
        }
    })?;
    let seqs = scoring_sequences(
        &args.input,
        &records,
        tokenizer.as_ref(),
        model.config(),
        "a score needs at least one",
    )?;
    let pad = model.config().pad_token_id.unwrap_or(0);
    let scores = batched_scores(&model, &seqs, pad, args.batch_size as usize)?;
    let mut out = JsonlWriter::create(args.output.as_deref())?;
    for score in scores {
        out.write(&Record { score })?;
    }
    out.finish()
}

/// Scores of every (non-empty) sequence, in batches of similar length, right-padded with
/// `pad` under an attention mask.
pub fn batched_scores(
    model: &RewardModel,
    seqs: &[Vec<u32>],
    pad: u32,
    batch_size: usize,
) -> anyhow::Result<Vec<f32>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].len());
    let mut out = vec![0.0; seqs.len()];
    for batch in order.chunks(batch_size) {
        let t = batch.iter().map(|&i| seqs[i].len()).max().unwrap_or(1);
        let (ids, mask) = padded_batch(seqs, batch, t, pad, model.device())?;
        let scores = model
            .forward(&ids, Some(&mask))?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?;
        for (&i, s) in batch.iter().zip(scores) {
            out[i] = s;
        }
    }
    Ok(out)
}
