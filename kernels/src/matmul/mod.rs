//! The GEMMs of training, `C = A · B` with `C` f32 row-major and the operands f32 views with
//! any strides, so the three products of a linear layer (forward `x · Wᵀ`, input gradient
//! `∂y · W`, weight gradient `∂yᵀ · x`) read the f32 tensors in place, transposes included:
//! - [`Numbers::F32`]: f32 throughout (`f32.rs`, the `gemm` crate);
//! - [`Numbers::Bf16`]: bf16 mixed precision: both operands rounded to bf16 (nearest, ties
//!   to even) and the products summed in f32. The rounding happens while packing, so the
//!   f32 master weights are never overwritten.
//!
//! bf16 paths, chosen at run time from what the CPU has ([`Bf16Path::detect`]; the
//! environment variable `OXALIGN_BF16_GEMM=avx512bf16|rounded` overrides):
//! - [`Bf16Path::Avx512Bf16`]: operands packed as bf16 pairs, a 12 × 32 register tile of
//!   `vdpbf16ps` (two bf16 products per f32 lane and instruction), `bf16_avx512.rs`;
//! - [`Bf16Path::RoundedF32`]: every other CPU (AVX2, AVX-512 without BF16, NEON): the
//!   operands rounded to bf16 values held in f32 and multiplied by the f32 GEMM. The same
//!   numbers up to summation order, at f32 speed.
//!
//! AMX tiles are not used yet (no machine with AMX enabled has run this code). Not here: the
//! differentiable linear op (`ops/linear.rs`).

#[cfg(target_arch = "x86_64")]
mod bf16_avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_blocked;
#[cfg(target_arch = "x86_64")]
mod bf16_pack;
#[cfg(target_arch = "x86_64")]
mod bf16_pack_avx512;
mod bf16_rounded;
mod f32;
mod strided;
#[cfg(test)]
mod tests;

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

impl Bf16Path {
    /// The path this CPU runs: `OXALIGN_BF16_GEMM=avx512bf16` or `=rounded` when set (and
    /// available), else the AVX-512 BF16 tile on AMD CPUs that have it, else
    /// [`Bf16Path::RoundedF32`]. On an Intel Xeon without AMX the tile reached 0.45x of the
    /// f32 GEMM and the rounded operands 0.9x (`oxalign bench matmul --precision bf16-mixed`,
    /// docs/PERFORMANCE.md); on AMD Zen 4 the tile is expected to beat f32 (the vendor's
    /// instruction tables: two bf16 products per lane at the f32 FMA's rate; not measured
    /// here).
    pub fn detect() -> Bf16Path {
        let tile = Bf16Path::available().contains(&Bf16Path::Avx512Bf16);
        match std::env::var("OXALIGN_BF16_GEMM").as_deref() {
            Ok("avx512bf16") if tile => return Bf16Path::Avx512Bf16,
            Ok("rounded") => return Bf16Path::RoundedF32,
            _ => {}
        }
        match tile && amd() {
            true => Bf16Path::Avx512Bf16,
            false => Bf16Path::RoundedF32,
        }
    }

    /// Every path this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Bf16Path> {
        let mut paths = vec![Bf16Path::RoundedF32];
        #[cfg(target_arch = "x86_64")]
        if bf16_avx512::available() {
            paths.push(Bf16Path::Avx512Bf16);
        }
        paths
    }
}

/// Whether the CPU's vendor string is AMD's.
fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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
