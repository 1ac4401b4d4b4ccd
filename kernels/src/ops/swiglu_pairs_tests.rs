use super::*;
use crate::ops::testing::{assert_close, bits, random_tensor};
use crate::ops::{gate_up_bf16, linear_bf16, swiglu, swiglu_linear_f32};
use candle_core::Var;

/// Over bf16 pairs the op is `swiglu` of the widened halves followed by `linear_bf16`, bit
/// for bit; its gradient of the pairs is the composed one rounded to bf16.
#[test]
fn it_is_the_composed_swiglu_and_bf16_linear_over_the_pairs() -> Result<()> {
    let pairs = (random_tensor(&[2, 9, 80], 1.0, 1)? * 4.0)?.to_dtype(DType::BF16)?;
    let gu = Var::from_tensor(&pairs)?;
    let w = Var::from_tensor(&random_tensor(&[24, 40], 0.2, 3)?)?;
    let probe = random_tensor(&[2, 9, 24], 1.0, 4)?;
    let fused = swiglu_pairs_linear_bf16(gu.as_tensor(), w.as_tensor())?;
    let wide = Var::from_tensor(&pairs.to_dtype(DType::F32)?)?;
    let (g, u) = (wide.narrow(2, 0, 40)?, wide.narrow(2, 40, 40)?);
    let composed = linear_bf16(&swiglu(&g.contiguous()?, &u.contiguous()?)?, w.as_tensor())?;
    assert_eq!(bits(&fused), bits(&composed), "forward");
    let gf = fused.mul(&probe)?.sum_all()?.backward()?;
    let gc = composed.mul(&probe)?.sum_all()?.backward()?;
    let d_pairs = gf.get(gu.as_tensor()).expect("fused d pairs");
    assert_eq!(d_pairs.dtype(), DType::BF16);
    let d_wide = gc.get(wide.as_tensor()).expect("composed d pairs");
    assert_eq!(
        bits(d_pairs),
        bits(&d_wide.to_dtype(DType::BF16)?),
        "d pairs"
    );
    let (a, b) = (gf.get(w.as_tensor()), gc.get(w.as_tensor()));
    assert_eq!(
        bits(a.expect("fused dw")),
        bits(b.expect("composed dw")),
        "d w"
    );
    Ok(())
}

/// The whole bf16 block (`gate_up_bf16` then this op) against the f32 block: the output
/// and every gradient within bf16's relative error.
#[test]
fn the_bf16_block_is_the_f32_block_within_bf16_error() -> Result<()> {
    let x = Var::from_tensor(&random_tensor(&[4, 16, 32], 1.0, 1)?)?;
    let wg = Var::from_tensor(&random_tensor(&[48, 32], 0.3, 2)?)?;
    let wu = Var::from_tensor(&random_tensor(&[48, 32], 0.3, 3)?)?;
    let wd = Var::from_tensor(&random_tensor(&[32, 48], 0.3, 4)?)?;
    let probe = random_tensor(&[4, 16, 32], 1.0, 5)?;
    let (xt, gt, ut, dt) = (
        x.as_tensor(),
        wg.as_tensor(),
        wu.as_tensor(),
        wd.as_tensor(),
    );
    let half = swiglu_pairs_linear_bf16(&gate_up_bf16(xt, gt, ut)?, dt)?;
    let full = swiglu_linear_f32(
        &crate::ops::linear_f32(xt, gt)?,
        &crate::ops::linear_f32(xt, ut)?,
        dt,
    )?;
    assert_close(&half, &full, 3e-2, "forward")?;
    let gh = half.mul(&probe)?.sum_all()?.backward()?;
    let gf = full.mul(&probe)?.sum_all()?.backward()?;
    for (v, what) in [
        (&x, "d x"),
        (&wg, "d w_gate"),
        (&wu, "d w_up"),
        (&wd, "d w_down"),
    ] {
        let a = gh.get(v.as_tensor()).expect("bf16 grad");
        let b = gf.get(v.as_tensor()).expect("f32 grad");
        assert_close(a, b, 3e-2, what)?;
    }
    Ok(())
}

#[test]
fn bad_inputs_are_named() -> Result<()> {
    let gu = random_tensor(&[3, 8], 1.0, 1)?.to_dtype(DType::BF16)?;
    let err = swiglu_pairs_linear_bf16(&gu, &random_tensor(&[5, 8], 1.0, 2)?)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be [.., 2·i]"), "{err}");
    let err = swiglu_pairs_linear_bf16(&gu.to_dtype(DType::F32)?, &random_tensor(&[5, 4], 1.0, 2)?)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be bf16"), "{err}");
    Ok(())
}
