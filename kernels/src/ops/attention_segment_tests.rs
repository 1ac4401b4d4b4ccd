//! Tests of packed (segmented) causal attention: a row holding several sequences back to back
//! equals those sequences run one by one, in outputs and in input gradients, on the fused
//! kernel and the composed path; and the fused backward against finite differences.

use candle_core::{DType, Result, Tensor, Var};

use super::attention::causal_attention_tiled;
use super::attention_fwd::Tiles;
use super::reference::causal_attention_segmented as composed;
use super::testing::{assert_close, finite_difference_check, random_tensor};

/// Segment lengths of one packed row (a trailing pad run is added up to `t`).
struct Packed {
    lens: &'static [usize],
    t: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    window: Option<usize>,
    tiles: Tiles,
}

impl Packed {
    /// Segment ids `[1, t]`: segment `s` gets id `s`, the pad run id `lens.len()`.
    fn segments(&self) -> Vec<u32> {
        let mut ids = vec![self.lens.len() as u32; self.t];
        let mut at = 0;
        for (s, &n) in self.lens.iter().enumerate() {
            ids[at..at + n].fill(s as u32);
            at += n;
        }
        ids
    }

    /// Key mask `[1, t]`: the pad run is padding.
    fn key_mask(&self) -> Vec<u32> {
        let real: usize = self.lens.iter().sum();
        (0..self.t).map(|i| u32::from(i < real)).collect()
    }

    fn fused(&self, qkv: [&Tensor; 3], packed: bool) -> Result<Tensor> {
        let (seg, mask) = (self.segments(), self.key_mask());
        let masks = if packed {
            (Some(&mask[..]), Some(&seg[..]))
        } else {
            (None, None)
        };
        causal_attention_tiled(qkv[0], qkv[1], qkv[2], masks, self.window, self.tiles)
    }
}

fn cases() -> Vec<Packed> {
    let small = Tiles { q: 3, k: 2 };
    let c = |lens, t, nh, nkv, hd, window, tiles| Packed {
        lens,
        t,
        nh,
        nkv,
        hd,
        window,
        tiles,
    };
    vec![
        c(&[5, 7], 14, 2, 1, 8, None, small),
        c(&[3, 1, 6], 10, 4, 2, 4, Some(2), small),
        c(&[40, 29, 50], 130, 4, 2, 16, None, Tiles::DEFAULT),
        c(&[70, 60], 130, 2, 2, 8, Some(33), Tiles { q: 16, k: 8 }),
    ]
}

/// The sequences of each case run one by one (a batch of one, no mask) against the packed
/// row: outputs, and gradients of a random projection of the outputs, segment by segment.
#[test]
fn packed_row_equals_sequences_run_separately() -> Result<()> {
    for (n, case) in cases().iter().enumerate() {
        let seed = 20 * n as u64;
        let q = Var::from_tensor(&random_tensor(&[1, case.nh, case.t, case.hd], 2.0, seed)?)?;
        let k = Var::from_tensor(&random_tensor(
            &[1, case.nkv, case.t, case.hd],
            2.0,
            seed + 1,
        )?)?;
        let v = Var::from_tensor(&random_tensor(
            &[1, case.nkv, case.t, case.hd],
            1.0,
            seed + 2,
        )?)?;
        let proj = random_tensor(&[1, case.nh, case.t, case.hd], 1.0, seed + 3)?;
        let real: usize = case.lens.iter().sum();
        let qkv = [q.as_tensor(), k.as_tensor(), v.as_tensor()];
        let packed = case.fused(qkv, true)?;
        let (seg, mask) = (case.segments(), case.key_mask());
        let want = composed(qkv[0], qkv[1], qkv[2], Some(&mask), Some(&seg), case.window)?;
        assert_close(
            &packed,
            &want,
            1e-5,
            &format!("case {n}: fused vs composed"),
        )?;
        let loss = |o: &Tensor, at: usize, len: usize| -> Result<Tensor> {
            o.mul(&proj.narrow(2, at, len)?)?.sum_all()
        };
        let gp = loss(&packed.narrow(2, 0, real)?, 0, real)?.backward()?;
        let gc = loss(&want.narrow(2, 0, real)?, 0, real)?.backward()?;
        for (name, x) in ["q", "k", "v"].iter().zip(qkv) {
            let (a, c) = (gp.get(x).expect("fused"), gc.get(x).expect("composed"));
            assert_close(a, c, 1e-5, &format!("case {n}: d{name} fused vs composed"))?;
        }
        let mut at = 0;
        for (s, &len) in case.lens.iter().enumerate() {
            let part = qkv.map(|x| {
                let x = x.narrow(2, at, len).and_then(|x| x.contiguous());
                Var::from_tensor(&x.expect("narrow")).expect("var")
            });
            let part = [0, 1, 2].map(|i| part[i].as_tensor().clone());
            let alone = case.fused([&part[0], &part[1], &part[2]], false)?;
            let what = format!("case {n} segment {s}");
            assert_close(&packed.narrow(2, at, len)?, &alone, 1e-5, &what)?;
            let ga = loss(&alone, at, len)?.backward()?;
            for (name, (x, p)) in ["q", "k", "v"].iter().zip(qkv.iter().zip(&part)) {
                let got = gp.get(x).expect("packed grad").narrow(2, at, len)?;
                let alone = ga.get(p).expect("separate grad");
                assert_close(&got, alone, 1e-5, &format!("{what} d{name}"))?;
            }
            at += len;
        }
    }
    Ok(())
}

/// The fused backward of a packed row (three segments, a pad run, GQA, a window) against
/// central finite differences in f64.
#[test]
fn packed_backward_matches_finite_differences() -> Result<()> {
    let case = Packed {
        lens: &[3, 1, 3],
        t: 8,
        nh: 2,
        nkv: 1,
        hd: 3,
        window: Some(2),
        tiles: Tiles { q: 3, k: 2 },
    };
    let f64_tensor = |dims: &[usize], seed| -> Result<Tensor> {
        random_tensor(dims, 2.0, seed)?.to_dtype(DType::F64)
    };
    let q = f64_tensor(&[1, 2, 8, 3], 1)?;
    let k = f64_tensor(&[1, 1, 8, 3], 2)?;
    let v = f64_tensor(&[1, 1, 8, 3], 3)?;
    let proj = f64_tensor(&[1, 2, 8, 3], 4)?;
    let loss = |o: Tensor| o.mul(&proj)?.sqr()?.sum_all();
    finite_difference_check(&q, |q| loss(case.fused([q, &k, &v], true)?), 1e-6)?;
    finite_difference_check(&k, |k| loss(case.fused([&q, k, &v], true)?), 1e-6)?;
    finite_difference_check(&v, |v| loss(case.fused([&q, &k, v], true)?), 1e-6)
}
