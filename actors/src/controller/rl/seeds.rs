//! Sampling and shuffling seeds of an RL step: pure functions of the run seed, the step and
//! the sample index, so a resumed run samples exactly what the uninterrupted run would have.

/// Per-sample sampling seed: a pure function of run seed, step and sample index, so a
/// resumed run samples exactly what the uninterrupted run would have.
pub(crate) fn sample_seed(seed: u64, step: u64, index: usize) -> u64 {
    let mut x = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x.wrapping_mul(0x94D0_49BB_1331_11EB)
}
