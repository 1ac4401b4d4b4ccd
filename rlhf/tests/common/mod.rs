//! Shared helpers for the integration tests: fixture loading, tensor builders, comparisons.
#![allow(dead_code)]

pub mod tiny_moe;

use std::collections::HashMap;
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

/// Tolerance for a dtype: 1e-6 for f64, 1e-5 for f32 (relative above magnitude 1).
pub fn tol(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        1e-6
    } else {
        1e-5
    }
}

pub const DTYPES: [DType; 2] = [DType::F64, DType::F32];

/// The reference fixture written by tools/rlhf_reference.py.
pub fn fixture() -> &'static Value {
    static FIXTURE: OnceLock<Value> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reference.json");
        let text = std::fs::read_to_string(path).expect("read tests/fixtures/reference.json");
        serde_json::from_str(&text).expect("parse reference.json")
    })
}

pub fn f(v: &Value) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("expected a number, got {v}"))
}

pub fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        other => vec![f(other)],
    }
}

pub fn dims(v: &Value) -> Vec<usize> {
    let mut out = vec![];
    let mut cur = v;
    while let Value::Array(items) = cur {
        out.push(items.len());
        match items.first() {
            Some(first) => cur = first,
            None => break,
        }
    }
    out
}

/// A tensor with the nested-array value's shape, in `dtype`, on the CPU.
pub fn tensor(v: &Value, dtype: DType) -> Tensor {
    Tensor::from_vec(flat(v), dims(v), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

pub fn host(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

pub fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length {} vs {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: got {g}, want {w} (|diff| = {:e} > {bound:e})",
            (g - w).abs()
        );
    }
}

#[track_caller]
pub fn assert_close1(what: &str, got: f64, want: f64, tol: f64) {
    assert_close(what, &[got], &[want], tol);
}

/// Deterministic pseudo-random numbers (SplitMix64), so property loops need no extra crates.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
    /// A random 0/1 mask with at least one response token per row.
    pub fn mask(&mut self, b: usize, t: usize) -> Vec<f64> {
        let mut m: Vec<f64> = (0..b * t)
            .map(|_| if self.uniform() < 0.6 { 1.0 } else { 0.0 })
            .collect();
        for row in 0..b {
            let col = (self.next_u64() % t as u64) as usize;
            m[row * t + col] = 1.0;
        }
        m
    }
}

pub fn from_vec(v: Vec<f64>, dims: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, dims, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Largest |a − b| over every element of two sets of named weights (the same names).
pub fn max_weight_diff(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .map(|(k, x)| {
            let d = (x - &b[k]).unwrap().abs().unwrap().flatten_all().unwrap();
            d.max(0)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .fold(0.0, f32::max)
}

use oxalign_models::{GenerationRequest, SamplingParams};

/// `rows` deterministic prompts (row `i` has `3 + 2i` tokens in 3..93) of `new_tokens`
/// sampled tokens each (EOS ignored, T = 1, row `i` seeded `seed + i`).
pub fn seeded_requests(rows: u64, new_tokens: usize, seed: u64) -> Vec<GenerationRequest> {
    (0..rows)
        .map(|i| {
            let prompt: Vec<u32> = (0..3 + 2 * i as usize)
                .map(|j| ((7 + 13 * i as usize + 5 * j) % 90 + 3) as u32)
                .collect();
            let mut r = GenerationRequest::new(prompt, new_tokens);
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: seed + i,
            };
            r
        })
        .collect()
}

/// A tiny dense `family` config: `vocab` ids, width `hidden`, MLP width `intermediate`,
/// 2 layers, 4 heads of `hidden / 4` over 2 kv heads (fast in the dev profile).
pub fn tiny_dense(
    family: oxalign_models::Family,
    vocab: usize,
    hidden: usize,
    intermediate: usize,
) -> oxalign_models::ModelConfig {
    let mut c = oxalign_models::ModelConfig::preset(family, oxalign_models::Preset::Tiny, vocab);
    c.hidden_size = hidden;
    c.intermediate_size = intermediate;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = hidden / 4;
    c
}

/// `n` seeded ids in `1..vocab` (xorshift; never the pad id 0).
pub fn seeded_ids(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % (vocab as u64 - 1)) as u32
        })
        .collect()
}
