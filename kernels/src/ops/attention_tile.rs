//! A key (or value) tile of the attention kernels stored transposed, `[hd, stride]`, so the
//! dot products of one query row with every key of the tile vectorise over the keys (no
//! horizontal reductions). Loaded once per tile and reused by every query row of a block.
//! The stride is the tile's width rounded up to [`LANES`] with zero columns, so the dot
//! products run in whole vectors even for the few keys a query row of a short sequence sees.
//! The training kernels score [`ROWS`] query rows per pass over the tile
//! ([`TransposedTile::dots_rows`]): one row's sums form one chain of dependent additions, so
//! several rows (and two key chunks) give the CPU independent sums to overlap.

use std::ops::Range;

use multiversion::multiversion;

use super::cpu_math::Real;

/// Keys per vector chunk of the dot products (one AVX-512 register of f32).
const LANES: usize = 16;

/// Query rows scored together by [`TransposedTile::dots_rows`].
pub(crate) const ROWS: usize = 4;

/// Rows `keys` of a `[t, hd]` matrix, transposed into `data[d * stride + c]`; the columns
/// from `keys.len()` to `stride` are zero.
pub(crate) struct TransposedTile<T> {
    keys: Range<usize>,
    hd: usize,
    stride: usize,
    data: Vec<T>,
}

impl<T: Real> TransposedTile<T> {
    /// An empty tile for rows of `hd` elements, holding up to `cap` rows without reallocating.
    pub(crate) fn new(hd: usize, cap: usize) -> Self {
        TransposedTile {
            keys: 0..0,
            hd,
            stride: 0,
            data: Vec::with_capacity(hd * cap.next_multiple_of(LANES)),
        }
    }

    /// Loads rows `keys` of `rows` (`[t, hd]` row-major).
    pub(crate) fn load(&mut self, rows: &[T], keys: Range<usize>) {
        let (hd, stride) = (self.hd, keys.len().next_multiple_of(LANES));
        self.data.clear();
        self.data.resize(hd * stride, T::ZERO);
        for (c, row) in rows[keys.start * hd..keys.end * hd].chunks(hd).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                self.data[d * stride + c] = x;
            }
        }
        self.keys = keys;
        self.stride = stride;
    }

    /// The absolute row indices the tile holds.
    pub(crate) fn keys(&self) -> &Range<usize> {
        &self.keys
    }

    /// `out[r * width + c] = Σ_d (alpha * xs[r]_d) k_(keys.start + c),d` for the tile-local
    /// indices `local` and each of the [`ROWS`] query rows `xs` (`width = out.len() / ROWS`,
    /// at least `local.end`; other entries untouched). Every sum runs over `d` in order from
    /// zero, so a row's scores are the same bits whichever rows share its pass.
    #[inline(always)]
    pub(crate) fn dots_rows(&self, xs: [&[T]; ROWS], alpha: T, local: Range<usize>, out: &mut [T]) {
        tile_dots_rows(&self.data, self.stride, self.hd, xs, alpha, local, out);
    }

    /// `out[c - local.start] = alpha * (Σ_d x_d k_(keys.start + c),d)` for the tile-local
    /// indices `local`, each dot product summed over `d` in order from zero before the one
    /// multiplication by `alpha` (`out`: `local.len()` long). The decoding engine's paged
    /// attention computes its scores in exactly this order.
    #[inline(always)]
    pub(crate) fn dots_then_scale(&self, x: &[T], alpha: T, local: Range<usize>, out: &mut [T]) {
        tile_dots_then_scale(&self.data, self.stride, self.hd, x, alpha, local, out);
    }
}

/// The loops of [`TransposedTile::dots_then_scale`] (sums first, one multiplication by
/// `alpha` after), in whole chunks of [`LANES`] keys (the zero columns of the stride fill
/// the last chunk; their sums are never written out). Each key's sum runs over `d` in order
/// whatever the chunking, and the clones for AVX-512 and AVX2+FMA do the same arithmetic in
/// wider or narrower vectors (Rust never fuses the multiply and the add), so every clone
/// gives the same bits.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn tile_dots_then_scale<T: Real>(
    data: &[T],
    stride: usize,
    hd: usize,
    x: &[T],
    alpha: T,
    local: Range<usize>,
    out: &mut [T],
) {
    let mut start = local.start / LANES * LANES;
    while start < local.end {
        // One chunk at a time: a fixed-size accumulator stays in registers across `d`.
        let mut acc = [T::ZERO; LANES];
        for (d, &xd) in x.iter().enumerate().take(hd) {
            let col = &data[d * stride + start..d * stride + start + LANES];
            for (o, &k) in acc.iter_mut().zip(col) {
                *o += xd * k;
            }
        }
        acc.iter_mut().for_each(|o| *o *= alpha);
        let keys = start.max(local.start)..(start + LANES).min(local.end);
        out[keys.start - local.start..keys.end - local.start]
            .copy_from_slice(&acc[keys.start - start..keys.end - start]);
        start += LANES;
    }
}

