//! Checksums of weights: what a refit verifies, on the sender and on the engine.

use candle_core::{DType, Device, Tensor};

/// Checksum of one tensor: a 64-bit mix over its f32 bit patterns (row-major, contiguous
/// order), so any changed element changes it with overwhelming probability. Not
/// cryptographic.
pub fn tensor_checksum(t: &Tensor) -> candle_core::Result<u64> {
    let v = t
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_device(&Device::Cpu)?
        .to_vec1::<f32>()?;
    Ok(checksum_f32(&v))
}

/// [`tensor_checksum`] of a host slice.
pub fn checksum_f32(v: &[f32]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ (v.len() as u64);
    for pair in v.chunks(2) {
        let lo = pair[0].to_bits() as u64;
        let hi = pair.get(1).map_or(0, |x| x.to_bits() as u64);
        h ^= lo | (hi << 32);
        h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h.wrapping_mul(0xC4CE_B9FE_1A85_EC53) ^ (h >> 31)
}
