//! Int8 linear: exactness of the integer path, bit-identity of the two kernels, and the
//! quantization error against the f32 product.

use super::int8_linear::{panel_portable, quantize_rows, GROUP, PANEL};
use super::*;

pub(super) fn lcg(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The same product from the dequantized weight and activations, in f64.
fn reference(w: &Int8Weight, x: &[f32], rows: usize) -> Vec<f64> {
    let wd = w.dequantize();
    let (k, n) = (w.in_dim(), w.out_dim());
    let pad = k.div_ceil(GROUP) * GROUP;
    let xq = quantize_rows(x, rows, k, pad);
    let mut out = vec![0f64; rows * n];
    for m in 0..rows {
        for j in 0..n {
            let mut s = 0f64;
            for i in 0..k {
                let xv = (xq.bytes[m * pad + i] as i32 - 128) as f64 * xq.scales[m] as f64;
                s += xv * wd[j * k + i] as f64;
            }
            out[m * n + j] = s;
        }
    }
    out
}

#[test]
fn matmul_equals_dequantized_product() {
    for &(rows, k, n) in &[
        (1, 64, 16),
        (3, 70, 37),
        (9, 128, 48),
        (17, 36, 5),
        (70, 36, 20),
    ] {
        let w = Int8Weight::quantize(&lcg(n * k, 1), n, k);
        let x = lcg(rows * k, 2);
        let bias = lcg(n, 3);
        let mut out = vec![0f32; rows * n];
        w.matmul(&x, rows, Some(&bias), &mut out);
        let want = reference(&w, &x, rows);
        for i in 0..rows * n {
            let expect = want[i] + bias[i % n] as f64;
            assert!(
                (out[i] as f64 - expect).abs() < 1e-4,
                "({rows},{k},{n}) at {i}: {} vs {expect}",
                out[i]
            );
        }
    }
}

#[test]
fn vnni_and_portable_kernels_agree_bit_for_bit() {
    if !int8_uses_vnni() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let (rows, k, n) = (13, 260, 16);
    let w = Int8Weight::quantize(&lcg(n * k, 4), n, k);
    let pad = k.div_ceil(GROUP) * GROUP;
    let xq = quantize_rows(&lcg(rows * k, 5), rows, k, pad);
    // One panel (16 channels): compare the raw i32 accumulators of both kernels.
    let panel_len = pad / GROUP * PANEL * GROUP;
    let wp = w.packed_for_tests()[..panel_len].to_vec();
    let mut a = vec![0i32; rows * PANEL];
    let mut b = vec![0i32; rows * PANEL];
    panel_portable(&xq.bytes, rows, pad, &wp, &mut a);
    super::int8_vnni::panel(&xq.bytes, rows, pad, &wp, &mut b);
    assert_eq!(a, b);
}

/// The AVX2 kernel's centred sums plus the weight's offset term are the portable kernel's
/// sums, bit for bit, including the extreme products (|w| = 127 against u = 1 and 255) that
/// would saturate `vpmaddubsw` on uncentred bytes.
#[test]
fn avx2_and_portable_kernels_agree_bit_for_bit() {
    if !super::int8_avx2::available() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let (rows, k, n) = (13, 260, 16);
    let mut wf = lcg(n * k, 4);
    wf[..k].iter_mut().for_each(|v| *v = 1.0); // a row quantized to all +127
    let w = Int8Weight::quantize(&wf, n, k);
    let pad = k.div_ceil(GROUP) * GROUP;
    let mut x = lcg(rows * k, 5);
    x[..k]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i % 2 == 0 { 1.0 } else { -1.0 });
    let xq = quantize_rows(&x, rows, k, pad);
    let panel_len = pad / GROUP * PANEL * GROUP;
    let wp = w.packed_for_tests()[..panel_len].to_vec();
    let mut a = vec![0i32; rows * PANEL];
    let mut b = vec![0i32; rows * PANEL];
    panel_portable(&xq.bytes, rows, pad, &wp, &mut a);
    super::int8_avx2::panel_centred(&xq.bytes, rows, pad, &wp, &mut b);
    for lane in 0..PANEL {
        let offset: i32 = (0..pad / GROUP)
            .map(|g| {
                (0..GROUP)
                    .map(|j| wp[g * PANEL * GROUP + lane * GROUP + j] as i32)
                    .sum::<i32>()
            })
            .sum::<i32>()
            * 128;
        for r in 0..rows {
            assert_eq!(
                a[r * PANEL + lane],
                b[r * PANEL + lane] + offset,
                "row {r} lane {lane}"
            );
        }
    }
}

