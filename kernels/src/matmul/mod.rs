//! The GEMMs of training, `C = A · B` with `C` f32 row-major and the operands f32 views with
//! any strides, so the three products of a linear layer (forward `x · Wᵀ`, input gradient
//! `∂y · W`, weight gradient `∂yᵀ · x`) read the f32 tensors in place, transposes included:
//! - [`Numbers::F32`]: f32 throughout (`f32.rs`, the `gemm` crate);
//! - [`Numbers::Bf16`]: bf16 mixed precision: both operands rounded to bf16 (nearest, ties
//!   to even) and the products summed in f32. The rounding happens while packing, so the
//!   f32 master weights are never overwritten.
//!
//! bf16 paths, chosen at run time from what the CPU has and which of them is faster there
//! ([`Bf16Path::detect`], `bf16_path.rs`; the environment variable
//! `OXALIGN_BF16_GEMM=avx512bf16|rounded` overrides):
//! - [`Bf16Path::Avx512Bf16`]: operands packed as bf16 pairs, a 12 × 32 register tile of
//!   `vdpbf16ps` (two bf16 products per f32 lane and instruction), `bf16_avx512.rs`;
//! - [`Bf16Path::RoundedF32`]: every other CPU (AVX2, AVX-512 without BF16, NEON), and an
//!   AVX-512 BF16 CPU where the tile times slower: the operands rounded to bf16 values held
//!   in f32 and multiplied by the f32 GEMM. The same numbers up to summation order, at f32
//!   speed.
//!
//! `bf16_serial.rs` multiplies on the calling thread against a `B` packed once (the fused LM
//! head's chunks). AMX tiles are not used yet (no machine with AMX enabled has run this
//! code). Not here: the differentiable linear op (`ops/linear.rs`).

#[cfg(target_arch = "x86_64")]
mod bf16_avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_blocked;
#[cfg(target_arch = "x86_64")]
mod bf16_pack;
#[cfg(target_arch = "x86_64")]
mod bf16_pack_avx512;
mod bf16_path;
mod bf16_rounded;
#[cfg(target_arch = "x86_64")]
mod bf16_serial;
mod f32;
mod strided;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
pub(crate) use bf16_pack::bf16_row_pairs;
#[cfg(target_arch = "x86_64")]
pub(crate) use bf16_serial::{gemm_packed, PackedRhs, RhsWindow};
pub(crate) use strided::{gemm_rm, MatRef};

/// A strided f32 matrix view: the operands of every GEMM here.
pub(crate) type MatView<'a> = MatRef<'a, f32>;

/// The kernel a bf16 GEMM runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Path {
    /// AVX-512 with the BF16 extension: `vdpbf16ps` on packed bf16 pairs.
    Avx512Bf16,
    /// bf16-rounded operands multiplied by the f32 GEMM (any CPU).
    RoundedF32,
}

/// The numbers a GEMM computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbers {
    /// f32 operands, f32 sums.
    F32,
    /// bf16-rounded operands, f32 sums, on the given path.
    Bf16(Bf16Path),
}

/// `c = a · b` (`c` row-major `[a.rows, b.cols]`, overwritten) in `numbers` (a bf16 path
/// must be available on this CPU).
///
/// # Panics
/// If the inner dimensions or the output size do not match (a caller's shape bug).
pub(crate) fn gemm(numbers: Numbers, a: MatView, b: MatView, c: &mut [f32]) {
    assert_eq!(a.cols, b.rows, "matmul: inner dimensions differ");
    assert_eq!(c.len(), a.rows * b.cols, "matmul: output size");
    if c.is_empty() {
        return;
    }
    if a.cols == 0 {
        c.fill(0.0);
        return;
    }
    match numbers {
        Numbers::F32 => f32::gemm(a, b, c),
        #[cfg(target_arch = "x86_64")]
        Numbers::Bf16(Bf16Path::Avx512Bf16) => bf16_blocked::gemm(a, b, c),
        Numbers::Bf16(_) => bf16_rounded::gemm(a, b, c),
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as its 16 bits.
#[inline]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// `v` rounded to the nearest bf16 and widened back to f32 (exact).
#[inline]
pub(crate) fn round_to_bf16(v: f32) -> f32 {
    f32::from_bits((bf16_bits(v) as u32) << 16)
}
