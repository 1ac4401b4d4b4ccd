//! All-to-all with variable lengths over NCCL: first every rank's send lengths are
//! all-gathered (so each rank knows what it will receive), then one grouped round of
//! `ncclSend`/`ncclRecv` moves the rows (empty blocks are skipped). Both rounds wait with the
//! group's timeout.

use super::nccl::NcclCollective;
use super::{Collective, CollectiveError};
use cudarc::driver::CudaSlice;

/// [`Collective::all_to_all_f32`] for [`NcclCollective`].
pub(super) fn all_to_all(
    c: &NcclCollective,
    send: Vec<Vec<f32>>,
) -> Result<Vec<Vec<f32>>, CollectiveError> {
    let op = "all_to_all";
    let (rank, world) = (c.rank(), c.world_size());
    if send.len() != world {
        return Err(c.mismatch(format!(
            "{op}: {} send blocks for a group of {world}",
            send.len()
        )));
    }
    let counts = exchange_counts(c, &send)?;
    let blocks: Vec<Option<CudaSlice<f32>>> = send
        .iter()
        .map(|s| (!s.is_empty()).then(|| c.upload(op, s)).transpose())
        .collect::<Result<_, _>>()?;
    let mut recv: Vec<Option<CudaSlice<f32>>> = (0..world)
        .map(|s| {
            let n = counts[s * world + rank] as usize;
            (n > 0).then(|| c.zeros::<f32>(op, n)).transpose()
        })
        .collect::<Result<_, _>>()?;
    c.run(op, |comm| {
        c.grouped(op, || {
            for (d, b) in blocks.iter().enumerate() {
                if let Some(b) = b {
                    comm.send(b, d as i32)?;
                }
            }
            for (s, b) in recv.iter_mut().enumerate() {
                if let Some(b) = b {
                    comm.recv(b, s as i32)?;
                }
            }
            Ok(())
        })
    })?;
    recv.iter()
        .map(|b| match b {
            Some(b) => c.download(op, b),
            None => Ok(Vec::new()),
        })
        .collect()
}

/// The `[world, world]` send lengths of every rank (`counts[s·world + d]`: what rank `s`
/// sends to rank `d`).
fn exchange_counts(c: &NcclCollective, send: &[Vec<f32>]) -> Result<Vec<u64>, CollectiveError> {
    let op = "all_to_all";
    let world = c.world_size();
    let mine: Vec<u64> = send.iter().map(|s| s.len() as u64).collect();
    let mine = c.upload(op, &mine)?;
    let mut all = c.zeros::<u64>(op, world * world)?;
    c.run(op, |comm| {
        c.grouped(op, || comm.all_gather(&mine, &mut all).map(|_| ()))
    })?;
    c.download(op, &all)
}