#[test]
fn quantization_error_is_small_against_f32() {
    let (rows, k, n) = (8, 512, 64);
    let wf = lcg(n * k, 6);
    let x = lcg(rows * k, 7);
    let w = Int8Weight::quantize(&wf, n, k);
    let mut out = vec![0f32; rows * n];
    w.matmul(&x, rows, None, &mut out);
    let mut err = 0f64;
    let mut norm = 0f64;
    for m in 0..rows {
        for j in 0..n {
            let exact: f64 = (0..k)
                .map(|i| x[m * k + i] as f64 * wf[j * k + i] as f64)
                .sum();
            err += (out[m * n + j] as f64 - exact).powi(2);
            norm += exact * exact;
        }
    }
    let rel = (err / norm).sqrt();
    assert!(rel < 0.02, "relative error {rel}");
}

#[test]
fn zero_rows_and_zero_weight() {
    let w = Int8Weight::quantize(&vec![0.0; 16 * 8], 16, 8);
    let mut out = vec![1f32; 2 * 16];
    w.matmul(&[0.0; 16], 2, None, &mut out);
    assert!(out.iter().all(|&v| v == 0.0));
    w.matmul(&[], 0, None, &mut []);
}

mod packed {
    use super::super::packed::PanelKernel;
    use super::super::{PackedBf16Weight, PackedF32Weight};
    use super::lcg;
    use half::bf16;

