//! bf16 products on the calling thread against a `B` packed once for many of them: the
//! fused LM head's chunked GEMMs under bf16 mixed precision, where rayon already runs over
//! row blocks or vocabulary chunks and `B` (the head's weight) would otherwise be rounded
//! and packed again for every block. `A` is packed per call, one block of `k` at a time,
//! into this thread's buffer.

use super::bf16_avx512 as avx512;
use super::bf16_blocked::{KC_PAIRS, PACKED_A};
use super::bf16_pack::{pack_a, pack_b, MR, NR};
use super::MatView;

/// `B` `[k, n]` rounded to bf16 and packed as panels of [`NR`] columns over all of `k`.
pub(crate) struct PackedRhs {
    data: Vec<u32>,
    pairs: usize,
    n: usize,
}

impl PackedRhs {
    /// Packs `b` (on rayon's threads).
    pub(crate) fn pack(b: MatView) -> PackedRhs {
        let mut data = Vec::new();
        pack_b(b, &mut data);
        PackedRhs {
            data,
            pairs: b.rows.div_ceil(2),
            n: b.cols,
        }
    }
}

/// Where a product reads `B` and writes `C`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RhsWindow {
    /// First pair of `k` of `B` (`a`'s column `2i` multiplies `B`'s row `2 (pair0 + i)`).
    pub pair0: usize,
    /// First column of `B`, a multiple of [`NR`].
    pub col0: usize,
    /// Columns of `B` (and `C`) from `col0`.
    pub cols: usize,
}

/// `c (+)= alpha · a · B[window]` on this thread (`c` row-major `[a.rows, window.cols]`
/// with row stride `ldc`; overwritten unless `accumulate`). Needs the AVX-512 BF16 path.
///
/// # Panics
/// On a window outside `b`, a misaligned `col0`, `a`'s `k` past `b`'s, or a short `c`.
pub(crate) fn gemm_packed(
    a: MatView,
    b: &PackedRhs,
    w: RhsWindow,
    c: &mut [f32],
    (ldc, alpha, accumulate): (usize, f32, bool),
) {
    let a_pairs = a.cols.div_ceil(2);
    assert!(
        w.col0.is_multiple_of(NR) && w.col0 + w.cols <= b.n,
        "gemm_packed: column window"
    );
    assert!(w.pair0 + a_pairs <= b.pairs, "gemm_packed: k window");
    assert!(
        a.rows == 0 || c.len() >= (a.rows - 1) * ldc + w.cols,
        "gemm_packed: output"
    );
    assert!(
        super::bf16_avx512::available(),
        "gemm_packed: needs AVX-512 BF16"
    );
    if a.rows == 0 || w.cols == 0 {
        return;
    }
    PACKED_A.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => run(a, b, w, c, (ldc, alpha, accumulate), &mut buf),
        Err(_) => run(a, b, w, c, (ldc, alpha, accumulate), &mut Vec::new()),
    });
}

fn run(
    a: MatView,
    b: &PackedRhs,
    w: RhsWindow,
    c: &mut [f32],
    (ldc, alpha, accumulate): (usize, f32, bool),
    packed_a: &mut Vec<u32>,
) {
    let (rows, a_pairs) = (a.rows, a.cols.div_ceil(2));
    let tiles = rows.div_ceil(MR);
    packed_a.resize(tiles * KC_PAIRS * MR, 0);
    for p0 in (0..a_pairs).step_by(KC_PAIRS) {
        let pn = KC_PAIRS.min(a_pairs - p0);
        let block = &mut packed_a[..tiles * pn * MR];
        pack_a(a, 0, rows, p0, pn, block);
        for q in 0..w.cols.div_ceil(NR) {
            let panel0 = ((w.col0 / NR + q) * b.pairs + w.pair0 + p0) * NR;
            let panel = &b.data[panel0..panel0 + pn * NR];
            let cols = NR.min(w.cols - q * NR);
            for t in 0..tiles {
                let live = MR.min(rows - t * MR);
                let c_tile = &mut c[t * MR * ldc + q * NR..];
                let a_tile = &block[t * pn * MR..(t + 1) * pn * MR];
                let first = p0 == 0 && !accumulate;
                // SAFETY: checked available above; `a_tile` holds `pn` pairs × MR rows and
                // `panel` `pn` pairs × NR columns; the tile writes `live` rows of `cols`
                // columns at stride `ldc`, inside `c_tile` by the output assertion.
                unsafe { avx512::tile(pn, a_tile, panel, c_tile, ldc, live, cols, (first, alpha)) };
            }
        }
    }
}
