//! Inference linear layers for the rollout engine, on host slices: an f32 weight packed once
//! for decode-sized batches ([`PackedF32Weight`]) and a W8A8 int8 weight ([`Int8Weight`]).
//! They have no backward pass: training never runs through them ([`fake_quantize_rows`]
//! gives a trainer the int8 layer's numbers instead).

mod f32_packed;
#[cfg(target_arch = "x86_64")]
mod f32_x86;
mod int8_linear;
mod int8_vnni;

pub use f32_packed::PackedF32Weight;
pub use int8_linear::{fake_quantize_rows, Int8Operand, Int8Weight};

/// Whether int8 matmuls use the AVX-512 VNNI kernel on this CPU (otherwise the portable
/// kernel, with bit-identical results).
pub fn int8_uses_vnni() -> bool {
    int8_vnni::available()
}

#[cfg(test)]
mod tests;
