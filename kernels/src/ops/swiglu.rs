//! Fused SwiGLU `silu(gate) * up`, the gate of Llama/Qwen2/Mistral feed-forward blocks, as a
//! differentiable candle op on the CPU. Composed, autograd keeps `silu(gate)` alive for the
//! backward pass next to `gate`, `up` and the product; fused, only the inputs are kept, so
//! training holds one `[B, T, intermediate]` tensor less per layer. Other devices get the
//! composed ops. The projections themselves are not here.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::{contiguous_slice, Real};
use super::validate;

const OP: &str = "swiglu";
/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// `silu(gate) * up` elementwise, `silu(x) = x / (1 + e^-x)`.
///
/// `gate` and `up`: the same shape and dtype (f32, or f64 on CPU). Differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    swiglu_op(gate, up, SwiGlu::PLAIN)
}

/// [`swiglu`] whose CPU forward computes `g / (1 + e^-g) · u`, the arithmetic of the
/// engine's `rows::silu_mul_rows`, so a trainer in the engine's numbers gets the engine's
/// activations bit for bit ([`swiglu`] computes `g · (1 / (1 + e^-g)) · u`, within an ulp).
/// Same backward.
pub fn swiglu_engine_order(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    swiglu_op(gate, up, SwiGlu { engine_order: true })
}

fn swiglu_op(gate: &Tensor, up: &Tensor, op: SwiGlu) -> Result<Tensor> {
    validate::float_dtype(OP, "gate", gate)?;
    validate::same_dtype(OP, "gate", gate, "up", up)?;
    validate::same_device(OP, gate, "up", up)?;
    if gate.dims() != up.dims() {
        candle_core::bail!(
            "{OP}: `up` must have the shape of `gate` {:?}, got {:?}",
            gate.dims(),
            up.dims()
        );
    }
    if !gate.device().is_cpu() {
        return gate.silu()? * up;
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, op)
}

/// Forward op: `(gate, up) -> silu(gate) * up`, in the engine's order when `engine_order`.
pub(super) struct SwiGlu {
    engine_order: bool,
}

impl SwiGlu {
    /// [`swiglu`]'s forward (not the engine's order).
    pub(super) const PLAIN: SwiGlu = SwiGlu {
        engine_order: false,
    };
}

/// Backward op: `(gate, up, grad) -> [2, ...]`: the gradients of gate and up, stacked.
pub(super) struct SwiGluGrad;

/// [`swiglu`]'s forward on f32 storages (`gate`, `up`), as a vector.
pub(super) fn silu_times_up(
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Result<Vec<f32>> {
    let g = contiguous_slice::<f32>(s1, l1, OP, "gate")?;
    let u = contiguous_slice::<f32>(s2, l2, OP, "up")?;
    Ok(fwd(g, u, false))
}

#[inline(always)]
fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// `silu(g) · u` for one element, [`swiglu`]'s forward arithmetic (`g · σ(g) · u`).
#[inline(always)]
pub(super) fn silu_times<T: Real>(g: T, u: T) -> T {
    g * sigmoid(g) * u
}

/// `(∂g, ∂u)` of `silu(g) · u` for one element from its upstream gradient `dy`, [`swiglu`]'s
/// backward arithmetic.
#[inline(always)]
pub(super) fn silu_times_grads<T: Real>(g: T, u: T, dy: T) -> (T, T) {
    let s = sigmoid(g);
    (dy * u * s * (T::ONE + g * (T::ONE - s)), dy * (g * s))
}

fn fwd<T: Real>(g: &[T], u: &[T], engine_order: bool) -> Vec<T> {
    let mut out = vec![T::ZERO; g.len()];
    out.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|(o, (g, u))| fwd_task(o, g, u, engine_order));
    out
}

/// One task's elements of [`fwd`]. The per-task bodies are functions of their own,
/// multiversioned, not the closures rayon calls: a closure is compiled for the baseline CPU
/// (SSE2) whatever the function defining it is compiled for.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn fwd_task<T: Real>(out: &mut [T], g: &[T], u: &[T], engine_order: bool) {
    let pairs = out.iter_mut().zip(g).zip(u);
    match engine_order {
        true => pairs.for_each(|((o, &g), &u)| *o = g / (T::ONE + (-g).exp()) * u),
        false => pairs.for_each(|((o, &g), &u)| *o = silu_times(g, u)),
    }
}

fn bwd<T: Real>(g: &[T], u: &[T], dy: &[T]) -> Vec<T> {
    let n = g.len();
    let mut out = vec![T::ZERO; 2 * n];
    let (dg, du) = out.split_at_mut(n);
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .zip(dy.par_chunks(CHUNK))
        .for_each(|(((dg, du), (g, u)), dy)| bwd_task((dg, du), (g, u), dy));
    out
}

