//! `oxalign bench turns`: multi-turn generation on the paged engine, the shape of an episode
//! with a tool or an environment: every turn continues each episode with its earlier turns,
//! then a reply, as one `generate` call. Prints one JSON line: seconds of each turn and of the
//! whole episode batch (median, min, max over the runs) and the tokens prefilled and found in
//! the prefix cache, so a run with `--prefix-cache false` shows what the cache saves.

use super::bench_generate::random_prompts;
use super::spread::Spread;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use oxalign_models::engine::{Engine, EngineConfig};
use oxalign_models::{CausalLm, GenerationRequest, SamplingParams};
use serde::Serialize;

use crate::model_dir::{check_model_dir, model_error, open_device};

/// Arguments of `oxalign bench turns`.
#[derive(Debug, Parser)]
#[command(
    about = "Measure multi-turn generation (episodes continued turn by turn) with and without the prefix cache",
    long_about = "Measure multi-turn generation on the paged engine: --batch episodes start from seeded \
random prompts of --prompt-len tokens; each of --turns turns generates --new-tokens greedy tokens per \
episode (eos ignored) in one generate call, then appends --reply-len seeded random tokens (the \
environment's reply) for the next turn. Each run uses a fresh engine. Prints one JSON line: \
turn_seconds (per turn, median over the runs), episode_seconds (all turns: median/min/max), \
prefill_tokens and prefix_cache_hit_tokens of the last run. --prefix-cache false re-prefills every \
turn from its first token."
)]
pub struct Args {
    /// Model folder (config.json, model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Episodes generated together.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Tokens of each episode's first prompt.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub prompt_len: u64,
    /// Tokens generated per episode and turn.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub new_tokens: u64,
    /// Tokens of the reply appended after each turn.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..))]
    pub reply_len: u64,
    /// Turns per episode.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub turns: u64,
    /// Keep finished turns' KV blocks for the next turn.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefix_cache: bool,
    /// Timed runs (each with a fresh engine).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Seed of the prompts and replies.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device: cpu, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// The JSON line.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    prefix_cache: bool,
    batch: u64,
    prompt_len: u64,
    new_tokens: u64,
    reply_len: u64,
    turns: u64,
    runs: u64,
    /// Median seconds of each turn's generate call.
    turn_seconds: Vec<f64>,
    episode_seconds: Spread,
    prefill_tokens: u64,
    prefix_cache_hit_tokens: u64,
    threads: usize,
}

/// One run: a fresh engine, every turn timed. Returns the turns' seconds and the engine.
fn run_episodes(args: &Args, model: &CausalLm) -> anyhow::Result<(Vec<f64>, Engine)> {
    let config = EngineConfig {
        max_running: args.batch as usize,
        prefix_cache: args.prefix_cache,
        ..EngineConfig::default()
    };
    let mut engine = Engine::from_model(model, config)?;
    let vocab = model.config().vocab_size;
    let mut prompts = random_prompts(args.seed, args.batch, args.prompt_len, vocab);
    let mut seconds = Vec::new();
    for turn in 0..args.turns {
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .map(|p| {
                let mut r = GenerationRequest::new(p.clone(), args.new_tokens as usize);
                r.sampling = SamplingParams::greedy();
                r.ignore_eos = true;
                r
            })
            .collect();
        let t = Instant::now();
        let out = engine.generate(&requests)?;
        seconds.push(t.elapsed().as_secs_f64());
        let seed = args.seed ^ (1000 + turn);
        let replies = random_prompts(seed, args.batch, args.reply_len, vocab);
        for ((p, c), r) in prompts.iter_mut().zip(out).zip(replies) {
            p.extend_from_slice(&c.tokens);
            p.extend_from_slice(&r);
        }
    }
    Ok((seconds, engine))
}

/// Runs `oxalign bench turns`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let device = open_device(&args.device)?;
    let model = CausalLm::load(&args.model, &device).map_err(|e| model_error(e, &args.model))?;
    // Untimed: one short turn, so the first timed run pays no first-touch costs.
    run_episodes(
        &Args {
            turns: 1,
            new_tokens: 1,
            model: args.model.clone(),
            device: args.device.clone(),
            ..args
        },
        &model,
    )?;
    let mut per_run = Vec::new();
    let mut last = None;
    for _ in 0..args.runs {
        let (seconds, engine) = run_episodes(&args, &model)?;
        per_run.push(seconds);
        last = Some(engine.stats());
    }
    let stats = last.unwrap_or_default();
    let turn_seconds = (0..args.turns as usize)
        .map(|t| Spread::of(&per_run.iter().map(|r| r[t]).collect::<Vec<_>>()).median)
        .collect();
    let totals: Vec<f64> = per_run.iter().map(|r| r.iter().sum()).collect();
    let report = Report {
        bench: "turns",
        prefix_cache: args.prefix_cache,
        batch: args.batch,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        reply_len: args.reply_len,
        turns: args.turns,
        runs: args.runs,
        turn_seconds,
        episode_seconds: Spread::of(&totals),
        prefill_tokens: stats.prefill_tokens,
        prefix_cache_hit_tokens: stats.prefix_cache_hit_tokens,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
