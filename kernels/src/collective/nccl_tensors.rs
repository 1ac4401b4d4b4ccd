//! The tensor-level operations of [`NcclCollective`] on CUDA tensors of its own device:
//! each tensor is read in place (as contiguous f32) and the result is written to a fresh
//! device buffer, wrapped as a tensor of the input's device, so no data crosses to the host.
//! Anything else (CPU tensors, another GPU, empty tensors) goes through the host-staged
//! defaults (`collective::staged`).

use super::nccl::{device_error, NcclCollective};
use super::{staged, Collective, CollectiveError};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, DeviceLocation, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaView};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, ReduceOp};

/// True when every tensor is a non-empty float tensor on this rank's GPU.
fn on_device(c: &NcclCollective, tensors: &[Tensor]) -> bool {
    let here = DeviceLocation::Cuda {
        gpu_id: c.ordinal(),
    };
    !tensors.is_empty()
        && tensors
            .iter()
            .all(|t| t.device().location() == here && t.elem_count() > 0 && t.dtype().is_float())
}

/// Runs one grouped NCCL call per tensor: `call(comm, input, output)` with the tensor's
/// flattened f32 values and a fresh buffer of `out_len(numel)` zeros. Returns the outputs as
/// 1-D f32 tensors on each input's device.
fn each_on_device(
    c: &NcclCollective,
    op: &'static str,
    tensors: &[Tensor],
    out_len: impl Fn(usize) -> usize,
    call: impl Fn(&Comm, &CudaView<'_, f32>, &mut CudaSlice<f32>) -> Result<(), NcclError>,
) -> Result<Vec<Tensor>, CollectiveError> {
    let t_err = |e: candle_core::Error| device_error(c.rank(), op, e);
    let flats = tensors
        .iter()
        .map(|t| t.flatten_all()?.to_dtype(DType::F32)?.contiguous())
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(t_err)?;
    let guards: Vec<_> = flats.iter().map(|f| f.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(guards.len());
    for (g, layout) in &guards {
        let Storage::Cuda(s) = &**g else {
            return Err(device_error(c.rank(), op, "a tensor left the GPU"));
        };
        let start = layout.start_offset();
        let n = layout.shape().elem_count();
        views.push(
            s.as_cuda_slice::<f32>()
                .map_err(t_err)?
                .slice(start..start + n),
        );
    }
    let mut outs = views
        .iter()
        .map(|v| c.zeros::<f32>(op, out_len(v.len())))
        .collect::<Result<Vec<_>, _>>()?;
    c.run(op, |comm| {
        c.grouped(op, || {
            views
                .iter()
                .zip(outs.iter_mut())
                .try_for_each(|(v, o)| call(comm, v, o))
        })
    })?;
    drop(views);
    drop(guards);
    outs.into_iter()
        .zip(tensors)
        .map(|(o, t)| {
            let dev = t.device().as_cuda_device().map_err(t_err)?.clone();
            let len = o.len();
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(o, dev));
            Ok(Tensor::from_storage(
                storage,
                len,
                BackpropOp::none(),
                false,
            ))
        })
        .collect()
}

/// `flat` scaled by `by`, in `like`'s dtype and (when `shape`) shape.
fn finish(
    c: &NcclCollective,
    op: &'static str,
    flat: Tensor,
    by: f64,
    like: &Tensor,
    shape: bool,
) -> Result<Tensor, CollectiveError> {
    let t = if by == 1.0 {
        Ok(flat)
    } else {
        flat.affine(by, 0.0)
    }
    .and_then(|t| t.to_dtype(like.dtype()));
    let t = if shape {
        t.and_then(|t| t.reshape(like.dims()))
    } else {
        t
    };
    t.map_err(|e| device_error(c.rank(), op, e))
}

/// [`Collective::all_reduce_mean`]: sum over ranks, scaled by `1 / world_size`.
pub(super) fn all_reduce_mean(
    c: &NcclCollective,
    tensors: &[Tensor],
) -> Result<Vec<Tensor>, CollectiveError> {
    if !on_device(c, tensors) {
        return staged::all_reduce_mean(c, tensors);
    }
    let op = "all_reduce_mean";
    let sums = each_on_device(
        c,
        op,
        tensors,
        |n| n,
        |comm, v, o| comm.all_reduce(v, o, &ReduceOp::Sum).map(|_| ()),
    )?;
    let by = 1.0 / c.world_size() as f64;
    sums.into_iter()
        .zip(tensors)
        .map(|(s, t)| finish(c, op, s, by, t, true))
        .collect()
}

/// [`Collective::broadcast`]: rank `root`'s values on every rank.
pub(super) fn broadcast(
    c: &NcclCollective,
    tensors: &[Tensor],
    root: usize,
) -> Result<Vec<Tensor>, CollectiveError> {
    if !on_device(c, tensors) || root >= c.world_size() {
        return staged::broadcast(c, tensors, root);
    }
    let op = "broadcast";
    let got = each_on_device(
        c,
        op,
        tensors,
        |n| n,
        |comm, v, o| comm.broadcast(Some(v), o, root as i32).map(|_| ()),
    )?;
    got.into_iter()
        .zip(tensors)
        .map(|(g, t)| finish(c, op, g, 1.0, t, true))
        .collect()
}

/// [`Collective::all_gather`]: every rank's flattened shard, in rank order.
pub(super) fn all_gather(
    c: &NcclCollective,
    shards: &[Tensor],
) -> Result<Vec<Tensor>, CollectiveError> {
    if !on_device(c, shards) {
        return staged::all_gather(c, shards);
    }
    let op = "all_gather";
    let world = c.world_size();
    let got = each_on_device(
        c,
        op,
        shards,
        |n| n * world,
        |comm, v, o| comm.all_gather(v, o).map(|_| ()),
    )?;
    got.into_iter()
        .zip(shards)
        .map(|(g, t)| finish(c, op, g, 1.0, t, false))
        .collect()
}

/// [`Collective::reduce_scatter_mean`]: this rank's chunk of the mean over ranks.
pub(super) fn reduce_scatter_mean(
    c: &NcclCollective,
    tensors: &[Tensor],
) -> Result<Vec<Tensor>, CollectiveError> {
    let world = c.world_size();
    if !on_device(c, tensors) || tensors.iter().any(|t| t.elem_count() % world != 0) {
        // The staged path also reports the size mismatch.
        return staged::reduce_scatter_mean(c, tensors);
    }
    let op = "reduce_scatter_mean";
    let got = each_on_device(
        c,
        op,
        tensors,
        |n| n / world,
        |comm, v, o| comm.reduce_scatter(v, o, &ReduceOp::Sum).map(|_| ()),
    )?;
    let by = 1.0 / world as f64;
    got.into_iter()
        .zip(tensors)
        .map(|(g, t)| finish(c, op, g, by, t, false))
        .collect()
}
