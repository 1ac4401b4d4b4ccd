//! Tests of the fused causal attention against the composed candle path
//! (`reference::causal_attention`) and against finite differences: GQA, left padding, holes
//! in the key mask, sliding windows, T not a multiple of the tile, dead (fully hidden) rows.

use candle_core::{DType, Device, Result, Tensor, Var};

use super::attention::{causal_attention, causal_attention_tiled};
use super::attention_fwd::Tiles;
use super::reference::causal_attention as composed;
use super::testing::{assert_close, finite_difference_check, random_tensor};

/// One test configuration: shapes, leading pads per batch row, window, tiles.
struct Case {
    b: usize,
    nh: usize,
    nkv: usize,
    t: usize,
    hd: usize,
    pads: &'static [usize],
    window: Option<usize>,
    tiles: Tiles,
}

impl Case {
    fn key_mask(&self) -> Option<Vec<u32>> {
        if self.pads.is_empty() {
            return None;
        }
        let mut m = vec![1u32; self.b * self.t];
        for (row, &p) in self.pads.iter().enumerate() {
            m[row * self.t..row * self.t + p.min(self.t)].fill(0);
        }
        Some(m)
    }

    fn qkv(&self, seed: u64, dtype: DType) -> Result<[Tensor; 3]> {
        let q = random_tensor(&[self.b, self.nh, self.t, self.hd], 2.0, seed)?;
        let k = random_tensor(&[self.b, self.nkv, self.t, self.hd], 2.0, seed + 1)?;
        let v = random_tensor(&[self.b, self.nkv, self.t, self.hd], 1.0, seed + 2)?;
        Ok([q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?])
    }

    fn fused(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&[u32]>) -> Result<Tensor> {
        causal_attention_tiled(q, k, v, (mask, None), self.window, self.tiles)
    }
}

const SMALL: Tiles = Tiles { q: 3, k: 2 };

fn cases() -> Vec<Case> {
    let c = |b, nh, nkv, t, hd, pads, window, tiles| Case {
        b,
        nh,
        nkv,
        t,
        hd,
        pads,
        window,
        tiles,
    };
    vec![
        c(1, 1, 1, 1, 4, &[], None, Tiles::DEFAULT),
        c(2, 2, 2, 5, 8, &[], None, SMALL),
        c(2, 4, 2, 7, 8, &[2, 0], None, SMALL),
        c(3, 4, 1, 9, 6, &[0, 4, 9], Some(3), SMALL),
        c(2, 6, 3, 11, 16, &[5, 1], Some(4), Tiles { q: 4, k: 5 }),
        c(2, 4, 2, 70, 32, &[13, 0], None, Tiles::DEFAULT),
        c(1, 4, 4, 130, 64, &[0], Some(50), Tiles::DEFAULT),
        c(2, 8, 2, 150, 16, &[70, 3], Some(64), Tiles::DEFAULT),
    ]
}

#[test]
fn forward_matches_composed() -> Result<()> {
    for (n, case) in cases().iter().enumerate() {
        let [q, k, v] = case.qkv(10 * n as u64, DType::F32)?;
        let mask = case.key_mask();
        let got = case.fused(&q, &k, &v, mask.as_deref())?;
        let want = composed(&q, &k, &v, mask.as_deref(), case.window)?;
        assert_eq!(got.dims(), [case.b, case.nh, case.t, case.hd]);
        assert_close(&got, &want, 1e-5, &format!("forward case {n}"))?;
        let [q, k, v] = [&q, &k, &v].map(|x| x.to_dtype(DType::F64).expect("f64"));
        let got = case.fused(&q, &k, &v, mask.as_deref())?;
        let want = composed(&q, &k, &v, mask.as_deref(), case.window)?;
        assert_close(&got, &want, 1e-12, &format!("forward f64 case {n}"))?;
    }
    Ok(())
}

#[test]
fn backward_matches_composed_autograd() -> Result<()> {
    for (n, case) in cases().iter().enumerate() {
        let qkv = case.qkv(100 + 10 * n as u64, DType::F32)?;
        let vars = qkv.clone().map(|x| Var::from_tensor(&x).expect("var"));
        let [q, k, v] = [0, 1, 2].map(|i| vars[i].as_tensor());
        let mask = case.key_mask();
        let proj = random_tensor(&[case.b, case.nh, case.t, case.hd], 1.0, 7)?;
        let gf = case
            .fused(q, k, v, mask.as_deref())?
            .mul(&proj)?
            .sum_all()?
            .backward()?;
        let gc = composed(q, k, v, mask.as_deref(), case.window)?
            .mul(&proj)?
            .sum_all()?
            .backward()?;
        for (name, x) in [("q", q), ("k", k), ("v", v)] {
            let a = gf.get(x).expect("fused grad");
            let c = gc.get(x).expect("composed grad");
            assert_close(a, c, 1e-5, &format!("case {n} d{name}"))?;
        }
    }
    Ok(())
}

