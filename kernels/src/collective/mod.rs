//! Collectives for data-parallel and sharded (FSDP-style) replicas: the [`Collective`] trait
//! and [`ThreadCollective`], its implementation for N replicas on N threads of one process (CPU
//! data parallelism). All-reduce, broadcast and barrier serve replicated training; all-gather
//! and reduce-scatter serve sharded training; all-to-all (variable lengths per peer) serves
//! expert parallelism, where each rank sends token rows to the experts' owners. The in-process
//! CPU group is `collective/thread.rs`; the GPU group over NCCL is `collective/nccl.rs`
//! (feature `cuda`), with its unique id (`nccl_id.rs`, every build) and the deadline its waits
//! use (`deadline.rs`). Tests: `kernels/tests/collective_*.rs`; the GPU ones
//! (`kernels/tests/collective_nccl.rs`) run on a GPU machine through `tools/gpu-check.sh`.

mod deadline;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod nccl_all_to_all;
#[cfg(feature = "cuda")]
mod nccl_collective;
mod nccl_id;
#[cfg(feature = "cuda")]
mod nccl_tensors;
mod thread;

pub use deadline::Deadline;
#[cfg(feature = "cuda")]
pub use nccl::{NcclCollective, NcclGroup};
pub use nccl_id::{NcclUniqueId, NCCL_UNIQUE_ID_BYTES};
pub use thread::{ThreadCollective, DEFAULT_TIMEOUT};

use candle_core::{DType, Tensor};
use std::time::Duration;

/// Errors from a collective operation. After any of them the group is unusable: every rank
/// gets an error from every later call (a partial reduction is never returned).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CollectiveError {
    /// The group was aborted: a rank left (dropped its handle, e.g. its thread panicked),
    /// called [`ThreadCollective::abort`], timed out, or the ranks disagreed on the call.
    #[error("collective group aborted: {reason}")]
    Aborted {
        /// Why, naming the rank that caused it.
        reason: String,
    },
    /// This rank waited longer than the group's timeout for the others.
    #[error("rank {rank}: {op} timed out after {waited:?} waiting for rank(s) {missing:?}")]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// The operation it was in (`all_reduce_mean`, `barrier`, ...).
        op: &'static str,
        /// How long it waited.
        waited: Duration,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// NCCL or the CUDA driver failed (creating the communicator, queuing the operation or
    /// waiting for it). The communicator is aborted.
    #[error("rank {rank}: {op}: {message}")]
    Device {
        /// The rank.
        rank: usize,
        /// The operation.
        op: &'static str,
        /// What NCCL or CUDA reported.
        message: String,
    },
    /// The ranks called different operations, or with buffers of different sizes.
    #[error("rank {rank}: {detail}")]
    Mismatch {
        /// The rank that noticed.
        rank: usize,
        /// What differed.
        detail: String,
    },
    /// A tensor could not be read or rebuilt.
    #[error("rank {rank}: tensor error in {op}: {message}")]
    Tensor {
        /// The rank.
        rank: usize,
        /// The operation.
        op: &'static str,
        /// candle's message.
        message: String,
    },
}

/// Group operations among the data-parallel replicas of one role.
///
/// Every rank must make the same sequence of calls with buffers of the same sizes; results
/// are identical on every rank and reproducible run to run (sums are taken in rank order).
pub trait Collective: Send + Sync {
    /// This replica's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of replicas in the group.
    fn world_size(&self) -> usize;

    /// Replaces each buffer with the elementwise mean of that buffer over all ranks.
    /// Buffer `i` must have the same length on every rank.
    fn all_reduce_mean_f32(&self, buffers: &mut [&mut [f32]]) -> Result<(), CollectiveError>;

    /// Replaces each buffer with rank `root`'s copy of it.
    fn broadcast_f32(&self, bufs: &mut [&mut [f32]], root: usize) -> Result<(), CollectiveError>;

    /// Returns once every rank has called `barrier`.
    fn barrier(&self) -> Result<(), CollectiveError>;

    /// Fails the group on purpose (this replica hit an error or panicked): every rank's
    /// pending and later calls return an error instead of waiting for this one.
    fn abort(&self, reason: &str);

