//! bf16 mixed precision (`Precision::Bf16Mixed`) against f32 on tiny Llama and Qwen2
//! policies: log-probs within a bf16 tolerance of f32's, every trainable tensor still
//! receiving a gradient, and 200 SFT steps whose loss curve follows f32's. The kernel-level
//! tests (`oxalign-kernels`, `bf16_gemm`) hold every dispatch path to the same products of
//! bf16-rounded operands, so what holds here on this CPU's path holds on the others.
//!
//! Tolerances (measured on this fixture, with headroom): log-probs max |Δ| ≤ 0.05 nats and
//! mean |Δ| ≤ 0.01; the SFT loss curve within 0.05 nats of f32's at every step, and both end
//! below a fifth of where they started.

mod common;

use candle_core::{DType, Device};
use oxalign_models::{CausalLm, Family, ModelConfig, Precision, TokenDistribution};
use oxalign_rlhf::trainer::{PolicyTrainer, TokenBatch};

/// Vocab 96, hidden 64, 2 layers, 4 heads over 2 kv heads: wide enough that every
/// projection cuts the bf16 GEMM's register tiles.
fn tiny(family: Family) -> ModelConfig {
    common::tiny_dense(family, 96, 64, 112)
}

/// Seeded ids in `1..96`.
fn ids(seed: u64, n: usize) -> Vec<u32> {
    common::seeded_ids(seed, n, 96)
}

/// Six (prompt, response) pairs of mixed lengths.
fn batch() -> TokenBatch {
    let shapes = [(3, 12), (1, 17), (4, 9), (2, 14), (5, 11), (2, 16)];
    let seqs: Vec<(Vec<u32>, Vec<u32>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(p, r))| (ids(10 + i as u64, p), ids(30 + i as u64, r)))
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = seqs.iter().map(|(p, r)| (&p[..], &r[..])).collect();
    TokenBatch::new(&pairs, 0, &Device::Cpu).expect("batch")
}

fn policy(family: Family, precision: Precision) -> PolicyTrainer {
    let mut m = CausalLm::init_random(&tiny(family), 5, &Device::Cpu).unwrap();
    m.set_precision(precision);
    PolicyTrainer::new(m, 3e-3, 0.0).unwrap()
}

/// Response-token log-probs, flattened.
fn response_logprobs(t: &PolicyTrainer, b: &TokenBatch) -> Vec<f32> {
    let lp = t
        .head_outputs(b, TokenDistribution::MODEL, false)
        .unwrap()
        .logprobs;
    let mask = b
        .response_mask
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let lp = lp.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    lp.into_iter()
        .zip(mask)
        .filter(|&(_, m)| m > 0.0)
        .map(|(v, _)| v)
        .collect()
}

#[test]
fn bf16_mixed_logprobs_are_within_bf16_tolerance_of_f32() {
    let b = batch();
    for family in [Family::Llama, Family::Qwen2] {
        let f32_lp = response_logprobs(&policy(family, Precision::F32), &b);
        let bf_lp = response_logprobs(&policy(family, Precision::Bf16Mixed), &b);
        let diffs: Vec<f32> = f32_lp
            .iter()
            .zip(&bf_lp)
            .map(|(a, b)| (a - b).abs())
            .collect();
        let max = diffs.iter().cloned().fold(0f32, f32::max);
        let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
        assert!(
            max <= 0.05 && mean <= 0.01,
            "{family}: max {max}, mean {mean}"
        );
        assert!(
            max > 0.0,
            "{family}: bf16 mixed computed the f32 numbers exactly"
        );
    }
}

#[test]
fn every_trainable_tensor_gets_a_gradient_under_bf16_mixed() {
    let b = batch();
    let t = policy(Family::Qwen2, Precision::Bf16Mixed);
    let lp = t
        .head_outputs(&b, TokenDistribution::MODEL, false)
        .unwrap()
        .logprobs;
    let loss = (lp * &b.response_mask).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in t.model.vars() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            norm.is_finite() && norm > 0.0,
            "{name}: gradient norm² {norm}"
        );
        assert_eq!(g.dtype(), DType::F32, "{name}: the master gradient is f32");
    }
}

#[test]
fn two_hundred_sft_steps_in_bf16_mixed_follow_the_f32_loss_curve() {
    let b = batch();
    let run = |precision| -> Vec<f64> {
        let mut t = policy(Family::Llama, precision);
        (0..200)
            .map(|_| t.sft_step(&b, 3e-3, 1.0, 1.0, None).unwrap().0)
            .collect()
    };
    let (f32_curve, bf_curve) = (run(Precision::F32), run(Precision::Bf16Mixed));
    let worst = f32_curve
        .iter()
        .zip(&bf_curve)
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);
    assert!(worst <= 0.05, "loss curves differ by up to {worst} nats");
    for (name, curve) in [("f32", &f32_curve), ("bf16", &bf_curve)] {
        let (first, last) = (curve[0], curve[199]);
        assert!(last < first / 5.0, "{name}: loss {first} -> {last}");
    }
}
