//! `oxalign bench train`: training throughput of a causal LM — forward, a next-token
//! cross-entropy over every position, backward, global-norm clipping and an AdamW step on a
//! seeded random token batch (fixed or variable lengths, padded or packed; see
//! `bench_train_batch.rs`) — reported as one JSON line with tokens/s, the per-phase step
//! times, peak RSS, model FLOPs and MFU. It trains on no real data and saves nothing.

use super::proc_stats::{peak_rss_bytes, process_cpu_seconds};
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Var;
use clap::Parser;
use oxalign_models::nn::checkpointing::Checkpointing;
use oxalign_models::{CausalLm, Precision};
use oxalign_rlhf::optim::{clip_coefficient, AdamW, AdamWConfig};
use serde::Serialize;

use super::bench_matmul::{measure_matmul_peak, MatmulPeak};
use super::bench_train_batch::{BenchBatch, Lengths};
use super::spread::Spread;
use crate::model_dir::{check_model_dir, model_error, open_device};
use crate::user_error::user_error;

/// Arguments of `oxalign bench train`.
#[derive(Debug, Parser)]
#[command(
    about = "Measure training throughput (forward + backward + AdamW) of a causal LM",
    long_about = "Measure training throughput of a causal LM: on a seeded random [batch, seq] \
token batch, --warmup untimed steps then --steps timed steps of forward, next-token \
cross-entropy over all positions (mean over every target of every sequence), backward, \
global-norm gradient clipping and AdamW. Prints one JSON line: tokens_per_sec (real tokens, \
padding excluded; median over the timed steps, with min and max), step_seconds and the \
forward / backward / optimizer split (median, min, max), peak_rss_bytes (VmHWM), params, \
model FLOPs per step and MFU.\n\n\
--lengths uniform draws each sequence's length uniformly in [seq/4, seq] and right-pads the \
batch; --packing runs the sequences packed first-fit-decreasing into rows of the longest \
length (attention and positions per sequence) instead of padded. Compare padded and packed \
with the same --lengths uniform --seed.\n\n\
FLOPs per step = sum over sequences of 6 · matmul_params · len + 12 · layers · heads · \
head_dim · len² (with fixed lengths: 6 · matmul_params · batch · seq + 12 · layers · heads · \
head_dim · seq² · batch), where matmul_params counts every parameter except the input \
embedding table (a lookup); padding is not counted. MFU = (FLOPs per step / median step seconds) / the matmul peak of --precision, measured in the \
same process as `oxalign bench matmul` does unless --peak-gflops is given."
)]
pub struct Args {
    /// Model folder (config.json, model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Sequences per step.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Tokens per sequence (at least 2: the loss predicts token t+1 from tokens ..=t).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(2..))]
    pub seq: u64,
    /// Timed steps.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// Untimed warm-up steps before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// Global gradient-norm clip (L2).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Seed of the random token batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device: cpu, cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Matmul peak in GFLOP/s for MFU; measured (2048³ f32 GEMM, median of 7) when omitted.
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// Sequence lengths: `fixed` (all --seq) or `uniform` (each in [seq/4, seq], seeded).
    #[arg(long, value_enum, default_value_t = Lengths::Fixed)]
    pub lengths: Lengths,
    /// Run the batch as packed rows (several sequences per row) instead of padded rows.
    #[arg(long)]
    pub packing: bool,
    /// Numbers of the linear layers: `f32`, or `bf16-mixed` (bf16 products with f32 sums;
    /// f32 master weights, gradients and AdamW moments). MFU is then taken against the bf16
    /// GEMM peak.
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
    /// How the backward holds activations: `plain` (candle's one backward: every activation
    /// lives until it ends), `layerwise` (each decoder layer's activations freed once its
    /// backward is done; the trainers' default) or `recompute` (activation checkpointing).
    #[arg(long, value_enum, default_value_t = BackwardMode::Layerwise)]
    pub backward: BackwardMode,
}

