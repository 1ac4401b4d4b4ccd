//! [`ExpertWeights`]: one SiLU-gated expert of the engine's sparse block and its forward
//! over the rows routed to it.

use crate::engine::linear::Linear;
use candle_core::Result;
use oxalign_kernels::ops::rows;
use rayon::prelude::*;

/// One SiLU-gated expert: fused `[gate; up]` `[2I, H]` and `down` `[H, I]`.
#[derive(Clone, Debug)]
pub(crate) struct ExpertWeights {
    pub gate_up: Linear,
    pub down: Linear,
    pub inter: usize,
}

impl ExpertWeights {
    /// `x` `[rows, H]` -> `[rows, H]`.
    pub(crate) fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let gu = self.gate_up.forward_host(x, n)?;
        let inter = self.inter;
        let mut act = vec![0f32; n * inter];
        act.par_chunks_mut(inter * 8)
            .zip(gu.par_chunks(2 * inter * 8))
            .for_each(|(a, g)| rows::silu_mul_rows(g, inter, a));
        self.down.forward_host(&act, n)
    }
}
