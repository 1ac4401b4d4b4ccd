//! The f32 GEMM and every bf16 GEMM path against an f64 product of the bf16-rounded operands, over shapes
//! that cut every block and tile edge and over transposed (strided) views.

use super::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503);
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// The f64 product of the bf16-rounded views, and the sum of |a||b| per element (the scale
/// of the f32 rounding error).
fn reference(a: MatView, b: MatView) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut want = vec![0f64; m * n];
    let mut scale = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let p = round_to_bf16(a.at(i, kk)) as f64 * round_to_bf16(b.at(kk, j)) as f64;
                want[i * n + j] += p;
                scale[i * n + j] += p.abs();
            }
        }
    }
    (want, scale)
}

fn check(path: Bf16Path, a: MatView, b: MatView) {
    let mut c = vec![f32::NAN; a.rows * b.cols];
    gemm(Numbers::Bf16(path), a, b, &mut c);
    let (want, scale) = reference(a, b);
    for (idx, ((&got, &w), &s)) in c.iter().zip(&want).zip(&scale).enumerate() {
        let err = (got as f64 - w).abs();
        assert!(
            err <= 1e-6 * s + 1e-30,
            "{path:?} m={} k={} n={} at {idx}: got {got}, want {w} (scale {s})",
            a.rows,
            a.cols,
            b.cols
        );
    }
}

#[test]
fn every_path_multiplies_bf16_rounded_operands_with_f32_sums() {
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (13, 257, 33),
        (25, 300, 65),
        (100, 40, 31),
    ];
    for path in Bf16Path::available() {
        for &(m, k, n) in &shapes {
            let ad = values(m * k, 1);
            let bd = values(k * n, 2);
            let a = MatView::row_major(&ad, m, k);
            let b = MatView::row_major(&bd, k, n);
            check(path, a, b);
            // The linear layer's three products: x·Wᵀ, ∂y·W, ∂yᵀ·x (strided views).
            let wd = values(n * k, 3);
            check(path, a, MatView::row_major(&wd, n, k).t());
            let gd = values(k * m, 4);
            check(path, MatView::row_major(&gd, k, m).t(), b);
        }
    }
}

#[test]
fn an_empty_inner_dimension_gives_zeros() {
    for path in Bf16Path::available() {
        let mut c = vec![f32::NAN; 6];
        gemm(
            Numbers::Bf16(path),
            MatView::row_major(&[], 2, 0),
            MatView::row_major(&[], 0, 3),
            &mut c,
        );
        assert_eq!(c, vec![0.0; 6]);
    }
}

/// The rounding is to nearest, ties to even, as `torch.bfloat16` rounds.
#[test]
fn rounding_is_to_nearest_even() {
    assert_eq!(round_to_bf16(1.0 + 1.0 / 256.0), 1.0); // tie: down to even
    assert_eq!(round_to_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0); // tie: up to even
    assert_eq!(round_to_bf16(1.0 + 1.5 / 256.0), 1.0 + 2.0 / 256.0);
}

/// The branch-free rounding gives `half::bf16::from_f32`'s bits for every kind of f32: ties,
/// the largest finite values (to infinity), infinities, subnormals, signed zeros and NaNs
/// (quieted), and a stride through all 2^32 bit patterns.
#[test]
fn rounding_matches_the_half_crate_bit_for_bit() {
    let edges = [
        0u32,
        0x8000_0000,
        0x0000_0001,
        0x0000_8000,
        0x0001_8000,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_8001,
        0x7f7f_ffff,
        0xff7f_ffff,
        0x7f7f_7fff,
        0x7f80_0000,
        0xff80_0000,
        0x7f80_0001,
        0xff80_0001,
        0x7fc0_0000,
        0x7fbf_ffff,
        0xffff_ffff,
    ];
    let stride = (0..=u32::MAX).step_by(65_521);
    for bits in edges.into_iter().chain(stride) {
        let v = f32::from_bits(bits);
        let want = half::bf16::from_f32(v).to_bits();
        assert_eq!(bf16_bits(v), want, "bits {bits:#010x}");
        assert_eq!(
            round_to_bf16(v).to_bits(),
            (want as u32) << 16,
            "bits {bits:#010x}"
        );
    }
}