    fn exact(w: &[f32], x: &[f32], rows: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0f64; rows * n];
        for m in 0..rows {
            for j in 0..n {
                out[m * n + j] = (0..k)
                    .map(|i| x[m * k + i] as f64 * w[j * k + i] as f64)
                    .sum();
            }
        }
        out
    }

    fn kernels() -> Vec<PanelKernel> {
        let mut kernels = vec![PanelKernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(PanelKernel::Avx512);
            }
            if super::super::packed_bf16dot::available() {
                kernels.push(PanelKernel::Avx512Bf16Dot);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                kernels.push(PanelKernel::Avx2);
            }
        }
        eprintln!("kernels tested: {kernels:?}");
        kernels
    }

    /// Rows beyond one 64-row block, channels not a multiple of 32, odd inner sizes; 8 and 32
    /// rows (a decode batch) end in the AVX2 kernel's two blocks of 4.
    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 7, 3),
        (9, 64, 40),
        (70, 33, 65),
        (13, 512, 96),
        (8, 40, 33),
        (32, 65, 70),
    ];

    #[test]
    fn every_kernel_matches_the_f64_product() {
        for &(rows, k, n) in &SHAPES {
            let w = lcg(n * k, 11);
            let x = lcg(rows * k, 12);
            let bias = lcg(n, 13);
            let packed = PackedF32Weight::pack(&w, n, k);
            let want = exact(&w, &x, rows, k, n);
            for kernel in kernels() {
                let mut out = vec![f32::NAN; rows * n];
                packed.matmul_with(kernel, &x, rows, Some(&bias), &mut out);
                for i in 0..rows * n {
                    let e = want[i] + bias[i % n] as f64;
                    let tol = 1e-5 * (1.0 + e.abs()) * (k as f64).sqrt();
                    assert!(
                        (out[i] as f64 - e).abs() < tol,
                        "{kernel:?} ({rows},{k},{n}) at {i}: {} vs {e}",
                        out[i]
                    );
                }
            }
        }
    }

    /// A bf16 weight is the f32 kernel on the bf16-rounded weight, bit for bit on every
    /// register kernel that keeps f32 activations, and takes half the bytes.
    #[test]
    fn a_bf16_weight_equals_the_f32_kernel_on_its_rounded_values() {
        for &(rows, k, n) in &SHAPES {
            let w = lcg(n * k, 21);
            let rounded: Vec<f32> = w.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
            assert!(w.iter().zip(&rounded).any(|(a, b)| a != b));
            let x = lcg(rows * k, 22);
            let bias = lcg(n, 23);
            let b16 = PackedBf16Weight::pack(&w, n, k);
            let f32w = PackedF32Weight::pack(&rounded, n, k);
            assert_eq!(2 * b16.bytes(), f32w.bytes());
            for kernel in kernels() {
                if kernel == PanelKernel::Avx512Bf16Dot {
                    continue; // rounds the activations too: `the_bf16_dot_kernel_...`
                }
                let mut got = vec![f32::NAN; rows * n];
                let mut want = vec![f32::NAN; rows * n];
                b16.matmul_with(kernel, &x, rows, Some(&bias), &mut got);
                f32w.matmul_with(kernel, &x, rows, Some(&bias), &mut want);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{kernel:?} ({rows},{k},{n}) differs from f32 on rounded weights"
                );
            }
        }
    }

    /// On a CPU with AVX-512 BF16 a bf16 weight multiplies bf16-rounded activations: the
    /// f64 product of both rounded operands, to f32 summation, on every shape.
    #[test]
    fn the_bf16_dot_kernel_multiplies_bf16_rounded_activations_and_weights() {
        if !kernels().contains(&PanelKernel::Avx512Bf16Dot) {
            eprintln!("no AVX-512 BF16 on this CPU: kernel not run");
            return;
        }
        let round =
            |v: &[f32]| -> Vec<f32> { v.iter().map(|&a| bf16::from_f32(a).to_f32()).collect() };
        for &(rows, k, n) in &SHAPES {
            let (w, x, bias) = (lcg(n * k, 41), lcg(rows * k, 42), lcg(n, 43));
            let want = exact(&round(&w), &round(&x), rows, k, n);
            let mut got = vec![f32::NAN; rows * n];
            let packed = PackedBf16Weight::pack(&w, n, k);
            packed.matmul_with(PanelKernel::Avx512Bf16Dot, &x, rows, Some(&bias), &mut got);
            for i in 0..rows * n {
                let e = want[i] + bias[i % n] as f64;
                let tol = 1e-5 * (1.0 + e.abs()) * (k as f64).sqrt();
                assert!(
                    (got[i] as f64 - e).abs() < tol,
                    "({rows},{k},{n}) at {i}: {} vs {e}",
                    got[i]
                );
            }
        }
    }

    /// bf16 keeps 8 bits of mantissa: with the weight (and, on the dot-product kernel, the
    /// activations) rounded, the product is within `(2^-8 + 2^-18) · Σ|x·w|` (plus f32 sums)
    /// of the exact one.
    #[test]
    fn a_bf16_product_is_within_its_rounding_bound() {
        let (rows, k, n) = (5, 256, 48);
        let w = lcg(n * k, 31);
        let x = lcg(rows * k, 32);
        let mut got = vec![0f32; rows * n];
        PackedBf16Weight::pack(&w, n, k).matmul(&x, rows, None, &mut got);
        let want = exact(&w, &x, rows, k, n);
        for m in 0..rows {
            for j in 0..n {
                let abs: f64 = (0..k)
                    .map(|i| (x[m * k + i] as f64 * w[j * k + i] as f64).abs())
                    .sum();
                let err = (got[m * n + j] as f64 - want[m * n + j]).abs();
                let bound = abs * (1.0 / 256.0 + 1.0 / 262144.0);
                assert!(err <= bound + 1e-5, "({m},{j}): err {err}, bound {bound}");
            }
        }
    }
}

/// Fake quantization gives a trainer the int8 layer's numbers: the weight rows equal
/// [`Int8Weight::dequantize`] bit for bit, and the f32 product of the fake-quantized input
/// and weight is the int8 matmul to f32 rounding (the engine's sums are exact integers).
#[test]
fn fake_quantized_rows_reproduce_the_int8_layer() {
    for &(rows, k, n) in &[(3, 70, 37), (17, 64, 48), (1, 36, 5)] {
        let w = lcg(n * k, 11);
        let x = lcg(rows * k, 12);
        let q = Int8Weight::quantize(&w, n, k);
        let mut wf = w.clone();
        fake_quantize_rows(&mut wf, k, Int8Operand::Weight);
        assert_eq!(wf, q.dequantize(), "({rows},{k},{n}) weight rows");
        let mut xf = x.clone();
        fake_quantize_rows(&mut xf, k, Int8Operand::Input);
        let mut out = vec![0f32; rows * n];
        q.matmul(&x, rows, None, &mut out);
        for m in 0..rows {
            for j in 0..n {
                let s: f32 = (0..k).map(|i| xf[m * k + i] * wf[j * k + i]).sum();
                let got = out[m * n + j];
                assert!(
                    (s - got).abs() <= 1e-6 * got.abs().max(1.0),
                    "({rows},{k},{n}) at ({m},{j}): {s} vs {got}"
                );
            }
        }
    }
}