/// One task's elements of [`bwd`] (multiversioned as [`fwd_task`] is).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn bwd_task<T: Real>((dg, du): (&mut [T], &mut [T]), (g, u): (&[T], &[T]), dy: &[T]) {
    for i in 0..g.len() {
        (dg[i], du[i]) = silu_times_grads(g[i], u[i], dy[i]);
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(fwd(
                contiguous_slice::<f32>(s1, l1, OP, "gate")?,
                contiguous_slice::<f32>(s2, l2, OP, "up")?,
                self.engine_order,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(fwd(
                contiguous_slice::<f64>(s1, l1, OP, "gate")?,
                contiguous_slice::<f64>(s2, l2, OP, "up")?,
                self.engine_order,
            )),
            (a, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluGrad)?;
        let shape = gate.shape();
        Ok((
            Some(both.get(0)?.reshape(shape)?),
            Some(both.get(1)?.reshape(shape)?),
        ))
    }
}

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "swiglu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const BWD: &str = "swiglu backward";
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(bwd(
                contiguous_slice::<f32>(s1, l1, BWD, "gate")?,
                contiguous_slice::<f32>(s2, l2, BWD, "up")?,
                contiguous_slice::<f32>(s3, l3, BWD, "grad")?,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(bwd(
                contiguous_slice::<f64>(s1, l1, BWD, "gate")?,
                contiguous_slice::<f64>(s2, l2, BWD, "up")?,
                contiguous_slice::<f64>(s3, l3, BWD, "grad")?,
            )),
            (a, _, _) => validate::unsupported_cpu_dtype(BWD, a)?,
        };
        Ok((out, Shape::from((2, l1.shape().elem_count()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close, finite_difference_check, random_tensor};
    use candle_core::{DType, Var};

    /// The engine-order forward is the engine's `rows::silu_mul_rows`, bit for bit, and the
    /// plain one is within an ulp of it.
    #[test]
    fn the_engine_order_forward_is_the_engines_bits() -> Result<()> {
        let (rows, inter) = (5, 40);
        let g = (random_tensor(&[rows, inter], 1.0, 4)? * 6.0)?;
        let u = random_tensor(&[rows, inter], 2.0, 5)?;
        let got: Vec<f32> = swiglu_engine_order(&g, &u)?.flatten_all()?.to_vec1()?;
        let (gh, uh) = (g.to_vec2::<f32>()?, u.to_vec2::<f32>()?);
        let fused: Vec<f32> = gh
            .iter()
            .zip(&uh)
            .flat_map(|(a, b)| [a.clone(), b.clone()].concat())
            .collect();
        let mut want = vec![0f32; rows * inter];
        crate::ops::rows::silu_mul_rows(&fused, inter, &mut want);
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let plain = swiglu(&g, &u)?;
        let engine = Tensor::from_vec(want, (rows, inter), g.device())?;
        assert_close(&plain, &engine, 1e-5, "plain vs engine order")?;
        Ok(())
    }

    #[test]
    fn forward_and_backward_match_composed() -> Result<()> {
        let g = Var::from_tensor(&(random_tensor(&[3, 37, 70], 1.0, 1)? * 6.0)?)?;
        let u = Var::from_tensor(&random_tensor(&[3, 37, 70], 2.0, 2)?)?;
        let w = random_tensor(&[3, 37, 70], 1.0, 3)?;
        let fused = swiglu(g.as_tensor(), u.as_tensor())?;
        let composed = (g.as_tensor().silu()? * u.as_tensor())?;
        assert_close(&fused, &composed, 1e-6, "swiglu forward")?;
        let gf = fused.mul(&w)?.sum_all()?.backward()?;
        let gc = composed.mul(&w)?.sum_all()?.backward()?;
        for (v, what) in [(&g, "d gate"), (&u, "d up")] {
            let a = gf.get(v.as_tensor()).expect("fused grad");
            let b = gc.get(v.as_tensor()).expect("composed grad");
            assert_close(a, b, 1e-5, what)?;
        }
        Ok(())
    }

    #[test]
    fn backward_matches_finite_differences() -> Result<()> {
        let g = (random_tensor(&[2, 5], 3.0, 4)?).to_dtype(DType::F64)?;
        let u = random_tensor(&[2, 5], 1.0, 5)?.to_dtype(DType::F64)?;
        let w = random_tensor(&[2, 5], 1.0, 6)?.to_dtype(DType::F64)?;
        finite_difference_check(&g, |g| swiglu(g, &u)?.mul(&w)?.sum_all(), 1e-6)?;
        finite_difference_check(&u, |u| swiglu(&g, u)?.mul(&w)?.sum_all(), 1e-6)
    }

    #[test]
    fn mismatched_shapes_are_named() -> Result<()> {
        let g = random_tensor(&[2, 5], 1.0, 1)?;
        let u = random_tensor(&[2, 4], 1.0, 2)?;
        let err = swiglu(&g, &u).unwrap_err().to_string();
        assert!(err.contains("`up` must have the shape of `gate`"), "{err}");
        Ok(())
    }
}
