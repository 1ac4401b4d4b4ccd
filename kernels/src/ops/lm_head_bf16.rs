//! The fused LM head's three products in bf16, for bf16 mixed precision: the hidden states,
//! the head weight and the logits' gradient are rounded to bf16 (nearest, ties to even) and
//! multiplied with f32 sums, as `torch.autocast` runs an LM head; the softmax, log-probs and
//! entropy stay f32. On a CPU whose bf16 path is the AVX-512 BF16 tile the weight is rounded
//! and packed once per forward or backward pass (as `Wᵀ` for the logits and, in the
//! backward, as `W` for the hidden states' gradient) instead of once per block of rows;
//! elsewhere the operands are rounded to bf16 values in f32 and the f32 GEMM multiplies
//! them (the same numbers up to summation order).
//!
//! The kernels in `lm_head_cpu.rs` are generic over f32 and f64; this head exists only for
//! f32 storage ([`Bf16Head::new`] checks it), so its slices are reinterpreted as f32.

use std::any::TypeId;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use crate::matmul::{gemm_packed, PackedRhs, RhsWindow};
use crate::matmul::{gemm_rm, round_to_bf16, Bf16Path, MatView};

/// A block of hidden states packed once for the `∂W` products of every vocabulary chunk, on
/// the AVX-512 BF16 tile (no other path packs, so elsewhere there is none).
#[cfg(target_arch = "x86_64")]
pub(crate) type PackedHidden = PackedRhs;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) enum PackedHidden {}

/// The hidden states `[rows, hidden]` of one backward block, and their packed form when
/// [`Bf16Head::pack_hidden`] made one.
pub(crate) struct HiddenRows<'a, T> {
    pub rows: &'a [T],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub packed: Option<&'a PackedHidden>,
}

/// Which products a pass of the head runs, so that only their operands are prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeadPass {
    /// The logits.
    Forward,
    /// The gradients of the hidden states and the weight, and the logits again unless the
    /// forward kept them.
    Backward { recompute_logits: bool },
}

/// The head weight, prepared for bf16 products.
pub(crate) enum Bf16Head {
    /// Packed bf16 pairs for the AVX-512 BF16 tile: `Wᵀ` (`[hidden, vocab]`) when the pass
    /// computes logits and, for the backward pass, `W` (`[vocab, hidden]`).
    #[cfg(target_arch = "x86_64")]
    Tile {
        wt: Option<PackedRhs>,
        w: Option<PackedRhs>,
        hidden: usize,
    },
    /// `W` rounded to bf16 values, for the f32 GEMM.
    Rounded { w: Vec<f32>, hidden: usize },
}

/// `s` as f32 slices (`T` must be f32).
fn f32s<T: 'static>(s: &[T]) -> &[f32] {
    assert_eq!(
        TypeId::of::<T>(),
        TypeId::of::<f32>(),
        "the bf16 head runs on f32"
    );
    // SAFETY: `T` is f32 (asserted).
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

fn f32s_mut<T: 'static>(s: &mut [T]) -> &mut [f32] {
    assert_eq!(
        TypeId::of::<T>(),
        TypeId::of::<f32>(),
        "the bf16 head runs on f32"
    );
    // SAFETY: `T` is f32 (asserted).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

fn scalar<T: 'static + Copy>(v: T) -> f32 {
    f32s(std::slice::from_ref(&v))[0]
}

/// A rounded copy of `v`, on rayon's threads (the head weight, `[vocab, hidden]`).
fn rounded(v: &[f32]) -> Vec<f32> {
    v.par_iter().map(|&x| round_to_bf16(x)).collect()
}

