//! The blocked loop around the register tile: `B` packed once per call, `A` packed one
//! block of rows and pairs at a time, blocks of `C` rows spread over rayon's threads. A
//! `B` panel slice (`KC_PAIRS` pairs × 32 columns, 16 KiB) stays in L1 while every tile of
//! the `A` block (96 rows × 256 k, 48 KiB) streams past it. Pack buffers are kept per thread
//! and reused, so a training step maps no fresh pages for them.

use std::cell::RefCell;

use rayon::prelude::*;

use super::bf16_avx512 as avx512;
use super::bf16_pack::{pack_a, pack_b, MR, NR};
use super::MatView;

/// Pairs of `k` per block (256 values of `k`).
pub(super) const KC_PAIRS: usize = 128;
/// Rows of `C` per parallel block (a multiple of `MR`).
const MC: usize = 8 * MR;

thread_local! {
    static PACKED_B: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// This thread's `A` blocks (also `bf16_serial.rs`'s).
    pub(super) static PACKED_A: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// `c = a · b` on the AVX-512 BF16 tile.
pub(super) fn gemm(a: MatView, b: MatView, c: &mut [f32]) {
    PACKED_B.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => gemm_with_b(a, b, c, &mut buf),
        Err(_) => gemm_with_b(a, b, c, &mut Vec::new()),
    });
}

fn gemm_with_b(a: MatView, b: MatView, c: &mut [f32], packed_b: &mut Vec<u32>) {
    pack_b(b, packed_b);
    let packed_b: &[u32] = packed_b;
    let n = b.cols;
    c.par_chunks_mut(MC * n)
        .enumerate()
        .for_each(|(blk, c_blk)| {
            PACKED_A.with(|cell| match cell.try_borrow_mut() {
                Ok(mut buf) => row_block(a, packed_b, n, blk * MC, c_blk, &mut buf),
                Err(_) => row_block(a, packed_b, n, blk * MC, c_blk, &mut Vec::new()),
            })
        });
}

/// One block of `C` rows (`c_blk`, `[rows, n]` from `row0`) over all of `k`.
fn row_block(
    a: MatView,
    packed_b: &[u32],
    n: usize,
    row0: usize,
    c_blk: &mut [f32],
    packed_a: &mut Vec<u32>,
) {
    let rows = c_blk.len() / n;
    let tiles = rows.div_ceil(MR);
    let pairs = a.cols.div_ceil(2);
    packed_a.resize(tiles * KC_PAIRS * MR, 0);
    for p0 in (0..pairs).step_by(KC_PAIRS) {
        let pn = KC_PAIRS.min(pairs - p0);
        let block = &mut packed_a[..tiles * pn * MR];
        pack_a(a, row0, rows, p0, pn, block);
        for q in 0..n.div_ceil(NR) {
            let panel = &packed_b[(q * pairs + p0) * NR..(q * pairs + p0 + pn) * NR];
            let cols = NR.min(n - q * NR);
            for t in 0..tiles {
                let live = MR.min(rows - t * MR);
                let c_tile = &mut c_blk[(t * MR) * n + q * NR..];
                let a_tile = &block[t * pn * MR..(t + 1) * pn * MR];
                // SAFETY: `available()` held when this path was chosen; `a_tile` holds `pn`
                // pairs × MR rows and `panel` `pn` pairs × NR columns; the tile writes
                // `live` rows of `cols` columns at stride `n`, all inside `c_tile`.
                unsafe { avx512::tile(pn, a_tile, panel, c_tile, n, live, cols, (p0 == 0, 1.0)) };
            }
        }
    }
}
