//! The in-place CPU kernels of AdamW and of the global gradient norm: one pass per moment
//! and one per parameter, in place on the tensors' own storage (candle `InplaceOp`s), with
//! no temporary tensors. The arithmetic is the composed path's, operation for operation in
//! f32, so both give the same bits. Used by [`crate::optim::AdamW`] for contiguous f32
//! tensors on the CPU; anything else takes the composed path.

use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

/// True when `t` can use the fused kernels: f32, on the CPU, contiguous.
pub(crate) fn fusable(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous()
}

/// `Σ g²` in f64. Fixed chunks of [`CHUNK`] elements are summed in parallel, each into eight
/// running sums over the elements' positions mod 8; the chunk sums are then added in chunk
/// order. The order depends only on the length, never on the thread count, so the norm is
/// the same on every machine; it differs from a sequential sum by rounding in the last bits
/// of an f64 (far below the f32 clip scale it feeds). A sequential fold over a 50M-element
/// model is one long chain of dependent f64 adds: 75 ms a step on one core, where this
/// takes a few. `g` must be [`fusable`].
pub(crate) fn sum_of_squares(g: &Tensor) -> Result<f64> {
    let (storage, layout) = g.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("sum_of_squares: gradient is not on the CPU");
    };
    let data = f32_slice(cpu, layout, "gradient")?;
    let chunks: Vec<f64> = data.par_chunks(CHUNK).map(chunk_sum_of_squares).collect();
    Ok(chunks.iter().sum())
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn chunk_sum_of_squares(x: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut rows = x.chunks_exact(8);
    for row in &mut rows {
        for (acc, &v) in lanes.iter_mut().zip(row) {
            let v = v as f64;
            *acc += v * v;
        }
    }
    for (acc, &v) in lanes.iter_mut().zip(rows.remainder()) {
        let v = v as f64;
        *acc += v * v;
    }
    lanes.iter().sum()
}

fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("fused AdamW: {what} must be f32");
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("fused AdamW: {what} must be contiguous"),
    }
}

fn f32_slice_mut<'a>(s: &'a mut CpuStorage, l: &Layout, what: &str) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("fused AdamW: {what} must be f32");
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut data[a..b]),
        None => candle_core::bail!("fused AdamW: {what} must be contiguous"),
    }
}

/// `m ← β·m + (1−β)·ĝ` (first moment) or `v ← β·v + (1−β)·ĝ²` (second), where
/// `ĝ = g·scale` when a clip scale is set.
pub(crate) struct MomentUpdate {
    pub beta: f64,
    pub squared: bool,
    pub grad_scale: Option<f64>,
}

impl InplaceOp2 for MomentUpdate {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        g: &CpuStorage,
        g_l: &Layout,
    ) -> Result<()> {
        let m = f32_slice_mut(dst, dst_l, "moment")?;
        let g = f32_slice(g, g_l, "gradient")?;
        if m.len() != g.len() {
            candle_core::bail!("fused AdamW: moment and gradient sizes differ");
        }
        let (keep, take) = (self.beta as f32, (1.0 - self.beta) as f32);
        let scale = self.grad_scale.map(|s| s as f32);
        let squared = self.squared;
        m.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .for_each(|(m, g)| moment_chunk(m, g, (keep, take), scale, squared));
        Ok(())
    }
}

/// `p ← p·(1 − ηλ)` (when λ ≠ 0), then `p ← p − (m / (sqrt(v)·c2 + ε))·step`, where
/// `c2 = 1/sqrt(1−β2^t)` and `step = η/(1−β1^t)`.
pub(crate) struct ParamUpdate {
    pub decay: Option<f64>,
    pub inv_bias_correction2_sqrt: f64,
    pub eps: f64,
    pub step_size: f64,
}

impl InplaceOp3 for ParamUpdate {
    fn name(&self) -> &'static str {
        "adamw-param"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        m: &CpuStorage,
        m_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<()> {
        let p = f32_slice_mut(dst, dst_l, "parameter")?;
        let m = f32_slice(m, m_l, "first moment")?;
        let v = f32_slice(v, v_l, "second moment")?;
        if p.len() != m.len() || p.len() != v.len() {
            candle_core::bail!("fused AdamW: parameter and moment sizes differ");
        }
        let decay = self.decay.map(|d| d as f32);
        let (c2, eps) = (self.inv_bias_correction2_sqrt as f32, self.eps as f32);
        let step = self.step_size as f32;
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .for_each(|(p, (m, v))| param_chunk(p, m, v, decay, (c2, eps), step));
        Ok(())
    }
}

/// One chunk of [`MomentUpdate`], cloned for AVX-512 and AVX2 (the crate is built for
/// baseline x86-64: 4-lane SSE); every clone does the same f32 operations in the same order
/// (Rust never fuses a multiply and an add), so all give the same bits.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn moment_chunk(
    m: &mut [f32],
    g: &[f32],
    (keep, take): (f32, f32),
    scale: Option<f32>,
    squared: bool,
) {
    for (m, &g) in m.iter_mut().zip(g) {
        let g = match scale {
            Some(s) => g * s,
            None => g,
        };
        let x = if squared { g * g } else { g };
        *m = *m * keep + x * take;
    }
}

/// One chunk of [`ParamUpdate`], cloned as [`moment_chunk`] is.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn param_chunk(
    p: &mut [f32],
    m: &[f32],
    v: &[f32],
    decay: Option<f32>,
    (c2, eps): (f32, f32),
    step: f32,
) {
    for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
        let denom = v.sqrt() * c2 + eps;
        let base = match decay {
            Some(d) => *p * d,
            None => *p,
        };
        *p = base - (m / denom) * step;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The chunked parallel sum matches a sequential f64 sum to f64 rounding, and gives the
    /// same bits on one thread as on several.
    #[test]
    fn sum_of_squares_is_the_sum_and_independent_of_threads() -> Result<()> {
        let n = 3 * CHUNK + 1234;
        let data: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0)
            .collect();
        let g = Tensor::from_vec(data.clone(), n, &Device::Cpu)?;
        let sequential = data.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        let pool = |threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        let one = pool(1)
            .map_err(candle_core::Error::wrap)?
            .install(|| sum_of_squares(&g))?;
        let four = pool(4)
            .map_err(candle_core::Error::wrap)?
            .install(|| sum_of_squares(&g))?;
        assert_eq!(one.to_bits(), four.to_bits());
        assert!(
            (one - sequential).abs() <= 1e-12 * sequential,
            "{one} vs {sequential}"
        );
        Ok(())
    }
}