impl Bf16Head {
    /// The head for weight `w` (`[vocab, hidden]`) on `path`, or `None` when `T` is not f32
    /// (f64 storage computes in f64), prepared for the products of `pass`.
    pub(crate) fn new<T: 'static>(
        w: &[T],
        (vocab, hidden): (usize, usize),
        pass: HeadPass,
        path: Bf16Path,
    ) -> Option<Bf16Head> {
        if TypeId::of::<T>() != TypeId::of::<f32>() {
            return None;
        }
        let w = f32s(w);
        match path {
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Avx512Bf16 => {
                let wm = MatView::row_major(w, vocab, hidden);
                let logits = pass
                    != HeadPass::Backward {
                        recompute_logits: false,
                    };
                Some(Bf16Head::Tile {
                    wt: logits.then(|| PackedRhs::pack(wm.t())),
                    w: (pass != HeadPass::Forward).then(|| PackedRhs::pack(wm)),
                    hidden,
                })
            }
            _ => Some(Bf16Head::Rounded {
                w: rounded(w),
                hidden,
            }),
        }
    }

    /// Whether the products round their operands to bf16 themselves (the tile rounds while
    /// packing), so `∂z` and the hidden states need not be rounded first ([`round_in_place`]).
    pub(crate) fn rounds_operands(&self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { .. } => true,
            Bf16Head::Rounded { .. } => false,
        }
    }

    /// `hb` (`[rows, hidden]`) packed for [`Self::weight_grad`]'s products, on the tile (the
    /// rounded path multiplies the rows as they are: `None`).
    pub(crate) fn pack_hidden<T: 'static>(&self, hb: &[T], rows: usize) -> Option<PackedHidden> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { hidden, .. } => {
                Some(PackedRhs::pack(MatView::row_major(f32s(hb), rows, *hidden)))
            }
            Bf16Head::Rounded { .. } => None,
        }
    }

    fn hidden(&self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { hidden, .. } => *hidden,
            Bf16Head::Rounded { hidden, .. } => *hidden,
        }
    }

    /// `z = scale · hb · W[c0..c0 + cw]ᵀ`: `hb` `[rows, hidden]` (bf16 values already
    /// where the head does not round its operands, [`Self::rounds_operands`]), `z` `[rows, cw]`.
    pub(crate) fn logits<T: 'static + Copy>(
        &self,
        hb: &[T],
        rows: usize,
        (c0, cw): (usize, usize),
        z: &mut [T],
        scale: T,
    ) {
        let (hb, z, scale, h) = (f32s(hb), f32s_mut(z), scalar(scale), self.hidden());
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { wt, .. } => {
                let wt = wt.as_ref().expect("a head that computes logits packs Wᵀ");
                let window = RhsWindow {
                    pair0: 0,
                    col0: c0,
                    cols: cw,
                };
                gemm_packed(
                    MatView::row_major(hb, rows, h),
                    wt,
                    window,
                    z,
                    (cw, scale, false),
                );
            }
            Bf16Head::Rounded { w, .. } => {
                let wc = MatView::row_major(&w[c0 * h..(c0 + cw) * h], cw, h);
                gemm_rm(
                    &mut z[..rows * cw],
                    MatView::row_major(hb, rows, h),
                    wc.t(),
                    scale,
                    false,
                    1.0,
                );
            }
        }
    }

    /// `dh += scale · dz · W[c0..c0 + cw]`: `dz` `[rows, cw]` (bf16 values already, see
    /// [`round_in_place`]), `dh` `[rows, hidden]`.
    pub(crate) fn input_grad<T: 'static + Copy>(
        &self,
        dz: &[T],
        rows: usize,
        (c0, cw): (usize, usize),
        dh: &mut [T],
        scale: T,
    ) {
        let (dz, dh, scale, h) = (f32s(dz), f32s_mut(dh), scalar(scale), self.hidden());
        let dzv = MatView::row_major(dz, rows, cw);
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { w, .. } => {
                let w = w.as_ref().expect("a backward head packs W");
                let window = RhsWindow {
                    pair0: c0 / 2,
                    col0: 0,
                    cols: h,
                };
                gemm_packed(dzv, w, window, dh, (h, scale, true));
            }
            Bf16Head::Rounded { w, .. } => {
                let wc = MatView::row_major(&w[c0 * h..(c0 + cw) * h], cw, h);
                gemm_rm(dh, dzv, wc, scale, true, 1.0);
            }
        }
    }

    /// `dw += scale · dzᵀ · hb`: `dz` `[rows, cw]`, `hb` `[rows, hidden]` (on the tile,
    /// packed by [`Self::pack_hidden`]; elsewhere bf16 values already,
    /// [`Self::rounds_operands`]), `dw` `[cw, hidden]`.
    pub(crate) fn weight_grad<T: 'static + Copy>(
        &self,
        dz: &[T],
        (rows, cw): (usize, usize),
        hb: HiddenRows<'_, T>,
        dw: &mut [T],
        scale: T,
    ) {
        let (dz, dw, scale, h) = (f32s(dz), f32s_mut(dw), scalar(scale), self.hidden());
        let dzt = MatView::row_major(dz, rows, cw).t();
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Head::Tile { .. } => {
                let hp = hb.packed.expect("the tile's hidden states come packed");
                let window = RhsWindow {
                    pair0: 0,
                    col0: 0,
                    cols: h,
                };
                gemm_packed(dzt, hp, window, dw, (h, scale, true));
            }
            Bf16Head::Rounded { .. } => {
                let hb = MatView::row_major(f32s(hb.rows), rows, h);
                gemm_rm(dw, dzt, hb, scale, true, 1.0);
            }
        }
    }
}

/// Rounds the logits' gradient to bf16 values in place (the operand both backward products
/// read; the tile would round it while packing, the f32 GEMM needs it done).
pub(crate) fn round_in_place<T: 'static>(z: &mut [T]) {
    for v in f32s_mut(z) {
        *v = round_to_bf16(*v);
    }
}