/// `--backward`: what a step keeps of the forward for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackwardMode {
    Plain,
    Layerwise,
    Recompute,
}

impl BackwardMode {
    /// Sets `model` up for this mode; the handle that collects the layers' gradients.
    fn apply(self, model: &mut CausalLm) -> Option<std::sync::Arc<Checkpointing>> {
        match self {
            BackwardMode::Plain => None,
            BackwardMode::Layerwise => Some(model.layerwise_backward()),
            BackwardMode::Recompute => Some(model.checkpoint_activations()),
        }
    }
}

/// The JSON line `oxalign bench train` prints.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    model: String,
    /// Numbers of the linear layers (`--precision`).
    precision: Precision,
    /// What the step kept of the forward for its backward (`--backward`).
    backward: BackwardMode,
    /// Bytes of weights, gradients and AdamW moments the optimizer step reads and writes
    /// (all f32: 4 arrays read, 3 written, 4 bytes each per parameter).
    optimizer_bytes_per_step: usize,
    /// Trainable parameters.
    params: usize,
    /// Parameters that take part in a matmul (all but the input embedding table).
    matmul_params: usize,
    layers: usize,
    hidden: usize,
    vocab: usize,
    batch: usize,
    seq: usize,
    /// `fixed` or `uniform` (see `--lengths`).
    lengths: &'static str,
    /// Whether the step ran on packed rows.
    packing: bool,
    /// Rows the model ran on (`batch` padded; fewer when packed).
    rows: usize,
    /// Real tokens per step (the sum of the sequence lengths; padding excluded).
    tokens_per_step: usize,
    /// Token slots the model computed per step (`rows · longest length`, padding included).
    row_tokens_per_step: usize,
    warmup: u64,
    steps: u64,
    /// Threads of candle's CPU backend.
    threads: usize,
    /// Median over timed steps of `tokens_per_step / step_seconds`.
    tokens_per_sec: f64,
    tokens_per_sec_min: f64,
    tokens_per_sec_max: f64,
    step_seconds: Spread,
    forward_seconds: Spread,
    backward_seconds: Spread,
    optimizer_seconds: Spread,
    /// CPU time (user + system, all threads) of this process per timed step, seconds; on a
    /// shared machine `step_seconds` grows with others' load, this much less. `None` off Linux.
    step_cpu_seconds: Option<Spread>,
    /// Model FLOPs per step (formula in `--help`).
    flops_per_step: f64,
    /// `flops_per_step / step_seconds.median / 1e9`.
    achieved_gflops: f64,
    /// Matmul peak used for MFU, GFLOP/s.
    peak_gflops: f64,
    /// `measured` (this process) or `given` (`--peak-gflops`).
    peak_source: &'static str,
    /// The measurement behind `peak_gflops`, when measured.
    matmul: Option<MatmulPeak>,
    /// `achieved_gflops / peak_gflops`.
    mfu: f64,
    /// Loss (nats/token) of the first and the last step, warm-up included.
    loss_first: f64,
    loss_last: f64,
    /// Peak resident set size of this process (VmHWM), bytes.
    peak_rss_bytes: Option<u64>,
}

/// The model of `--model` in `--precision`, set up for `--backward` (with the handle that
/// collects its layers' gradients); refuses a `seq` beyond its positions.
fn load_model(
    args: &Args,
    device: &candle_core::Device,
    seq: usize,
) -> anyhow::Result<(CausalLm, Option<std::sync::Arc<Checkpointing>>)> {
    let mut model = CausalLm::load(&args.model, device).map_err(|e| model_error(e, &args.model))?;
    model.set_precision(args.precision);
    let layers = args.backward.apply(&mut model);
    let positions = model.config().max_position_embeddings;
    if seq > positions {
        return user_error(format!(
            "--seq {seq} exceeds the model's max_position_embeddings ({positions}) in {}",
            args.model.join("config.json").display()
        ));
    }
    Ok((model, layers))
}

