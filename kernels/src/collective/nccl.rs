//! [`NcclCollective`]: the [`Collective`] of a role whose devices are CUDA GPUs, over NCCL
//! (cudarc's `nccl` module). [`NcclGroup::create`] builds one communicator per rank from a
//! [`NcclUniqueId`] (one thread per device, `ncclCommInitRank` on each). Every operation is
//! queued on the communicator's stream (candle's stream of that device, so it is ordered with
//! the role's tensor work) inside `ncclGroupStart`/`ncclGroupEnd`, then waited for with the
//! group's timeout ([`Deadline`]): a rank whose peers never come gets
//! [`CollectiveError::Timeout`] and the communicator is aborted (`ncclCommAbort`), never a
//! hang. Host-slice methods stage through device memory; tensor methods on CUDA tensors stay
//! on the device (`nccl_tensors.rs`). Means are sums scaled by `1 / world_size`.
//!
//! Not here: cross-process groups (every rank of a group lives in one process; the id is
//! still the controller's, see `NcclUniqueId`), and a time limit on communicator creation
//! (`ncclCommInitRank` blocks until every rank has joined; [`NcclGroup::create`] gives up
//! waiting after the timeout, leaving the stuck threads behind).

use super::{CollectiveError, Deadline, NcclUniqueId, NCCL_UNIQUE_ID_BYTES};
use candle_core::CudaDevice;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{group_end, group_start, Comm, Id};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

/// An NCCL communicator, movable between threads.
struct SendComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as two calls on it never
// run at once; `NcclCollective` only touches it under its mutex.
unsafe impl Send for SendComm {}

/// The state behind a rank's lock: the communicator until the group fails.
pub(super) struct State {
    comm: Option<SendComm>,
    aborted: Option<String>,
}

/// One rank's handle on an NCCL group (one GPU). Create the group with
/// [`NcclGroup::create`] and move each handle to its device's executor thread.
pub struct NcclCollective {
    pub(super) rank: usize,
    pub(super) ordinal: usize,
    pub(super) world: usize,
    pub(super) timeout: Duration,
    pub(super) device: CudaDevice,
    pub(super) stream: Arc<CudaStream>,
    pub(super) state: Mutex<State>,
}

/// Building the communicators of one group.
pub struct NcclGroup;

impl NcclUniqueId {
    /// A fresh id from NCCL (`ncclGetUniqueId`), made by the group's owner (the controller)
    /// and handed to every rank.
    pub fn generate() -> Result<Self, CollectiveError> {
        let id = Id::new().map_err(|e| nccl_error(0, "unique_id", e))?;
        Ok(Self::from_bytes(id.internal().map(|c| c as u8)))
    }

    pub(super) fn to_nccl(self) -> Id {
        let mut internal = [0 as std::ffi::c_char; NCCL_UNIQUE_ID_BYTES];
        for (dst, src) in internal.iter_mut().zip(self.as_bytes()) {
            *dst = *src as std::ffi::c_char;
        }
        Id::uninit(internal)
    }
}

impl NcclGroup {
    /// One handle per rank (rank `r` on CUDA device `ordinals[r]`) of the communicator named
    /// `id`, each operation waiting at most `timeout`. Creates the ranks' communicators
    /// together, one thread per device; fails if any cannot be created, or if they are not
    /// all created within `timeout`.
    pub fn create(
        id: NcclUniqueId,
        ordinals: &[usize],
        timeout: Duration,
    ) -> Result<Vec<NcclCollective>, CollectiveError> {
        let world = ordinals.len();
        let (tx, rx) = mpsc::channel();
        for (rank, &ordinal) in ordinals.iter().enumerate() {
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("oxalign-nccl-init-{rank}"))
                .spawn(move || {
                    let _ = tx.send((rank, init_rank(id, rank, world, ordinal, timeout)));
                })
                .map_err(|e| CollectiveError::Device {
                    rank,
                    op: "init",
                    message: format!("cannot start a thread: {e}"),
                })?;
        }
        drop(tx);
        let deadline = Deadline::new(0, "init", timeout);
        let mut handles: Vec<Option<NcclCollective>> = (0..world).map(|_| None).collect();
        for _ in 0..world {
            match rx.recv_timeout(deadline.remaining()) {
                Ok((rank, handle)) => handles[rank] = Some(handle?),
                Err(_) => {
                    let missing = (0..world).filter(|r| handles[*r].is_none()).collect();
                    return Err(deadline.timeout_error(missing));
                }
            }
        }
        Ok(handles.into_iter().flatten().collect())
    }
}

