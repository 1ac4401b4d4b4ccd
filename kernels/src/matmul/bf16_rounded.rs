//! The portable bf16 GEMM: both operands rounded to bf16 values (kept as f32, exact) and
//! multiplied by the f32 GEMM. The numbers of the packed bf16 kernel up to summation order;
//! the speed of f32 plus one rounding pass over each operand.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::{round_to_bf16, MatView};

/// `c = a · b` on bf16-rounded copies of `a` and `b` (each copied run by run in its own
/// layout when its rows or columns are contiguous, so a transposed or narrowed operand is
/// rounded in streaming passes, not gathered element by element); an operand marked
/// `bf16_exact` is used in place.
pub(super) fn gemm(a: MatView, b: MatView, c: &mut [f32], bf16_exact: [bool; 2]) {
    let copy = |v: MatView, exact: bool| (!exact).then(|| rounded_copy(v));
    let (ar, br) = rayon::join(|| copy(a, bf16_exact[0]), || copy(b, bf16_exact[1]));
    super::f32::gemm(copy_or_source(a, &ar), copy_or_source(b, &br), c);
}

/// The view of `copy` (made by [`rounded_copy`] from `v`), or `v` itself where none was made.
fn copy_or_source<'a>(v: MatView<'a>, copy: &'a Option<Vec<f32>>) -> MatView<'a> {
    match copy {
        Some(copy) => view_of(v, copy),
        None => v,
    }
}

/// An operand of several bf16 products, rounded once: on the portable path
/// ([`super::Bf16Path::RoundedF32`]) a rounded copy made here, elsewhere the view itself (the
/// packed kernels round while packing, and f32 products take it as it is).
pub(crate) struct RoundedOperand<'a> {
    source: MatView<'a>,
    copy: Option<Vec<f32>>,
}

impl<'a> RoundedOperand<'a> {
    /// `v` prepared for products in `numbers`.
    pub(crate) fn new(numbers: super::Numbers, v: MatView<'a>) -> RoundedOperand<'a> {
        let portable = numbers == super::Numbers::Bf16(super::Bf16Path::RoundedF32);
        RoundedOperand {
            source: v,
            copy: portable.then(|| rounded_copy(v)),
        }
    }

    /// The operand's view: the rounded copy's, where one was made.
    pub(crate) fn view(&self) -> MatView<'_> {
        copy_or_source(self.source, &self.copy)
    }

    /// Whether [`Self::view`] holds bf16 values (the mark for [`super::gemm_marked`]).
    pub(crate) fn bf16_exact(&self) -> bool {
        self.copy.is_some()
    }

    /// The rounded copy, row-major when the source's rows were runs or nothing was
    /// (`None` where none was made).
    pub(crate) fn into_copy(self) -> Option<Vec<f32>> {
        self.copy
    }
}

/// How a view's elements lie in its data: rows as contiguous runs, columns as contiguous
/// runs, or neither.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Runs {
    Rows,
    Cols,
    Scattered,
}

fn runs(v: &MatView) -> Runs {
    if v.col_stride == 1 {
        Runs::Rows
    } else if v.row_stride == 1 {
        Runs::Cols
    } else {
        Runs::Scattered
    }
}

/// `v`'s elements rounded to bf16: row-major when its rows are runs (or nothing is),
/// column-major when its columns are, each run rounded in one pass on rayon's threads
/// straight into the new buffer (no zero-fill pass before it).
fn rounded_copy(v: MatView) -> Vec<f32> {
    let n = v.rows * v.cols;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let spare = &mut out.spare_capacity_mut()[..n];
    match runs(&v) {
        Runs::Rows => round_runs(spare, v.data, v.cols, v.row_stride),
        Runs::Cols => round_runs(spare, v.data, v.rows, v.col_stride),
        Runs::Scattered => spare
            .par_chunks_mut(v.cols)
            .enumerate()
            .for_each(|(r, row)| {
                for (c, o) in row.iter_mut().enumerate() {
                    o.write(round_to_bf16(v.at(r, c)));
                }
            }),
    }
    // SAFETY: each branch above wrote all `n` elements (`n / len` runs of `len`, or
    // `rows` rows of `cols`), and `n` is within the capacity.
    unsafe { out.set_len(n) };
    out
}

/// Rounds run `i` (`len` elements from `data[i * stride]`) into `out[i * len..]`.
fn round_runs(out: &mut [MaybeUninit<f32>], data: &[f32], len: usize, stride: usize) {
    out.par_chunks_mut(len).enumerate().for_each(|(i, run)| {
        let src = &data[i * stride..i * stride + len];
        for (o, &x) in run.iter_mut().zip(src) {
            o.write(round_to_bf16(x));
        }
    });
}

/// The view of `rounded` (made by [`rounded_copy`] from `v`).
fn view_of<'a>(v: MatView, rounded: &'a [f32]) -> MatView<'a> {
    match runs(&v) {
        Runs::Cols => MatView::row_major(rounded, v.cols, v.rows).t(),
        Runs::Rows | Runs::Scattered => MatView::row_major(rounded, v.rows, v.cols),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided copy holds the rounded elements in the layout its view reads: rows, columns
    /// (a narrowed transpose) and scattered views alike.
    #[test]
    fn rounded_copies_read_back_as_the_rounded_elements() {
        let data: Vec<f32> = (0..600).map(|i| (i as f32) * 0.013_7 - 3.1).collect();
        // Rows of 12 out of every 30 (a narrowed operand).
        let narrowed = MatView {
            data: &data,
            rows: 19,
            cols: 12,
            row_stride: 30,
            col_stride: 1,
        };
        let views = [
            MatView::row_major(&data, 20, 30),
            MatView::row_major(&data, 20, 30).t(),
            narrowed,
            narrowed.t(),
            MatView {
                data: &data,
                rows: 9,
                cols: 7,
                row_stride: 61,
                col_stride: 3,
            },
        ];
        for (k, &v) in views.iter().enumerate() {
            let copy = rounded_copy(v);
            let back = view_of(v, &copy);
            assert_eq!((back.rows, back.cols), (v.rows, v.cols), "view {k}");
            for r in 0..v.rows {
                for c in 0..v.cols {
                    let want = round_to_bf16(v.at(r, c));
                    assert_eq!(
                        back.at(r, c).to_bits(),
                        want.to_bits(),
                        "view {k} ({r}, {c})"
                    );
                }
            }
        }
        assert_eq!(runs(&views[1]), Runs::Cols);
        assert_eq!(runs(&views[4]), Runs::Scattered);
    }
}
