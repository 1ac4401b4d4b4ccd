//! Collectives for data-parallel and sharded (FSDP-style) replicas: the [`Collective`] trait
//! and [`ThreadCollective`], its implementation for N replicas on N threads of one process
//! (CPU data parallelism). All-reduce, broadcast and barrier serve replicated training;
//! all-gather and reduce-scatter serve sharded training; all-to-all (variable lengths per
//! peer) serves expert parallelism, where each rank sends token rows to the experts' owners.
//! NCCL for GPUs and cross-process transports are other implementations, not in this file.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};
use rayon::prelude::*;

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
    fn broadcast_f32(&self, buffers: &mut [&mut [f32]], root: usize)
        -> Result<(), CollectiveError>;

    /// Returns once every rank has called `barrier`.
    fn barrier(&self) -> Result<(), CollectiveError>;

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
        let mut host = tensors_to_host(self.rank(), "all_reduce_mean", tensors)?;
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.all_reduce_mean_f32(&mut views)?;
        }
        host_to_tensors(self.rank(), "all_reduce_mean", host, tensors)
    }

    /// Rank `root`'s values of each tensor (e.g. initial weights), on every rank.
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<Vec<Tensor>, CollectiveError> {
        let mut host = tensors_to_host(self.rank(), "broadcast", tensors)?;
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.broadcast_f32(&mut views, root)?;
        }
        host_to_tensors(self.rank(), "broadcast", host, tensors)
    }

    /// Every rank's `shards[i]`, flattened and concatenated in rank order: a 1-D tensor of
    /// `world_size() · numel` elements with the shard's dtype and device.
    fn all_gather(&self, shards: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let host = tensors_to_host(self.rank(), "all_gather", shards)?;
        let world = self.world_size();
        let mut out: Vec<Vec<f32>> = host.iter().map(|h| vec![0.0; h.len() * world]).collect();
        {
            let ins: Vec<&[f32]> = host.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            self.all_gather_f32(&ins, &mut outs)?;
        }
        host_to_flat_tensors(self.rank(), "all_gather", out, shards)
    }

    /// Reduce-scatter of each tensor (e.g. gradients), flattened: a 1-D tensor holding this
    /// rank's chunk of the elementwise mean over ranks, `numel / world_size()` elements with
    /// the input's dtype and device. `numel` must be a multiple of `world_size()`.
    fn reduce_scatter_mean(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let rank = self.rank();
        let host = tensors_to_host(rank, "reduce_scatter_mean", tensors)?;
        let world = self.world_size();
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
            self.reduce_scatter_mean_f32(&ins, &mut outs)?;
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

/// Default time a rank waits for the others before failing the group.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What a rank contributed to the operation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    AllReduceMean,
    Broadcast { root: usize },
    Barrier,
    AllGather,
    ReduceScatterMean,
    AllToAll,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::AllReduceMean => "all_reduce_mean",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Barrier => "barrier",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatterMean => "reduce_scatter_mean",
            OpKind::AllToAll => "all_to_all",
        }
    }
}

struct Contribution {
    kind: OpKind,
    buffers: Vec<Vec<f32>>,
}

/// Shared state of one thread group, guarded by the mutex.
struct State {
    /// Number of completed operations; a waiting rank watches it change.
    generation: u64,
    /// Contributions to the operation in progress, by rank.
    slots: Vec<Option<Contribution>>,
    /// The last completed operation's result (kept until the next one completes).
    result: Arc<Vec<Vec<f32>>>,
    /// Set once the group fails; every later call returns it.
    aborted: Option<String>,
}

struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    cond: Condvar,
}

/// One replica's handle on an in-process group of `world_size` threads.
///
/// Create the group with [`ThreadCollective::group`] and move one handle into each replica
/// thread. Dropping a handle (normally or while a thread panics) aborts the group, so ranks
/// still waiting get [`CollectiveError::Aborted`] instead of hanging; a rank that waits
/// longer than the timeout fails the group with [`CollectiveError::Timeout`].
pub struct ThreadCollective {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadCollective {
    /// `n` handles (ranks `0..n`) sharing one group, with [`DEFAULT_TIMEOUT`].
    pub fn group(n: usize) -> Vec<ThreadCollective> {
        Self::group_with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// `n` handles sharing one group; a rank gives up after waiting `timeout` for the others.
    pub fn group_with_timeout(n: usize, timeout: Duration) -> Vec<ThreadCollective> {
        let shared = Arc::new(Shared {
            world: n,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                slots: (0..n).map(|_| None).collect(),
                result: Arc::new(Vec::new()),
                aborted: None,
            }),
            cond: Condvar::new(),
        });
        (0..n)
            .map(|rank| ThreadCollective {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Fails the group on purpose (e.g. this replica hit an error): every rank's pending and
    /// future calls return [`CollectiveError::Aborted`] with `reason`.
    pub fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(format!("rank {} aborted: {reason}", self.rank));
        }
        drop(st);
        self.shared.cond.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written in a way that
        // matters: every path that could fail sets `aborted` first. Recover the guard.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn aborted(reason: &str) -> CollectiveError {
        CollectiveError::Aborted {
            reason: reason.to_string(),
        }
    }

