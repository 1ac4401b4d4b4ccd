//! Response-mask helpers shared by the advantage estimators and the losses: argument checks,
//! masked sums/means and the "zero where masked" guard that keeps padding out of every result.
//! It does not build masks from token ids (that is the rollout's job).

use candle_core::{DType, Tensor};

use crate::error::{Result, RlhfError};

/// Checks that `t` has a float dtype (F16, BF16, F32 or F64) and returns it.
pub(crate) fn expect_float(name: &str, t: &Tensor) -> Result<DType> {
    match t.dtype() {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Ok(t.dtype()),
        got => Err(RlhfError::DType {
            name: name.into(),
            expected: "a float dtype (f32 or f64)".into(),
            got,
        }),
    }
}

/// Checks that `t` has exactly `dtype` (all float inputs of one call must agree).
pub(crate) fn expect_dtype(name: &str, t: &Tensor, dtype: DType, like: &str) -> Result<()> {
    if t.dtype() != dtype {
        return Err(RlhfError::DType {
            name: name.into(),
            expected: format!("{dtype:?} (the dtype of `{like}`)"),
            got: t.dtype(),
        });
    }
    Ok(())
}

/// Checks that `t` is 2-D and returns `(batch, seq)`.
pub(crate) fn expect_2d(name: &str, t: &Tensor) -> Result<(usize, usize)> {
    match t.dims() {
        [b, s] => Ok((*b, *s)),
        got => Err(RlhfError::Shape {
            name: name.into(),
            expected: "[batch, seq]".into(),
            got: got.to_vec(),
        }),
    }
}

/// Checks that `t` is 1-D and returns its length.
pub(crate) fn expect_1d(name: &str, t: &Tensor) -> Result<usize> {
    match t.dims() {
        [n] => Ok(*n),
        got => Err(RlhfError::Shape {
            name: name.into(),
            expected: "[batch]".into(),
            got: got.to_vec(),
        }),
    }
}

/// Checks that `t` has exactly the shape `dims` (`what` describes it, e.g. `"[batch, seq]"`).
pub(crate) fn expect_shape(name: &str, t: &Tensor, dims: &[usize], what: &str) -> Result<()> {
    if t.dims() != dims {
        return Err(RlhfError::Shape {
            name: name.into(),
            expected: format!("{what} = {dims:?}"),
            got: t.dims().to_vec(),
        });
    }
    Ok(())
}

/// Checks a float input of shape `dims` with the given dtype, in one call.
pub(crate) fn expect_like(
    name: &str,
    t: &Tensor,
    dims: &[usize],
    dtype: DType,
    like: &str,
) -> Result<()> {
    let what = if dims.len() == 2 {
        "[batch, seq]"
    } else {
        "[batch]"
    };
    expect_shape(name, t, dims, what)?;
    expect_dtype(name, t, dtype, like)
}

/// Turns a mask (any dtype; non-zero = response token) into a `u8` predicate of the same shape.
pub(crate) fn predicate(mask: &Tensor) -> Result<Tensor> {
    Ok(mask.ne(0.0)?)
}

/// `x` where the predicate is set, exact zeros elsewhere. Gradients flow to `x` only at set
/// positions, and whatever sits at unset positions (even NaN/inf) never reaches the output.
pub(crate) fn zero_unmasked_out(x: &Tensor, pred: &Tensor) -> Result<Tensor> {
    Ok(pred.where_cond(x, &x.zeros_like()?)?)
}

/// Copies a float tensor to the host as a flat `Vec<f64>` (row-major).
pub(crate) fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// Copies a mask to the host as a flat `Vec<bool>` (non-zero = true).
pub(crate) fn host_mask(mask: &Tensor) -> Result<Vec<bool>> {
    Ok(predicate(mask)?
        .flatten_all()?
        .to_vec1::<u8>()?
        .into_iter()
        .map(|m| m != 0)
        .collect())
}

/// Builds a tensor of `dtype` on `like`'s device from host values.
pub(crate) fn from_host(
    values: Vec<f64>,
    dims: &[usize],
    dtype: DType,
    like: &Tensor,
) -> Result<Tensor> {
    Ok(Tensor::from_vec(values, dims, like.device())?.to_dtype(dtype)?)
}

/// Reads a scalar tensor (any float dtype) as `f64`.
pub(crate) fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// Sum of `x` over positions where `mask` is non-zero.
///
/// * `x`: `[batch, seq]` float; `mask`: `[batch, seq]`, any dtype, non-zero = counted.
/// * Returns a scalar tensor of `x`'s dtype, differentiable w.r.t. `x` (zero gradient at masked
///   positions). Values at masked positions never influence the result, even if not finite.
pub fn masked_sum(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    expect_float("x", x)?;
    let (b, s) = expect_2d("x", x)?;
    expect_shape("mask", mask, &[b, s], "[batch, seq]")?;
    Ok(zero_unmasked_out(x, &predicate(mask)?)?.sum_all()?)
}

/// Mean of `x` over positions where `mask` is non-zero (`0` when the mask is all zero).
///
/// * `x`: `[batch, seq]` float; `mask`: `[batch, seq]`, any dtype, non-zero = counted.
/// * Returns a scalar tensor of `x`'s dtype, differentiable w.r.t. `x`.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let sum = masked_sum(x, mask)?;
    let count = predicate(mask)?
        .to_dtype(x.dtype())?
        .sum_all()?
        .maximum(1.0)?;
    Ok(sum.broadcast_div(&count)?)
}

/// Broadcasts one value per sequence to its response tokens.
///
/// * `values`: `[batch]` float (e.g. group-relative advantages); `mask`: `[batch, seq]`, any dtype.
/// * Returns `[batch, seq]` of `values`' dtype: `values[b]` where `mask[b, t] != 0`, else `0`.
pub fn broadcast_to_tokens(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    expect_float("values", values)?;
    let n = expect_1d("values", values)?;
    let (b, s) = expect_2d("mask", mask)?;
    if b != n {
        return Err(RlhfError::Shape {
            name: "mask".into(),
            expected: format!("[batch, seq] with batch = {n} (the length of `values`)"),
            got: mask.dims().to_vec(),
        });
    }
    let wide = values.unsqueeze(1)?.broadcast_as((b, s))?.contiguous()?;
    zero_unmasked_out(&wide, &predicate(mask)?)
}

/// `(mean, max)` of `|a − b|` over the positions where `mask` is 1, in nats when `a` and `b`
/// are log-probs (`(0, 0)` for an empty mask). All three `[B, T]`; `a` is detached.
pub fn masked_abs_diff(a: &Tensor, b: &Tensor, mask: &Tensor) -> Result<(f64, f64)> {
    let mask = mask.to_dtype(a.dtype())?;
    let d = ((a.detach() - b)?.abs()? * &mask)?;
    let count = scalar(&mask.sum_all()?)?;
    if count == 0.0 {
        return Ok((0.0, 0.0));
    }
    let sum = scalar(&d.sum_all()?)?;
    let max = scalar(&d.flatten_all()?.max(0)?)?;
    Ok((sum / count, max))
}
