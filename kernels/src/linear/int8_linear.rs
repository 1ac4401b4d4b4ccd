//! W8A8 integer linear layer for inference: `y = x · Wᵀ (+ b)` with the weight quantized once
//! per output channel to int8 and each input row quantized per step to int8, multiplied in
//! exact 32-bit integer arithmetic and rescaled to f32 once per output element.
//!
//! The weight is packed for AVX-512 VNNI (`vpdpbusd`: 64 u8·i8 products per instruction) in
//! panels of 16 output channels × 4 inputs. Where VNNI is missing, an AVX2 kernel
//! (`vpmaddubsw`/`vpmaddwd` on centred activations) or a portable one runs the same integer
//! math, so results are bit-identical on every CPU. Inference only: no
//! gradients, no tensors.

use rayon::prelude::*;

pub(crate) use super::int8_panel::{ACT_OFFSET, GROUP, PANEL};

/// An int8 weight `[out, in]`, packed `[out/16][in/4][16][4]` (zero-padded), with one f32
/// scale per output channel (`w ≈ scale · q`, `|q| ≤ 127`).
#[derive(Clone, Debug)]
pub struct Int8Weight {
    out_dim: usize,
    in_dim: usize,
    /// `in_dim` rounded up to a multiple of [`GROUP`].
    in_pad: usize,
    packed: Vec<i8>,
    scales: Vec<f32>,
    /// `ACT_OFFSET · Σ_k q[n, k]` per output channel.
    offset_terms: Vec<i32>,
}

/// Input rows per cache block.
const ROW_BLOCK: usize = 64;

/// Activations of one call, quantized per row: `x ≈ scale · (u − 128)`.
pub(crate) struct QuantRows {
    pub bytes: Vec<u8>,
    pub scales: Vec<f32>,
}

impl Int8Weight {
    /// Quantizes a row-major f32 weight `[out_dim, in_dim]` per output channel (symmetric,
    /// round to nearest).
    ///
    /// # Panics
    /// When `w.len() != out_dim * in_dim`.
    pub fn quantize(w: &[f32], out_dim: usize, in_dim: usize) -> Int8Weight {
        assert_eq!(w.len(), out_dim * in_dim, "weight length must be out * in");
        let in_pad = in_dim.div_ceil(GROUP) * GROUP;
        let panels = out_dim.div_ceil(PANEL);
        let mut packed = vec![0i8; panels * PANEL * in_pad];
        let mut scales = vec![0f32; out_dim];
        let mut offset_terms = vec![0i32; out_dim];
        for n in 0..out_dim {
            let row = &w[n * in_dim..(n + 1) * in_dim];
            let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
            let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
            scales[n] = scale;
            let (p, lane) = (n / PANEL, n % PANEL);
            let mut sum = 0i32;
            for (k, &x) in row.iter().enumerate() {
                let q = round_small((x / scale).clamp(-127.0, 127.0)) as i8;
                sum += q as i32;
                let (g, j) = (k / GROUP, k % GROUP);
                packed[((p * (in_pad / GROUP) + g) * PANEL + lane) * GROUP + j] = q;
            }
            offset_terms[n] = ACT_OFFSET * sum;
        }
        Int8Weight {
            out_dim,
            in_dim,
            in_pad,
            packed,
            scales,
            offset_terms,
        }
    }

    /// Output size.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Input size.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Bytes held (packed weight, scales and offset terms).
    pub fn bytes(&self) -> usize {
        self.packed.len() + 4 * (self.scales.len() + self.offset_terms.len())
    }