/// The f32 GEMM reads transposed views in place and sums like an f64 product.
#[test]
fn the_f32_gemm_reads_strided_views() {
    let (m, k, n) = (9, 33, 17);
    let ad = values(m * k, 5);
    let wd = values(n * k, 6);
    let a = MatView::row_major(&ad, m, k);
    let b = MatView::row_major(&wd, n, k).t();
    let mut c = vec![f32::NAN; m * n];
    gemm(Numbers::F32, a, b, &mut c);
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|kk| a.at(i, kk) as f64 * b.at(kk, j) as f64)
                .sum();
            assert!((c[i * n + j] as f64 - want).abs() < 1e-5, "({i}, {j})");
        }
    }
}

/// The packers round exactly as `half` does, special values included, on every layout.
#[cfg(target_arch = "x86_64")]
#[test]
fn packing_rounds_every_value_as_half_does() {
    use super::bf16_pack::{pack_a, pack_b, MR, NR};
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        1e-40,
        -3e-39,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(0x3f80_8001),
    ];
    let (k, n) = (37, 41);
    let data: Vec<f32> = values(k * n, 9)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if i % 3 == 0 {
                special[(i / 3) % special.len()]
            } else {
                v
            }
        })
        .collect();
    let row_major = MatView::row_major(&data, k, n);
    let transposed = MatView::row_major(&data, n, k).t();
    let pairs = k.div_ceil(2);
    let want = |m: &MatView, kk: usize, j: usize| -> u32 {
        let hi = if kk + 1 < k {
            bf16_bits(m.at(kk + 1, j))
        } else {
            0
        };
        bf16_bits(m.at(kk, j)) as u32 | (hi as u32) << 16
    };
    for b in [row_major, transposed] {
        let mut out = Vec::new();
        pack_b(b, &mut out);
        for p in 0..pairs {
            for j in 0..n {
                let got = out[(j / NR) * pairs * NR + p * NR + j % NR];
                assert_eq!(got, want(&b, 2 * p, j), "B pair {p} column {j}");
            }
        }
        // The same matrix as `A` ([n, k]): rows 3.. of it, pairs 2.. in tiles of MR.
        let a = b.t();
        let (row0, rows, p0, pn) = (3, n - 3, 2, pairs - 2);
        let mut tiles = vec![u32::MAX; rows.div_ceil(MR) * pn * MR];
        pack_a(a, row0, rows, p0, pn, &mut tiles);
        for (idx, &got) in tiles.iter().enumerate() {
            let (t, p, i) = (idx / (pn * MR), idx / MR % pn, idx % MR);
            let r = t * MR + i;
            let expect = if r < rows {
                want(&b, 2 * (p0 + p), row0 + r)
            } else {
                0
            };
            assert_eq!(got, expect, "A tile {t} pair {p} lane {i}");
        }
    }
}

/// An operand rounded once ([`RoundedOperand`]) and marked exact gives the same bits as the
/// product that rounds it itself, on every path, transposed views included; on the portable
/// path the mark is what skips the rounding (an unrounded operand marked exact is multiplied
/// as it is).
#[test]
fn a_marked_operand_is_multiplied_in_place() {
    let (m, k, n) = (37, 70, 29);
    let ad = values(k * m, 11);
    let bd = values(k * n, 12);
    let a = MatView::row_major(&ad, k, m).t();
    let b = MatView::row_major(&bd, k, n);
    for path in Bf16Path::available() {
        let numbers = Numbers::Bf16(path);
        let once = RoundedOperand::new(numbers, a);
        let (mut plain, mut marked) = (vec![0f32; m * n], vec![0f32; m * n]);
        gemm(numbers, a, b, &mut plain);
        gemm_marked(
            numbers,
            once.view(),
            b,
            &mut marked,
            [once.bf16_exact(), false],
        );
        let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain), bits(&marked), "{path:?}");
        assert_eq!(once.bf16_exact(), path == Bf16Path::RoundedF32, "{path:?}");
    }
    let portable = Numbers::Bf16(Bf16Path::RoundedF32);
    let (mut unrounded, mut f32_product) = (vec![0f32; m * n], vec![0f32; m * n]);
    gemm_marked(portable, a, b, &mut unrounded, [true, true]);
    gemm(Numbers::F32, a, b, &mut f32_product);
    assert_eq!(unrounded, f32_product);
}
