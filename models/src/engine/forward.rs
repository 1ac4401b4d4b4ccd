//! One forward step of the engine over a ragged batch: every item is a run of new tokens of
//! one sequence (a prefill chunk or a single decode token) whose earlier keys/values sit in
//! the paged pool. It runs on host buffers: projections and the MLP are a few large matmuls
//! over all tokens of the step, attention is one parallel pass over every token's block
//! table ([`paged_attention`]). No scheduling decisions are made here.

use crate::config::model_config::Activation;
use crate::engine::block_pool::BlockPool;
use crate::engine::paged_attention::paged_attention;
use crate::engine::step_item::{AttnDims, StepItem, WantLogits};
use crate::engine::weights::{EngineWeights, FfnWeights};
use candle_core::Result;
use oxalign_kernels::ops::{rows, TokenDistribution};
use rayon::prelude::*;

/// What the sparse layers of one step do with routing: append each layer's choices for the
/// step's tokens (`tokens * k`, item order) to `record`, and/or send the tokens to
/// `replay[l]` (same layout, [`crate::moe::routing::FREE`] = the router chooses) instead of
/// their own top-k. Default: neither.
#[derive(Default)]
pub(crate) struct StepRouting<'a> {
    pub record: Option<&'a mut Vec<Vec<u32>>>,
    pub replay: Option<&'a [Vec<u32>]>,
}

/// What the LM head returns for the wanted rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Head<'a> {
    /// Full logits `[rows, V]` (the sampler needs them).
    Logits,
    /// One log-prob per wanted row, of the target token given for that row, under the
    /// distribution (scoring). The logits are computed [`HEAD_CHUNK`] rows at a time and never
    /// held for the whole batch.
    TargetLogprobs(&'a [u32], TokenDistribution),
}

/// Rows of logits alive at once when the head returns target log-probs.
const HEAD_CHUNK: usize = 64;