/// Runs `oxalign bench train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_numbers(&args)?;
    check_model_dir(&args.model)?;
    let device = open_device(&args.device)?;
    let (batch, seq) = (args.batch as usize, args.seq as usize);
    let (peak_gflops, peak_source, matmul) = match args.peak_gflops {
        Some(p) => (p, "given", None),
        None => {
            let m = measure_matmul_peak(2048, 7, args.precision)?;
            (m.gflops_median, "measured", Some(m))
        }
    };
    let (model, layers) = load_model(&args, &device, seq)?;
    let cfg = model.config().clone();
    let (params, matmul_params) = parameter_counts(&model);
    let data = BenchBatch::new(batch, seq, cfg.vocab_size, args.lengths, args.seed, &device)?;
    let rows = data.rows(args.packing)?;
    // As a trainer role's job runs (`Replicas::each`): inside the pool, its workers awake.
    let times = oxalign_kernels::cpu_threads::with_workers_awake(|| {
        time_steps(&args, &model, &data, layers.as_deref())
    })?;

    let tokens: usize = data.lens.iter().sum();
    let tps: Vec<f64> = times.step.iter().map(|s| tokens as f64 / s).collect();
    let tps = Spread::of(&tps);
    let step = Spread::of(&times.step);
    let attn_width = cfg.num_attention_heads * cfg.head_dim;
    let flops_per_step: f64 = data
        .lens
        .iter()
        .map(|&n| model_flops_per_step(matmul_params, cfg.num_hidden_layers, attn_width, 1, n))
        .sum();
    let achieved_gflops = flops_per_step / step.median / 1e9;
    let report = Report {
        bench: "train",
        model: args.model.display().to_string(),
        precision: args.precision,
        backward: args.backward,
        optimizer_bytes_per_step: params * 4 * 7,
        params,
        matmul_params,
        layers: cfg.num_hidden_layers,
        hidden: cfg.hidden_size,
        vocab: cfg.vocab_size,
        batch,
        seq,
        lengths: args.lengths.name(),
        packing: args.packing,
        rows,
        tokens_per_step: tokens,
        row_tokens_per_step: rows * data.batch.ids.dim(1)?,
        warmup: args.warmup,
        steps: args.steps,
        threads: candle_core::utils::get_num_threads(),
        tokens_per_sec: tps.median,
        tokens_per_sec_min: tps.min,
        tokens_per_sec_max: tps.max,
        step_seconds: step,
        forward_seconds: Spread::of(&times.forward),
        backward_seconds: Spread::of(&times.backward),
        optimizer_seconds: Spread::of(&times.optimizer),
        step_cpu_seconds: (times.cpu.len() == times.step.len()).then(|| Spread::of(&times.cpu)),
        flops_per_step,
        achieved_gflops,
        peak_gflops,
        peak_source,
        matmul,
        mfu: achieved_gflops / peak_gflops,
        loss_first: times.losses.first().copied().unwrap_or(f64::NAN),
        loss_last: times.losses.last().copied().unwrap_or(f64::NAN),
        peak_rss_bytes: peak_rss_bytes(Path::new("/proc/self/status")),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Refuses a non-positive `--peak-gflops` or `--max-grad-norm` and a negative `--lr`.
fn check_numbers(args: &Args) -> anyhow::Result<()> {
    if let Some(p) = args.peak_gflops {
        if !(p.is_finite() && p > 0.0) {
            return user_error(format!(
                "--peak-gflops {p}: expected a positive number of GFLOP/s"
            ));
        }
    }
    if !(args.lr.is_finite() && args.lr >= 0.0) {
        return user_error(format!("--lr {}: expected a number >= 0", args.lr));
    }
    if !(args.max_grad_norm.is_finite() && args.max_grad_norm > 0.0) {
        return user_error(format!(
            "--max-grad-norm {}: expected a positive number",
            args.max_grad_norm
        ));
    }
    Ok(())
}

/// `(all parameters, those multiplied in a matmul)`: a tied LM head multiplies by the
/// embedding table, so the table counts then; an untied embedding is a lookup.
/// `(all parameters, matmul parameters)`: the latter leaves out the input embedding table (a
/// lookup) unless it is tied to the LM head.
pub(super) fn parameter_counts(model: &CausalLm) -> (usize, usize) {
    let named = model.vars();
    let params: usize = named.iter().map(|(_, v)| v.elem_count()).sum();
    let embed: usize = named
        .iter()
        .filter(|(n, _)| n.ends_with("embed_tokens.weight"))
        .map(|(_, v)| v.elem_count())
        .sum();
    match model.config().tie_word_embeddings {
        true => (params, params),
        false => (params, params - embed),
    }
}

/// Seconds of each timed step (after `--warmup`), by phase, and every step's loss.
#[derive(Default)]
struct StepTimes {
    step: Vec<f64>,
    forward: Vec<f64>,
    backward: Vec<f64>,
    optimizer: Vec<f64>,
    /// Process CPU seconds per step, where `/proc/self/stat` can be read.
    cpu: Vec<f64>,
    losses: Vec<f64>,
}

/// Runs `--warmup + --steps` AdamW steps (forward, backward, clip, step) on `data`.
fn time_steps(
    args: &Args,
    model: &CausalLm,
    data: &BenchBatch,
    layers: Option<&Checkpointing>,
) -> anyhow::Result<StepTimes> {
    let named = model.vars();
    let vars: Vec<Var> = named.iter().map(|(_, v)| v.clone()).collect();
    let config = AdamWConfig {
        lr: args.lr,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(named, config)?;
    let mut t = StepTimes::default();
    for i in 0..args.warmup + args.steps {
        let cpu0 = process_cpu_seconds(Path::new("/proc/self/stat"));
        let t0 = Instant::now();
        let loss = data.loss(model, args.packing)?;
        let loss_value = f64::from(loss.to_scalar::<f32>()?);
        let t1 = Instant::now();
        let grads = oxalign_rlhf::trainer::backward(&loss, layers)?;
        // As a trainer's step: the loss's graph is gone before the optimizer runs.
        drop(loss);
        let t2 = Instant::now();
        let (_, clip_scale) = clip_coefficient(&grads, vars.iter(), args.max_grad_norm)?;
        opt.step_scaled(&grads, clip_scale)?;
        drop(grads);
        let t3 = Instant::now();
        let cpu1 = process_cpu_seconds(Path::new("/proc/self/stat"));
        t.losses.push(loss_value);
        if i >= args.warmup {
            t.forward.push((t1 - t0).as_secs_f64());
            t.backward.push((t2 - t1).as_secs_f64());
            t.optimizer.push((t3 - t2).as_secs_f64());
            t.step.push((t3 - t0).as_secs_f64());
            if let (Some(a), Some(b)) = (cpu0, cpu1) {
                t.cpu.push(b - a);
            }
        }
    }
    Ok(t)
}

/// Model FLOPs of one training step (forward + backward ≈ 3× forward):
/// `6 · matmul_params · batch · seq` for the weight matmuls plus
/// `12 · layers · attn_width · seq² · batch` for the attention scores and weighted sum
/// (`QKᵀ` and `AV`, 2·seq²·attn_width each forward, full square: no causal halving).
pub fn model_flops_per_step(
    matmul_params: usize,
    layers: usize,
    attn_width: usize,
    batch: usize,
    seq: usize,
) -> f64 {
    let (n, l, h, b, t) = (
        matmul_params as f64,
        layers as f64,
        attn_width as f64,
        batch as f64,
        seq as f64,
    );
    6.0 * n * b * t + 12.0 * l * h * t * t * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_odd_and_even_counts() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
    }

    #[test]
    fn flops_formula() {
        // 6·N·B·T + 12·L·H·T²·B with N=10, L=2, H=4, B=3, T=5.
        assert_eq!(
            model_flops_per_step(10, 2, 4, 3, 5),
            6.0 * 10.0 * 15.0 + 12.0 * 2.0 * 4.0 * 25.0 * 3.0
        );
    }
}
