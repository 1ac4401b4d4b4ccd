//! [`Collective`] for [`NcclCollective`]: each collective of the trait as NCCL calls on the
//! rank's stream (host buffers staged through the device), the tensor and all-to-all forms
//! in `nccl_tensors.rs` and `nccl_all_to_all.rs`. The communicator and its lock are
//! `nccl.rs`'s.

use super::nccl::{abort_locked, NcclCollective};
use super::{Collective, CollectiveError};
use cudarc::nccl::ReduceOp;

fn scale(buf: &mut [f32], by: f32) {
    buf.iter_mut().for_each(|x| *x *= by);
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn abort(&self, reason: &str) {
        let mut st = self.lock();
        abort_locked(&mut st, format!("rank {} aborted: {reason}", self.rank));
    }

    fn all_reduce_mean_f32(&self, buffers: &mut [&mut [f32]]) -> Result<(), CollectiveError> {
        let op = "all_reduce_mean";
        let mut dev = buffers
            .iter()
            .map(|b| self.upload(op, b))
            .collect::<Result<Vec<_>, _>>()?;
        self.run(op, |comm| {
            self.grouped(op, || {
                dev.iter_mut()
                    .try_for_each(|d| comm.all_reduce_in_place(d, &ReduceOp::Sum).map(|_| ()))
            })
        })?;
        for (b, d) in buffers.iter_mut().zip(&dev) {
            b.copy_from_slice(&self.download(op, d)?);
            scale(b, 1.0 / self.world as f32);
        }
        Ok(())
    }

    fn broadcast_f32(
        &self,
        buffers: &mut [&mut [f32]],
        root: usize,
    ) -> Result<(), CollectiveError> {
        let op = "broadcast";
        if root >= self.world {
            return Err(self.mismatch(format!(
                "broadcast root {root} is not a rank of {}",
                self.world
            )));
        }
        let mut dev = buffers
            .iter()
            .map(|b| self.upload(op, b))
            .collect::<Result<Vec<_>, _>>()?;
        self.run(op, |comm| {
            self.grouped(op, || {
                dev.iter_mut()
                    .try_for_each(|d| comm.broadcast_in_place(d, root as i32).map(|_| ()))
            })
        })?;
        for (b, d) in buffers.iter_mut().zip(&dev) {
            b.copy_from_slice(&self.download(op, d)?);
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        let op = "barrier";
        let mut token = self.zeros::<f32>(op, 1)?;
        self.run(op, |comm| {
            self.grouped(op, || {
                comm.all_reduce_in_place(&mut token, &ReduceOp::Sum)
                    .map(|_| ())
            })
        })
    }

    fn all_gather_f32(
        &self,
        shards: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let op = "all_gather";
        self.check_lengths(op, shards.iter().map(|s| s.len() * self.world), out)?;
        let send = shards
            .iter()
            .map(|s| self.upload(op, s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut recv = out
            .iter()
            .map(|o| self.zeros::<f32>(op, o.len()))
            .collect::<Result<Vec<_>, _>>()?;
        self.run(op, |comm| {
            self.grouped(op, || {
                send.iter()
                    .zip(recv.iter_mut())
                    .try_for_each(|(s, r)| comm.all_gather(s, r).map(|_| ()))
            })
        })?;
        for (o, r) in out.iter_mut().zip(&recv) {
            o.copy_from_slice(&self.download(op, r)?);
        }
        Ok(())
    }

    fn reduce_scatter_mean_f32(
        &self,
        inputs: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let op = "reduce_scatter_mean";
        if let Some((i, x)) = inputs
            .iter()
            .enumerate()
            .find(|(_, x)| x.len() % self.world != 0)
        {
            return Err(self.mismatch(format!(
                "{op}: input {i} has {} elements, not a multiple of the group size {}",
                x.len(),
                self.world
            )));
        }
        self.check_lengths(op, inputs.iter().map(|x| x.len() / self.world), out)?;
        let send = inputs
            .iter()
            .map(|x| self.upload(op, x))
            .collect::<Result<Vec<_>, _>>()?;
        let mut recv = out
            .iter()
            .map(|o| self.zeros::<f32>(op, o.len()))
            .collect::<Result<Vec<_>, _>>()?;
        self.run(op, |comm| {
            self.grouped(op, || {
                send.iter()
                    .zip(recv.iter_mut())
                    .try_for_each(|(s, r)| comm.reduce_scatter(s, r, &ReduceOp::Sum).map(|_| ()))
            })
        })?;
        for (o, r) in out.iter_mut().zip(&recv) {
            o.copy_from_slice(&self.download(op, r)?);
            scale(o, 1.0 / self.world as f32);
        }
        Ok(())
    }

    fn all_to_all_f32(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CollectiveError> {
        super::nccl_all_to_all::all_to_all(self, send)
    }

    fn all_reduce_mean(
        &self,
        tensors: &[candle_core::Tensor],
    ) -> Result<Vec<candle_core::Tensor>, CollectiveError> {
        super::nccl_tensors::all_reduce_mean(self, tensors)
    }

    fn broadcast(
        &self,
        tensors: &[candle_core::Tensor],
        root: usize,
    ) -> Result<Vec<candle_core::Tensor>, CollectiveError> {
        super::nccl_tensors::broadcast(self, tensors, root)
    }

    fn all_gather(
        &self,
        shards: &[candle_core::Tensor],
    ) -> Result<Vec<candle_core::Tensor>, CollectiveError> {
        super::nccl_tensors::all_gather(self, shards)
    }

    fn reduce_scatter_mean(
        &self,
        tensors: &[candle_core::Tensor],
    ) -> Result<Vec<candle_core::Tensor>, CollectiveError> {
        super::nccl_tensors::reduce_scatter_mean(self, tensors)
    }
}

impl NcclCollective {
    fn check_lengths(
        &self,
        op: &'static str,
        want: impl Iterator<Item = usize>,
        out: &[&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let want: Vec<usize> = want.collect();
        if want.len() != out.len() {
            return Err(self.mismatch(format!(
                "{op}: {} inputs but {} outputs",
                want.len(),
                out.len()
            )));
        }
        match want.iter().zip(out).position(|(w, o)| *w != o.len()) {
            None => Ok(()),
            Some(i) => Err(self.mismatch(format!(
                "{op}: output {i} has {} elements, expected {}",
                out[i].len(),
                want[i]
            ))),
        }
    }
}
