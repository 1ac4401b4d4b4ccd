//! The differentiable exchange of token rows between expert-parallel ranks: a candle custom
//! op whose forward is an all-to-all of row blocks and whose backward is the reverse
//! all-to-all of their gradients. Dispatch (tokens to the experts' owners) and combine
//! (expert outputs back to the tokens' ranks) are the same op with the counts swapped.
//!
//! Every rank's autograd graph holds one exchange per dispatch and per combine, in the same
//! layer order, and each sits on the chain from one layer to the next, so backward reaches
//! them in the same order on every rank (combine, then dispatch, last layer first). A rank
//! with no rows to send or receive still runs every exchange. CPU only, f32 or f64 (the
//! exchange itself carries f32).

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use oxalign_kernels::collective::Collective;
use std::sync::Arc;

/// Sends rows of `x` `[Σ send, C]` (the first `send[0]` rows to rank 0, the next `send[1]`
/// to rank 1, ...) and returns the rows received `[Σ recv, C]`, rank 0's first (`recv[s]`:
/// the rows rank `s` sends here). Differentiable: the gradient travels back the same way.
pub(crate) fn exchange_rows(
    comm: &Arc<dyn Collective>,
    x: &Tensor,
    send: &[usize],
    recv: &[usize],
) -> Result<Tensor> {
    let (rows, cols) = x.dims2()?;
    if rows != send.iter().sum::<usize>() || send.len() != comm.world_size() {
        candle_core::bail!(
            "expert exchange: {rows} rows to send, counts {send:?} for a group of {}",
            comm.world_size()
        )
    }
    x.contiguous()?.apply_op1(RowExchange {
        comm: comm.clone(),
        send: send.to_vec(),
        recv: recv.to_vec(),
        cols,
    })
}

/// The exchange op: `send` rows out per rank, `recv` rows in per rank, `cols` wide.
struct RowExchange {
    comm: Arc<dyn Collective>,
    send: Vec<usize>,
    recv: Vec<usize>,
    cols: usize,
}

impl RowExchange {
    /// Cuts `data` (rows of `cols`) into blocks of `counts` rows, exchanges them and joins
    /// what arrives; errors unless every peer sent `expect[s]` rows.
    fn run(&self, data: &[f32], counts: &[usize], expect: &[usize]) -> Result<Vec<f32>> {
        let mut blocks = Vec::with_capacity(counts.len());
        let mut at = 0;
        for &n in counts {
            blocks.push(data[at..at + n * self.cols].to_vec());
            at += n * self.cols;
        }
        let got = self
            .comm
            .all_to_all_f32(blocks)
            .map_err(candle_core::Error::wrap)?;
        let mut out = Vec::with_capacity(expect.iter().sum::<usize>() * self.cols);
        for (s, (block, &n)) in got.iter().zip(expect).enumerate() {
            if block.len() != n * self.cols {
                candle_core::bail!(
                    "expert exchange: rank {s} sent {} values, expected {n} rows of {}",
                    block.len(),
                    self.cols
                )
            }
            out.extend_from_slice(block);
        }
        Ok(out)
    }
}

impl CustomOp1 for RowExchange {
    fn name(&self) -> &'static str {
        "expert-row-exchange"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("expert exchange: input must be contiguous")
        };
        let rows: usize = self.recv.iter().sum();
        let shape = Shape::from((rows, self.cols));
        let out = match storage {
            CpuStorage::F32(v) => {
                CpuStorage::F32(self.run(&v[start..end], &self.send, &self.recv)?)
            }
            CpuStorage::F64(v) => {
                let host: Vec<f32> = v[start..end].iter().map(|&x| x as f32).collect();
                let got = self.run(&host, &self.send, &self.recv)?;
                CpuStorage::F64(got.into_iter().map(f64::from).collect())
            }
            _ => candle_core::bail!("expert exchange: only f32 and f64 rows are exchanged"),
        };
        Ok((out, shape))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let host = grad_res
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        // Reverse direction: the rows that came in go back to where they came from.
        let back = self.run(&host, &self.recv, &self.send)?;
        let rows = self.send.iter().sum::<usize>();
        let g = Tensor::from_vec(back, (rows, self.cols), arg.device())?.to_dtype(arg.dtype())?;
        Ok(Some(g))
    }
}
