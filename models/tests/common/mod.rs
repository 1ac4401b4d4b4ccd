//! Shared helpers for the model tests: tiny configs of each family and small tensor utilities.
#![allow(dead_code)]

use candle_core::{Device, Tensor};
use oxalign_models::{Family, ModelConfig, Preset};

/// A very small config (fast in the dev profile) of `family`: vocab 64, hidden 32,
/// 2 layers, 4 heads, 2 KV heads. Llama gets attention + MLP biases, qwen2 tied embeddings,
/// mistral a sliding window of 4; the MoE families 4 experts of width 16, top-2 (qwen3_moe
/// renormalised with layer 1 dense, qwen2_moe with a shared expert of 24, mixtral with a
/// sliding window of 4 and experts of the MLP width 48).
pub fn tiny(family: Family) -> ModelConfig {
    let mut c = ModelConfig::preset(family, Preset::Tiny, 64);
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.eos_token_id = vec![1];
    c.bos_token_id = Some(2);
    c.pad_token_id = Some(0);
    match family {
        Family::Llama => {
            c.attention_bias = true;
            c.mlp_bias = true;
            c.rope_scaling = Some(oxalign_models::RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 16,
            });
        }
        Family::Qwen2 => {}
        // Qwen3's own head_dim: wider than hidden / heads (8).
        Family::Qwen3 => c.head_dim = 16,
        Family::Mistral | Family::Phi3 => c.sliding_window = Some(4),
        // A sliding layer under a full one; q/k scaled by query_pre_attn_scalar 32; Gemma 2's
        // soft-caps small enough to act.
        Family::Gemma2 | Family::Gemma3 => {
            c.sliding_window = Some(4);
            c.sliding_layers = Some(oxalign_models::SlidingLayers::Listed(vec![true, false]));
            if family == Family::Gemma2 {
                c.style.attn_softcap = Some(1.0);
                c.style.final_softcap = Some(2.0);
            }
        }
        Family::Qwen3Moe | Family::Qwen2Moe | Family::Mixtral => {
            let m = c.moe.as_mut().expect("MoE preset");
            m.num_experts = 4;
            m.num_experts_per_tok = 2;
            m.moe_intermediate_size = 16;
            match family {
                Family::Qwen3Moe => m.mlp_only_layers = vec![1],
                Family::Qwen2Moe => m.shared_expert_intermediate_size = Some(24),
                _ => {
                    m.moe_intermediate_size = 48;
                    c.sliding_window = Some(4);
                }
            }
        }
    }
    c
}

/// Deterministic pseudo-random token ids in `1..vocab` (never the pad id 0).
pub fn ids(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            1 + ((x >> 33) % (vocab as u64 - 1)) as u32
        })
        .collect()
}

/// Max absolute difference of two same-shaped tensors.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// `[rows, len]` u32 tensor from rows.
pub fn batch(rows: &[Vec<u32>]) -> Tensor {
    let len = rows[0].len();
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (rows.len(), len), &Device::Cpu).unwrap()
}

/// `[1, len]` u32 tensor from one row.
pub fn batch1(row: &[u32]) -> Tensor {
    Tensor::from_vec(row.to_vec(), (1, row.len()), &Device::Cpu).unwrap()
}
