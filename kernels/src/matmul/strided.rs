//! Strided matrix views ([`MatRef`]) and one safe function over the `gemm` crate that
//! multiplies two of them into a row-major block ([`gemm_rm`]): single-threaded for the
//! chunked LM-head kernels (which parallelise over blocks with rayon), on rayon's threads for
//! the training GEMMs of this folder. Not a general BLAS wrapper: f32 and f64 only.

use std::any::TypeId;

/// A strided `rows × cols` matrix view over a slice: element `(i, j)` is
/// `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A row-major `rows × cols` matrix (row stride `cols`).
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of this view (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// Element `(r, c)`.
    #[inline]
    pub fn at(&self, r: usize, c: usize) -> T
    where
        T: Copy,
    {
        self.data[r * self.row_stride + c * self.col_stride]
    }

    fn last_index(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
    }
}

/// `dst = beta · a · b` (or `dst += beta · a · b` with `accumulate`), where `dst` is a
/// row-major `a.rows × b.cols` block, on the calling thread. Panics on mismatched shapes or
/// short slices (callers build the views from checked dimensions), or on a dtype other than
/// f32/f64.
pub(crate) fn gemm_rm<T: Copy + 'static>(
    dst: &mut [T],
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    beta: T,
    accumulate: bool,
    one: T,
) {
    gemm_strided(
        dst,
        a,
        b,
        (beta, one),
        accumulate,
        ::gemm::Parallelism::None,
    )
}

/// [`gemm_rm`] on `parallelism`'s threads; `(beta, one)` as there.
pub(crate) fn gemm_strided<T: Copy + 'static>(
    dst: &mut [T],
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    (beta, one): (T, T),
    accumulate: bool,
    parallelism: ::gemm::Parallelism,
) {
    assert!(
        TypeId::of::<T>() == TypeId::of::<f32>() || TypeId::of::<T>() == TypeId::of::<f64>(),
        "gemm_rm: f32 or f64 only"
    );
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "gemm_rm: inner dimensions differ");
    assert!(dst.len() >= m * n, "gemm_rm: destination too short");
    if m == 0 || n == 0 {
        return;
    }
    if k > 0 {
        assert!(a.last_index() < a.data.len() && b.last_index() < b.data.len());
    }
    // SAFETY: every index the kernel touches is within the slices (checked above), `dst` is
    // exclusively borrowed and does not alias `a` or `b` (distinct borrows).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            one,
            beta,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: MatRef<'_, f64>, b: MatRef<'_, f64>) -> Vec<f64> {
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                for p in 0..a.cols {
                    out[i * b.cols + j] += a.data[i * a.row_stride + p * a.col_stride]
                        * b.data[p * b.row_stride + j * b.col_stride];
                }
            }
        }
        out
    }

    #[test]
    fn strided_products_match_naive() {
        let x: Vec<f64> = (0..35).map(|i| (i as f64 * 0.37).sin()).collect();
        let y: Vec<f64> = (0..35).map(|i| (i as f64 * 0.11).cos()).collect();
        let a = MatRef::row_major(&x, 5, 7);
        let b = MatRef::row_major(&y, 5, 7).t();
        let want = naive(a, b);
        let mut got = vec![1.0; 25];
        gemm_rm(&mut got, a, b, 2.0, false, 1.0);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - 2.0 * w).abs() < 1e-12);
        }
        gemm_rm(&mut got, a, b, 1.0, true, 1.0);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - 3.0 * w).abs() < 1e-12);
        }
    }
}
