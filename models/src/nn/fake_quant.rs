//! The trainer's forward in the int8 engine's numbers (fake quantization, W8A8): every
//! linear layer the engine quantizes sees its input rows and weight rows rounded to int8
//! exactly as the engine's [`oxalign_kernels::linear::Int8Weight`] rounds them
//! ([`fake_quantize_rows`]), while the gradient passes straight through the rounding (the
//! straight-through estimator of quantization-aware training: `∂q(x)/∂x = 1`). Routers,
//! norms and embeddings stay f32, as in the engine. A policy trained this way optimises the
//! policy the int8 engine samples from, and its log-probs are the engine's up to f32
//! rounding. CPU (host) only.
//!
//! The rest of the decoder follows the engine's arithmetic too: the attention's engine-order
//! forward (`oxalign_kernels::ops::causal_attention_engine_order`), routers and shared-expert
//! gates on the engine's f32 kernel (`f32_linear.rs`), the SwiGLU's engine-order forward
//! (`swiglu_engine_order`), and the RMSNorm and RoPE kernels the engine's host code shares;
//! so the trainer's decoder is the int8 engine's bit for bit, and the log-probs differ only
//! by the LM head's summation order (`models/tests/routing_replay.rs`). Quantization-aware
//! training against the CPU int8 engine (`rl.trainer_precision = "fake_int8"`).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use oxalign_kernels::linear::{fake_quantize_rows, Int8Operand, Int8Weight};

use crate::nn::precision::Precision;

/// `x` with each last-dim row fake-quantized as `operand` (a no-op under [`Precision::F32`]);
/// differentiable, with the identity as its gradient.
pub(crate) fn fake_quant(x: &Tensor, operand: Int8Operand, precision: Precision) -> Result<Tensor> {
    match precision {
        Precision::F32 | Precision::Bf16Mixed => Ok(x.clone()),
        Precision::FakeInt8 => x.contiguous()?.apply_op1(FakeQuantRows(operand)),
    }
}

/// The op behind [`fake_quant`].
struct FakeQuantRows(Int8Operand);

impl CustomOp1 for FakeQuantRows {
    fn name(&self) -> &'static str {
        "fake-quant-int8-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("fake quantization: input must be contiguous")
        };
        let shape = layout.shape().clone();
        let in_dim = shape.dims().last().copied().unwrap_or(0);
        if in_dim == 0 {
            return Ok((storage.clone(), shape));
        }
        let out = match storage {
            CpuStorage::F32(v) => {
                let mut host = v[start..end].to_vec();
                fake_quantize_rows(&mut host, in_dim, self.0);
                CpuStorage::F32(host)
            }
            CpuStorage::F64(v) => {
                let mut host: Vec<f32> = v[start..end].iter().map(|&x| x as f32).collect();
                fake_quantize_rows(&mut host, in_dim, self.0);
                CpuStorage::F64(host.into_iter().map(f64::from).collect())
            }
            _ => candle_core::bail!("fake quantization: only f32 and f64 tensors"),
        };
        Ok((out, shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.clone()))
    }
}

/// A linear layer the int8 engine quantizes: `x · Wᵀ (+ b)`, `x` `[..., in]`, in
/// `precision`'s numbers (bf16 products under [`Precision::Bf16Mixed`]). Under
/// [`Precision::FakeInt8`] the product is the engine's own int8 kernel
/// ([`Int8Weight::matmul`]: the same rounding, exact integer sums and rescaling, so the
/// same bits), with straight-through gradients: `∂x = ∂y · q(W)`, `∂W = ∂yᵀ · q(x)`.
pub(crate) fn quantizable_linear(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    precision: Precision,
) -> Result<Tensor> {
    match precision {
        Precision::F32 => return crate::nn::layers::linear(x, weight, bias),
        Precision::Bf16Mixed => return crate::nn::layers::linear_bf16(x, weight, bias),
        Precision::FakeInt8 => {}
    }
    let dims = x.dims().to_vec();
    let Some((&in_dim, lead)) = dims.split_last() else {
        candle_core::bail!("linear: input must have at least one dim")
    };
    let rows: usize = lead.iter().product();
    let x2 = x.reshape((rows, in_dim))?.contiguous()?;
    let y = x2.apply_op2(&weight.contiguous()?, Int8LinearSte)?;
    let y = match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut shape = lead.to_vec();
    shape.push(weight.dim(0)?);
    y.reshape(shape)
}

/// The op behind [`quantizable_linear`]: `x [rows, in]`, `W [out, in]` -> `[rows, out]`.
struct Int8LinearSte;

impl CustomOp2 for Int8LinearSte {
    fn name(&self) -> &'static str {
        "int8-linear-ste"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        host_linear(
            "int8 linear",
            (xs, xl),
            (ws, wl),
            |w, x, (rows, out_dim, in_dim), y| {
                Int8Weight::quantize(w, out_dim, in_dim).matmul(x, rows, None, y)
            },
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let xq = fake_quant(x, Int8Operand::Input, Precision::FakeInt8)?;
        let wq = fake_quant(w, Int8Operand::Weight, Precision::FakeInt8)?;
        linear_grads(grad, &xq, &wq)
    }
}

