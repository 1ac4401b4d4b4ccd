//! `oxalign generate`: completes each input prompt with a causal LM on the paged engine the
//! RL loop uses (continuous batching over a paged KV cache, seeded sampling or greedy) and
//! writes the completion with its per-token log-probs. A batch tool, not a server.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{ArgGroup, Parser};
use oxalign_models::engine::{Engine, EngineConfig};
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::{CausalLm, Completion, FinishReason, GenerationRequest, SamplingParams};
use serde::Serialize;

use crate::context_len::fit_generation;
use crate::jsonl::JsonlWriter;
use crate::model_dir::{check_model_dir, load_tokenizer, model_error, open_device};
use crate::prompt_input::{read_records, record_ids, text_records, EncodeMode, InputRecord};
use crate::user_error::{user_error, IntoUserError};

/// Arguments of `oxalign generate`.
#[derive(Debug, Parser)]
#[command(group(ArgGroup::new("prompts").required(true).args(["input", "prompt"])))]
#[command(
    about = "Sample completions for prompts with a causal LM",
    long_about = "Sample completions for prompts with a causal LM (KV-cached, batched).\n\n\
The prompts come from --input (a JSONL file, `-` for standard input) or from --prompt \
(repeatable; each is one {\"text\": ...} line). Each input line is {\"text\": \"...\"}, {\"input_ids\": [...]} or {\"messages\": [...]} (a chat, \
rendered with the tokenizer's chat template and an assistant header). With --chat, \"text\" is \
wrapped as one user message. Each output line is {\"prompt\", \"prompt_ids\", \"completion\", \
\"completion_ids\", \"logprobs\", \"finish_reason\"}: prompt is the decoded prompt ids, \
completion the decoded completion without special tokens, logprobs[i] the log-prob in nats of \
completion_ids[i] at temperature 1 (no top-k/top-p), finish_reason \"stop\" or \"length\".\n\n\
Prompt plus --max-new-tokens must fit in the model's context (max_position_embeddings); \
--truncate fits them instead. Input lines over 10 MiB are refused.\n\n\
--temperature 0 is greedy. Line i samples with seed --seed + i, so results do not depend on \
--batch-size."
)]
pub struct Args {
    /// Model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Input JSONL file; `-` reads standard input. Exactly one of --input and --prompt.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// A prompt's text, as the line {"text": TEXT} (with --chat, a user message); repeatable,
    /// one output line each, in order.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Vec<String>,
    /// Output JSONL file (stdout when omitted).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Most tokens to generate per prompt (a stop token counts).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 = greedy.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling threshold in (0, 1]; 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Base seed; line i uses seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Wrap "text" inputs as a user message and apply the chat template.
    #[arg(long)]
    pub chat: bool,
    /// Keep generating past EOS / stop tokens (until --max-new-tokens or the end of the
    /// model's context).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Fit each generation into the model's context (max_position_embeddings): keep the
    /// last tokens of a prompt that fills it, and stop the completion where the context ends
    /// (finish_reason "length"). Without it, such a line is an error.
    #[arg(long)]
    pub truncate: bool,
    /// Prompts per batch.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_size: u64,
    /// Device: cpu, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Record {
    prompt: Option<String>,
    prompt_ids: Vec<u32>,
    completion: Option<String>,
    completion_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish_reason: &'static str,
}

/// Runs `oxalign generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    if let Err(msg) = sampling.validate() {
        return user_error(format!("invalid sampling option: {msg}"));
    }
    let device = open_device(&args.device)?;
    let (source, records) = match &args.input {
        Some(path) => (path.clone(), read_records(path)?),
        None => (PathBuf::from("--prompt"), text_records(&args.prompt)),
    };
    let tokenizer = load_tokenizer(&args.model)?;
    if args.chat && tokenizer.as_ref().and_then(|t| t.chat_template()).is_none() {
        return user_error(format!(
            "--chat needs a chat template, but the tokenizer in {} has none",
            args.model.display()
        ));
    }
    let model = CausalLm::load(&args.model, &device).map_err(|e| model_error(e, &args.model))?;
    let input = Input {
        source: &source,
        records: &records,
    };
    let requests = requests(&args, input, tokenizer.as_ref(), &model, &sampling)?;
    let completions = generate(&args, &model, &requests)?;
    let mut out = JsonlWriter::create(args.output.as_deref())?;
    for (req, c) in requests.into_iter().zip(completions) {
        out.write(&record(tokenizer.as_ref(), req, c)?)?;
    }
    out.finish()
}

/// The prompts to complete, and what names them in messages (the input file, or `--prompt`
/// with the prompt's 1-based position as its line).
#[derive(Clone, Copy)]
struct Input<'a> {
    source: &'a Path,
    records: &'a [InputRecord],
}

/// One generation request per input line: its prompt ids (fitted to the context), its
/// seed `--seed + line index`, and the tokenizer's stop tokens unless `--ignore-eos`.
fn requests(
    args: &Args,
    Input { source, records }: Input<'_>,
    tokenizer: Option<&Tokenizer>,
    model: &CausalLm,
    sampling: &SamplingParams,
) -> anyhow::Result<Vec<GenerationRequest>> {
    let (vocab, ctx) = (
        model.config().vocab_size,
        model.config().max_position_embeddings,
    );
    let mode = EncodeMode {
        chat: args.chat,
        add_generation_prompt: true,
    };
    let stop_ids: Vec<u32> = match (args.ignore_eos, tokenizer) {
        (false, Some(t)) => t.stop_token_ids().to_vec(),
        _ => Vec::new(),
    };
    let mut requests = Vec::with_capacity(records.len());
    for (i, rec) in records.iter().enumerate() {
        let mut prompt = record_ids(source, rec, tokenizer, vocab, mode)?;
        if prompt.is_empty() {
            return user_error(format!(
                "{}:{}: the prompt has no tokens",
                source.display(),
                rec.line
            ));
        }
        let (line, want) = (rec.line, args.max_new_tokens);
        let max_new_tokens = fit_generation(source, line, &mut prompt, want, ctx, args.truncate)?;
        requests.push(GenerationRequest {
            prompt,
            max_new_tokens,
            sampling: SamplingParams {
                seed: args.seed.wrapping_add(i as u64),
                ..sampling.clone()
            },
            stop_token_ids: stop_ids.clone(),
            ignore_eos: args.ignore_eos,
        });
    }
    Ok(requests)
}

/// Completes `requests` on the paged engine, at most `--batch-size` sequences running at
/// once. Each request has its own RNG, so the batching does not change what is sampled.
fn generate(
    args: &Args,
    model: &CausalLm,
    requests: &[GenerationRequest],
) -> anyhow::Result<Vec<Completion>> {
    let config = EngineConfig {
        max_running: args.batch_size as usize,
        ..EngineConfig::default()
    };
    let mut engine = Engine::from_model(model, config).context("starting the generation engine")?;
    engine.generate(requests).context("generating")
}

/// The output line of one request.
fn record(
    tokenizer: Option<&Tokenizer>,
    req: GenerationRequest,
    c: Completion,
) -> anyhow::Result<Record> {
    let (prompt, completion) = match tokenizer {
        Some(t) => (
            Some(
                t.decode(&req.prompt, false)
                    .user_err("cannot decode the prompt")?,
            ),
            Some(
                t.decode_generated(&c.tokens, true)
                    .user_err("cannot decode the completion")?,
            ),
        ),
        None => (None, None),
    };
    Ok(Record {
        prompt,
        prompt_ids: req.prompt,
        completion,
        completion_ids: c.tokens,
        logprobs: c.logprobs,
        finish_reason: match c.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        },
    })
}
