//! Inference linear layers for the rollout engine, on host slices: an f32 or bf16 weight
//! packed once for decode-sized batches ([`PackedF32Weight`], [`PackedBf16Weight`]) and a
//! W8A8 int8 weight ([`Int8Weight`]).
//! They have no backward pass: training never runs through them ([`fake_quantize_rows`]
//! gives a trainer the int8 layer's numbers instead).

mod int8_avx2;
mod int8_linear;
mod int8_panel;
mod int8_vnni;
#[cfg(target_arch = "x86_64")]
mod next_panel;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_bf16dot;
#[cfg(target_arch = "x86_64")]
mod packed_x86;
mod panel;

pub use int8_linear::{fake_quantize_rows, Int8Operand, Int8Weight};
pub use packed::{PackedBf16Weight, PackedF32Weight, PackedWeight, PanelElement};

/// Whether int8 matmuls use the AVX-512 VNNI kernel on this CPU (otherwise the portable
/// kernel, with bit-identical results).
#[cfg(test)]
pub(crate) fn int8_uses_vnni() -> bool {
    int8_vnni::available()
}

#[cfg(test)]
mod tests;
