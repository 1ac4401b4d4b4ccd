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
pub(crate) use bf16_rounded::RoundedOperand;
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
    gemm_marked(numbers, a, b, c, [false; 2]);
}

/// [`gemm`], where `bf16_exact[i]` says operand `i` (`a`, `b`) holds bf16 values already
/// (widened from bf16, or a [`RoundedOperand`]): the portable bf16 path multiplies such an
/// operand in place instead of rounding a copy of it. Marking an operand that is not exact
/// gives products of its unrounded values.
///
/// # Panics
/// As [`gemm`].
pub(crate) fn gemm_marked(
    numbers: Numbers,
    a: MatView,
    b: MatView,
    c: &mut [f32],
    bf16_exact: [bool; 2],
) {
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
        Numbers::Bf16(_) => bf16_rounded::gemm(a, b, c, bf16_exact),
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as its 16 bits: `half::bf16::from_f32`'s
/// bits, NaN quieted as it does, without its branches (so a loop over a slice vectorizes).
#[inline]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    (rounded_bits(v) >> 16) as u16
}

/// `v` rounded to the nearest bf16 (ties to even): [`bf16_bits`] as a `half::bf16`.
#[inline]
pub(crate) fn to_bf16(v: f32) -> half::bf16 {
    half::bf16::from_bits(bf16_bits(v))
}

/// `h` widened to f32 (exact; a NaN stays a NaN), without `half`'s branch for NaN.
#[inline]
pub(crate) fn widen_bf16(h: half::bf16) -> f32 {
    f32::from_bits((h.to_bits() as u32) << 16)
}

/// `v` rounded to the nearest bf16 and widened back to f32 (exact).
#[inline]
pub(crate) fn round_to_bf16(v: f32) -> f32 {
    f32::from_bits(rounded_bits(v))
}

/// The f32 bits of `v` rounded to bf16: adding `0x7fff` plus the kept part's lowest bit
/// carries into the kept part exactly when the dropped half is above a half-unit or a tie
/// with an odd kept part (ties to even; the largest finite values round to infinity). A NaN
/// keeps its sign and top mantissa bits with the quiet bit set.
#[inline]
fn rounded_bits(v: f32) -> u32 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) & 0xffff_0000;
    let quiet_nan = (x | 0x0040_0000) & 0xffff_0000;
    if x & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }
}
