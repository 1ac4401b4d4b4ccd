//! Fused ops vs their composed candle equivalents, forward and forward+backward, at realistic
//! sizes. A plain timing loop (no criterion): one JSON line per measurement with the median,
//! min and max of N runs, then one line per op/pass with the fused/composed ratio.
//! Run: `cargo bench -p oxalign-kernels [-- FILTER]`; `OXALIGN_BENCH_RUNS=N` sets N (default 5).

use std::time::Instant;

use candle_core::{Device, Result, Tensor, Var};
use oxalign_kernels::ops::{self, reference};

struct Stats {
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

fn time_runs(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
    f()?; // warm-up (allocator, rayon pool, page faults)
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f().map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(Stats {
        median_ms: ms[ms.len() / 2],
        min_ms: ms[0],
        max_ms: ms[ms.len() - 1],
    })
}

fn random(dims: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let mut s = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let n: usize = dims.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
}

type Op = Box<dyn Fn(&Tensor) -> Result<Tensor>>;

/// An op of several inputs (all differentiated in the fwd+bwd pass).
type OpN = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

/// Times fused and composed `op(x)` forward, and forward + `sum().backward()`.
fn bench(
    name: &str,
    shape: &[usize],
    x: &Tensor,
    fused: Op,
    composed: Op,
    runs: usize,
) -> Result<()> {
    let inputs = [x.clone()];
    bench_n(
        name,
        shape,
        &inputs,
        Box::new(move |xs| fused(&xs[0])),
        Box::new(move |xs| composed(&xs[0])),
        runs,
    )
}

/// [`bench`] for ops of several inputs; the backward pass differentiates all of them.
fn bench_n(
    name: &str,
    shape: &[usize],
    inputs: &[Tensor],
    fused: OpN,
    composed: OpN,
    runs: usize,
) -> Result<()> {
    bench_pair(
        name,
        shape,
        inputs,
        [("fused", fused), ("composed", composed)],
        runs,
    )
}

/// Times two variants of an op of several inputs, forward and forward + backward, and
/// prints each median and the ratio of the first to the second.
fn bench_pair(
    name: &str,
    shape: &[usize],
    inputs: &[Tensor],
    variants: [(&str, OpN); 2],
    runs: usize,
) -> Result<()> {
    let vars: Vec<Var> = inputs.iter().map(Var::from_tensor).collect::<Result<_>>()?;
    let tracked: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    for pass in ["fwd", "fwd+bwd"] {
        let mut medians = Vec::new();
        for (variant, f) in &variants {
            let stats = time_runs(runs, || {
                if pass == "fwd" {
                    let y = f(inputs)?;
                    std::hint::black_box(&y);
                } else {
                    let grads = f(&tracked)?.sum_all()?.backward()?;
                    std::hint::black_box(grads.get(&tracked[0]));
                }
                Ok(())
            })?;
            println!(
                "{{\"op\":\"{name}\",\"variant\":\"{variant}\",\"pass\":\"{pass}\",\"shape\":{shape:?},\"runs\":{runs},\"median_ms\":{:.3},\"min_ms\":{:.3},\"max_ms\":{:.3}}}",
                stats.median_ms, stats.min_ms, stats.max_ms
            );
            medians.push(stats.median_ms);
        }
        let (a, b) = (variants[0].0, variants[1].0);
        println!(
            "{{\"op\":\"{name}\",\"pass\":\"{pass}\",\"shape\":{shape:?},\"ratio_{a}_over_{b}\":{:.3}}}",
            medians[0] / medians[1]
        );
    }
    Ok(())
}

/// The attention benches' inputs: q, k, v `[B, heads, T, hd]` = `[8, 8, 256, 64]` (MHA) and
/// a key mask left-padding row 0 by 32 tokens.
fn attention_inputs() -> Result<([usize; 4], Vec<Tensor>, Vec<u32>)> {
    let shape = [8, 8, 256, 64];
    let inputs = [5u64, 6, 7].map(|seed| random(&shape, 1.0, seed));
    let inputs = inputs.into_iter().collect::<Result<Vec<_>>>()?;
    let mut mask = vec![1u32; 8 * 256];
    mask[..32].fill(0);
    Ok((shape, inputs, mask))
}

fn main() -> Result<()> {
    let runs: usize = std::env::var("OXALIGN_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    // `cargo bench` passes `--bench`; any other argument filters ops by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    eprintln!(
        "rayon threads: {}, runs per measurement: {runs}",
        rayon::current_num_threads()
    );

    if wanted("token_logprobs") {
        let shape = [8, 256, 32000];
        let logits = random(&shape, 4.0, 1)?;
        let ids: Vec<u32> = (0..8 * 256).map(|i| (i * 7919 % 32000) as u32).collect();
        let targets = Tensor::from_vec(ids, (8, 256), &Device::Cpu)?;
        let (t1, t2) = (targets.clone(), targets);
        bench(
            "token_logprobs",
            &shape,
            &logits,
            Box::new(move |x| ops::token_logprobs(x, &t1)),
            Box::new(move |x| reference::token_logprobs(x, &t2)),
            runs,
        )?;
    }
    if wanted("lm_head") {
        // The GRPO benchmark's policy update: 128 sequences of 73 positions, hidden 256,
        // vocabulary 32000. Fused head against the logits path it replaced (linear, then
        // the fused token_logprobs and entropy over [B, T, V]).
        let shape = [128, 73, 256];
        let hidden = random(&shape, 1.0, 3)?;
        let weight = Var::from_tensor(&random(&[32000, 256], 0.05, 4)?)?;
        let ids: Vec<u32> = (0..128 * 73).map(|i| (i * 7919 % 32000) as u32).collect();
        let targets = Tensor::from_vec(ids, (128, 73), &Device::Cpu)?;
        let (t1, t2) = (targets.clone(), targets);
        let (w1, w2) = (weight.as_tensor().clone(), weight.as_tensor().clone());
        bench(
            "lm_head",
            &shape,
            &hidden,
            Box::new(move |x| {
                let o = ops::lm_head_logprobs(x, &w1, &t1, ops::TokenDistribution::MODEL)?;
                o.logprobs + o.entropy
            }),
            Box::new(move |x| {
                let logits = x.broadcast_matmul(&w2.t()?)?;
                ops::token_logprobs(&logits, &t2)? + ops::entropy(&logits)?
            }),
            runs,
        )?;
    }
    if wanted("entropy") {
        let shape = [8, 256, 32000];
        let logits = random(&shape, 4.0, 2)?;
        bench(
            "entropy",
            &shape,
            &logits,
            Box::new(ops::entropy),
            Box::new(reference::entropy),
            runs,
        )?;
    }
    if wanted("rms_norm") {
        let shape = [8, 256, 512];
        let x = random(&shape, 2.0, 3)?;
        let w = random(&[512], 1.0, 4)?;
        let (w1, w2) = (w.clone(), w);
        bench(
            "rms_norm",
            &shape,
            &x,
            Box::new(move |x| ops::rms_norm(x, &w1, 1e-6)),
            Box::new(move |x| reference::rms_norm(x, &w2, 1e-6)),
            runs,
        )?;
    }
    if wanted("rope") {
        let shape = [8, 8, 256, 64];
        let x = random(&shape, 1.0, 5)?;
        let theta = random(&[8, 256, 32], 3.0, 6)?;
        let (cos, sin) = (theta.cos()?, theta.sin()?);
        let (c1, s1, c2, s2) = (cos.clone(), sin.clone(), cos, sin);
        bench(
            "rope",
            &shape,
            &x,
            Box::new(move |x| ops::rope(x, &c1, &s1)),
            Box::new(move |x| reference::rope(x, &c2, &s2)),
            runs,
        )?;
    }
    if wanted("causal_attention") {
        let (shape, inputs, mask) = attention_inputs()?;
        let (m1, m2) = (mask.clone(), mask);
        bench_n(
            "causal_attention",
            &shape,
            &inputs,
            Box::new(move |x| ops::causal_attention(&x[0], &x[1], &x[2], Some(&m1), None)),
            Box::new(move |x| reference::causal_attention(&x[0], &x[1], &x[2], Some(&m2), None)),
            runs,
        )?;
    }
    if wanted("attention_engine_order") {
        // The fake-int8 trainer's attention (the engine's per-query arithmetic) against the
        // tiled forward every other trainer uses.
        let (shape, inputs, mask) = attention_inputs()?;
        let (m1, m2) = (mask.clone(), mask);
        let engine_order: OpN = Box::new(move |x| {
            ops::causal_attention_engine_order(&x[0], &x[1], &x[2], Some(&m1), None, None)
        });
        let tiled: OpN =
            Box::new(move |x| ops::causal_attention(&x[0], &x[1], &x[2], Some(&m2), None));
        let variants = [("engine_order", engine_order), ("tiled", tiled)];
        bench_pair("attention_engine_order", &shape, &inputs, variants, runs)?;
    }
    Ok(())
}
