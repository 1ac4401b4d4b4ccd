//! One forward step of the engine over a ragged batch: every item is a run of new tokens of
//! one sequence (a prefill chunk or a single decode token) whose earlier keys/values sit in
//! the paged pool. Projections and the MLP are batched over all tokens; RoPE and attention
//! run on the host over each sequence's block table. No scheduling decisions are made here.

use crate::engine::block_pool::BlockPool;
use crate::engine::weights::EngineWeights;
use crate::layers::{embedding, rms_norm};
use candle_core::{Device, Result, Tensor};

/// Which logits an item wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WantLogits {
    /// None (a prefill chunk that does not reach the end of the sequence).
    None,
    /// The last new position only (to sample the next token).
    Last,
    /// Every new position (scoring a sequence).
    All,
}

/// A run of new tokens of one sequence.
pub(crate) struct StepItem<'a> {
    /// The sequence's block table (already covering `start + tokens.len()` positions).
    pub table: &'a [usize],
    /// Position of the first new token (= tokens already cached).
    pub start: usize,
    /// The new tokens.
    pub tokens: &'a [u32],
    /// Which logits to return.
    pub want: WantLogits,
}

/// Attention shape of the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Runs all `items` through the model, writing their keys/values into `pool`, and returns
/// the requested logits `[rows, V]` f32 (rows in item order, positions ascending), or `None`
/// when no item asked for any.
pub(crate) fn paged_forward(
    w: &EngineWeights,
    dims: AttnDims,
    inv_freq: &[f32],
    pool: &mut BlockPool,
    items: &[StepItem<'_>],
    device: &Device,
) -> Result<Option<Tensor>> {
    let ids: Vec<u32> = items
        .iter()
        .flat_map(|i| i.tokens.iter().copied())
        .collect();
    let total = ids.len();
    if total == 0 {
        return Ok(None);
    }
    let positions: Vec<usize> = items
        .iter()
        .flat_map(|i| i.start..i.start + i.tokens.len())
        .collect();
    // RoPE tables [T, head_dim/2], exactly as `RotaryEmbedding::cos_sin` builds them.
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(total * half);
    let mut sin = Vec::with_capacity(total * half);
    for &p in &positions {
        for &f in inv_freq {
            let angle = p as u32 as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    let (nh, nkv, hd) = (dims.heads, dims.kv_heads, dims.head_dim);
    let q_dim = nh * hd;
    let kv_dim = nkv * hd;
    let row = q_dim + 2 * kv_dim;
    let ids_t = Tensor::from_vec(ids, (1, total), device)?;
    let hidden = w.embed.dim(1)?;
    let mut x = embedding(&w.embed, &ids_t)?.reshape((total, hidden))?;
    let mut attn_out = vec![0f32; total * q_dim];
    let mut scores: Vec<f32> = Vec::new();
    for (li, layer) in w.layers.iter().enumerate() {
        let h = rms_norm(&x, &layer.input_norm, w.eps)?;
        let mut qkv = layer
            .qkv
            .forward(&h)?
            .flatten_all()?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        // RoPE on q and k heads (HF rotate_half layout), then store k/v in the pool.
        for t in 0..total {
            let (c, s) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            let r = &mut qkv[t * row..t * row + q_dim + kv_dim];
            for head in r.chunks_exact_mut(hd) {
                let (x1, x2) = head.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (x1[i], x2[i]);
                    x1[i] = a * c[i] - b * s[i];
                    x2[i] = b * c[i] + a * s[i];
                }
            }
        }
        let mut t0 = 0;
        for item in items {
            for j in 0..item.tokens.len() {
                let r = &qkv[(t0 + j) * row..(t0 + j + 1) * row];
                pool.write(
                    li,
                    item.table,
                    item.start + j,
                    &r[q_dim..q_dim + kv_dim],
                    &r[q_dim + kv_dim..],
                );
            }
            t0 += item.tokens.len();
        }
        // Attention of every new token over its sequence's cached keys.
        let scale = (hd as f64).powf(-0.5) as f32;
        let n_rep = nh / nkv;
        let (kbuf, vbuf) = pool.layer(li);
        let bs = pool.block_size();
        let mut t0 = 0;
        for item in items {
            for j in 0..item.tokens.len() {
                let t = t0 + j;
                let p = item.start + j;
                let lo = layer.window.map_or(0, |win| (p + 1).saturating_sub(win));
                let n = p + 1 - lo;
                for qh in 0..nh {
                    let g = qh / n_rep;
                    let q = &qkv[t * row + qh * hd..t * row + (qh + 1) * hd];
                    scores.clear();
                    let mut max = f32::NEG_INFINITY;
                    for pos in lo..=p {
                        let o = pool.offset(item.table[pos / bs], g, pos % bs);
                        let k = &kbuf[o..o + hd];
                        let mut dot = 0f32;
                        for d in 0..hd {
                            dot += q[d] * k[d];
                        }
                        let sc = dot * scale;
                        max = max.max(sc);
                        scores.push(sc);
                    }
                    let mut sum = 0f32;
                    for sc in scores.iter_mut() {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    let out = &mut attn_out[t * q_dim + qh * hd..t * q_dim + (qh + 1) * hd];
                    out.fill(0.0);
                    for (i, pos) in (lo..=p).enumerate() {
                        let pr = scores[i] / sum;
                        let o = pool.offset(item.table[pos / bs], g, pos % bs);
                        let v = &vbuf[o..o + hd];
                        for d in 0..hd {
                            out[d] += pr * v[d];
                        }
                    }
                    debug_assert_eq!(scores.len(), n);
                }
            }
            t0 += item.tokens.len();
        }
        let a = Tensor::from_slice(&attn_out, (total, q_dim), device)?;
        x = (x + layer.o.forward(&a)?)?;
        let h = rms_norm(&x, &layer.post_norm, w.eps)?;
        let gu = layer.gate_up.forward(&h)?;
        let gate = gu.narrow(1, 0, w.intermediate)?.silu()?;
        let up = gu.narrow(1, w.intermediate, w.intermediate)?;
        x = (x + layer.down.forward(&(gate * up)?)?)?;
    }
    // Final norm and LM head only on the rows whose logits are wanted.
    let rows = wanted_rows(items);
    if rows.is_empty() {
        return Ok(None);
    }
    let x = if rows.len() == total {
        x
    } else {
        let n = rows.len();
        x.index_select(&Tensor::from_vec(rows, n, device)?, 0)?
    };
    let h = rms_norm(&x, &w.norm, w.eps)?;
    Ok(Some(w.lm_head.forward(&h)?))
}

/// Flat token indices of the rows whose logits the items want.
fn wanted_rows(items: &[StepItem<'_>]) -> Vec<u32> {
    let mut rows = Vec::new();
    let mut t0 = 0u32;
    for item in items {
        let n = item.tokens.len() as u32;
        match item.want {
            WantLogits::None => {}
            WantLogits::Last => rows.push(t0 + n - 1),
            WantLogits::All => rows.extend(t0..t0 + n),
        }
        t0 += n;
    }
    rows
}
