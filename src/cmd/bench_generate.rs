//! `oxalign bench generate`: generation throughput of a causal LM on seeded random prompts,
//! greedy, through the paged engine, the contiguous-cache `CausalLm::generate` or a naive
//! no-cache loop, printed as one JSON line (tokens/s, time to first token, peak RSS).
//! It loads no tokenizer and writes no completions.

use super::proc_stats::peak_rss_bytes;
use super::spread::Spread;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Tensor, D};
use clap::{Parser, ValueEnum};
use oxalign_models::engine::{Engine, EngineConfig, QuantMode};
use oxalign_models::{CausalLm, GenerationRequest, Precision, SamplingParams};
use serde::Serialize;

use crate::model_dir::{check_model_dir, model_error, open_device};
use crate::user_error::user_error;

/// Which generation path to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The rollout engine (paged KV cache, continuous batching).
    Paged,
    /// `CausalLm::generate` (contiguous KV cache, left padding).
    Contiguous,
    /// Full forward over the whole sequence for every new token (no cache).
    Naive,
}

/// Arguments of `oxalign bench generate`.
#[derive(Debug, Parser)]
#[command(
    about = "Measure generation throughput (tokens/s, time to first token, peak RSS)",
    long_about = "Measure generation throughput of a causal LM: --batch seeded random prompts of \
--prompt-len tokens, --new-tokens greedy tokens each (eos ignored). --warmup untimed runs, then \
--runs timed runs. Prints one JSON line: tokens_per_sec (generated tokens / wall seconds of a \
run: median, min, max over the runs), ttft_seconds (wall time of a run with one new token: \
prefill + first sample, median/min/max), peak_rss_bytes (VmHWM of this process) and, for the \
paged engine, the KV pool and decode-step memory traffic (weight bytes + KV bytes read by the \
last decode step) and logprob_mismatch_vs_f32 (max/mean |engine - f32 trainer forward| \
log-prob over the first completion: ~1e-6 in f32, the quantization error with --quant).\n\n--engine paged (default) is the rollout engine, contiguous is \
CausalLm::generate, naive recomputes the full forward for every token. --quant applies to \
the paged engine only."
)]
pub struct Args {
    /// Model folder (config.json, model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompts generated together.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Tokens per prompt.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub prompt_len: u64,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    pub new_tokens: u64,
    /// Generation path.
    #[arg(long, value_enum, default_value_t = EngineKind::Paged)]
    pub engine: EngineKind,
    /// Rollout weight precision of the paged engine: none, bf16, int8, q4.
    #[arg(long, default_value = "none")]
    pub quant: String,
    /// Timed runs.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Untimed warm-up runs (with one new token) before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// KV block size of the paged engine (tokens).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub block_size: u64,
    /// KV pool budget of the paged engine, MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_memory_mib: u64,
    /// Token budget per engine step.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batched_tokens: u64,
    /// Seed of the random prompts.
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
    engine: EngineKind,
    quant: String,
    batch: u64,
    prompt_len: u64,
    new_tokens: u64,
    runs: u64,
    generated_tokens: u64,
    tokens_per_sec: Spread,
    run_seconds: Spread,
    ttft_seconds: Spread,
    peak_rss_bytes: Option<u64>,
    threads: usize,
    /// Model FLOPs of one run (see [`generation_flops`]).
    flops_per_run: f64,
    /// `flops_per_run` over the median run time.
    achieved_gflops: f64,
    /// f32 GEMM throughput (2048³, as `oxalign bench matmul`) measured in this process before
    /// the runs: the distance of `achieved_gflops` to the machine's limit.
    peak_gflops: f64,
    /// Which GEMM `peak_gflops` measured (`f32`, or `bf16_mixed` for a bf16 engine).
    peak_precision: Precision,
    /// Paged engine: bytes of weights read per decode step.
    weight_bytes_per_step: Option<usize>,
    /// Paged engine: K/V bytes read by the last decode step (all sequences, all layers).
    kv_bytes_last_step: Option<usize>,
    /// Paged engine: most KV blocks in use, and the pool size.
    kv_blocks_peak: Option<usize>,
    kv_blocks_total: Option<usize>,
    /// Paged engine: |engine - f32 trainer forward| log-prob (nats) over the first
    /// completion's tokens (max and mean).
    logprob_mismatch_vs_f32: Option<Mismatch>,
}

/// Max and mean absolute log-prob difference, nats.
#[derive(Debug, Serialize)]
struct Mismatch {
    max: f32,
    mean: f32,
}

