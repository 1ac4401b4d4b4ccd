//! The portable bf16 GEMM: both operands rounded to bf16 values (kept as f32, exact) and
//! multiplied by the f32 GEMM. The numbers of the packed bf16 kernel up to summation order;
//! the speed of f32.

use super::{round_to_bf16, MatView};

/// `c = a · b` on bf16-rounded row-major copies of `a` and `b`.
pub(super) fn gemm(a: MatView, b: MatView, c: &mut [f32]) {
    let ar = rounded_copy(a);
    let br = rounded_copy(b);
    super::f32::gemm(
        MatView::row_major(&ar, a.rows, a.cols),
        MatView::row_major(&br, b.rows, b.cols),
        c,
    );
}

/// A row-major copy of `v` with every element rounded to bf16.
fn rounded_copy(v: MatView) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.rows * v.cols);
    for r in 0..v.rows {
        out.extend((0..v.cols).map(|c| round_to_bf16(v.at(r, c))));
    }
    out
}
