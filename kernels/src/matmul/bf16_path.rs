//! Which bf16 GEMM path this CPU runs. Having an instruction is not enough: on the AMD EPYC
//! of docs/PERFORMANCE.md the `vdpbf16ps` tile multiplies at about 1.5x the f32 GEMM, while
//! on an Intel Xeon (AVX-512 BF16 at the f32 FMA's rate) an earlier build of it reached
//! 0.45x, below the rounded-f32 path. So when both paths run here, a short timing decides.

use std::time::{Duration, Instant};

use super::{gemm, Bf16Path, MatView, Numbers};

impl Bf16Path {
    /// The path this CPU runs: `OXALIGN_BF16_GEMM=avx512bf16` or `=rounded` when set (and
    /// available), else the faster of the available paths on a training-sized product
    /// (timed once, about 20 ms; see [`faster`]).
    pub fn detect() -> Bf16Path {
        let paths = Bf16Path::available();
        let tile = paths.contains(&Bf16Path::Avx512Bf16);
        match std::env::var("OXALIGN_BF16_GEMM").as_deref() {
            Ok("avx512bf16") if tile => return Bf16Path::Avx512Bf16,
            Ok("rounded") => return Bf16Path::RoundedF32,
            _ => {}
        }
        match tile {
            true => faster(Bf16Path::Avx512Bf16, Bf16Path::RoundedF32),
            false => Bf16Path::RoundedF32,
        }
    }

    /// Every path this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Bf16Path> {
        let mut paths = vec![Bf16Path::RoundedF32];
        #[cfg(target_arch = "x86_64")]
        if super::bf16_avx512::available() && super::bf16_pack_avx512::available() {
            paths.push(Bf16Path::Avx512Bf16);
        }
        paths
    }
}

/// The faster of `a` and `b` (ties to `a`) on the forward product of a 1024 × 1024 linear
/// layer over 256 rows, the shortest of 3 timed runs each after one untimed run.
fn faster(a: Bf16Path, b: Bf16Path) -> Bf16Path {
    let (rows, k, n) = (256, 1024, 1024);
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i % 251) as f32 - 125.0) / 125.0)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i % 241) as f32 - 120.0) / 960.0)
        .collect();
    let mut c = vec![0f32; rows * n];
    let mut time = |path: Bf16Path| -> Duration {
        let (xv, wv) = (
            MatView::row_major(&x, rows, k),
            MatView::row_major(&w, n, k),
        );
        gemm(Numbers::Bf16(path), xv, wv.t(), &mut c);
        (0..3)
            .map(|_| {
                let t0 = Instant::now();
                gemm(Numbers::Bf16(path), xv, wv.t(), &mut c);
                t0.elapsed()
            })
            .min()
            .unwrap_or_default()
    };
    let (ta, tb) = (time(a), time(b));
    match ta <= tb {
        true => a,
        false => b,
    }
}