/// Scores `prompt + completion` with the engine and with the f32 trainer forward and compares
/// the log-probs of the completion tokens.
fn logprob_mismatch(
    engine: &mut Engine,
    model: &CausalLm,
    prompt: &[u32],
    completion: &[u32],
) -> anyhow::Result<Mismatch> {
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(completion);
    if seq.len() < 2 || completion.is_empty() {
        return Ok(Mismatch {
            max: 0.0,
            mean: 0.0,
        });
    }
    let got = engine.score(std::slice::from_ref(&seq))?.remove(0);
    let ids = Tensor::from_vec(seq.clone(), (1, seq.len()), model.device())?;
    let want = model
        .next_token_logprobs(&ids, None)?
        .squeeze(0)?
        .to_vec1::<f32>()?;
    let from = prompt.len() - 1;
    let diffs: Vec<f32> = got[from..]
        .iter()
        .zip(&want[from..])
        .map(|(a, b)| (a - b).abs())
        .collect();
    Ok(Mismatch {
        max: diffs.iter().copied().fold(0.0, f32::max),
        mean: diffs.iter().sum::<f32>() / diffs.len() as f32,
    })
}

/// Runs `oxalign bench generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let quant: QuantMode = match args.quant.parse() {
        Ok(q) => q,
        Err(e) => return user_error(format!("--quant: {e}")),
    };
    if quant != QuantMode::None && args.engine != EngineKind::Paged {
        return user_error("--quant needs --engine paged");
    }
    let device = open_device(&args.device)?;
    // The GEMM peak of the numbers the engine multiplies in: bf16 for a bf16 engine (whose
    // kernel rounds activations where the CPU has AVX-512 BF16), else f32 (int8 has no GEMM
    // peak of its own here).
    let peak_precision = match quant {
        QuantMode::Bf16 => Precision::Bf16Mixed,
        _ => Precision::F32,
    };
    let peak = super::bench_matmul::measure_matmul_peak(2048, 5, peak_precision)?;
    let model = CausalLm::load(&args.model, &device).map_err(|e| model_error(e, &args.model))?;
    let flops_per_run = generation_flops(&args, &model);
    let vocab = model.config().vocab_size;
    let prompts = random_prompts(args.seed, args.batch, args.prompt_len, vocab);
    let mut runner = Runner {
        kind: args.engine,
        engine: build_engine(&args, quant, &model)?,
        model: &model,
        prompts: &prompts,
    };
    // As the rollout engine runs in a role's job (`Replicas::each`): inside the pool, its
    // workers awake.
    let m = oxalign_kernels::cpu_threads::with_workers_awake(|| measure(&args, &mut runner))?;
    let mismatch = match runner.engine.as_mut() {
        Some(e) => Some(logprob_mismatch(e, &model, &prompts[0], &m.first)?),
        None => None,
    };
    let stats = runner.engine.as_ref().map(|e| e.stats());
    // Last decode step: every sequence reads its whole cache (prompt + new - 1 positions).
    let kv_last = stats.as_ref().map(|s| {
        let per_token = s.block_bytes / s.block_size;
        (args.batch * (args.prompt_len + args.new_tokens - 1)) as usize * per_token
    });
    let report = Report {
        bench: "generate",
        engine: args.engine,
        quant: args.quant.clone(),
        batch: args.batch,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        runs: args.runs,
        generated_tokens: m.generated,
        tokens_per_sec: Spread::of(&m.rates),
        run_seconds: Spread::of(&m.secs),
        ttft_seconds: Spread::of(&m.ttft),
        peak_rss_bytes: peak_rss_bytes(Path::new("/proc/self/status")),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        flops_per_run,
        achieved_gflops: flops_per_run / Spread::of(&m.secs).median / 1e9,
        peak_gflops: peak.gflops_median,
        peak_precision,
        weight_bytes_per_step: stats.as_ref().map(|s| s.weight_bytes),
        kv_bytes_last_step: kv_last,
        kv_blocks_peak: stats.as_ref().map(|s| s.peak_blocks_used),
        kv_blocks_total: stats.as_ref().map(|s| s.num_blocks),
        logprob_mismatch_vs_f32: mismatch,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Model FLOPs of one run: every prompt and generated token through the decoder's matmuls
/// (2 FLOPs per weight), the LM head for the generated tokens only (a prompt's last position
/// yields the first), and attention over the cache (`QKᵀ` and `AV`, `4 · layers · width`
/// per cached position, causal: `2 · layers · width · len²` per sequence).
fn generation_flops(args: &Args, model: &CausalLm) -> f64 {
    let cfg = model.config();
    let (_, matmul_params) = super::bench_train::parameter_counts(model);
    let head = (cfg.vocab_size * cfg.hidden_size) as f64;
    let decoder = matmul_params as f64 - head;
    let (p, n) = (args.prompt_len as f64, args.new_tokens as f64);
    let width = (cfg.num_attention_heads * cfg.head_dim) as f64;
    let layers = cfg.num_hidden_layers as f64;
    let per_sequence =
        2.0 * decoder * (p + n) + 2.0 * head * n + 2.0 * layers * width * (p + n) * (p + n);
    per_sequence * args.batch as f64
}

/// The paged engine of `--engine paged` with the command's pool and batch settings.
fn build_engine(args: &Args, quant: QuantMode, model: &CausalLm) -> anyhow::Result<Option<Engine>> {
    if args.engine != EngineKind::Paged {
        return Ok(None);
    }
    let ec = EngineConfig {
        block_size: args.block_size as usize,
        kv_memory_bytes: (args.kv_memory_mib as usize) << 20,
        max_batched_tokens: args.max_batched_tokens as usize,
        max_running: args.batch as usize,
        quant,
        // Every repetition generates the same prompts: a cache across calls would skip
        // their prefill, which HF's `generate` does not.
        prefix_cache: false,
        ..EngineConfig::default()
    };
    match Engine::from_model(model, ec) {
        Ok(e) => Ok(Some(e)),
        Err(e) => user_error(format!("cannot build the engine: {e}")),
    }
}

/// The generator under test and the prompts it completes greedily.
struct Runner<'a> {
    kind: EngineKind,
    engine: Option<Engine>,
    model: &'a CausalLm,
    prompts: &'a [Vec<u32>],
}