/// Rank `rank`'s handle: candle's device `ordinal` and a communicator on its stream.
fn init_rank(
    id: NcclUniqueId,
    rank: usize,
    world: usize,
    ordinal: usize,
    timeout: Duration,
) -> Result<NcclCollective, CollectiveError> {
    let op = "init";
    let device = candle_core::Device::new_cuda(ordinal)
        .and_then(|d| d.as_cuda_device().cloned())
        .map_err(|e| device_error(rank, op, e))?;
    let stream = device.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| device_error(rank, op, e))?;
    let comm = Comm::from_rank(stream.clone(), rank, world, id.to_nccl())
        .map_err(|e| nccl_error(rank, op, e))?;
    Ok(NcclCollective {
        rank,
        ordinal,
        world,
        timeout,
        device,
        stream,
        state: Mutex::new(State {
            comm: Some(SendComm(comm)),
            aborted: None,
        }),
    })
}

pub(super) fn nccl_error(
    rank: usize,
    op: &'static str,
    e: cudarc::nccl::result::NcclError,
) -> CollectiveError {
    CollectiveError::Device {
        rank,
        op,
        message: format!("NCCL error {:?}", e.0),
    }
}

pub(super) fn device_error(
    rank: usize,
    op: &'static str,
    e: impl std::fmt::Display,
) -> CollectiveError {
    CollectiveError::Device {
        rank,
        op,
        message: e.to_string(),
    }
}

impl NcclCollective {
    /// The CUDA device this rank runs on (candle's handle; its stream is the communicator's).
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The CUDA ordinal of this rank's device.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `enqueue` (NCCL calls, already grouped) on the communicator and waits for the
    /// stream with the group's timeout. A failure or a timeout aborts the communicator.
    pub(super) fn run<R>(
        &self,
        op: &'static str,
        enqueue: impl FnOnce(&Comm) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(CollectiveError::Aborted {
                reason: reason.clone(),
            });
        }
        let Some(SendComm(comm)) = st.comm.as_ref() else {
            unreachable!("a communicator is only taken when the group is aborted");
        };
        let out = self
            .bind(op)
            .and_then(|()| enqueue(comm))
            .and_then(|out| self.wait(op).map(|()| out));
        if let Err(e) = &out {
            abort_locked(&mut st, format!("rank {} failed in {op}: {e}", self.rank));
        }
        out
    }

    pub(super) fn bind(&self, op: &'static str) -> Result<(), CollectiveError> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_error(self.rank, op, e))
    }

    /// Waits until the work queued so far on the stream is done, at most the timeout.
    pub(super) fn wait(&self, op: &'static str) -> Result<(), CollectiveError> {
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| device_error(self.rank, op, e))?;
        let deadline = Deadline::new(self.rank, op, self.timeout);
        deadline.wait(|| {
            event
                .try_is_complete()
                .map_err(|e| device_error(self.rank, op, e))
        })
    }

    /// A device copy of `host` on this rank's stream.
    pub(super) fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        op: &'static str,
        host: &[T],
    ) -> Result<CudaSlice<T>, CollectiveError> {
        self.stream
            .clone_htod(host)
            .map_err(|e| device_error(self.rank, op, e))
    }

    /// `len` zeros on this rank's device.
    pub(super) fn zeros<T>(
        &self,
        op: &'static str,
        len: usize,
    ) -> Result<CudaSlice<T>, CollectiveError>
    where
        T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
    {
        self.stream
            .alloc_zeros::<T>(len)
            .map_err(|e| device_error(self.rank, op, e))
    }

    /// The host copy of `dev` (the work that wrote it must be done: after [`Self::run`]).
    pub(super) fn download<T: cudarc::driver::DeviceRepr>(
        &self,
        op: &'static str,
        dev: &CudaSlice<T>,
    ) -> Result<Vec<T>, CollectiveError> {
        self.stream
            .clone_dtoh(dev)
            .map_err(|e| device_error(self.rank, op, e))
    }

    pub(super) fn mismatch(&self, detail: String) -> CollectiveError {
        CollectiveError::Mismatch {
            rank: self.rank,
            detail,
        }
    }

    pub(super) fn grouped(
        &self,
        op: &'static str,
        calls: impl FnOnce() -> Result<(), cudarc::nccl::result::NcclError>,
    ) -> Result<(), CollectiveError> {
        grouped(calls).map_err(|e| nccl_error(self.rank, op, e))
    }
}

/// `calls` between `ncclGroupStart` and `ncclGroupEnd` (ended also when a call fails).
pub(super) fn grouped(
    calls: impl FnOnce() -> Result<(), cudarc::nccl::result::NcclError>,
) -> Result<(), cudarc::nccl::result::NcclError> {
    group_start()?;
    let out = calls();
    let end = group_end();
    out?;
    end.map(|_| ())
}

/// Marks the group failed and aborts the communicator (`ncclCommAbort`, which also ends
/// kernels still waiting for peers).
pub(super) fn abort_locked(st: &mut State, reason: String) {
    if st.aborted.is_none() {
        st.aborted = Some(reason);
    }
    if let Some(comm) = st.comm.take() {
        // cudarc's drop aborts the communicator and panics if NCCL reports an error; the
        // group is failed either way.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)));
    }
}
