//! Tests of the engine-order attention forward: it is the decoding engine's per-query
//! arithmetic bit for bit (against a plain loop written in that order), for any tiling; a
//! left-padded row and a packed segment give the bits of the sequence run alone; and values
//! and gradients agree with the tiled forward.

use candle_core::{Result, Tensor, Var};

use super::attention::{attention_op, Order};
use super::attention_fwd::Tiles;
use super::rows;
use super::testing::{assert_close, random_tensor};

/// The op over `qkv` (q, k, v) in `order`.
fn attend(
    qkv: &[Tensor; 3],
    masks: (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    how: (Tiles, Order),
) -> Result<Tensor> {
    attention_op(&qkv[0], &qkv[1], &qkv[2], masks, window, how)
}

/// [`attend`] in the engine's order.
fn engine_order(
    qkv: &[Tensor; 3],
    masks: (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    tiles: Tiles,
) -> Result<Tensor> {
    attend(qkv, masks, window, (tiles, Order::Engine))
}

/// q `[1, nh, t, hd]`, k and v `[1, nkv, t, hd]`.
fn qkv(nh: usize, nkv: usize, t: usize, hd: usize, seed: u64) -> Result<[Tensor; 3]> {
    Ok([
        random_tensor(&[1, nh, t, hd], 2.0, seed)?,
        random_tensor(&[1, nkv, t, hd], 2.0, seed + 1)?,
        random_tensor(&[1, nkv, t, hd], 1.0, seed + 2)?,
    ])
}

/// The engine's order for one query row of one head, written plainly: scores summed over
/// channels in order then scaled, [`rows::softmax_in_place`], values summed over keys in
/// order. `keys` are the visible key rows.
fn one_query(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], keys: &[usize]) -> Vec<f32> {
    let scale = (q.len() as f64).powf(-0.5) as f32;
    let mut s: Vec<f32> = keys
        .iter()
        .map(|&j| {
            let mut acc = 0f32;
            for (a, b) in q.iter().zip(&k[j]) {
                acc += a * b;
            }
            acc * scale
        })
        .collect();
    rows::softmax_in_place(&mut s);
    let mut out = vec![0f32; q.len()];
    for (&j, &p) in keys.iter().zip(&s) {
        for (o, &x) in out.iter_mut().zip(&v[j]) {
            *o += p * x;
        }
    }
    out
}

fn rows_of(t: &Tensor) -> Result<Vec<Vec<Vec<f32>>>> {
    t.squeeze(0)?.to_vec3::<f32>()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn each_query_is_the_engines_order_bit_for_bit_for_any_tiling() -> Result<()> {
    let (nh, nkv, t, hd) = (4, 2, 29, 16);
    let x = qkv(nh, nkv, t, hd, 11)?;
    let (q, k, v) = (rows_of(&x[0])?, rows_of(&x[1])?, rows_of(&x[2])?);
    for window in [None, Some(7)] {
        for tiles in [Tiles { q: 3, k: 2 }, Tiles { q: 8, k: 5 }, Tiles::DEFAULT] {
            let out = rows_of(&engine_order(&x, (None, None), window, tiles)?)?;
            for h in 0..nh {
                for i in 0..t {
                    let lo = window.map_or(0, |w| (i + 1).saturating_sub(w));
                    let keys: Vec<usize> = (lo..=i).collect();
                    let kv = h / (nh / nkv);
                    let want = one_query(&q[h][i], &k[kv], &v[kv], &keys);
                    assert!(
                        same_bits(&out[h][i], &want),
                        "{window:?} {tiles:?} head {h} row {i}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// A sequence left-padded by `pad` positions, and the same sequence inside a packed row
/// after another segment of length `pad`, give its bits run alone.
#[test]
fn padding_and_packing_leave_a_sequences_bits_unchanged() -> Result<()> {
    let (nh, nkv, n, hd, pad) = (2, 1, 13, 8, 6);
    let alone = qkv(nh, nkv, n, hd, 21)?;
    let filler = qkv(nh, nkv, pad, hd, 31)?;
    let joined: Vec<Tensor> = (0..3)
        .map(|i| Tensor::cat(&[&filler[i], &alone[i]], 2))
        .collect::<Result<_>>()?;
    let joined = [joined[0].clone(), joined[1].clone(), joined[2].clone()];
    let tiles = Tiles { q: 4, k: 3 };
    let want = engine_order(&alone, (None, None), None, tiles)?;
    let mask: Vec<u32> = (0..pad + n).map(|i| u32::from(i >= pad)).collect();
    let segments: Vec<u32> = (0..pad + n).map(|i| u32::from(i >= pad)).collect();
    for masks in [
        (Some(mask.as_slice()), None),
        (None, Some(segments.as_slice())),
    ] {
        let got = engine_order(&joined, masks, None, tiles)?.narrow(2, pad, n)?;
        let (a, b) = (
            got.flatten_all()?.to_vec1::<f32>()?,
            want.flatten_all()?.to_vec1()?,
        );
        assert!(same_bits(&a, &b), "{masks:?}");
    }
    Ok(())
}

#[test]
fn values_and_gradients_match_the_tiled_forward() -> Result<()> {
    let (nh, nkv, t, hd) = (4, 2, 37, 16);
    let x = qkv(nh, nkv, t, hd, 41)?;
    let mask: Vec<u32> = (0..t).map(|i| u32::from(i >= 5)).collect();
    let probe = random_tensor(&[1, nh, t, hd], 1.0, 51)?;
    for window in [None, Some(9)] {
        let vars: Vec<Var> = x.iter().map(Var::from_tensor).collect::<Result<_>>()?;
        let tracked = [0, 1, 2].map(|i| vars[i].as_tensor().clone());
        let a = engine_order(&tracked, (Some(&mask), None), window, Tiles::DEFAULT)?;
        let tiled = (Tiles::DEFAULT, Order::Tiled);
        let b = attend(&tracked, (Some(&mask), None), window, tiled)?;
        assert_close(&a, &b, 1e-5, "output")?;
        let ga = (&a * &probe)?.sum_all()?.backward()?;
        let gb = (&b * &probe)?.sum_all()?.backward()?;
        for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let (da, db) = (ga.get(&tracked[i]).unwrap(), gb.get(&tracked[i]).unwrap());
            assert_close(da, db, 1e-4, name)?;
        }
    }
    Ok(())
}
