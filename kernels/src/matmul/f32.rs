//! The f32 GEMM of training: the `gemm` crate (candle's CPU matmul uses it too) reading the
//! strided views in place on rayon's threads, so a transposed operand costs no copy.

use super::strided::{gemm_strided, MatRef};

/// `c = a · b` in f32.
pub(super) fn gemm(a: MatRef<'_, f32>, b: MatRef<'_, f32>, c: &mut [f32]) {
    let parallelism = match rayon::current_num_threads() {
        1 => ::gemm::Parallelism::None,
        t => ::gemm::Parallelism::Rayon(t),
    };
    gemm_strided(c, a, b, (1.0, 0.0), false, parallelism);
}
