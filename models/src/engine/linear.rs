//! [`Linear`]: one linear layer of the engine in the precision it serves — packed f32 or bf16
//! panels, int8, GGML-quantized or a dense device tensor — with its host forward and size.

use crate::engine::config::QuantMode;
use crate::engine::error::{EngineError, EngineResult};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use oxalign_kernels::linear::{Int8Weight, PackedBf16Weight, PackedF32Weight};
use std::sync::Arc;

/// One linear layer `x [T, in] -> [T, out]` in the engine's precision.
#[derive(Clone, Debug)]
pub(crate) enum Linear {
    /// f32 or bf16 weight `[out, in]` (candle matmul; devices other than the CPU).
    Dense(Tensor, Option<Tensor>),
    /// f32 weight packed for decode batches (host kernel), with an f32 bias `[out]`.
    Packed(Arc<PackedF32Weight>, Option<Vec<f32>>),
    /// bf16 weight packed for decode batches (host kernel: widened to f32 in registers, f32
    /// activations and sums), with an f32 bias `[out]`.
    PackedBf16(Arc<PackedBf16Weight>, Option<Vec<f32>>),
    /// Quantized weight `[out, in]` (candle's ggml kernels: Q4_0, and Q8_0 off the CPU).
    Quant(QMatMul, Option<Tensor>),
    /// W8A8 int8 weight `[out, in]` with per-channel scales (host integer kernel), and an
    /// f32 bias `[out]`.
    Int8(Arc<Int8Weight>, Option<Vec<f32>>),
}

impl Linear {
    pub(crate) fn new(w: Tensor, b: Option<Tensor>, quant: QuantMode) -> EngineResult<Linear> {
        let dtype = match quant {
            QuantMode::None if w.device().is_cpu() => {
                let (host, out_dim, in_dim, bias) = host_linear(&w, b.as_ref())?;
                let p = PackedF32Weight::pack(&host, out_dim, in_dim);
                return Ok(Linear::Packed(Arc::new(p), bias));
            }
            QuantMode::None => return Ok(Linear::Dense(w, b)),
            QuantMode::Bf16 if w.device().is_cpu() => {
                let (host, out_dim, in_dim, bias) = host_linear(&w, b.as_ref())?;
                let p = PackedBf16Weight::pack(&host, out_dim, in_dim);
                return Ok(Linear::PackedBf16(Arc::new(p), bias));
            }
            QuantMode::Bf16 => return Ok(Linear::Dense(w.to_dtype(DType::BF16)?, b)),
            QuantMode::Int8 if w.device().is_cpu() => {
                let (host, out_dim, in_dim, bias) = host_linear(&w, b.as_ref())?;
                let q = Int8Weight::quantize(&host, out_dim, in_dim);
                return Ok(Linear::Int8(Arc::new(q), bias));
            }
            QuantMode::Int8 => GgmlDType::Q8_0,
            QuantMode::Q4 => GgmlDType::Q4_0,
        };
        let in_dim = w.dim(1)?;
        if in_dim % dtype.block_size() != 0 {
            return Err(EngineError::Config {
                key: "quant",
                message: format!(
                    "{quant:?} needs every linear input size to be a multiple of {}, found {in_dim}",
                    dtype.block_size()
                ),
            });
        }
        let q = QMatMul::from_qtensor(QTensor::quantize(&w, dtype)?)?;
        Ok(Linear::Quant(q, b))
    }

    /// `x`: host `[rows, in]` f32 -> host `[rows, out]`. The packed and int8 weights run
    /// their host kernels directly; tensor weights go through candle on their device.
    pub(crate) fn forward_host(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let in_dim = x.len() / rows.max(1);
        match self {
            Linear::Packed(p, b) => {
                let mut out = vec![0f32; rows * p.out_dim()];
                p.matmul(x, rows, b.as_deref(), &mut out);
                Ok(out)
            }
            Linear::PackedBf16(p, b) => {
                let mut out = vec![0f32; rows * p.out_dim()];
                p.matmul(x, rows, b.as_deref(), &mut out);
                Ok(out)
            }
            Linear::Int8(q, b) => {
                let mut out = vec![0f32; rows * q.out_dim()];
                q.matmul(x, rows, b.as_deref(), &mut out);
                Ok(out)
            }
            Linear::Dense(w, b) => {
                // A bf16 weight multiplies bf16 activations (the device's bf16 matmul).
                let xt = Tensor::from_slice(x, (rows, in_dim), w.device())?.to_dtype(w.dtype())?;
                let b = b.as_ref().map(|b| b.to_dtype(w.dtype())).transpose()?;
                host(&crate::nn::layers::linear(&xt, w, b.as_ref())?.to_dtype(DType::F32)?)
            }
            Linear::Quant(q, b) => {
                let device = match q {
                    QMatMul::QTensor(t) => t.device(),
                    QMatMul::Tensor(w) | QMatMul::TensorF16(w) => w.device().clone(),
                };
                let y = q.forward(&Tensor::from_slice(x, (rows, in_dim), &device)?)?;
                match b {
                    Some(b) => host(&y.broadcast_add(b)?),
                    None => host(&y),
                }
            }
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        let t = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.elem_count() * 4);
        match self {
            Linear::Dense(w, b) => w.elem_count() * w.dtype().size_in_bytes() + t(b),
            Linear::Quant(QMatMul::QTensor(q), b) => q.storage_size_in_bytes() + t(b),
            Linear::Quant(QMatMul::Tensor(w), b) | Linear::Quant(QMatMul::TensorF16(w), b) => {
                w.elem_count() * w.dtype().size_in_bytes() + t(b)
            }
            Linear::Packed(p, b) => p.bytes() + b.as_ref().map_or(0, |b| b.len() * 4),
            Linear::PackedBf16(p, b) => p.bytes() + b.as_ref().map_or(0, |b| b.len() * 4),
            Linear::Int8(q, b) => q.bytes() + b.as_ref().map_or(0, |b| b.len() * 4),
        }
    }
}

/// A linear layer's weight `[out, in]` as a host row-major vector with its shape, and its
/// bias on the host.
type HostLinear = (Vec<f32>, usize, usize, Option<Vec<f32>>);
fn host_linear(w: &Tensor, b: Option<&Tensor>) -> candle_core::Result<HostLinear> {
    let (out_dim, in_dim) = w.dims2()?;
    let bias = b.map(host).transpose()?;
    Ok((host(w)?, out_dim, in_dim, bias))
}

/// A tensor's values as a host f32 vector (row-major).
pub(crate) fn host(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?
        .flatten_all()?
        .to_device(&Device::Cpu)?
        .to_vec1::<f32>()
}