    /// The f32 weight this int8 weight stands for, row-major `[out, in]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out_dim * self.in_dim];
        for n in 0..self.out_dim {
            for k in 0..self.in_dim {
                w[n * self.in_dim + k] = self.scales[n] * self.packed[self.index(n, k)] as f32;
            }
        }
        w
    }

    #[cfg(test)]
    pub(crate) fn packed_for_tests(&self) -> &[i8] {
        &self.packed
    }

    fn index(&self, n: usize, k: usize) -> usize {
        let (p, lane, g, j) = (n / PANEL, n % PANEL, k / GROUP, k % GROUP);
        ((p * (self.in_pad / GROUP) + g) * PANEL + lane) * GROUP + j
    }

    /// `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])` for row-major `x: [rows, in]`, into
    /// `out: [rows, out]`. Uses AVX-512 VNNI when the CPU has it, else the portable kernel;
    /// both give the same bits.
    ///
    /// # Panics
    /// When the slice lengths do not match `rows` and the weight's shape.
    pub fn matmul(&self, x: &[f32], rows: usize, bias: Option<&[f32]>, out: &mut [f32]) {
        assert_eq!(x.len(), rows * self.in_dim, "input must be [rows, in]");
        assert_eq!(out.len(), rows * self.out_dim, "output must be [rows, out]");
        if let Some(b) = bias {
            assert_eq!(b.len(), self.out_dim, "bias must be [out]");
        }
        if rows == 0 {
            return;
        }
        let xq = quantize_rows(x, rows, self.in_dim, self.in_pad);
        let panel_len = (self.in_pad / GROUP) * PANEL * GROUP;
        let kernel = Int8Kernel::detect();
        let out_ptr = SendPtr(out.as_mut_ptr());
        for m0 in (0..rows).step_by(ROW_BLOCK) {
            let mr = ROW_BLOCK.min(rows - m0);
            let xb = &xq.bytes[m0 * self.in_pad..(m0 + mr) * self.in_pad];
            self.packed
                .par_chunks(panel_len)
                .enumerate()
                .for_each(|(p, w)| {
                    let mut tile = [0i32; ROW_BLOCK * PANEL];
                    let centred = match kernel {
                        Int8Kernel::Vnni => {
                            super::int8_vnni::panel(xb, mr, self.in_pad, w, &mut tile);
                            false
                        }
                        Int8Kernel::Avx2 => {
                            super::int8_avx2::panel_centred(xb, mr, self.in_pad, w, &mut tile);
                            true
                        }
                        Int8Kernel::Portable => {
                            panel_portable(xb, mr, self.in_pad, w, &mut tile);
                            false
                        }
                    };
                    let rows = TileRows { m0, mr, centred };
                    self.rescale_tile(&tile, p, rows, &xq.scales, bias, &out_ptr);
                });
        }
    }

    /// Writes one panel's columns of rows `m0..m0 + mr`: `(acc − offset) · s_x · s_w + b`
    /// (a centred tile already holds `acc − offset`).
    fn rescale_tile(
        &self,
        tile: &[i32],
        p: usize,
        TileRows { m0, mr, centred }: TileRows,
        x_scales: &[f32],
        bias: Option<&[f32]>,
        out: &SendPtr,
    ) {
        let cols = PANEL.min(self.out_dim - p * PANEL);
        let scales = &self.scales[p * PANEL..p * PANEL + cols];
        let offsets = &self.offset_terms[p * PANEL..p * PANEL + cols];
        for r in 0..mr {
            // SAFETY: each panel task writes only its own columns of rows m0..m0+mr;
            // panels are disjoint and `out` outlives the parallel loop.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.0.add((m0 + r) * self.out_dim + p * PANEL), cols)
            };
            let sx = x_scales[m0 + r];
            for c in 0..cols {
                let offset = if centred { 0 } else { offsets[c] };
                let a = (tile[r * PANEL + c] - offset) as f32;
                dst[c] = a * (sx * scales[c]) + bias.map_or(0.0, |b| b[p * PANEL + c]);
            }
        }
    }
}

/// Which integer micro-kernel runs on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Int8Kernel {
    Vnni,
    Avx2,
    Portable,
}

impl Int8Kernel {
    fn detect() -> Int8Kernel {
        if super::int8_vnni::available() {
            Int8Kernel::Vnni
        } else if super::int8_avx2::available() {
            Int8Kernel::Avx2
        } else {
            Int8Kernel::Portable
        }
    }
}

/// The rows of one tile: `m0..m0 + mr`, and whether its sums are centred (`Σ (u − 128)·w`).
#[derive(Clone, Copy)]
struct TileRows {
    m0: usize,
    mr: usize,
    centred: bool,
}

