use oxalign_kernels::linear::PackedF32Weight;
use std::time::Instant;
fn main() {
    for &(m, k, n) in &[(32usize, 512usize, 1024usize), (32, 512, 2816), (32, 1408, 512), (32, 512, 512), (32, 512, 32000), (64, 512, 32000)] {
        let w: Vec<f32> = (0..n * k).map(|i| ((i % 97) as f32) * 0.01).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i % 89) as f32) * 0.01).collect();
        let p = PackedF32Weight::pack(&w, n, k);
        let mut out = vec![0f32; m * n];
        let mut best = f64::MAX;
        for _ in 0..30 {
            let t = Instant::now();
            p.matmul(&x, m, None, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{m}x{k}x{n}: {:.3} ms, {:.1} GFLOP/s, weights {:.1} GB/s", best * 1e3, 2.0 * (m * k * n) as f64 / best / 1e9, (n*k*4) as f64 / best / 1e9);
    }
}
