//! Freeing and refilling a CPU `Var`'s storage in place, so a model keeps its structure (its
//! layers hold the same tensors) while the full weights of a sharded replica exist only
//! between a gather and the next release.
//!
//! A released tensor still reports its shape but owns no elements: reading it is an error or
//! a panic in candle, so only [`super::ShardedParams`] calls these, and the trainers gather
//! before every use. CPU and f32 only (other devices keep their full weights).

use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor};
use std::sync::Mutex;

/// Replaces the storage with an empty buffer (frees the elements).
struct Release;

impl InplaceOp1 for Release {
    fn name(&self) -> &'static str {
        "fsdp-release"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, _layout: &Layout) -> candle_core::Result<()> {
        match storage {
            CpuStorage::F32(v) => {
                *v = Vec::new();
                Ok(())
            }
            _ => candle_core::bail!("fsdp release: only f32 parameters are sharded"),
        }
    }
}

/// Replaces the storage with `data` (moved in, not copied).
struct Restore(Mutex<Option<Vec<f32>>>);

impl InplaceOp1 for Restore {
    fn name(&self) -> &'static str {
        "fsdp-restore"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let mut slot = self
            .0
            .lock()
            .map_err(|_| candle_core::Error::Msg("fsdp restore: lock poisoned".into()))?;
        let Some(data) = slot.take() else {
            candle_core::bail!("fsdp restore: the data was already used")
        };
        if layout.contiguous_offsets() != Some((0, data.len())) {
            candle_core::bail!(
                "fsdp restore: {} elements do not fit the parameter's layout {:?}",
                data.len(),
                layout.shape()
            )
        }
        match storage {
            CpuStorage::F32(v) => {
                *v = data;
                Ok(())
            }
            _ => candle_core::bail!("fsdp restore: only f32 parameters are sharded"),
        }
    }
}

/// Frees the elements of `t` (CPU, f32); its shape is unchanged.
pub(crate) fn release(t: &Tensor) -> candle_core::Result<()> {
    t.inplace_op1(&Release)
}

/// Gives `t` the elements `data` (row-major, exactly its element count).
pub(crate) fn restore(t: &Tensor, data: Vec<f32>) -> candle_core::Result<()> {
    if data.len() != t.elem_count() {
        candle_core::bail!(
            "fsdp restore: {} elements for a parameter of shape {:?}",
            data.len(),
            t.dims()
        )
    }
    t.inplace_op1(&Restore(Mutex::new(Some(data))))
}

/// Bytes the storage behind `t` holds now (0 once released); for non-CPU storage, the
/// bytes of its elements.
pub(crate) fn held_bytes(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => v.len() * 4,
        Storage::Cpu(CpuStorage::F64(v)) => v.len() * 8,
        _ => t.elem_count() * t.dtype().size_in_bytes(),
    }
}

/// True when `t`'s elements can be freed and refilled here: f32, on the CPU, contiguous
/// from offset 0 over its whole storage.
pub(crate) fn releasable(t: &Tensor) -> bool {
    let (storage, layout) = t.storage_and_layout();
    let whole = match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => v.len() == t.elem_count(),
        _ => false,
    };
    whole && layout.contiguous_offsets() == Some((0, t.elem_count()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn release_frees_and_restore_refills_the_same_var() {
        let v = Var::from_tensor(&Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap())
            .unwrap();
        let alias = v.as_tensor().clone();
        assert!(releasable(&alias));
        assert_eq!(held_bytes(&alias), 16);
        release(v.as_tensor()).unwrap();
        assert_eq!(held_bytes(&alias), 0);
        assert_eq!(alias.dims(), &[2, 2]);
        restore(v.as_tensor(), vec![5.0, 6.0, 7.0, 8.0]).unwrap();
        assert_eq!(
            alias.to_vec2::<f32>().unwrap(),
            vec![vec![5.0, 6.0], vec![7.0, 8.0]]
        );
        assert!(restore(v.as_tensor(), vec![1.0]).is_err());
    }
}