/// A raw output pointer shared by the panel tasks (each writes disjoint columns).
struct SendPtr(*mut f32);
// SAFETY: only used for disjoint writes, see `Int8Weight::rescale_tile`.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Round to nearest (ties to even) for `|x| < 2^22`, branch-free so loops vectorise.
#[inline(always)]
fn round_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (x + MAGIC) - MAGIC
}

/// Quantizes each row of `x: [rows, in]` symmetrically to `[-127, 127]`, stored offset by
/// [`ACT_OFFSET`] as bytes, zero-padded to `in_pad` (padding holds the offset, i.e. zero).
pub(crate) fn quantize_rows(x: &[f32], rows: usize, in_dim: usize, in_pad: usize) -> QuantRows {
    let mut bytes = vec![ACT_OFFSET as u8; rows * in_pad];
    let mut scales = vec![0f32; rows];
    for m in 0..rows {
        let r = &x[m * in_dim..(m + 1) * in_dim];
        let amax = r.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let scale = if amax > 0.0 && amax.is_finite() {
            amax / 127.0
        } else {
            1.0
        };
        scales[m] = scale;
        let inv = 1.0 / scale;
        for (b, &v) in bytes[m * in_pad..m * in_pad + in_dim].iter_mut().zip(r) {
            *b = (round_small((v * inv).clamp(-127.0, 127.0)) as i32 + ACT_OFFSET) as u8;
        }
    }
    QuantRows { bytes, scales }
}

/// Which side of an int8 linear layer [`fake_quantize_rows`] mimics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Operand {
    /// A weight `[out, in]`, quantized once per output channel ([`Int8Weight::quantize`]).
    Weight,
    /// An input `[rows, in]`, quantized per row on every call ([`Int8Weight::matmul`]).
    Input,
}

/// Replaces every row of `x` (`in_dim` values each) by the f32 values the int8 layer
/// computes with: `scale · q`, with the row's scale and its rounding to `q ∈ [-127, 127]`
/// exactly as `operand`'s side of [`Int8Weight`] makes them. A trainer whose forward runs
/// on these values (fake quantization) sees the numbers of the int8 engine; the products
/// then differ from the engine's exact integer sums by f32 rounding only.
///
/// # Panics
/// When `in_dim` is 0 or does not divide `x.len()`.
pub fn fake_quantize_rows(x: &mut [f32], in_dim: usize, operand: Int8Operand) {
    assert!(
        in_dim > 0 && x.len().is_multiple_of(in_dim),
        "rows must be whole"
    );
    for row in x.chunks_mut(in_dim) {
        let amax = row.iter().fold(0f32, |a, &v| a.max(v.abs()));
        match operand {
            Int8Operand::Weight => {
                let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                for v in row.iter_mut() {
                    *v = round_small((*v / scale).clamp(-127.0, 127.0)) * scale;
                }
            }
            Int8Operand::Input => {
                let scale = if amax > 0.0 && amax.is_finite() {
                    amax / 127.0
                } else {
                    1.0
                };
                let inv = 1.0 / scale;
                for v in row.iter_mut() {
                    *v = round_small((*v * inv).clamp(-127.0, 127.0)) * scale;
                }
            }
        }
    }
}

/// Portable kernel: `acc[m][lane] = Σ_k u[m, k] · w[lane, k]` for one panel (exact i32).
/// `x`: `rows` quantized rows of `in_pad` bytes.
pub(crate) fn panel_portable(x: &[u8], rows: usize, in_pad: usize, w: &[i8], acc: &mut [i32]) {
    let groups = in_pad / GROUP;
    for m in 0..rows {
        let x = &x[m * in_pad..(m + 1) * in_pad];
        let a = &mut acc[m * PANEL..(m + 1) * PANEL];
        let mut lanes = [0i32; PANEL];
        for g in 0..groups {
            let xg = &x[g * GROUP..(g + 1) * GROUP];
            let wg = &w[g * PANEL * GROUP..(g + 1) * PANEL * GROUP];
            for (lane, l) in lanes.iter_mut().enumerate() {
                for j in 0..GROUP {
                    *l += xg[j] as i32 * wg[lane * GROUP + j] as i32;
                }
            }
        }
        a.copy_from_slice(&lanes);
    }
}
