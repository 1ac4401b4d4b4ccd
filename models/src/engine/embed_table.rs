//! [`EmbedTable`]: the engine's token embeddings `[vocab, hidden]`, f32, row-major on the
//! host: its own copy, or a LoRA model's frozen base embedding shared with the trainer.
//!
//! The engine copies every weight it serves, so that an optimizer's in-place update of the
//! trainer's parameters never reaches the rollouts without a refit. The frozen base of a
//! LoRA model is never written by anyone (the adapters train, the base is a value): its
//! embedding, the largest tensor the engine keeps unpacked, is read in place rather than
//! held twice.

use candle_core::{DType, Storage, Tensor};
use std::sync::Arc;

/// The engine's token embeddings.
#[derive(Clone, Debug)]
pub(crate) enum EmbedTable {
    /// The engine's own copy.
    Own(Arc<Vec<f32>>),
    /// A frozen host f32 tensor, contiguous, shared with the trainer.
    Frozen(Tensor),
}

impl EmbedTable {
    /// `t` shared as a frozen table when it is a contiguous host f32 tensor; `None`
    /// otherwise (the caller copies it).
    pub(crate) fn frozen(t: &Tensor) -> Option<EmbedTable> {
        let shared = t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous();
        shared.then(|| EmbedTable::Frozen(t.clone()))
    }

    /// Writes row `id` of the table into each `hidden`-wide chunk of `out`, one per id.
    pub(crate) fn copy_rows(
        &self,
        ids: &[u32],
        hidden: usize,
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        match self {
            EmbedTable::Own(v) => copy_rows(v, ids, hidden, out),
            EmbedTable::Frozen(t) => {
                let (storage, layout) = t.storage_and_layout();
                let Storage::Cpu(cpu) = &*storage else {
                    candle_core::bail!("a frozen embedding table must be on the host")
                };
                let all = cpu.as_slice::<f32>()?;
                copy_rows(&all[layout.start_offset()..], ids, hidden, out)
            }
        }
    }

    /// Whether both are the same table (not a copy).
    #[cfg(test)]
    pub(crate) fn same(&self, other: &EmbedTable) -> bool {
        match (self, other) {
            (EmbedTable::Own(a), EmbedTable::Own(b)) => Arc::ptr_eq(a, b),
            (EmbedTable::Frozen(a), EmbedTable::Frozen(b)) => host_ptr(a) == host_ptr(b),
            _ => false,
        }
    }
}

/// Where a host f32 tensor's storage starts (tests: whether two tensors share it).
#[cfg(test)]
pub(crate) fn host_ptr(t: &Tensor) -> Option<*const f32> {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => cpu.as_slice::<f32>().ok().map(|s| s.as_ptr()),
        _ => None,
    }
}

fn copy_rows(
    table: &[f32],
    ids: &[u32],
    hidden: usize,
    out: &mut [f32],
) -> candle_core::Result<()> {
    for (row, &id) in out.chunks_mut(hidden).zip(ids) {
        let start = id as usize * hidden;
        let Some(src) = table.get(start..start + hidden) else {
            candle_core::bail!("token id {id} is outside the embedding table")
        };
        row.copy_from_slice(src);
    }
    Ok(())
}
