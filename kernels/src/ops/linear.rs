//! The linear layer of training as one differentiable candle op, `y = x · Wᵀ`, in f32 or in
//! bf16 mixed precision, with a backward that runs the two products it needs straight into
//! their layouts: `∂x = ∂y · W` `[.., in]` and `∂W = ∂yᵀ · x` `[out, in]`.
//!
//! Why an op and not `x.reshape().matmul(&w.t())`: candle's autograd gives every node of that
//! chain (two reshapes, a transpose, the matmul) a zero-filled gradient buffer plus an add,
//! and the transpose's add walks the weight gradient with a stride. One node has two
//! gradients and no strided pass.
//!
//! bf16 mixed precision is PyTorch's `torch.autocast(dtype=torch.bfloat16)` contract for
//! linear layers (operands rounded to bf16, products summed in f32, the weight gradient
//! landing in the f32 master weight's), except that the output stays f32 rather than being
//! rounded to bf16 (one rounding less, twice the bytes of activations; the SwiGLU block's
//! gate and up, the widest, do round theirs: `gate_up_bf16.rs`). Everything around the
//! layer stays f32. On the CPU the GEMMs are `matmul/`'s; on other devices (and for f64)
//! the composed candle ops run instead (cuBLAS on CUDA, casting to bf16 and back).

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::cpu_math::contiguous_slice;
use super::validate;
use crate::matmul::{gemm_marked, widen_bf16, Bf16Path, MatView, Numbers, RoundedOperand};

const OP: &str = "linear";

/// `x · Wᵀ` in f32: `x` `[.., in]`, `w` `[out, in]` -> `[.., out]`. Differentiable in both.
/// f64 tensors and non-CPU devices run the composed candle ops.
pub fn linear_f32(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 || !x.device().is_cpu() {
        return composed(x, w, x.dtype());
    }
    linear_op(Numbers::F32, x, w)
}

/// `x · Wᵀ` in bf16 with f32 sums: `x` `[.., in]` f32, `w` `[out, in]` f32 (or bf16: a
/// frozen weight kept in bf16) -> `[.., out]` f32. Differentiable in both (a bf16 `w` only
/// when frozen), with bf16 products in the backward too. The CPU kernel is the
/// fastest this CPU has ([`Bf16Path::detect`]).
pub fn linear_bf16(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    linear_bf16_on(bf16_path(), x, w)
}

/// The bf16 GEMM path of this process ([`Bf16Path::detect`], decided once).
pub(crate) fn bf16_path() -> Bf16Path {
    static PATH: OnceLock<Bf16Path> = OnceLock::new();
    *PATH.get_or_init(Bf16Path::detect)
}

/// [`linear_bf16`] on a chosen CPU path (one of [`Bf16Path::available`]), for tests and
/// benchmarks that compare the paths.
pub fn linear_bf16_on(path: Bf16Path, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 || !matches!(w.dtype(), DType::F32 | DType::BF16) {
        candle_core::bail!(
            "{OP}: `x` must be f32 and `w` f32 (the master copy) or bf16 (frozen), got {:?} and {:?}",
            x.dtype(),
            w.dtype()
        );
    }
    if !x.device().is_cpu() {
        return composed(x, w, DType::BF16);
    }
    linear_op(Numbers::Bf16(path), x, w)
}

fn linear_op(numbers: Numbers, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    validate::same_device(OP, x, "w", w)?;
    let (_, in_dim) = lead_and_width(x)?;
    let (_, w_in) = w.dims2()?;
    if in_dim != w_in {
        candle_core::bail!("{OP}: input width {in_dim} but weight {:?}", w.dims());
    }
    let op = Product::new(Kind::Forward, numbers);
    x.contiguous()?.apply_op2(&w.contiguous()?, op)
}

/// `x · Wᵀ` by candle's composed ops (other devices, f64): `x` flattened to rows and both
/// operands cast to `compute` (a no-op when it is already their dtype), the product cast
/// back to `x`'s dtype.
fn composed(x: &Tensor, w: &Tensor, compute: DType) -> Result<Tensor> {
    validate::same_device(OP, x, "w", w)?;
    let (lead, in_dim) = lead_and_width(x)?;
    let rows = x
        .reshape((lead.iter().product::<usize>(), in_dim))?
        .to_dtype(compute)?;
    let y = rows
        .matmul(&w.to_dtype(compute)?.t()?)?
        .to_dtype(x.dtype())?;
    let mut shape = lead;
    shape.push(w.dim(0)?);
    y.reshape(shape)
}

/// The leading dims of `x` and its last (the input width).
fn lead_and_width(x: &Tensor) -> Result<(Vec<usize>, usize)> {
    match x.dims().split_last() {
        Some((&last, lead)) => Ok((lead.to_vec(), last)),
        None => candle_core::bail!("{OP}: the input must have at least one dim"),
    }
}

/// Which of a linear layer's three products an op computes (`r`: all leading dims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `(x [.., i], W [o, i]) -> x · Wᵀ [.., o]`.
    Forward,
    /// `(∂y [r, o], W [o, i]) -> ∂y · W [r, i]`.
    GradInput,
    /// `(∂y [r, o], x [r, i]) -> ∂yᵀ · x [o, i]`.
    GradWeight,
}

pub(super) struct Product {
    kind: Kind,
    numbers: Numbers,
    /// Which operands hold bf16 values already (besides bf16 tensors, which always do).
    bf16_exact: [bool; 2],
}

impl Product {
    /// The product `kind` in `numbers`.
    pub(super) fn new(kind: Kind, numbers: Numbers) -> Product {
        Product {
            kind,
            numbers,
            bf16_exact: [false; 2],
        }
    }