    /// All-gather: `out[i]` (length `world_size() · shards[i].len()`) receives every rank's
    /// `shards[i]`, concatenated in rank order. `shards[i]` must have the same length on every
    /// rank.
    fn all_gather_f32(
        &self,
        shards: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError>;

    /// Reduce-scatter with a mean: `inputs[i]` (length `world_size() · L_i`, the same on every
    /// rank) is averaged elementwise over ranks (sums in rank order) and this rank receives
    /// chunk `rank()` of the mean, `out[i]` (length `L_i`).
    fn reduce_scatter_mean_f32(
        &self,
        inputs: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError>;

    /// All-to-all with variable lengths: `send[d]` goes to rank `d` (`send.len()` must be
    /// `world_size()`; the lengths may differ by destination and by rank, zero included).
    /// Returns `recv[s]`, what rank `s` sent to this rank, for every `s` in rank order. Every
    /// rank must call it, also one with nothing to send.
    fn all_to_all_f32(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CollectiveError>;

    /// [`Collective::all_to_all_f32`] of row blocks: `send[d]` `[n_d, C]` goes to rank `d`;
    /// returns `[m_s, C]` from each rank `s`, with the dtype and device of `send[0]`. Every
    /// tensor, on every rank, must have the same column count `C` (any row count, zero
    /// included). Float tensors only; the exchange runs in f32 on the host.
    fn all_to_all_rows(&self, send: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let (rank, op) = (self.rank(), "all_to_all_rows");
        let Some(first) = send.first() else {
            return Err(CollectiveError::Mismatch {
                rank,
                detail: format!("{op}: no tensors to send (one per rank is needed)"),
            });
        };
        let cols = first.dims2().map_err(|e| tensor_error(rank, op, e))?.1;
        if let Some((d, t)) = send
            .iter()
            .enumerate()
            .find(|(_, t)| cols == 0 || t.rank() != 2 || t.dims()[1] != cols)
        {
            return Err(CollectiveError::Mismatch {
                rank,
                detail: format!(
                    "{op}: tensor for rank {d} has shape {:?}; every block must be [rows, C] with C = {cols} > 0",
                    t.dims()
                ),
            });
        }
        let host = tensors_to_host(rank, op, send)?;
        let recv = self.all_to_all_f32(host)?;
        recv.into_iter()
            .enumerate()
            .map(|(s, data)| {
                if data.len() % cols != 0 {
                    return Err(CollectiveError::Mismatch {
                        rank,
                        detail: format!(
                            "{op}: received {} values from rank {s}, not rows of {cols}",
                            data.len()
                        ),
                    });
                }
                let rows = data.len() / cols;
                Tensor::from_vec(data, (rows, cols), first.device())
                    .and_then(|t| t.to_dtype(first.dtype()))
                    .map_err(|e| tensor_error(rank, op, e))
            })
            .collect()
    }

    /// Elementwise mean over ranks of each tensor (e.g. gradients): same shapes, dtypes and
    /// devices in and out. Float tensors only; the reduction runs in f32 on the host.
    fn all_reduce_mean(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        staged::all_reduce_mean(self, tensors)
    }

    /// Rank `root`'s values of each tensor (e.g. initial weights), on every rank.
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<Vec<Tensor>, CollectiveError> {
        staged::broadcast(self, tensors, root)
    }

    /// Every rank's `shards[i]`, flattened and concatenated in rank order: a 1-D tensor of
    /// `world_size() · numel` elements with the shard's dtype and device.
    fn all_gather(&self, shards: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        staged::all_gather(self, shards)
    }

    /// Reduce-scatter of each tensor (e.g. gradients), flattened: a 1-D tensor holding this
    /// rank's chunk of the elementwise mean over ranks, `numel / world_size()` elements with
    /// the input's dtype and device. `numel` must be a multiple of `world_size()`.
    fn reduce_scatter_mean(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        staged::reduce_scatter_mean(self, tensors)
    }
}

/// The tensor-level operations staged through host f32 buffers and the slice methods: the
/// trait's defaults, and what a device implementation falls back to for CPU tensors.
pub mod staged {
    use super::*;

    /// [`Collective::all_reduce_mean`] through host buffers.
    pub fn all_reduce_mean<C: Collective + ?Sized>(
        c: &C,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let mut host = tensors_to_host(c.rank(), "all_reduce_mean", tensors)?;
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|v| v.as_mut_slice()).collect();
            c.all_reduce_mean_f32(&mut views)?;
        }
        host_to_tensors(c.rank(), "all_reduce_mean", host, tensors)
    }

    /// [`Collective::broadcast`] through host buffers.
    pub fn broadcast<C: Collective + ?Sized>(
        c: &C,
        tensors: &[Tensor],
        root: usize,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let mut host = tensors_to_host(c.rank(), "broadcast", tensors)?;
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|v| v.as_mut_slice()).collect();
            c.broadcast_f32(&mut views, root)?;
        }
        host_to_tensors(c.rank(), "broadcast", host, tensors)
    }

    /// [`Collective::all_gather`] through host buffers.
    pub fn all_gather<C: Collective + ?Sized>(
        c: &C,
        shards: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let host = tensors_to_host(c.rank(), "all_gather", shards)?;
        let world = c.world_size();
        let mut out: Vec<Vec<f32>> = host.iter().map(|h| vec![0.0; h.len() * world]).collect();
        {
            let ins: Vec<&[f32]> = host.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            c.all_gather_f32(&ins, &mut outs)?;
        }
        host_to_flat_tensors(c.rank(), "all_gather", out, shards)
    }

    /// [`Collective::reduce_scatter_mean`] through host buffers.
    pub fn reduce_scatter_mean<C: Collective + ?Sized>(
        c: &C,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let rank = c.rank();
        let host = tensors_to_host(rank, "reduce_scatter_mean", tensors)?;
        let world = c.world_size();
        if let Some((i, h)) = host.iter().enumerate().find(|(_, h)| h.len() % world != 0) {
            return Err(CollectiveError::Mismatch {
                rank,
                detail: format!(
                    "reduce_scatter_mean: tensor {i} has {} elements, not a multiple of the \
                     group size {world}",
                    h.len()
                ),
            });
        }
        let mut out: Vec<Vec<f32>> = host.iter().map(|h| vec![0.0; h.len() / world]).collect();
        {
            let ins: Vec<&[f32]> = host.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            c.reduce_scatter_mean_f32(&ins, &mut outs)?;
        }
        host_to_flat_tensors(rank, "reduce_scatter_mean", out, tensors)
    }
}

