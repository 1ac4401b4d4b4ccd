//! The token-embedding lookup whose backward hands the table's gradient to a
//! [`GradientSink`]. Candle's own lookup (`index_select`) builds the gradient as
//! `zeros_like(table).index_add(..)`, copying the whole `[V, H]` table of zeros and touching
//! every page of it, and then accumulates it as `zeros + grad` at the end of the backward,
//! when every weight gradient is alive. Here each token's row is added, in candle's order,
//! onto what the sink collected so far or onto one fresh zeroed buffer (`calloc`: its pages
//! stay unmapped until written), so only the rows of tokens in the batch occupy memory
//! ([`scatter_rows`]). CPU, f32 and f64; other devices and dtypes use `index_select`.

use std::sync::Arc;

use candle_core::{
    CpuStorage, CustomOp2, DType, InplaceOp2, Layout, Result, Shape, Tensor, WithDType,
};

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
    let (_, h) = table.dims2()?;
    let mut out_dims = ids.dims().to_vec();
    out_dims.push(h);
    let ids = validate::token_ids(OP, "ids", ids)?
        .flatten_all()?
        .contiguous()?;
    let fused = table.device().is_cpu() && matches!(table.dtype(), DType::F32 | DType::F64);
    let rows = match sink {
        Some(sink) if fused => {
            let op = Lookup { sink };
            table.contiguous()?.apply_op2(&ids, op)?
        }
        _ => table.index_select(&ids, 0)?,
    };
    rows.reshape(out_dims)
}

/// `(table [V, H], ids [N]) -> [N, H]`.
struct Lookup {
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
        let (vocab, h) = l1.shape().dims2()?;
        let ids = contiguous_slice::<u32>(s2, l2, OP, "ids")?;
        validate::targets_in_vocab(OP, ids, vocab)?;
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
        if self.sink.add_rows(table, ids, grad_res)? {
            return Ok((None, None));
        }
        Ok((Some(scatter_rows(None, table, ids, grad_res)?), None))
    }
}

/// `have + Σ_i e_{ids[i]} ⊗ rows[i]`, the rows added in order of `i` (candle's `index_add`
/// order): into `have` in place when given (it must be the only holder of its storage), else
/// into a fresh zeroed `[V, H]` buffer shaped like `table` whose untouched rows are never
/// written. `rows` `[.., H]`, `ids` the matching `u32` ids.
pub fn scatter_rows(
    have: Option<Tensor>,
    table: &Tensor,
    ids: &Tensor,
    rows: &Tensor,
) -> Result<Tensor> {
    let dims = table.dims2()?;
    let ids = ids.flatten_all()?.to_vec1::<u32>()?;
    let rows = rows.to_dtype(table.dtype())?.flatten_all()?.contiguous()?;
    let grad = match have {
        Some(g) => g,
        // candle's CPU zeros are `calloc`ed.
        None => Tensor::zeros(dims, table.dtype(), table.device())?,
    };
    grad.inplace_op2(&rows, &AddRows { ids, dims })?;
    Ok(grad)
}

/// In place: `dst[ids[i]] += rows[i]`.
struct AddRows {
    ids: Vec<u32>,
    dims: (usize, usize),
}

fn add_rows_typed<T: WithDType + std::ops::AddAssign>(
    dst: &mut [T],
    rows: &[T],
    ids: &[u32],
    h: usize,
) {
    for (row, &id) in rows.chunks_exact(h).zip(ids) {
        let at = id as usize * h;
        for (o, g) in dst[at..at + h].iter_mut().zip(row) {
            *o += *g;
        }
    }
}

impl InplaceOp2 for AddRows {
    fn name(&self) -> &'static str {
        "embedding-add-rows"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> Result<()> {
        let (v, h) = self.dims;
        if dl.dims() != [v, h]
            || !dl.is_contiguous()
            || sl.shape().elem_count() != self.ids.len() * h
        {
            candle_core::bail!(
                "{OP}: gradient {:?} and rows {:?} against ids {}",
                dl.dims(),
                sl.dims(),
                self.ids.len()
            );
        }
        validate::targets_in_vocab(OP, &self.ids, v)?;
        let start = dl.start_offset();
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(_)) => add_rows_typed(
                &mut d[start..start + v * h],
                contiguous_slice(src, sl, OP, "rows")?,
                &self.ids,
                h,
            ),
            (CpuStorage::F64(d), CpuStorage::F64(_)) => add_rows_typed(
                &mut d[start..start + v * h],
                contiguous_slice(src, sl, OP, "rows")?,
                &self.ids,
                h,
            ),
            (other, _) => return validate::unsupported_cpu_dtype(OP, &*other),
        }
        Ok(())
    }
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
        fn accept(&self, _param: &Tensor, grad: Tensor) -> Result<Option<Tensor>> {
            Ok(Some(grad))
        }

        fn add_rows(&self, param: &Tensor, ids: &Tensor, rows: &Tensor) -> Result<bool> {
            if param.id() != self.param {
                return Ok(false);
            }
            let mut got = self.got.lock().expect("lock");
            *got = Some(scatter_rows(got.take(), param, ids, rows)?);
            Ok(true)
        }
    }

    /// Rows and the table's gradient equal candle's `index_select` bit for bit, with
    /// repeated ids and two lookups of overlapping ids in one backward (the sum in candle's
    /// order); the gradient reaches the sink, not candle's store.
    #[test]
    fn lookup_and_gradient_match_index_select() -> Result<()> {
        let table = Var::from_tensor(&random_tensor(&[50, 8], 1.0, 1)?)?;
        let ids = random_ids(&[3, 7], 50, 2)?;
        let ids = Tensor::cat(&[&ids, &ids.narrow(1, 0, 2)?], 1)?;
        let other = Tensor::cat(&[&ids.narrow(1, 3, 6)?, &random_ids(&[3, 3], 50, 9)?], 1)?;
        let weights = random_tensor(&[3, 9, 8], 1.0, 3)?;
        let sink = Arc::new(Collect {
            param: table.as_tensor().id(),
            got: Mutex::new(None),
        });
        let lookups = |sink: Option<Arc<dyn GradientSink>>| -> Result<(Tensor, Tensor)> {
            let a = embedding(table.as_tensor(), &ids, sink.clone())?;
            let b = embedding(table.as_tensor(), &other, sink)?;
            Ok((a, b))
        };
        let select = |i: &Tensor| {
            table
                .as_tensor()
                .index_select(&i.flatten_all()?, 0)?
                .reshape((3, 9, 8))
        };
        let (ours, ours_b) = lookups(Some(sink.clone()))?;
        let (theirs, theirs_b) = (select(&ids)?, select(&other)?);
        assert_close(&ours, &theirs, 0.0, "rows")?;
        let loss =
            |a: Tensor, b: Tensor| (a * &weights)?.sum_all()? + (b.sqr()? * &weights)?.sum_all()?;
        let g_ours = loss(ours, ours_b)?.backward()?;
        let g_theirs = loss(theirs, theirs_b)?.backward()?;
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