    /// Deposits this rank's contribution, waits for all ranks, returns the combined result.
    fn exchange(
        &self,
        kind: OpKind,
        buffers: Vec<Vec<f32>>,
    ) -> Result<Arc<Vec<Vec<f32>>>, CollectiveError> {
        let world = self.shared.world;
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(Self::aborted(reason));
        }
        if st.slots[self.rank].is_some() {
            // Only possible if the same handle is used from two threads at once.
            let detail = format!(
                "rank {} entered {} twice concurrently (a handle must be used by one thread)",
                self.rank,
                kind.name()
            );
            st.aborted = Some(detail.clone());
            self.shared.cond.notify_all();
            return Err(CollectiveError::Mismatch {
                rank: self.rank,
                detail,
            });
        }
        // Every deposited contribution must agree with the ones already there.
        if let Some(other) = st.slots.iter().flatten().next() {
            if let Some(detail) = mismatch(other, kind, &buffers) {
                let detail = format!("rank {}: {detail}", self.rank);
                st.aborted = Some(detail.clone());
                self.shared.cond.notify_all();
                return Err(CollectiveError::Mismatch {
                    rank: self.rank,
                    detail,
                });
            }
        }
        let my_generation = st.generation;
        st.slots[self.rank] = Some(Contribution { kind, buffers });
        if st.slots.iter().all(Option::is_some) {
            let contributions: Vec<Contribution> = st
                .slots
                .iter_mut()
                .map(|s| s.take().expect("all present"))
                .collect();
            let result = Arc::new(combine(kind, contributions, world));
            st.result = result.clone();
            st.generation += 1;
            drop(st);
            self.shared.cond.notify_all();
            return Ok(result);
        }
        let start = Instant::now();
        loop {
            if st.generation != my_generation {
                return Ok(st.result.clone());
            }
            if let Some(reason) = &st.aborted {
                return Err(Self::aborted(reason));
            }
            let waited = start.elapsed();
            if waited >= self.shared.timeout {
                let missing: Vec<usize> = st
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(r, _)| r)
                    .collect();
                let err = CollectiveError::Timeout {
                    rank: self.rank,
                    op: kind.name(),
                    waited,
                    missing,
                };
                st.aborted = Some(err.to_string());
                drop(st);
                self.shared.cond.notify_all();
                return Err(err);
            }
            let (guard, _) = self
                .shared
                .cond
                .wait_timeout(st, self.shared.timeout - waited)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            st = guard;
        }
    }
}

/// Describes how `kind`/`buffers` differ from another rank's contribution, if they do.
fn mismatch(other: &Contribution, kind: OpKind, buffers: &[Vec<f32>]) -> Option<String> {
    if other.kind != kind {
        return Some(format!(
            "called {:?} while another rank called {:?}",
            kind, other.kind
        ));
    }
    let mine: Vec<usize> = buffers.iter().map(Vec::len).collect();
    let theirs: Vec<usize> = other.buffers.iter().map(Vec::len).collect();
    if kind == OpKind::AllToAll {
        // Lengths differ by design; each rank checked it sends one buffer per rank.
        return None;
    }
    (mine != theirs).then(|| {
        format!(
            "{} buffer lengths {mine:?} differ from another rank's {theirs:?}",
            kind.name()
        )
    })
}

/// The combined result: rank-order sums divided by `world` (mean; reduce-scatter takes its
/// chunk of it), root's copy (broadcast), the rank-order concatenation (all-gather), every
/// rank's buffers source-major (all-to-all: entry `s · world + d` is what `s` sent to `d`).
fn combine(kind: OpKind, mut contributions: Vec<Contribution>, world: usize) -> Vec<Vec<f32>> {
    match kind {
        OpKind::Barrier => Vec::new(),
        OpKind::AllToAll => contributions.into_iter().flat_map(|c| c.buffers).collect(),
        OpKind::Broadcast { root } => std::mem::take(&mut contributions[root].buffers),
        OpKind::AllGather => {
            let n_buffers = contributions[0].buffers.len();
            (0..n_buffers)
                .map(|b| {
                    let mut all = Vec::with_capacity(contributions[0].buffers[b].len() * world);
                    for c in &contributions {
                        all.extend_from_slice(&c.buffers[b]);
                    }
                    all
                })
                .collect()
        }
        OpKind::AllReduceMean | OpKind::ReduceScatterMean => {
            let n_buffers = contributions[0].buffers.len();
            let n = world as f32;
            (0..n_buffers)
                .map(|b| {
                    let mut acc = std::mem::take(&mut contributions[0].buffers[b]);
                    const CHUNK: usize = 1 << 14;
                    acc.par_chunks_mut(CHUNK).enumerate().for_each(|(c, acc)| {
                        let start = c * CHUNK;
                        // Rank order per element: deterministic whatever the thread count.
                        for other in &contributions[1..] {
                            let src = &other.buffers[b][start..start + acc.len()];
                            for (a, &v) in acc.iter_mut().zip(src) {
                                *a += v;
                            }
                        }
                        for a in acc.iter_mut() {
                            *a /= n;
                        }
                    });
                    acc
                })
                .collect()
        }
    }
}