impl Runner<'_> {
    /// One generation of `n` tokens per prompt; returns the generated token count and the
    /// first completion.
    fn generate(&mut self, n: u64) -> anyhow::Result<(u64, Vec<u32>)> {
        let reqs: Vec<GenerationRequest> = self
            .prompts
            .iter()
            .map(|p| {
                let mut r = GenerationRequest::new(p.clone(), n as usize);
                r.sampling = SamplingParams::greedy();
                r.ignore_eos = true;
                r
            })
            .collect();
        let out = match self.kind {
            EngineKind::Paged => match self.engine.as_mut() {
                Some(e) => e.generate(&reqs)?,
                None => anyhow::bail!("paged engine missing"),
            },
            EngineKind::Contiguous => self.model.generate(&reqs)?,
            EngineKind::Naive => naive_greedy(self.model, self.prompts, n as usize)?,
        };
        let first = out.first().map(|c| c.tokens.clone()).unwrap_or_default();
        Ok((out.iter().map(|c| c.tokens.len() as u64).sum(), first))
    }
}

/// What the timed runs measured.
struct Measured {
    /// Seconds to the first token, per run.
    ttft: Vec<f64>,
    /// Seconds per full run, and generated tokens per second.
    secs: Vec<f64>,
    rates: Vec<f64>,
    /// Tokens generated in the last run, and its first completion.
    generated: u64,
    first: Vec<u32>,
}

/// `--warmup` one-token runs, `--runs` timed one-token runs (time to first token), then
/// `--runs` timed runs of `--new-tokens`.
fn measure(args: &Args, runner: &mut Runner<'_>) -> anyhow::Result<Measured> {
    for _ in 0..args.warmup {
        runner.generate(1)?;
    }
    let mut ttft = vec![];
    for _ in 0..args.runs {
        let t = Instant::now();
        runner.generate(1)?;
        ttft.push(t.elapsed().as_secs_f64());
    }
    let (mut secs, mut rates, mut generated, mut first) = (vec![], vec![], 0, vec![]);
    for _ in 0..args.runs {
        let t = Instant::now();
        (generated, first) = runner.generate(args.new_tokens)?;
        let s = t.elapsed().as_secs_f64();
        secs.push(s);
        rates.push(generated as f64 / s);
    }
    Ok(Measured {
        ttft,
        secs,
        rates,
        generated,
        first,
    })
}

/// `batch` prompts of `len` token ids drawn from `1..vocab` by a fixed LCG of `seed`.
pub(super) fn random_prompts(seed: u64, batch: u64, len: u64, vocab: usize) -> Vec<Vec<u32>> {
    let mut x = seed ^ 0x2545_F491_4F6C_DD1D;
    (0..batch)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + ((x >> 33) % (vocab as u64 - 1).max(1)) as u32
                })
                .collect()
        })
        .collect()
}

/// Greedy generation by recomputing the full forward over `[batch, len]` for every token.
fn naive_greedy(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    n: usize,
) -> anyhow::Result<Vec<oxalign_models::Completion>> {
    let b = prompts.len();
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..n {
        let len = seqs[0].len();
        let flat: Vec<u32> = seqs.iter().flatten().copied().collect();
        let ids = Tensor::from_vec(flat, (b, len), model.device())?;
        let h = model.hidden(&ids, None)?.narrow(1, len - 1, 1)?.detach();
        let next = model
            .lm_logits(&h)?
            .argmax(D::Minus1)?
            .flatten_all()?
            .to_vec1::<u32>()?;
        for (s, t) in seqs.iter_mut().zip(next) {
            s.push(t);
        }
    }
    Ok(seqs
        .into_iter()
        .zip(prompts)
        .map(|(s, p)| oxalign_models::Completion {
            tokens: s[p.len()..].to_vec(),
            logprobs: vec![],
            finish_reason: oxalign_models::FinishReason::Length,
        })
        .collect())
}
