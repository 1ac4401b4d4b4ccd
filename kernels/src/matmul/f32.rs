//! The f32 GEMM of training: the `gemm` crate (candle's CPU matmul uses it too) reading the
//! strided views in place, so a transposed operand costs no copy.

use super::MatView;

/// `c = a · b` in f32.
pub(super) fn gemm(a: MatView, b: MatView, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let threads = rayon::current_num_threads();
    let parallelism = match threads {
        1 => ::gemm::Parallelism::None,
        t => ::gemm::Parallelism::Rayon(t),
    };
    // SAFETY: `MatView::new` checked that every element `(r, c)` of `a` and `b` lies inside
    // its slice; `c` is `[m, n]` row-major (checked by the caller).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}
