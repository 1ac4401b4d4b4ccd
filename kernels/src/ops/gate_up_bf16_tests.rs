use super::*;
use crate::ops::linear_bf16;
use crate::ops::testing::{bits, random_tensor};
use candle_core::{DType, Tensor, Var};

/// The op is two `linear_bf16` products rounded to bf16 and set side by side; its three
/// gradients are theirs for the bf16-rounded upstream gradient, bit for bit.
#[test]
fn it_is_two_bf16_linears_rounded_side_by_side() -> Result<()> {
    let x = Var::from_tensor(&random_tensor(&[2, 7, 24], 1.0, 1)?)?;
    let wg = Var::from_tensor(&random_tensor(&[40, 24], 0.3, 2)?)?;
    let wu = Var::from_tensor(&random_tensor(&[40, 24], 0.3, 3)?)?;
    let probe = random_tensor(&[2, 7, 80], 1.0, 4)?
        .to_dtype(DType::BF16)?
        .to_dtype(DType::F32)?;
    let fused = gate_up_bf16(x.as_tensor(), wg.as_tensor(), wu.as_tensor())?;
    assert_eq!(fused.dtype(), DType::BF16);
    let gate = linear_bf16(x.as_tensor(), wg.as_tensor())?;
    let up = linear_bf16(x.as_tensor(), wu.as_tensor())?;
    let composed = Tensor::cat(&[&gate, &up], 2)?;
    assert_eq!(bits(&fused), bits(&composed.to_dtype(DType::BF16)?));
    let gf = fused
        .to_dtype(DType::F32)?
        .mul(&probe)?
        .sum_all()?
        .backward()?;
    let gc = composed.mul(&probe)?.sum_all()?.backward()?;
    for (v, what) in [(&x, "d x"), (&wg, "d w_gate"), (&wu, "d w_up")] {
        let a = gf.get(v.as_tensor()).expect("fused grad");
        let b = gc.get(v.as_tensor()).expect("composed grad");
        assert_eq!(a.dims(), b.dims(), "{what}");
        assert_eq!(bits(a), bits(b), "{what}");
    }
    Ok(())
}

#[test]
fn frozen_weights_take_no_gradient_and_bad_shapes_are_named() -> Result<()> {
    let x = Var::from_tensor(&random_tensor(&[3, 8], 1.0, 1)?)?;
    let (wg, wu) = (
        random_tensor(&[5, 8], 1.0, 2)?,
        random_tensor(&[5, 8], 1.0, 3)?,
    );
    let y = gate_up_bf16(x.as_tensor(), &wg, &wu)?;
    let grads = y.to_dtype(DType::F32)?.sum_all()?.backward()?;
    assert!(grads.get(&wg).is_none() && grads.get(&wu).is_none());
    assert!(grads.get(x.as_tensor()).is_some());
    let err = gate_up_bf16(x.as_tensor(), &wg, &random_tensor(&[5, 7], 1.0, 3)?)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must both be [i, 8]"), "{err}");
    let err = gate_up_bf16(&x.as_tensor().to_dtype(DType::BF16)?, &wg, &wu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`x` must be f32"), "{err}");
    Ok(())
}