/// Finite differences in f64 for each of q, k and v (GQA, padding with a dead row, window).
#[test]
fn backward_matches_finite_differences() -> Result<()> {
    let case = Case {
        b: 2,
        nh: 4,
        nkv: 2,
        t: 5,
        hd: 4,
        pads: &[2, 0],
        window: Some(3),
        tiles: SMALL,
    };
    let [q, k, v] = case.qkv(5, DType::F64)?;
    let mask = case.key_mask();
    let m = mask.as_deref();
    let proj = random_tensor(&[2, 4, 5, 4], 1.0, 6)?.to_dtype(DType::F64)?;
    // Squared so the loss is not linear in v.
    let loss = |o: Tensor| o.mul(&proj)?.sqr()?.sum_all();
    finite_difference_check(&q, |q| loss(case.fused(q, &k, &v, m)?), 1e-6)?;
    finite_difference_check(&k, |k| loss(case.fused(&q, k, &v, m)?), 1e-6)?;
    finite_difference_check(&v, |v| loss(case.fused(&q, &k, v, m)?), 1e-6)
}

/// Rows that see no key (left pads; here also a key mask with a hole) are the mean of all
/// values, finite, and pass no gradient to q; the composed path agrees.
#[test]
fn dead_rows_average_all_values_without_nan() -> Result<()> {
    let (t, hd) = (6, 4);
    let q = Var::from_tensor(&random_tensor(&[1, 2, t, hd], 2.0, 1)?)?;
    let k = random_tensor(&[1, 1, t, hd], 2.0, 2)?;
    let v = random_tensor(&[1, 1, t, hd], 1.0, 3)?;
    let mask = [0u32, 0, 0, 1, 0, 1];
    let out = causal_attention(q.as_tensor(), &k, &v, Some(&mask), None)?;
    assert_close(
        &out,
        &composed(q.as_tensor(), &k, &v, Some(&mask), None)?,
        1e-6,
        "dead",
    )?;
    let mean = v.mean_keepdim(2)?.squeeze(0)?.squeeze(0)?;
    for h in 0..2 {
        for i in 0..3 {
            assert_close(
                &out.get(0)?.get(h)?.get(i)?,
                &mean.squeeze(0)?,
                1e-6,
                "mean",
            )?;
        }
    }
    let grads = out.sqr()?.sum_all()?.backward()?;
    let dq = grads.get(q.as_tensor()).expect("dq");
    let dead = dq.narrow(2, 0, 3)?.abs()?.sum_all()?.to_scalar::<f32>()?;
    assert_eq!(dead, 0.0);
    // A window of 0 hides every key: every row is dead, still no NaN.
    let all_dead = causal_attention(q.as_tensor(), &k, &v, None, Some(0))?;
    let want = composed(q.as_tensor(), &k, &v, None, Some(0))?;
    assert_close(&all_dead, &want, 1e-6, "window 0")
}

#[test]
fn non_contiguous_inputs_and_no_grad_inputs() -> Result<()> {
    // [B, T, heads, hd] transposed to [B, heads, T, hd], as the model produces them.
    let q = random_tensor(&[2, 9, 4, 8], 1.0, 1)?.transpose(1, 2)?;
    let k = random_tensor(&[2, 9, 2, 8], 1.0, 2)?.transpose(1, 2)?;
    let v = Var::from_tensor(&random_tensor(&[2, 2, 9, 8], 1.0, 3)?)?;
    let got = causal_attention(&q, &k, v.as_tensor(), None, Some(5))?;
    let want = composed(&q, &k, v.as_tensor(), None, Some(5))?;
    assert_close(&got, &want, 1e-5, "non-contiguous")?;
    let grads = got.sum_all()?.backward()?;
    assert!(grads.get(&q).is_none());
    let gc = want.sum_all()?.backward()?;
    let (a, c) = (grads.get(v.as_tensor()), gc.get(v.as_tensor()));
    assert_close(a.expect("dv"), c.expect("dv"), 1e-5, "dv only")
}