/// The loops of [`TransposedTile::dots_rows`]: pairs of [`LANES`]-key chunks while the stride
/// holds two, then single chunks; each `x_d` scaled by `alpha` before its products. Each key's
/// sum runs over `d` in order whatever the chunking and grouping, and every clone does the
/// same arithmetic (Rust never fuses the multiply and the add): the same bits everywhere.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn tile_dots_rows<T: Real>(
    data: &[T],
    stride: usize,
    hd: usize,
    xs: [&[T]; ROWS],
    alpha: T,
    local: Range<usize>,
    out: &mut [T],
) {
    let width = out.len() / ROWS;
    assert!(local.end <= width && xs.iter().all(|x| x.len() >= hd));
    let xs = xs.map(|x| &x[..hd]);
    let mut start = local.start / LANES * LANES;
    while start < local.end {
        if start + LANES < local.end && start + 2 * LANES <= stride {
            let acc = chunk_sums::<T, { 2 * LANES }>(data, stride, &xs, alpha, start);
            store_rows(&acc, start, &local, out, width);
            start += 2 * LANES;
        } else {
            let acc = chunk_sums::<T, LANES>(data, stride, &xs, alpha, start);
            store_rows(&acc, start, &local, out, width);
            start += LANES;
        }
    }
}

/// The sums of keys `start..start + W` (tile-local) for every row: `ROWS × W / LANES`
/// independent vector accumulators, each summed over `d` in order.
#[inline(always)]
fn chunk_sums<T: Real, const W: usize>(
    data: &[T],
    stride: usize,
    xs: &[&[T]; ROWS],
    alpha: T,
    start: usize,
) -> [[T; W]; ROWS] {
    let mut acc = [[T::ZERO; W]; ROWS];
    for (d, col) in data.chunks_exact(stride).take(xs[0].len()).enumerate() {
        let col = &col[start..start + W];
        for (acc, x) in acc.iter_mut().zip(xs) {
            let a = alpha * x[d];
            for (o, &k) in acc.iter_mut().zip(col) {
                *o += a * k;
            }
        }
    }
    acc
}

/// Writes the keys of `local` among `start..start + W` of each row's sums into its block of
/// `out` (`width` entries per row).
#[inline(always)]
fn store_rows<T: Real, const W: usize>(
    acc: &[[T; W]; ROWS],
    start: usize,
    local: &Range<usize>,
    out: &mut [T],
    width: usize,
) {
    let keys = start.max(local.start)..(start + W).min(local.end);
    for (acc, out) in acc.iter().zip(out.chunks_exact_mut(width)) {
        out[keys.clone()].copy_from_slice(&acc[keys.start - start..keys.end - start]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_together_give_the_bits_of_each_row_summed_in_order() {
        let (t, hd) = (75, 13);
        let rows: Vec<f32> = (0..t * hd)
            .map(|i| ((i * 37) % 101) as f32 * 0.013 - 0.6)
            .collect();
        let xs: Vec<Vec<f32>> = (0..ROWS)
            .map(|r| {
                (0..hd)
                    .map(|d| ((d * 7 + r * 3) % 17) as f32 * 0.11 - 0.9)
                    .collect()
            })
            .collect();
        let mut tile = TransposedTile::new(hd, 64);
        tile.load(&rows, 5..69);
        let width = 70;
        for local in [0..64, 3..41, 17..18, 31..33, 40..64] {
            let mut got = vec![f32::NAN; ROWS * width];
            let x = [&xs[0][..], &xs[1][..], &xs[2][..], &xs[3][..]];
            tile.dots_rows(x, 0.37, local.clone(), &mut got);
            for (r, got) in got.chunks(width).enumerate() {
                for (c, &got) in got.iter().enumerate() {
                    if !local.contains(&c) {
                        assert!(got.is_nan(), "row {r} key {c} outside {local:?} written");
                        continue;
                    }
                    let key = &rows[(5 + c) * hd..(6 + c) * hd];
                    let want = (0..hd).fold(0.0f32, |s, d| s + (0.37 * xs[r][d]) * key[d]);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "row {r} key {c} of {local:?}"
                    );
                }
            }
        }
    }
}