/// 1-D tensors from host buffers, with the dtype and device of `like`.
fn host_to_flat_tensors(
    rank: usize,
    op: &'static str,
    host: Vec<Vec<f32>>,
    like: &[Tensor],
) -> Result<Vec<Tensor>, CollectiveError> {
    host.into_iter()
        .zip(like)
        .map(|(data, t)| {
            let n = data.len();
            Tensor::from_vec(data, n, t.device())
                .and_then(|r| r.to_dtype(t.dtype()))
                .map_err(|e| tensor_error(rank, op, e))
        })
        .collect()
}

fn tensor_error(rank: usize, op: &'static str, e: candle_core::Error) -> CollectiveError {
    CollectiveError::Tensor {
        rank,
        op,
        message: e.to_string(),
    }
}

fn tensors_to_host(
    rank: usize,
    op: &'static str,
    tensors: &[Tensor],
) -> Result<Vec<Vec<f32>>, CollectiveError> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if !t.dtype().is_float() {
                return Err(CollectiveError::Tensor {
                    rank,
                    op,
                    message: format!(
                        "tensor {i} has dtype {:?}; only float tensors reduce",
                        t.dtype()
                    ),
                });
            }
            t.flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| tensor_error(rank, op, e))
        })
        .collect()
}

fn host_to_tensors(
    rank: usize,
    op: &'static str,
    host: Vec<Vec<f32>>,
    like: &[Tensor],
) -> Result<Vec<Tensor>, CollectiveError> {
    host.into_iter()
        .zip(like)
        .map(|(data, t)| {
            Tensor::from_vec(data, t.dims(), t.device())
                .and_then(|r| r.to_dtype(t.dtype()))
                .map_err(|e| tensor_error(rank, op, e))
        })
        .collect()
}
