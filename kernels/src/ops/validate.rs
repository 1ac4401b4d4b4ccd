//! Argument checks shared by the public op wrappers: dtypes, devices and token-id tensors,
//! each failing with a message that names the op, the argument and what was expected.
//! Shape checks specific to one op stay in that op's file.

use candle_core::{CpuStorage, DType, Result, Tensor};

/// `t` must be f32 or f64 (f32 only on CUDA).
/// Every tensor of `args` (`(name, tensor)`) is f32 on the CPU.
pub(crate) fn f32_on_cpu(op: &str, args: &[(&str, &Tensor)]) -> Result<()> {
    for (what, t) in args {
        if t.dtype() != DType::F32 || !t.device().is_cpu() {
            candle_core::bail!(
                "{op}: `{what}` must be f32 on the CPU, got {:?} on {:?}",
                t.dtype(),
                t.device()
            );
        }
    }
    Ok(())
}

pub(crate) fn float_dtype(op: &str, arg: &str, t: &Tensor) -> Result<()> {
    match (t.dtype(), t.device().is_cuda()) {
        (DType::F32, _) | (DType::F64, false) => Ok(()),
        (dt, true) => candle_core::bail!("{op}: `{arg}` must be f32 on CUDA, got {dt:?}"),
        (dt, false) => candle_core::bail!("{op}: `{arg}` must be f32 or f64, got {dt:?}"),
    }
}

/// `b` must match `a`'s dtype.
pub(crate) fn same_dtype(
    op: &str,
    a_name: &str,
    a: &Tensor,
    b_name: &str,
    b: &Tensor,
) -> Result<()> {
    if a.dtype() != b.dtype() {
        candle_core::bail!(
            "{op}: `{b_name}` must have the dtype of `{a_name}` ({:?}), got {:?}",
            a.dtype(),
            b.dtype()
        );
    }
    Ok(())
}

/// `b` must live on `a`'s device.
pub(crate) fn same_device(op: &str, a: &Tensor, b_name: &str, b: &Tensor) -> Result<()> {
    if !a.device().same_device(b.device()) {
        candle_core::bail!(
            "{op}: `{b_name}` is on {:?} but the input is on {:?}",
            b.device().location(),
            a.device().location()
        );
    }
    Ok(())
}

/// Token ids as u32: u32 passes through, u8/i64 are converted, anything else is an error.
pub(crate) fn token_ids(op: &str, arg: &str, t: &Tensor) -> Result<Tensor> {
    match t.dtype() {
        DType::U32 => Ok(t.clone()),
        DType::U8 | DType::I64 => t.to_dtype(DType::U32),
        dt => candle_core::bail!("{op}: `{arg}` must hold integer token ids (u32), got {dt:?}"),
    }
}

/// Every id of `targets` must be below `vocab`; the error names the first that is not.
pub(crate) fn targets_in_vocab(op: &str, targets: &[u32], vocab: usize) -> Result<()> {
    if let Some((row, &id)) = targets
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        candle_core::bail!(
            "{op}: target id {id} at flat position {row} is out of range for a vocabulary of {vocab}"
        );
    }
    Ok(())
}

/// The error for a CPU storage dtype a kernel has no implementation for.
pub(crate) fn unsupported_cpu_dtype<T>(op: &str, s: &CpuStorage) -> Result<T> {
    use candle_core::backend::BackendStorage;
    candle_core::bail!(
        "{op}: unsupported dtype {:?} on CPU (expected f32 or f64)",
        s.dtype()
    )
}
