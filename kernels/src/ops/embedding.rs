//! The token-embedding lookup whose backward hands the table's gradient to a
//! [`GradientSink`]. Candle's own lookup (`index_select`) builds the gradient as
//! `zeros_like(table).index_add(..)`, copying the whole `[V, H]` table of zeros and touching
//! every page of it, and then accumulates it as `zeros + grad` at the end of the backward,
//! when every weight gradient is alive. Here the gradient is one fresh zeroed buffer
//! (`calloc`: its pages stay unmapped until written) into which each token's row is added,
//! so only the rows of tokens in the batch occupy memory, and a sink takes it as it is.
//! CPU, f32 and f64; other devices and dtypes use `index_select`.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType};

use super::cpu_math::contiguous_slice;
use super::gradient_sink::GradientSink;
use super::validate;

const OP: &str = "embedding";

/// Rows `ids` `[...]` of `table` `[V, H]`: `[..., H]`, differentiable in `table`. With a
/// `sink`, the backward hands the table's gradient to it (see the module docs).
pub fn embedding(
    table: &Tensor,
    ids: &Tensor,
    sink: Option<Arc<dyn GradientSink>>,
) -> Result<Tensor> {
    let (v, h) = table.dims2()?;
    let mut out_dims = ids.dims().to_vec();
    out_dims.push(h);
    let ids = validate::token_ids(OP, "ids", ids)?
        .flatten_all()?
        .contiguous()?;
    let fused = table.device().is_cpu() && matches!(table.dtype(), DType::F32 | DType::F64);
    let rows = match sink {
        Some(sink) if fused => {
            let op = Lookup { vocab: v, sink };
            table.contiguous()?.apply_op2(&ids, op)?
        }
        _ => table.index_select(&ids, 0)?,
    };
    rows.reshape(out_dims)
}

/// `(table [V, H], ids [N]) -> [N, H]`.
struct Lookup {
    vocab: usize,
    sink: Arc<dyn GradientSink>,
}

fn gather<T: WithDType>(table: &[T], ids: &[u32], h: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(ids.len() * h);
    for &id in ids {
        let at = id as usize * h;
        out.extend_from_slice(&table[at..at + h]);
    }
    out
}

/// `Σ_i e_{ids[i]} ⊗ grad[i]` as `[V, H]`, in a buffer whose untouched rows are never
/// written.
fn scatter_add<T: WithDType + std::ops::AddAssign>(
    grad: &[T],
    ids: &[u32],
    (v, h): (usize, usize),
) -> Vec<T> {
    let mut out = vec![T::zero(); v * h];
    for (row, &id) in grad.chunks_exact(h).zip(ids) {
        let at = id as usize * h;
        for (o, g) in out[at..at + h].iter_mut().zip(row) {
            *o += *g;
        }
    }
    out
}

impl CustomOp2 for Lookup {
    fn name(&self) -> &'static str {
        "embedding"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, h) = l1.shape().dims2()?;
        let ids = contiguous_slice::<u32>(s2, l2, OP, "ids")?;
        validate::targets_in_vocab(OP, ids, self.vocab)?;
        let out = match s1 {
            CpuStorage::F32(_) => {
                CpuStorage::F32(gather(contiguous_slice(s1, l1, OP, "table")?, ids, h))
            }
            CpuStorage::F64(_) => {
                CpuStorage::F64(gather(contiguous_slice(s1, l1, OP, "table")?, ids, h))
            }
            other => validate::unsupported_cpu_dtype(OP, other)?,
        };
        Ok((out, Shape::from((ids.len(), h))))
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dw = match table.dtype() {
            DType::F64 => table_gradient::<f64>(table, ids, grad_res)?,
            _ => table_gradient::<f32>(table, ids, grad_res)?,
        };
        Ok((self.sink.accept(table, dw)?, None))
    }
}

/// The gradient of `table` from the rows' gradient `grad` ([`scatter_add`]).
fn table_gradient<T: WithDType + std::ops::AddAssign>(
    table: &Tensor,
    ids: &Tensor,
    grad: &Tensor,
) -> Result<Tensor> {
    let dims = table.dims2()?;
    let grad = grad.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
    let dw = scatter_add(&grad, &ids.to_vec1::<u32>()?, dims);
    Tensor::from_vec(dw, dims, table.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close, random_ids, random_tensor};
    use candle_core::{TensorId, Var};
    use std::sync::Mutex;

    /// Collects the gradient of one tensor.
    #[derive(Debug)]
    struct Collect {
        param: TensorId,
        got: Mutex<Option<Tensor>>,
    }

    impl GradientSink for Collect {
        fn accept(&self, param: &Tensor, grad: Tensor) -> Result<Option<Tensor>> {
            if param.id() != self.param {
                return Ok(Some(grad));
            }
            *self.got.lock().expect("lock") = Some(grad);
            Ok(None)
        }
    }

    /// Rows and the table's gradient (repeated ids included) equal candle's `index_select`
    /// bit for bit; the gradient reaches the sink, not candle's store.
    #[test]
    fn lookup_and_gradient_match_index_select() -> Result<()> {
        let table = Var::from_tensor(&random_tensor(&[50, 8], 1.0, 1)?)?;
        let ids = random_ids(&[3, 7], 50, 2)?;
        let ids = Tensor::cat(&[&ids, &ids.narrow(1, 0, 2)?], 1)?;
        let weights = random_tensor(&[3, 9, 8], 1.0, 3)?;
        let sink = Arc::new(Collect {
            param: table.as_tensor().id(),
            got: Mutex::new(None),
        });
        let ours = embedding(table.as_tensor(), &ids, Some(sink.clone()))?;
        let theirs = table
            .as_tensor()
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((3, 9, 8))?;
        assert_close(&ours, &theirs, 0.0, "rows")?;
        let g_ours = (ours * &weights)?.sum_all()?.backward()?;
        let g_theirs = (theirs * &weights)?.sum_all()?.backward()?;
        assert!(g_ours.get(table.as_tensor()).is_none());
        let got = sink
            .got
            .lock()
            .expect("lock")
            .take()
            .expect("sink got nothing");
        let want = g_theirs.get(table.as_tensor()).expect("candle's gradient");
        assert_close(&got, want, 0.0, "table gradient")
    }

    /// Without a sink, or for a table the sink does not collect, candle gets the gradient.
    #[test]
    fn a_sink_that_declines_leaves_the_gradient_to_candle() -> Result<()> {
        let table = Var::from_tensor(&random_tensor(&[20, 4], 1.0, 4)?)?;
        let ids = random_ids(&[2, 5], 20, 5)?;
        let other = Arc::new(Collect {
            param: ids.id(),
            got: Mutex::new(None),
        });
        for sink in [None, Some(other as Arc<dyn GradientSink>)] {
            let rows = embedding(table.as_tensor(), &ids, sink)?;
            let grads = rows.sqr()?.sum_all()?.backward()?;
            assert!(grads.get(table.as_tensor()).is_some());
        }
        Ok(())
    }

    /// An id outside the table is an error naming it, not a panic.
    #[test]
    fn an_id_outside_the_table_is_an_error() -> Result<()> {
        let table = Var::from_tensor(&random_tensor(&[20, 4], 1.0, 6)?)?;
        let ids = Tensor::new(&[3u32, 20], table.device())?;
        let sink = Arc::new(Collect {
            param: table.as_tensor().id(),
            got: Mutex::new(None),
        });
        let err = embedding(table.as_tensor(), &ids, Some(sink))
            .unwrap_err()
            .to_string();
        assert!(err.contains("embedding"), "{err}");
        Ok(())
    }
}
