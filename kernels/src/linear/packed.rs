//! Inference linear layer `y = x · Wᵀ (+ b)` with the weight packed once for the engine's
//! decode shapes (few rows, many output channels), stored as f32 or as bf16.
//!
//! A general GEMM re-packs a transposed weight on every call; at decode batch sizes that
//! packing costs more than the arithmetic. Here the weight is packed once (at load or refit)
//! into panels of 32 output channels × all inputs (`[out/32][in][32]`), and each call streams
//! every panel once per block of 64 input rows while the block stays in L2. The register
//! kernels are AVX-512F (8 rows × 32 channels) and AVX2+FMA (4 rows × 16 channels); other
//! CPUs run a portable loop.
//!
//! A bf16 weight ([`PackedBf16Weight`]) halves the bytes streamed per call. On a CPU with
//! AVX-512 BF16 the activations are rounded to bf16 too and `vdpbf16ps` multiplies pairs of
//! both into f32 sums (`packed_bf16dot.rs`: twice the f32 kernel's products per
//! instruction). Elsewhere each panel row is widened to f32 in registers (a 16-bit shift,
//! exact) and multiplied with f32 activations into f32 sums, so its product equals the f32
//! kernel's on the bf16-rounded weight, bit for bit, on the same register kernel. Inference
//! only: no gradients, no tensors.

pub use super::panel::PanelElement;
use super::panel::PANEL;
use half::bf16;
use rayon::prelude::*;

/// Input rows per cache block (the block of `x` that every panel is multiplied with).
const ROW_BLOCK: usize = 64;

/// A weight `[out, in]` packed as `[out/32][in][32]` elements of `E` (output channels
/// zero-padded).
#[derive(Clone, Debug)]
pub struct PackedWeight<E> {
    out_dim: usize,
    in_dim: usize,
    packed: Vec<E>,
}

/// An f32 packed weight: the trainer's numbers exactly.
pub type PackedF32Weight = PackedWeight<f32>;
/// A bf16 packed weight (round to nearest even from f32): half the bytes of f32.
pub type PackedBf16Weight = PackedWeight<bf16>;

/// Which register kernel runs on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PanelKernel {
    /// AVX-512F, and for bf16 weights the AVX-512 BF16 dot products on bf16-rounded
    /// activations (`packed_bf16dot.rs`).
    Avx512Bf16Dot,
    Avx512,
    Avx2,
    Portable,
}

impl PanelKernel {
    pub(crate) fn detect() -> PanelKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if super::packed_bf16dot::available() {
                return PanelKernel::Avx512Bf16Dot;
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                return PanelKernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return PanelKernel::Avx2;
            }
        }
        PanelKernel::Portable
    }
}