    /// The product `kind` in `numbers` where `bf16_exact[i]` says operand `i`, an f32
    /// tensor, holds bf16 values already (a gradient rounded once for both of a layer's
    /// backward products, an activation rounded as it was computed).
    pub(super) fn marked(kind: Kind, numbers: Numbers, bf16_exact: [bool; 2]) -> Product {
        Product {
            bf16_exact,
            ..Product::new(kind, numbers)
        }
    }

    /// The product of `(s1, l1)` and `(s2, l2)` (see [`Kind`]), f32, with its shape.
    pub(super) fn compute(
        &self,
        (s1, l1): (&CpuStorage, &Layout),
        (s2, l2): (&CpuStorage, &Layout),
    ) -> Result<(Vec<f32>, Shape)> {
        let (mut wide1, mut wide2) = (Vec::new(), Vec::new());
        let (m1, m2) = (
            matrix(s1, l1, "lhs", &mut wide1)?,
            matrix(s2, l2, "rhs", &mut wide2)?,
        );
        let (a, b) = match self.kind {
            Kind::Forward => (m1, m2.t()),
            Kind::GradInput => (m1, m2),
            Kind::GradWeight => (m1.t(), m2),
        };
        if a.cols != b.rows {
            candle_core::bail!(
                "{OP}: {:?} of {:?} and {:?}",
                self.kind,
                l1.dims(),
                l2.dims()
            );
        }
        let mut out = crate::host_memory::zeros_touched(a.rows * b.cols, 0f32);
        let widened = |s: &CpuStorage| matches!(s, CpuStorage::BF16(_));
        let exact = [
            self.bf16_exact[0] || widened(s1),
            self.bf16_exact[1] || widened(s2),
        ];
        gemm_marked(self.numbers, a, b, &mut out, exact);
        let shape = match self.kind {
            Kind::Forward => {
                let mut dims = l1.dims().to_vec();
                if let Some(last) = dims.last_mut() {
                    *last = b.cols;
                }
                Shape::from(dims)
            }
            _ => Shape::from((a.rows, b.cols)),
        };
        Ok((out, shape))
    }
}

/// A contiguous f32 tensor as a row-major matrix over its last dim; a bf16 one (a frozen
/// weight, or `gate_up_bf16`'s activations and their gradients) widened into `widened`
/// first (exactly: every bf16 is an f32).
pub(super) fn matrix<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    arg: &str,
    widened: &'a mut Vec<f32>,
) -> Result<MatView<'a>> {
    let data = match s {
        CpuStorage::BF16(_) => {
            let half = contiguous_slice::<half::bf16>(s, l, OP, arg)?;
            *widened = crate::host_memory::zeros_touched(half.len(), 0f32);
            widened
                .par_iter_mut()
                .zip(half.par_iter())
                .for_each(|(w, h)| *w = widen_bf16(*h));
            widened.as_slice()
        }
        _ => contiguous_slice::<f32>(s, l, OP, arg)?,
    };
    let cols = *l.dims().last().unwrap_or(&1);
    let rows = match cols {
        0 => l.dims()[..l.dims().len().saturating_sub(1)]
            .iter()
            .product(),
        c => data.len() / c,
    };
    Ok(MatView::row_major(data, rows, cols))
}

impl CustomOp2 for Product {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (out, shape) = self.compute((s1, l1), (s2, l2))?;
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if self.kind != Kind::Forward {
            candle_core::bail!("{OP}: no second derivative");
        }
        gradients(self.numbers, x, w, &grad.contiguous()?)
    }
}

/// The gradients `(∂x, ∂W)` of `y = x · Wᵀ` in `numbers` from `dy` (contiguous, `[.., out]`).
/// A frozen operand (a LoRA model's base weight, the frozen embedding's output) is not
/// tracked: its product is skipped, not computed and dropped. On the portable bf16 path
/// `dy` is rounded once for both products.
pub(super) fn gradients(
    numbers: Numbers,
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let both = x.track_op() && w.track_op();
    let rounded = match both {
        true => rounded_once(numbers, dy)?,
        false => None,
    };
    let dy = rounded.as_ref().unwrap_or(dy);
    let product = |kind| Product::marked(kind, numbers, [rounded.is_some(), false]);
    let gx = match x.track_op() {
        true => Some(
            dy.apply_op2_no_bwd(w, &product(Kind::GradInput))?
                .reshape(x.dims())?,
        ),
        false => None,
    };
    let gw = match (w.track_op(), w.dtype()) {
        (true, DType::BF16) => {
            candle_core::bail!("{OP}: a bf16 weight is a frozen one; it takes no gradient")
        }
        (true, _) => Some(dy.apply_op2_no_bwd(x, &product(Kind::GradWeight))?),
        (false, _) => None,
    };
    Ok((gx, gw))
}

/// `t` (contiguous f32 on the CPU) rounded to bf16 values, as a new f32 tensor, where
/// `numbers` is the portable bf16 path (which would round it in every product); `None` on
/// the other paths and for other tensors.
pub(super) fn rounded_once(numbers: Numbers, t: &Tensor) -> Result<Option<Tensor>> {
    if numbers != Numbers::Bf16(Bf16Path::RoundedF32) || t.dtype() != DType::F32 {
        return Ok(None);
    }
    let copy = {
        let (storage, layout) = t.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            return Ok(None);
        };
        let data = contiguous_slice::<f32>(cpu, layout, OP, "grad")?;
        // Its rows as the runs rounded on rayon's threads (one run would be one thread).
        let cols = t.dims().last().copied().unwrap_or(1);
        let rows = data.len().checked_div(cols).unwrap_or(0);
        RoundedOperand::new(numbers, MatView::row_major(data, rows, cols)).into_copy()
    };
    copy.map(|c| Tensor::from_vec(c, t.shape(), t.device()))
        .transpose()
}

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;