/// The host side of a linear op `x [rows, in]`, `W [out, in]` -> `[rows, out]` over f32 or
/// f64 storages: checks the widths, hands the f32 values to `kernel(W, x, (rows, out, in),
/// y)` and returns `y` in `x`'s dtype. `name` names the op in errors.
pub(crate) fn host_linear(
    name: &str,
    (xs, xl): (&CpuStorage, &Layout),
    (ws, wl): (&CpuStorage, &Layout),
    kernel: impl FnOnce(&[f32], &[f32], (usize, usize, usize), &mut [f32]),
) -> Result<(CpuStorage, Shape)> {
    let (rows, in_dim) = xl.shape().dims2()?;
    let (out_dim, w_in) = wl.shape().dims2()?;
    if w_in != in_dim {
        candle_core::bail!("{name}: input width {in_dim}, weight [{out_dim}, {w_in}]")
    }
    let (x, f64_out) = host_f32(name, xs, xl)?;
    let (w, _) = host_f32(name, ws, wl)?;
    let mut out = vec![0f32; rows * out_dim];
    kernel(&w, &x, (rows, out_dim, in_dim), &mut out);
    let storage = match f64_out {
        true => CpuStorage::F64(out.into_iter().map(f64::from).collect()),
        false => CpuStorage::F32(out),
    };
    Ok((storage, Shape::from((rows, out_dim))))
}

/// A linear layer's gradients from the output gradient: `∂x = ∂y · W`, `∂W = ∂yᵀ · x` (with
/// the `x` and `W` given, e.g. their fake-quantized values for straight-through).
pub(crate) fn linear_grads(
    grad: &Tensor,
    x: &Tensor,
    w: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let gx = grad.matmul(&w.detach())?;
    let gw = grad.t()?.matmul(&x.detach())?;
    Ok((Some(gx), Some(gw)))
}

/// A contiguous f32/f64 storage as f32 host values, and whether it was f64.
fn host_f32(name: &str, s: &CpuStorage, l: &Layout) -> Result<(Vec<f32>, bool)> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("{name}: inputs must be contiguous")
    };
    match s {
        CpuStorage::F32(v) => Ok((v[start..end].to_vec(), false)),
        CpuStorage::F64(v) => Ok((v[start..end].iter().map(|&x| x as f32).collect(), true)),
        _ => candle_core::bail!("{name}: only f32 and f64 tensors"),
    }
}

/// [`fake_quant`] of a layer's input (for the fused LM head, which takes the hidden states
/// and the weight rather than a product).
pub(crate) fn quantized_input(x: &Tensor, precision: Precision) -> Result<Tensor> {
    fake_quant(x, Int8Operand::Input, precision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// The forward is the int8 kernel's bits; the gradients are the straight-through
    /// estimator's: `∂x = g · q(W)`, `∂W = gᵀ · q(x)`; under `F32` it is the plain linear.
    #[test]
    fn the_int8_linear_runs_the_engine_kernel_with_straight_through_gradients() {
        let dev = Device::Cpu;
        let (rows, k, n) = (5, 40, 12);
        let x = Var::from_vec(values(rows * k, 1), (rows, k), &dev).unwrap();
        let w = Var::from_vec(values(n * k, 7), (n, k), &dev).unwrap();
        let g = Tensor::from_vec(values(rows * n, 3), (rows, n), &dev).unwrap();
        let y = quantizable_linear(&x, &w, None, Precision::FakeInt8).unwrap();
        let q = Int8Weight::quantize(&w.flatten_all().unwrap().to_vec1().unwrap(), n, k);
        let mut want = vec![0f32; rows * n];
        q.matmul(
            &x.flatten_all().unwrap().to_vec1().unwrap(),
            rows,
            None,
            &mut want,
        );
        assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
        let grads = (y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let xq = fake_quant(&x, Int8Operand::Input, Precision::FakeInt8).unwrap();
        let wq = fake_quant(&w, Int8Operand::Weight, Precision::FakeInt8).unwrap();
        let close = |a: &Tensor, b: &Tensor| {
            let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            d.to_scalar::<f32>().unwrap()
        };
        let gx = grads.get(&x).unwrap();
        assert!(close(gx, &g.matmul(&wq).unwrap()) < 1e-6);
        let gw = grads.get(&w).unwrap();
        assert!(close(gw, &g.t().unwrap().matmul(&xq).unwrap()) < 1e-6);
        let plain = quantizable_linear(&x, &w, None, Precision::F32).unwrap();
        let direct = x.matmul(&w.t().unwrap()).unwrap();
        assert_eq!(close(&plain, &direct), 0.0);
    }
}
