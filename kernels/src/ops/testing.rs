//! Test helpers for the ops: seeded random tensors, closeness assertions and a central
//! finite-difference gradient check. Compiled for tests only; no op logic lives here.

use candle_core::{DType, Device, Result, Tensor, Var};

/// A small deterministic generator (splitmix64) so tests need no `rand` dependency.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// f32 tensor of `dims` with entries uniform in `[-scale, scale)`.
pub(crate) fn random_tensor(dims: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let mut rng = SplitMix::new(seed);
    let n: usize = dims.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.next_signed() * scale).collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
}

/// u32 tensor of `dims` with ids in `0..vocab`.
pub(crate) fn random_ids(dims: &[usize], vocab: usize, seed: u64) -> Result<Tensor> {
    let mut rng = SplitMix::new(seed);
    let n: usize = dims.iter().product();
    let data: Vec<u32> = (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
}

/// The bits of every element of `t`, widened to f32 first (exact for bf16 and f32).
pub(crate) fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("a tensor of f32-widenable values");
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts `|a - b| <= tol * (1 + |b|)` elementwise (shapes must match).
pub(crate) fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) -> Result<()> {
    assert_eq!(a.dims(), b.dims(), "{what}: shape mismatch");
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let err = (x - y).abs();
        assert!(
            err <= tol * (1.0 + y.abs()),
            "{what}: element {i}: {x} vs {y} (|diff| {err:e} > tol {tol:e})"
        );
    }
    Ok(())
}

/// Checks the autograd gradient of the scalar `loss(x)` against central finite differences,
/// for every element of `x` (keep `x` small). `x` should be f64 for a tight `tol`.
pub(crate) fn finite_difference_check(
    x: &Tensor,
    loss: impl Fn(&Tensor) -> Result<Tensor>,
    tol: f64,
) -> Result<()> {
    let var = Var::from_tensor(x)?;
    let grads = loss(var.as_tensor())?.backward()?;
    let analytic = grads
        .get(var.as_tensor())
        .expect("loss does not depend on x")
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let base = x.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let h = if x.dtype() == DType::F64 { 1e-6 } else { 1e-2 };
    for i in 0..base.len() {
        let eval = |delta: f64| -> Result<f64> {
            let mut data = base.clone();
            data[i] += delta;
            let t = Tensor::from_vec(data, x.dims(), x.device())?.to_dtype(x.dtype())?;
            loss(&t)?.to_dtype(DType::F64)?.to_scalar::<f64>()
        };
        let numeric = (eval(h)? - eval(-h)?) / (2.0 * h);
        let err = (numeric - analytic[i]).abs();
        assert!(
            err <= tol * (1.0 + numeric.abs()),
            "element {i}: autograd {} vs finite difference {numeric} (|diff| {err:e})",
            analytic[i]
        );
    }
    Ok(())
}
