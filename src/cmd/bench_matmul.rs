//! `oxalign bench matmul`: this CPU's measured GEMM throughput (an `n × n × n` matmul,
//! median of several), f32 through candle or bf16 with f32 sums through the bf16 training
//! kernel: the peak that training MFU is reported against, per precision.
//! It measures one square shape only; it is not a GEMM tuning sweep.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use clap::Parser;
use serde::Serialize;

use oxalign_models::Precision;

use crate::user_error::user_error;

/// Arguments of `oxalign bench matmul`.
#[derive(Debug, Parser)]
#[command(
    about = "Measure this CPU's matmul throughput (GFLOP/s), f32 or bf16",
    long_about = "Measure this CPU's matmul throughput: an n x n x n GEMM (2·n³ FLOPs) timed \
--reps times after one untimed run, f32 through candle or (--precision bf16-mixed) the bf16 \
training GEMM (operands rounded to bf16, f32 sums). Prints one JSON line with the median, \
min and max GFLOP/s. `oxalign bench train` measures the same thing and uses the median as the \
peak for its model-FLOPs utilisation (MFU)."
)]
pub struct Args {
    /// Matrix size n (both operands are n x n, f32).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    pub size: u64,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: u64,
    /// `f32` (candle's matmul) or `bf16-mixed` (the bf16 training GEMM: operands rounded to
    /// bf16 while packed, f32 sums).
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
}

/// Measured GEMM throughput in GFLOP/s (10⁹ floating-point operations per second).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MatmulPeak {
    /// The precision measured (`f32` or `bf16_mixed`).
    pub precision: Precision,
    /// Matrix size n of the `n × n × n` GEMM.
    pub size: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Threads candle's CPU backend uses.
    pub threads: usize,
    /// Median GFLOP/s over the repetitions.
    pub gflops_median: f64,
    /// Slowest repetition, GFLOP/s.
    pub gflops_min: f64,
    /// Fastest repetition, GFLOP/s.
    pub gflops_max: f64,
}

/// Times `reps` `[n, n] @ [n, n]` matmuls on the CPU in `precision` (after one warm-up) and
/// returns their throughput, counting `2·n³` FLOPs per matmul. `bf16_mixed` times the bf16
/// training GEMM (`a · bᵀ`, packing and rounding included); anything else candle's f32 matmul.
pub fn measure_matmul_peak(
    n: usize,
    reps: usize,
    precision: Precision,
) -> anyhow::Result<MatmulPeak> {
    let device = Device::Cpu;
    let a = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(DType::F32)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(DType::F32)?;
    let flops = 2.0 * (n as f64).powi(3);
    let precision = match precision {
        Precision::Bf16Mixed => Precision::Bf16Mixed,
        _ => Precision::F32,
    };
    let product = |a: &Tensor, b: &Tensor| match precision {
        Precision::Bf16Mixed => oxalign_kernels::ops::linear_bf16(a, b),
        _ => a.matmul(b),
    };
    // Warm-up: page in the operands and the output buffer, spin up the thread pool.
    product(&a, &b)?;
    let mut gflops = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        let c = product(&a, &b)?;
        let secs = start.elapsed().as_secs_f64();
        drop(c);
        gflops.push(flops / secs / 1e9);
    }
    let stats = super::spread::Spread::of(&gflops);
    Ok(MatmulPeak {
        precision,
        size: n,
        reps,
        threads: candle_core::utils::get_num_threads(),
        gflops_median: stats.median,
        gflops_min: stats.min,
        gflops_max: stats.max,
    })
}

/// Runs `oxalign bench matmul`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (Ok(n), Ok(reps)) = (usize::try_from(args.size), usize::try_from(args.reps)) else {
        return user_error("--size and --reps must fit in this machine's usize");
    };
    let peak = measure_matmul_peak(n, reps, args.precision)?;
    #[derive(Serialize)]
    struct Line {
        bench: &'static str,
        #[serde(flatten)]
        peak: MatmulPeak,
    }
    println!(
        "{}",
        serde_json::to_string(&Line {
            bench: "matmul",
            peak
        })?
    );
    Ok(())
}
