//! The differentiable building blocks of the decoder — RMSNorm, RoPE application, softmax,
//! linear, embedding, token log-probs, the SwiGLU gate. RMSNorm, RoPE, token log-probs,
//! SwiGLU and linear are the fused, differentiable kernels of `oxalign-kernels`; softmax and
//! embedding are composed candle ops with a backward pass. candle's fused `rms_norm`,
//! `softmax_last_dim` and `rope*` (no backward) are deliberately not used.

use candle_core::{DType, Result, Tensor, D};

/// RMSNorm over the last dim: `weight * x / sqrt(mean(x^2) + eps)`.
///
/// `x`: `[..., D]`, `weight`: `[D]`. Half-precision inputs are normalised in f32 and cast back,
/// as HF does.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F64 => {
            oxalign_kernels::ops::rms_norm(x, &weight.to_dtype(x.dtype())?, eps)
        }
        dt => oxalign_kernels::ops::rms_norm(
            &x.to_dtype(DType::F32)?,
            &weight.to_dtype(DType::F32)?,
            eps,
        )?
        .to_dtype(dt),
    }
}

/// Applies rotary position embeddings in HF's `rotate_half` layout:
/// `out = x * cos + rotate_half(x) * sin` with the first and second half of each head paired.
///
/// `x`: `[B, heads, T, Dh]`; `cos`, `sin`: `[B, T, Dh/2]` (per-row positions).
pub(crate) fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    oxalign_kernels::ops::rope(x, &cos.to_dtype(x.dtype())?, &sin.to_dtype(x.dtype())?)
}

/// Softmax over the last dim, composed (`exp(x - max) / sum`). The max is a constant shift
/// (softmax is invariant to it), so it is detached.
pub(crate) fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

/// `silu(gate) * up`, fused on the CPU (one `[.., intermediate]` tensor less kept for the
/// backward pass); f16/bf16 are computed in f32 and cast back.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    match gate.dtype() {
        DType::F32 | DType::F64 => oxalign_kernels::ops::swiglu(gate, up),
        dt => oxalign_kernels::ops::swiglu(&gate.to_dtype(DType::F32)?, &up.to_dtype(DType::F32)?)?
            .to_dtype(dt),
    }
}

/// [`swiglu`] in the engine's arithmetic (`g / (1 + e^-g) · u`), for a trainer in the
/// engine's numbers (f32/f64 only).
pub fn swiglu_engine_order(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    oxalign_kernels::ops::swiglu_engine_order(gate, up)
}

/// `x @ weight^T (+ bias)`. `x`: `[..., in]`, `weight`: `[out, in]`, `bias`: `[out]`. One
/// differentiable op on the CPU in f32 ([`oxalign_kernels::ops::linear_f32`]: its backward
/// writes both gradients straight into their layouts); f64 and other devices compose
/// candle's matmul.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    with_bias(oxalign_kernels::ops::linear_f32(x, weight)?, bias)
}

/// [`linear`] in bf16 mixed precision: `x` and `weight` rounded to bf16, products summed
/// in f32, the result (and the bias add) f32; gradients reach the f32 `weight`
/// ([`oxalign_kernels::ops::linear_bf16`]).
pub fn linear_bf16(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    with_bias(oxalign_kernels::ops::linear_bf16(x, weight)?, bias)
}

/// `y + bias` broadcast over the rows, or `y` without one.
pub(crate) fn with_bias(y: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// Log-probability of each target under `logits`: `[B, T, V]`, `[B, T]` u32 -> `[B, T]` (nats).
/// Differentiable w.r.t. `logits`.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    oxalign_kernels::ops::token_logprobs(logits, targets)
}