impl Collective for ThreadCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_mean_f32(&self, buffers: &mut [&mut [f32]]) -> Result<(), CollectiveError> {
        let owned = buffers.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::AllReduceMean, owned)?;
        copy_results(buffers, &result);
        Ok(())
    }

    fn broadcast_f32(
        &self,
        buffers: &mut [&mut [f32]],
        root: usize,
    ) -> Result<(), CollectiveError> {
        if root >= self.shared.world {
            return Err(CollectiveError::Mismatch {
                rank: self.rank,
                detail: format!(
                    "broadcast root {root} is not a rank of a group of {}",
                    self.shared.world
                ),
            });
        }
        let owned = buffers.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::Broadcast { root }, owned)?;
        copy_results(buffers, &result);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        self.exchange(OpKind::Barrier, Vec::new()).map(|_| ())
    }

    fn all_gather_f32(
        &self,
        shards: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        self.check_outputs("all_gather", shards, out, |len| len * world)?;
        let owned = shards.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::AllGather, owned)?;
        copy_results(out, &result);
        Ok(())
    }

    fn reduce_scatter_mean_f32(
        &self,
        inputs: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if let Some((i, b)) = inputs
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() % world != 0)
        {
            return Err(self.fail_local(format!(
                "reduce_scatter_mean: buffer {i} has {} elements, not a multiple of the group \
                 size {world}",
                b.len()
            )));
        }
        self.check_outputs("reduce_scatter_mean", inputs, out, |len| len / world)?;
        let owned = inputs.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::ReduceScatterMean, owned)?;
        for (dst, src) in out.iter_mut().zip(result.iter()) {
            let n = dst.len();
            dst.copy_from_slice(&src[self.rank * n..(self.rank + 1) * n]);
        }
        Ok(())
    }

    fn all_to_all_f32(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CollectiveError> {
        let world = self.shared.world;
        if send.len() != world {
            return Err(self.fail_local(format!(
                "all_to_all: {} send buffers in a group of {world} (one per rank is needed)",
                send.len()
            )));
        }
        let result = self.exchange(OpKind::AllToAll, send)?;
        Ok((0..world)
            .map(|s| result[s * world + self.rank].clone())
            .collect())
    }
}

/// Copies each exchanged buffer of `result` into its caller's buffer in `out` (same lengths).
fn copy_results(out: &mut [&mut [f32]], result: &[Vec<f32>]) {
    for (dst, src) in out.iter_mut().zip(result) {
        dst.copy_from_slice(src);
    }
}

impl ThreadCollective {
    /// Errors (before any exchange) unless there is one output per input and output `i` has
    /// `expected(inputs[i].len())` elements.
    fn check_outputs(
        &self,
        op: &'static str,
        inputs: &[&[f32]],
        out: &[&mut [f32]],
        expected: impl Fn(usize) -> usize,
    ) -> Result<(), CollectiveError> {
        let bad = inputs.len() != out.len()
            || inputs
                .iter()
                .zip(out)
                .any(|(i, o)| o.len() != expected(i.len()));
        if !bad {
            return Ok(());
        }
        let ins: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
        let outs: Vec<usize> = out.iter().map(|b| b.len()).collect();
        Err(self.fail_local(format!(
            "{op}: output lengths {outs:?} do not fit input lengths {ins:?} in a group of {}",
            self.shared.world
        )))
    }

    /// A call this rank cannot make: fails the group (so peers already waiting are released
    /// at once, as for a mismatch between ranks) and returns the error.
    fn fail_local(&self, detail: String) -> CollectiveError {
        let detail = format!("rank {}: {detail}", self.rank);
        self.abort(&detail);
        CollectiveError::Mismatch {
            rank: self.rank,
            detail,
        }
    }
}

impl Drop for ThreadCollective {
    fn drop(&mut self) {
        let mut st = self.lock();
        if st.aborted.is_none() && self.shared.world > 1 {
            let why = if std::thread::panicking() {
                "panicked"
            } else {
                "dropped its handle"
            };
            st.aborted = Some(format!("rank {} left the group ({why})", self.rank));
        }
        drop(st);
        self.shared.cond.notify_all();
    }
}

impl std::fmt::Debug for ThreadCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world)
            .finish()
    }
}
