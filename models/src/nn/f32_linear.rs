//! A linear layer the int8 engine keeps in f32 (an MoE router, a shared expert's gate) as
//! the trainer computes it: under [`Precision::FakeInt8`] with the engine's own f32 kernel
//! ([`PackedF32Weight`], packed per call), so the router logits are the engine's bits and
//! the experts and weights that follow cannot differ on one side only; under
//! [`Precision::F32`] and [`Precision::Bf16Mixed`] (routers stay f32) the plain
//! [`crate::nn::layers::linear`]. The gradients are a linear layer's: `∂x = ∂y · W`,
//! `∂W = ∂yᵀ · x`. CPU (host) only in the engine's numbers.

use crate::nn::fake_quant::{host_linear, linear_grads};
use crate::nn::precision::Precision;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use oxalign_kernels::linear::PackedF32Weight;

/// `x · Wᵀ`, `x` `[rows, in]`, `W` `[out, in]` -> `[rows, out]`, in `precision`'s numbers.
pub(crate) fn f32_linear(x: &Tensor, weight: &Tensor, precision: Precision) -> Result<Tensor> {
    match precision {
        Precision::F32 | Precision::Bf16Mixed => crate::nn::layers::linear(x, weight, None),
        Precision::FakeInt8 => x
            .contiguous()?
            .apply_op2(&weight.contiguous()?, PackedLinear),
    }
}

/// The op behind [`f32_linear`] in the engine's numbers.
struct PackedLinear;

impl CustomOp2 for PackedLinear {
    fn name(&self) -> &'static str {
        "engine-f32-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        host_linear(
            "f32 linear",
            (xs, xl),
            (ws, wl),
            |w, x, (rows, out_dim, in_dim), y| {
                PackedF32Weight::pack(w, out_dim, in_dim).matmul(x, rows, None, y)
            },
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        linear_grads(grad, x, w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The forward is the engine kernel's bits, and the gradients equal the plain linear
    /// layer's.
    #[test]
    fn the_router_linear_runs_the_engine_kernel_with_a_linear_layers_gradients() {
        let dev = Device::Cpu;
        let (rows, k, n) = (7, 48, 5);
        let xv: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
            .collect();
        let wv: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32) / 40.0 - 1.2)
            .collect();
        let x = Var::from_vec(xv.clone(), (rows, k), &dev).unwrap();
        let w = Var::from_vec(wv.clone(), (n, k), &dev).unwrap();
        let y = f32_linear(&x, &w, Precision::FakeInt8).unwrap();
        let mut want = vec![0f32; rows * n];
        PackedF32Weight::pack(&wv, n, k).matmul(&xv, rows, None, &mut want);
        let got: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));

        let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let plain = f32_linear(&x, &w, Precision::F32).unwrap();
        let pg = plain.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&x, &w] {
            let a: Vec<f32> = g.get(v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let b: Vec<f32> = pg.get(v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let worst = a
                .iter()
                .zip(&b)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-3, "gradient differs by {worst}");
        }
    }
}
