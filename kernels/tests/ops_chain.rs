//! The fused ops chained the way a decoder uses them (norm -> rope -> projection -> log-probs
//! and entropy under a padding mask): every trainable tensor gets a gradient, and the
//! gradients equal those of the composed reference ops.

use candle_core::{Device, Result, Tensor, Var, D};
use oxalign_kernels::ops::{self, reference};

fn random(dims: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let mut s = seed.wrapping_mul(0x2545_F491_4F6C_DD1D).wrapping_add(7);
    let n: usize = dims.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
}

struct Params {
    x: Var,
    norm_w: Var,
    w_out: Var,
}

type Norm = fn(&Tensor, &Tensor, f64) -> Result<Tensor>;
type Rope = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
type Logp = fn(&Tensor, &Tensor) -> Result<Tensor>;
type Ent = fn(&Tensor) -> Result<Tensor>;

#[allow(clippy::too_many_arguments)]
fn loss(
    p: &Params,
    cos: &Tensor,
    sin: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    (norm, rope, logp, ent): (Norm, Rope, Logp, Ent),
    heads: usize,
) -> Result<Tensor> {
    let (b, t, d) = p.x.as_tensor().dims3()?;
    let h = norm(p.x.as_tensor(), p.norm_w.as_tensor(), 1e-6)?;
    // [B, T, D] -> [B, H, T, D/H] (non-contiguous after the transpose), rope, and back.
    let h = h.reshape((b, t, heads, d / heads))?.transpose(1, 2)?;
    let h = rope(&h, cos, sin)?.transpose(1, 2)?.reshape((b, t, d))?;
    let logits = h.broadcast_matmul(p.w_out.as_tensor())?;
    let lp = logp(&logits, targets)?;
    let entropy = ent(&logits)?;
    let n = mask.sum_all()?;
    let pg = (lp * mask)?.sum_all()?.div(&n)?;
    let ent = (entropy * mask)?.sum_all()?.div(&n)?;
    (pg.neg()? - (ent * 0.01)?)?.sum_all()
}

#[test]
fn chained_fused_ops_match_composed_gradients() -> Result<()> {
    let (b, t, d, heads, v) = (2, 5, 16, 2, 37);
    let p = Params {
        x: Var::from_tensor(&random(&[b, t, d], 1.0, 1)?)?,
        norm_w: Var::from_tensor(&(random(&[d], 0.1, 2)? + 1.0)?)?,
        w_out: Var::from_tensor(&random(&[d, v], 0.5, 3)?)?,
    };
    // Per-row positions from a left-padded mask: row 0 padded by 2.
    let mask = Tensor::new(
        &[[0f32, 0., 1., 1., 1.], [1., 1., 1., 1., 1.]],
        &Device::Cpu,
    )?;
    let pos = Tensor::new(
        &[[0f32, 0., 0., 1., 2.], [0., 1., 2., 3., 4.]],
        &Device::Cpu,
    )?;
    let inv_freq: Vec<f32> = (0..d / heads / 2)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / (d / heads) as f32))
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, 1, d / heads / 2), &Device::Cpu)?;
    let angles = pos.unsqueeze(D::Minus1)?.broadcast_mul(&inv_freq)?; // [B, T, Dh/2]
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let targets = Tensor::new(&[[3u32, 0, 36, 5, 9], [1, 2, 3, 4, 30]], &Device::Cpu)?;

    let fused = (
        ops::rms_norm as Norm,
        ops::rope as Rope,
        ops::token_logprobs as Logp,
        ops::entropy as Ent,
    );
    let composed = (
        reference::rms_norm as Norm,
        reference::rope as Rope,
        reference::token_logprobs as Logp,
        reference::entropy as Ent,
    );
    let lf = loss(&p, &cos, &sin, &targets, &mask, fused, heads)?;
    let lc = loss(&p, &cos, &sin, &targets, &mask, composed, heads)?;
    let (lf_v, lc_v) = (lf.to_scalar::<f32>()?, lc.to_scalar::<f32>()?);
    assert!((lf_v - lc_v).abs() < 1e-5, "loss {lf_v} vs {lc_v}");

    let gf = lf.backward()?;
    let gc = lc.backward()?;
    for (name, var) in [("x", &p.x), ("norm_w", &p.norm_w), ("w_out", &p.w_out)] {
        let a = gf
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name} got no gradient through the fused ops"));
        let c = gc.get(var.as_tensor()).expect("composed gradient");
        let max_diff = (a - c)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let scale = c.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(scale > 0.0, "{name}: zero gradient");
        assert!(
            max_diff <= 1e-5 * (1.0 + scale),
            "{name}: max |diff| {max_diff}"
        );
    }
    // Padded positions of x get no gradient from the loss except through the norm weight.
    let gx = gf.get(p.x.as_tensor()).expect("x grad");
    let padded = gx
        .get(0)?
        .narrow(0, 0, 2)?
        .abs()?
        .sum_all()?
        .to_scalar::<f32>()?;
    assert_eq!(padded, 0.0);
    Ok(())
}