/// Runs all `items` through the model, writing their keys/values into `pool`, and returns
/// the requested logits `[rows, V]` f32 row-major (rows in item order, positions
/// ascending), or `None` when no item asked for any. Sparse layers record or replay their
/// routing as `routing` says.
///
/// Everything runs on host buffers: per layer, RMSNorm, the fused q/k/v projection, RoPE,
/// the KV write, one attention pass, the output projection, RMSNorm, the fused gate/up
/// projection, SwiGLU (or GeGLU) and the down projection, with no tensor allocations in
/// between; Gemma's extra norms wrap the attention's and the MLP's outputs.
pub(crate) fn paged_forward(
    w: &EngineWeights,
    dims: AttnDims,
    inv_freq: &[f32],
    pool: &mut BlockPool,
    items: &[StepItem<'_>],
    head: Head<'_>,
    routing: StepRouting<'_>,
) -> Result<Option<Vec<f32>>> {
    let StepRouting { mut record, replay } = routing;
    let mut sparse = 0;
    let ids: Vec<u32> = items
        .iter()
        .flat_map(|i| i.tokens.iter().copied())
        .collect();
    let total = ids.len();
    if total == 0 {
        return Ok(None);
    }
    let global = rope_tables(items, inv_freq);
    let local = w.local_inv_freq.as_deref().map(|f| rope_tables(items, f));
    let hidden = w.hidden;
    let mut x = embed_tokens(w, &ids)?;
    let q_dim = dims.heads * dims.head_dim;
    let mut h = vec![0f32; total * hidden];
    let mut attn_out = vec![0f32; total * q_dim];
    let mut act = vec![0f32; total * w.intermediate];
    for (li, layer) in w.layers.iter().enumerate() {
        rows::rms_norm_rows(&x, &layer.input_norm, w.eps, &mut h);
        let mut qkv = layer.qkv.forward_host(&h, total)?;
        if let Some((qn, kn)) = &layer.qk_norm {
            qk_norm_rows(&mut qkv, qn, kn, dims, w.eps);
        }
        if let Some(f) = w.q_rescale {
            scale_queries(&mut qkv, f, dims);
        }
        let (cos, sin) = match (&local, layer.local_rope) {
            (Some(local), true) => local,
            _ => &global,
        };
        apply_rope_and_store(&mut qkv, cos, sin, dims, pool, li, items);
        paged_attention(pool, li, items, &qkv, dims, layer.window, &mut attn_out);
        let attn = layer.o.forward_host(&attn_out, total)?;
        let ffn_norms = layer.feedforward_norms.as_ref();
        match ffn_norms {
            None => add_into(&mut x, &attn),
            Some(_) => add_normed_into(&mut x, &attn, &layer.post_norm, w.eps),
        }
        let pre_ffn = ffn_norms.map_or(&layer.post_norm, |(pre, _)| pre);
        rows::rms_norm_rows(&x, pre_ffn, w.eps, &mut h);
        let ffn_out = match &layer.ffn {
            FfnWeights::Dense { gate_up, down } => {
                let gu = gate_up.forward_host(&h, total)?;
                gated_activation(w, &gu, &mut act);
                down.forward_host(&act, total)?
            }
            FfnWeights::Sparse(moe) => {
                let rec = record.as_deref_mut().and_then(|r| {
                    r.push(Vec::new());
                    r.last_mut()
                });
                let forced = replay.map(|r| r.get(sparse).map_or(&[][..], Vec::as_slice));
                sparse += 1;
                moe.forward(&h, total, forced, rec)?
            }
        };
        match ffn_norms {
            None => add_into(&mut x, &ffn_out),
            Some((_, post)) => add_normed_into(&mut x, &ffn_out, post, w.eps),
        }
    }
    lm_head_rows(w, &x, items, head)
}

/// The embedding rows of `ids` (times the model's embedding scale): `[ids.len(), hidden]`
/// f32, row-major.
fn embed_tokens(w: &EngineWeights, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
    let hidden = w.hidden;
    let mut x = vec![0f32; ids.len() * hidden];
    w.embed.copy_rows(ids, hidden, &mut x)?;
    if let Some(scale) = w.embed_scale {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    Ok(x)
}

/// The model's final soft-cap on LM-head logits, in place (Gemma 2; nothing otherwise), as
/// the trainer computes it (`z / c`, `tanh`, `· c`).
fn softcap_logits(w: &EngineWeights, logits: &mut [f32]) {
    if let Some(c) = w.final_softcap {
        logits.par_iter_mut().for_each(|z| *z = (*z / c).tanh() * c);
    }
}

/// `act = act(gate) · up` of the fused `[gate | up]` rows `gu`, eight rows per task.
fn gated_activation(w: &EngineWeights, gu: &[f32], act: &mut [f32]) {
    let inter = w.intermediate;
    let rows_fn = match w.activation {
        Activation::Silu => rows::silu_mul_rows,
        Activation::GeluTanh => rows::gelu_tanh_mul_rows,
    };
    act.par_chunks_mut(inter * 8)
        .zip(gu.par_chunks(2 * inter * 8))
        .for_each(|(a, g)| rows_fn(g, inter, a));
}

/// `x += rms_norm(y) · norm` row by row (Gemma's norm after attention and after the MLP).
fn add_normed_into(x: &mut [f32], y: &[f32], norm: &[f32], eps: f64) {
    let mut normed = vec![0f32; y.len()];
    rows::rms_norm_rows(y, norm, eps, &mut normed);
    add_into(x, &normed);
}

/// Multiplies every query head of the fused `[q; k; v]` rows by `f`.
fn scale_queries(qkv: &mut [f32], f: f32, dims: AttnDims) {
    let q_dim = dims.heads * dims.head_dim;
    let row = q_dim + 2 * dims.kv_heads * dims.head_dim;
    for r in qkv.chunks_mut(row) {
        r[..q_dim].iter_mut().for_each(|v| *v *= f);
    }
}

/// The final RMSNorm and the LM head, only on the rows of `x` (`[tokens, hidden]`, the last
/// layer's output) whose logits the items want: full logits `[rows, V]` or one target
/// log-prob per row, as `head` says; `None` when no row is wanted.
fn lm_head_rows(
    w: &EngineWeights,
    x: &[f32],
    items: &[StepItem<'_>],
    head: Head<'_>,
) -> Result<Option<Vec<f32>>> {
    let hidden = w.hidden;
    let rows_wanted = wanted_rows(items);
    if rows_wanted.is_empty() {
        return Ok(None);
    }
    let mut picked = vec![0f32; rows_wanted.len() * hidden];
    for (dst, &r) in picked.chunks_mut(hidden).zip(&rows_wanted) {
        let r = r as usize;
        dst.copy_from_slice(&x[r * hidden..(r + 1) * hidden]);
    }
    let mut normed = vec![0f32; picked.len()];
    rows::rms_norm_rows(&picked, &w.norm, w.eps, &mut normed);
    match head {
        Head::Logits => {
            let mut logits = w.lm_head.forward_host(&normed, rows_wanted.len())?;
            softcap_logits(w, &mut logits);
            Ok(Some(logits))
        }
        Head::TargetLogprobs(targets, dist) => {
            if targets.len() != rows_wanted.len() {
                candle_core::bail!(
                    "{} scoring targets for {} wanted rows",
                    targets.len(),
                    rows_wanted.len()
                );
            }
            head_logprobs(w, &normed, targets, dist).map(Some)
        }
    }
}

/// `log p(target_r)` under `dist` of `lm_head(h_r)` for every row of `normed` (`[rows,
/// hidden]`), [`HEAD_CHUNK`] rows of logits at a time (the `[rows, V]` logits are never held
/// at once).
fn head_logprobs(
    w: &EngineWeights,
    normed: &[f32],
    targets: &[u32],
    dist: TokenDistribution,
) -> Result<Vec<f32>> {
    let hidden = w.hidden;
    let mut out = Vec::with_capacity(targets.len());
    for (chunk, tg) in normed
        .chunks(HEAD_CHUNK * hidden)
        .zip(targets.chunks(HEAD_CHUNK))
    {
        let n = tg.len();
        let mut logits = w.lm_head.forward_host(chunk, n)?;
        softcap_logits(w, &mut logits);
        let vocab = logits.len() / n;
        if let Some(&bad) = tg.iter().find(|&&t| t as usize >= vocab) {
            candle_core::bail!("scoring target {bad} is not below the vocabulary size {vocab}");
        }
        let lps: Vec<f32> = logits
            .par_chunks(vocab)
            .zip(tg.par_iter())
            .map(|(row, &t)| target_logprob(row, t as usize, dist))
            .collect();
        out.extend(lps);
    }
    Ok(out)
}

/// `log p(target)` of one logits row under `dist`, with the arithmetic of the sampler (and
/// so of the trainer's fused head): the kept set widened to reach the target.
fn target_logprob(row: &[f32], target: usize, dist: TokenDistribution) -> f32 {
    if dist == TokenDistribution::MODEL {
        return rows::token_logprob(row, target);
    }
    let inv_t = (1.0 / dist.temperature) as f32;
    let tempered: Vec<f32> = row.iter().map(|&x| x * inv_t).collect();
    if dist.truncation.is_off(row.len()) {
        return rows::token_logprob(&tempered, target);
    }
    let tau = rows::kept_threshold(&tempered, dist.truncation).min(tempered[target]);
    rows::kept_logprob(&tempered, tau, target)
}

/// RoPE tables `[tokens, head_dim/2]` of every new token's position, exactly as
/// `RotaryEmbedding::cos_sin` builds them.
fn rope_tables(items: &[StepItem<'_>], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let n: usize = items.iter().map(|i| i.tokens.len()).sum();
    let mut cos = Vec::with_capacity(n * inv_freq.len());
    let mut sin = Vec::with_capacity(n * inv_freq.len());
    for p in items.iter().flat_map(|i| i.start..i.start + i.tokens.len()) {
        for &f in inv_freq {
            let angle = p as u32 as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// RoPE on the q and k heads of every token (HF rotate_half layout), then the token's keys
/// and values into the pool.
fn apply_rope_and_store(
    qkv: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    dims: AttnDims,
    pool: &mut BlockPool,
    layer: usize,
    items: &[StepItem<'_>],
) {
    let (hd, half) = (dims.head_dim, dims.head_dim / 2);
    let q_dim = dims.heads * hd;
    let kv_dim = dims.kv_heads * hd;
    let row = q_dim + 2 * kv_dim;
    for (t, r) in qkv.chunks_mut(row).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in r[..q_dim + kv_dim].chunks_exact_mut(hd) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
    let mut t = 0;
    for item in items {
        for j in 0..item.tokens.len() {
            let r = &qkv[t * row..(t + 1) * row];
            let (k, v) = r[q_dim..].split_at(kv_dim);
            pool.write(layer, item.table, item.start + j, k, v);
            t += 1;
        }
    }
}

/// RMSNorm of every query head with `qn` and every key head with `kn` (`[head_dim]` each),
/// in place in the fused `[q; k; v]` rows (Qwen3's q/k norm, before RoPE).
fn qk_norm_rows(qkv: &mut [f32], qn: &[f32], kn: &[f32], dims: AttnDims, eps: f64) {
    let hd = dims.head_dim;
    let q_dim = dims.heads * hd;
    let kv_dim = dims.kv_heads * hd;
    let row = q_dim + 2 * kv_dim;
    qkv.par_chunks_mut(row).for_each(|r| {
        let mut tmp = vec![0f32; hd];
        for (i, head) in r[..q_dim + kv_dim].chunks_exact_mut(hd).enumerate() {
            let w = if i < dims.heads { qn } else { kn };
            rows::rms_norm_rows(head, w, eps, &mut tmp);
            head.copy_from_slice(&tmp);
        }
    });
}

/// `x += y` elementwise (the residual connections).
fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
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
            WantLogits::From(k) => rows.extend(t0 + k.min(n as usize) as u32..t0 + n),
        }
        t0 += n;
    }
    rows
}
