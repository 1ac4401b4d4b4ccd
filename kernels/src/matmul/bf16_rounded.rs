//! The portable bf16 GEMM: both operands rounded to bf16 values (kept as f32, exact) and
//! multiplied by the f32 GEMM. The numbers of the packed bf16 kernel up to summation order;
//! the speed of f32.

use super::{round_to_bf16, MatView};

/// `c = a · b` on bf16-rounded copies of `a` and `b` (each in its own memory layout when it
/// is dense, so a transposed operand is rounded in one streaming pass, not gathered).
pub(super) fn gemm(a: MatView, b: MatView, c: &mut [f32]) {
    let (ar, br) = rayon::join(|| rounded_copy(a), || rounded_copy(b));
    super::f32::gemm(view_of(a, &ar), view_of(b, &br), c);
}

/// Whether `v`'s data is exactly its elements, row-major or transposed.
fn dense(v: &MatView) -> bool {
    v.data.len() == v.rows * v.cols
        && ((v.col_stride == 1 && v.row_stride == v.cols)
            || (v.row_stride == 1 && v.col_stride == v.rows))
}

/// `v`'s elements rounded to bf16: its data in its own layout when dense, else gathered
/// row-major.
fn rounded_copy(v: MatView) -> Vec<f32> {
    if dense(&v) {
        return v.data.iter().map(|&x| round_to_bf16(x)).collect();
    }
    let mut out = Vec::with_capacity(v.rows * v.cols);
    for r in 0..v.rows {
        out.extend((0..v.cols).map(|c| round_to_bf16(v.at(r, c))));
    }
    out
}

/// The view of `rounded` (made by [`rounded_copy`] from `v`).
fn view_of<'a>(v: MatView, rounded: &'a [f32]) -> MatView<'a> {
    match dense(&v) {
        true => MatView { data: rounded, ..v },
        false => MatView::row_major(rounded, v.rows, v.cols),
    }
}