impl<E: PanelElement> PackedWeight<E> {
    /// Packs a row-major f32 weight `[out_dim, in_dim]` (rounding to `E`).
    ///
    /// # Panics
    /// When `w.len() != out_dim * in_dim`.
    pub fn pack(w: &[f32], out_dim: usize, in_dim: usize) -> PackedWeight<E> {
        assert_eq!(w.len(), out_dim * in_dim, "weight length must be out * in");
        let panels = out_dim.div_ceil(PANEL);
        let mut packed = vec![E::default(); panels * in_dim * PANEL];
        packed
            .par_chunks_mut(in_dim * PANEL)
            .enumerate()
            .for_each(|(p, panel)| {
                for lane in 0..PANEL.min(out_dim - p * PANEL) {
                    let row = &w[(p * PANEL + lane) * in_dim..(p * PANEL + lane + 1) * in_dim];
                    for (k, &v) in row.iter().enumerate() {
                        panel[k * PANEL + lane] = E::from_f32(v);
                    }
                }
            });
        PackedWeight {
            out_dim,
            in_dim,
            packed,
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

    /// Bytes held by the packed weight.
    pub fn bytes(&self) -> usize {
        self.packed.len() * std::mem::size_of::<E>()
    }

    /// `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])` for row-major `x: [rows, in]` into
    /// `out: [rows, out]`, parallel over panels (rayon).
    ///
    /// # Panics
    /// When the slice lengths do not match `rows` and the weight's shape.
    pub fn matmul(&self, x: &[f32], rows: usize, bias: Option<&[f32]>, out: &mut [f32]) {
        self.matmul_with(PanelKernel::detect(), x, rows, bias, out);
    }

    pub(crate) fn matmul_with(
        &self,
        kernel: PanelKernel,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) {
        assert_eq!(x.len(), rows * self.in_dim, "input must be [rows, in]");
        assert_eq!(out.len(), rows * self.out_dim, "output must be [rows, out]");
        if let Some(b) = bias {
            assert_eq!(b.len(), self.out_dim, "bias must be [out]");
        }
        let (k, n) = (self.in_dim, self.out_dim);
        let out_ptr = SendPtr(out.as_mut_ptr());
        let mut pairs = Vec::new();
        for m0 in (0..rows).step_by(ROW_BLOCK) {
            let mr = ROW_BLOCK.min(rows - m0);
            let xb = &x[m0 * k..(m0 + mr) * k];
            let operand = match kernel {
                #[cfg(target_arch = "x86_64")]
                PanelKernel::Avx512Bf16Dot if E::BF16 => {
                    crate::matmul::bf16_row_pairs(xb, mr, k, &mut pairs);
                    Rows::Bf16Pairs(&pairs)
                }
                _ => Rows::F32(xb),
            };
            self.packed
                .par_chunks(k * PANEL)
                .enumerate()
                .for_each(|(p, panel)| {
                    let mut tile = [0f32; ROW_BLOCK * PANEL];
                    panel_product(kernel, operand, mr, k, panel, &mut tile);
                    let cols = PANEL.min(n - p * PANEL);
                    for r in 0..mr {
                        // SAFETY: each task writes only columns p*32..p*32+cols of its rows;
                        // tasks cover disjoint column ranges and `out` outlives the loop.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(
                                out_ptr.get().add((m0 + r) * n + p * PANEL),
                                cols,
                            )
                        };
                        let src = &tile[r * PANEL..r * PANEL + cols];
                        match bias {
                            Some(b) => {
                                for ((d, s), bb) in dst.iter_mut().zip(src).zip(&b[p * PANEL..]) {
                                    *d = s + bb;
                                }
                            }
                            None => dst.copy_from_slice(src),
                        }
                    }
                });
        }
    }
}

/// A raw output pointer shared by the panel tasks (each writes disjoint columns).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used for disjoint writes, see `matmul_with`.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// One block of input rows as a panel kernel reads them.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// f32, `[rows, k]`.
    F32(&'a [f32]),
    /// bf16 pairs, `[rows][k.div_ceil(2)]`, for the bf16 dot-product kernel.
    Bf16Pairs(&'a [u32]),
}

/// `tile[r][c] = Σ_k x[r, k] · panel[k][c]` for `rows ≤ 64` rows of `x` (`[rows, k]`).
fn panel_product<E: PanelElement>(
    kernel: PanelKernel,
    x: Rows,
    rows: usize,
    k: usize,
    panel: &[E],
    tile: &mut [f32],
) {
    let x = match x {
        Rows::F32(x) => x,
        #[cfg(target_arch = "x86_64")]
        Rows::Bf16Pairs(xp) => {
            // SAFETY: `Bf16Pairs` is only made for panels with `E::BF16`, whose elements are
            // bf16 (the register kernels read them as 16-bit values too).
            let panel = unsafe { std::slice::from_raw_parts(panel.as_ptr().cast(), panel.len()) };
            return super::packed_bf16dot::panel_bf16dot(xp, rows, k, panel, tile);
        }
        #[cfg(not(target_arch = "x86_64"))]
        Rows::Bf16Pairs(_) => unreachable!("bf16 pairs are made on x86-64 only"),
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        PanelKernel::Avx512 | PanelKernel::Avx512Bf16Dot => {
            super::packed_x86::panel_avx512(x, rows, k, panel, tile)
        }
        #[cfg(target_arch = "x86_64")]
        PanelKernel::Avx2 => super::packed_x86::panel_avx2(x, rows, k, panel, tile),
        _ => panel_portable(x, rows, k, panel, tile),
    }
}

/// The portable kernel (sequential sum over `k`, no fused multiply-add).
pub(crate) fn panel_portable<E: PanelElement>(
    x: &[f32],
    rows: usize,
    k: usize,
    panel: &[E],
    tile: &mut [f32],
) {
    for r in 0..rows {
        let mut acc = [0f32; PANEL];
        for kk in 0..k {
            let xv = x[r * k + kk];
            let w = &panel[kk * PANEL..(kk + 1) * PANEL];
            for c in 0..PANEL {
                acc[c] += xv * w[c].to_f32();
            }
        }
        tile[r * PANEL..(r + 1) * PANEL].copy_from_slice(&acc);
    }
}