#[test]
fn bad_arguments_fail_with_clear_messages() -> Result<()> {
    let q = random_tensor(&[1, 4, 3, 8], 1.0, 1)?;
    let k = random_tensor(&[1, 3, 3, 8], 1.0, 2)?;
    let err = |r: Result<Tensor>| r.expect_err("should fail").to_string();
    let e = err(causal_attention(&q, &k, &k, None, None));
    assert!(e.contains("must divide the 4 heads"), "{e}");
    let k = random_tensor(&[1, 2, 4, 8], 1.0, 2)?;
    let e = err(causal_attention(&q, &k, &k, None, None));
    assert!(e.contains("`k` must be [1, nkv, 3, 8]"), "{e}");
    let k = random_tensor(&[1, 2, 3, 8], 1.0, 2)?;
    let v = random_tensor(&[1, 2, 3, 4], 1.0, 2)?;
    let e = err(causal_attention(&q, &k, &v, None, None));
    assert!(e.contains("`v` must have the shape of `k`"), "{e}");
    let e = err(causal_attention(&q, &k, &k, Some(&[1, 1]), None));
    assert!(e.contains("`key_mask` must hold"), "{e}");
    let e = err(causal_attention(&q.flatten_all()?, &k, &k, None, None));
    assert!(e.contains("`q` must be [B, nh, T, hd]"), "{e}");
    let ids = Tensor::zeros((1, 4, 3, 8), DType::U32, &Device::Cpu)?;
    let idk = Tensor::zeros((1, 2, 3, 8), DType::U32, &Device::Cpu)?;
    let e = err(causal_attention(&ids, &idk, &idk, None, None));
    assert!(e.contains("must be a float tensor"), "{e}");
    let e = err(causal_attention(
        &q,
        &k.to_dtype(DType::F64)?,
        &k,
        None,
        None,
    ));
    assert!(e.contains("dtype"), "{e}");
    Ok(())
}

/// The merged-heads output `[B, T, nh · hd]` is the split output transposed, and its
/// gradients are the split op's, bit for bit: GQA, a padded row, both orders.
#[test]
fn merged_heads_are_the_split_heads_transposed() -> Result<()> {
    use super::attention::{causal_attention_engine_order, causal_attention_merged};
    let (b, nh, nkv, t, hd) = (2, 4, 2, 7, 8);
    let q = Var::from_tensor(&random_tensor(&[b, nh, t, hd], 2.0, 11)?)?;
    let k = Var::from_tensor(&random_tensor(&[b, nkv, t, hd], 2.0, 12)?)?;
    let v = Var::from_tensor(&random_tensor(&[b, nkv, t, hd], 1.0, 13)?)?;
    let probe = random_tensor(&[b, t, nh * hd], 1.0, 14)?;
    let mut mask = vec![1u32; b * t];
    mask[t..t + 2].fill(0);
    for engine_order in [false, true] {
        let (qt, kt, vt) = (q.as_tensor(), k.as_tensor(), v.as_tensor());
        let split = match engine_order {
            false => causal_attention(qt, kt, vt, Some(&mask), None)?,
            true => causal_attention_engine_order(qt, kt, vt, Some(&mask), None, None)?,
        };
        let want = split.transpose(1, 2)?.reshape((b, t, nh * hd))?;
        let got = causal_attention_merged(qt, kt, vt, (Some(&mask), None), None, engine_order)?;
        assert_close(&got, &want, 0.0, "merged output")?;
        let g_want = (want * &probe)?.sqr()?.sum_all()?.backward()?;
        let g_got = (got * &probe)?.sqr()?.sum_all()?.backward()?;
        for (x, what) in [(&q, "dq"), (&k, "dk"), (&v, "dv")] {
            let a = g_got.get(x.as_tensor()).expect("merged gradient");
            let e = g_want.get(x.as_tensor()).expect("split gradient");
            assert_close(a, e, 0.0, what)?;
        }
    }
    Ok(())
}

/// `v` as a transposed view (the value projection's `[B, T, nkv, hd]`) gives the output and
/// gradients of a contiguous `v`, bit for bit.
#[test]
fn a_transposed_value_view_is_read_as_it_is() -> Result<()> {
    use super::attention::causal_attention_merged;
    let (b, nh, nkv, t, hd) = (2, 4, 2, 6, 8);
    let q = random_tensor(&[b, nh, t, hd], 2.0, 21)?;
    let k = random_tensor(&[b, nkv, t, hd], 2.0, 22)?;
    let v = Var::from_tensor(&random_tensor(&[b, t, nkv, hd], 1.0, 23)?)?;
    let probe = random_tensor(&[b, t, nh * hd], 1.0, 24)?;
    let view = v.as_tensor().transpose(1, 2)?;
    assert!(!view.is_contiguous());
    let got = causal_attention_merged(&q, &k, &view, (None, None), None, false)?;
    let want = causal_attention_merged(&q, &k, &view.contiguous()?, (None, None), None, false)?;
    assert_close(&got, &want, 0.0, "output")?;
    let g_got = (got * &probe)?.sqr()?.sum_all()?.backward()?;
    let g_want = (want * &probe)?.sqr()?.sum_all()?.backward()?;
    let dv = g_got.get(v.as_tensor()).expect("dv");
    assert_close(dv, g_want.get(v.as_tensor()).expect("dv"), 0.0, "dv")
}
