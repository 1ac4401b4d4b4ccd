//! Tests of the fused LM head against the composed path (linear, then log-softmax and
//! entropy over full logits) and against finite differences.

use super::*;
use crate::ops::reference;
use crate::ops::testing::{assert_close, finite_difference_check, random_ids, random_tensor};
use candle_core::{Device, Var};

/// The untruncated distribution at temperature `t`.
fn tempered(t: f64) -> TokenDistribution {
    TokenDistribution {
        temperature: t,
        truncation: Truncation::OFF,
    }
}

fn truncated(t: f64, top_k: usize, top_p: f64) -> TokenDistribution {
    TokenDistribution {
        temperature: t,
        truncation: Truncation { top_k, top_p },
    }
}

/// The composed reference: full logits, then the reference log-prob and entropy.
fn composed_ref(h: &Tensor, w: &Tensor, y: &Tensor, t: f64) -> Result<(Tensor, Tensor)> {
    let dims = h.dims().to_vec();
    let (lead, hd) = (&dims[..dims.len() - 1], dims[dims.len() - 1]);
    let n: usize = lead.iter().product();
    let logits = (h.reshape((n, hd))?.matmul(&w.t()?)? / t)?;
    let lp = reference::token_logprobs(&logits, &y.reshape(n)?)?.reshape(lead)?;
    let ent = reference::entropy(&logits)?.reshape(lead)?;
    Ok((lp, ent))
}

#[test]
fn forward_matches_composed_across_block_edges() -> Result<()> {
    // Rows past one row block (128) and a vocabulary past two chunks (512), not multiples.
    for &(b, t, hd, v, temp) in &[
        (2, 3, 8, 37, 1.0),
        (1, 1, 4, 1, 1.0),
        (3, 101, 16, 1100, 0.7),
        (1, 5, 32, 512, 1.3),
    ] {
        let h = random_tensor(&[b, t, hd], 1.0, 3 + v as u64)?;
        let w = random_tensor(&[v, hd], 0.8, 5 + hd as u64)?;
        let y = random_ids(&[b, t], v, 9)?;
        let fused = lm_head_logprobs(&h, &w, &y, tempered(temp))?;
        let (lp, ent) = composed_ref(&h, &w, &y, temp)?;
        assert_eq!(fused.logprobs.dims(), &[b, t]);
        assert_close(&fused.logprobs, &lp, 2e-5, "log-probs")?;
        assert_close(&fused.entropy, &ent, 2e-5, "entropy")?;
    }
    Ok(())
}

#[test]
fn large_logits_stay_finite_and_shift_invariant() -> Result<()> {
    let h = (random_tensor(&[2, 7, 8], 1.0, 1)? * 40.0)?;
    let w = random_tensor(&[700, 8], 1.0, 2)?;
    let y = random_ids(&[2, 7], 700, 3)?;
    let fused = lm_head_logprobs(&h, &w, &y, tempered(1.0))?;
    let (lp, ent) = composed_ref(&h, &w, &y, 1.0)?;
    assert_close(&fused.logprobs, &lp, 1e-4, "large log-probs")?;
    assert_close(&fused.entropy, &ent, 1e-4, "large entropy")?;
    Ok(())
}

/// Gradients of `Σ a·logprob + c·entropy` for hidden and weight, fused vs composed.
#[test]
fn backward_matches_composed_autograd() -> Result<()> {
    // Six vocabulary chunks: several chunks per backward task, the last one partial.
    let (b, t, hd, v) = (2, 70, 16, 2900);
    let h = Var::from_tensor(&random_tensor(&[b, t, hd], 1.0, 11)?)?;
    let w = Var::from_tensor(&random_tensor(&[v, hd], 0.5, 12)?)?;
    let y = random_ids(&[b, t], v, 13)?;
    // Zero weights on some rows (masked positions) and on both outputs of others.
    let mut a = random_tensor(&[b, t], 1.0, 14)?.to_vec2::<f32>()?;
    let mut c = random_tensor(&[b, t], 0.3, 15)?.to_vec2::<f32>()?;
    for r in 0..10 {
        a[0][r] = 0.0;
        c[0][r] = 0.0;
    }
    c[1][3] = 0.0;
    a[1][4] = 0.0;
    let a = Tensor::new(a, &Device::Cpu)?;
    let c = Tensor::new(c, &Device::Cpu)?;
    let loss = |lp: Tensor, ent: Tensor| -> Result<Tensor> {
        lp.mul(&a)?.sum_all()? + ent.mul(&c)?.sum_all()?
    };
    let fused = lm_head_logprobs(h.as_tensor(), w.as_tensor(), &y, tempered(0.9))?;
    let g_fused = loss(fused.logprobs, fused.entropy)?.backward()?;
    let (lp, ent) = composed_ref(h.as_tensor(), w.as_tensor(), &y, 0.9)?;
    let g_comp = loss(lp, ent)?.backward()?;
    for (var, what) in [(&h, "d hidden"), (&w, "d weight")] {
        let x = g_fused.get(var.as_tensor()).expect("fused grad");
        let want = g_comp.get(var.as_tensor()).expect("composed grad");
        assert_close(x, want, 2e-5, what)?;
    }
    // Rows with zero upstream gradient get an exactly zero hidden gradient.
    let dh = g_fused.get(h.as_tensor()).expect("grad");
    let masked = dh.get(0)?.narrow(0, 0, 10)?.abs()?.sum_all()?;
    assert_eq!(masked.to_scalar::<f32>()?, 0.0);
    Ok(())
}

/// A sink that collects the gradient of one parameter.
#[derive(Debug)]
struct OneParamSink {
    param: candle_core::TensorId,
    got: Mutex<Option<Tensor>>,
}

impl GradientSink for OneParamSink {
    fn accept(&self, param: &Tensor, grad: Tensor) -> Result<Option<Tensor>> {
        if param.id() != self.param {
            return Ok(Some(grad));
        }
        *self.got.lock().expect("sink lock") = Some(grad);
        Ok(None)
    }

    fn add_rows(&self, _param: &Tensor, _ids: &Tensor, _rows: &Tensor) -> Result<bool> {
        Ok(false)
    }
}

/// The weight's gradient handed to a sink is the one candle's backward returns without it,
/// bit for bit, and candle's store then holds none; a sink for another tensor changes
/// nothing.
#[test]
fn the_weight_gradient_goes_to_a_sink_that_takes_it() -> Result<()> {
    let (b, t, hd, v) = (2, 9, 16, 700);
    let h = Var::from_tensor(&random_tensor(&[b, t, hd], 1.0, 41)?)?;
    let w = Var::from_tensor(&random_tensor(&[v, hd], 0.5, 42)?)?;
    let y = random_ids(&[b, t], v, 43)?;
    let run = |sink: Option<Arc<dyn GradientSink>>| -> Result<candle_core::backprop::GradStore> {
        let out = lm_head_logprobs_with(
            h.as_tensor(),
            w.as_tensor(),
            &y,
            tempered(0.8),
            HeadProducts::F32,
            sink,
        )?;
        (out.logprobs.sum_all()? + out.entropy.sum_all()?)?.backward()
    };
    let plain = run(None)?;
    let want = plain.get(w.as_tensor()).expect("weight gradient");
    let sink = Arc::new(OneParamSink {
        param: w.as_tensor().id(),
        got: Mutex::new(None),
    });
    let sunk = run(Some(sink.clone()))?;
    assert!(
        sunk.get(w.as_tensor()).is_none(),
        "candle kept the weight's gradient"
    );
    let got = sink
        .got
        .lock()
        .expect("sink lock")
        .take()
        .expect("sink got nothing");
    assert_close(&got, want, 0.0, "sunk d weight")?;
    let dh = sunk.get(h.as_tensor()).expect("hidden gradient");
    assert_close(dh, plain.get(h.as_tensor()).expect("grad"), 0.0, "d hidden")?;
    let other = Arc::new(OneParamSink {
        param: h.as_tensor().id(),
        got: Mutex::new(None),
    });
    let passed = run(Some(other))?;
    let dw = passed
        .get(w.as_tensor())
        .expect("weight gradient returned to candle");
    assert_close(dw, want, 0.0, "returned d weight")?;
    Ok(())
}

#[test]
fn backward_matches_finite_differences() -> Result<()> {
    let h = random_tensor(&[2, 3, 5], 1.0, 21)?.to_dtype(DType::F64)?;
    let w = random_tensor(&[13, 5], 1.0, 22)?.to_dtype(DType::F64)?;
    let y = random_ids(&[2, 3], 13, 23)?;
    let a = random_tensor(&[2, 3], 1.0, 24)?.to_dtype(DType::F64)?;
    let c = random_tensor(&[2, 3], 1.0, 25)?.to_dtype(DType::F64)?;
    let loss = |h: &Tensor, w: &Tensor| -> Result<Tensor> {
        let o = lm_head_logprobs(h, w, &y, tempered(0.8))?;
        o.logprobs.mul(&a)?.sum_all()? + o.entropy.mul(&c)?.sum_all()?
    };
    finite_difference_check(&h, |h| loss(h, &w), 1e-6)?;
    finite_difference_check(&w, |w| loss(&h, w), 1e-6)
}

#[test]
fn bad_inputs_name_the_argument() -> Result<()> {
    let h = random_tensor(&[1, 2, 4], 1.0, 1)?;
    let w = random_tensor(&[6, 4], 1.0, 2)?;
    let y = Tensor::new(&[[0u32, 6]], &Device::Cpu)?;
    let err = lm_head_logprobs(&h, &w, &y, tempered(1.0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("target id 6") && err.contains("vocabulary of 6"),
        "{err}"
    );
    let y = Tensor::new(&[[0u32, 1]], &Device::Cpu)?;
    let err = lm_head_logprobs(&h, &w, &y, tempered(0.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`temperature`"), "{err}");
    let w_bad = random_tensor(&[6, 3], 1.0, 2)?;
    let err = lm_head_logprobs(&h, &w_bad, &y, tempered(1.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`weight` must be [V, 4]"), "{err}");
    let y_bad = Tensor::new(&[0u32, 1], &Device::Cpu)?;
    let err = lm_head_logprobs(&h, &w, &y_bad, tempered(1.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`targets` must have shape [1, 2]"), "{err}");
    Ok(())
}

/// An independent reference of the truncated distribution, in f64: sort each row of `z / t`,
/// keep the top `k`, then the prefix reaching `p` (ties kept), widen to the target, and
/// return (log-prob, entropy) per row.
fn truncated_ref(z: &[Vec<f64>], y: &[u32], t: f64, k: usize, p: f64) -> Vec<(f64, f64)> {
    z.iter()
        .zip(y)
        .map(|(row, &yi)| {
            let zt: Vec<f64> = row.iter().map(|x| x / t).collect();
            let mut sorted = zt.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kk = if k == 0 {
                sorted.len()
            } else {
                k.min(sorted.len())
            };
            let top = &sorted[..kk];
            let mass: f64 = top.iter().map(|x| x.exp()).sum();
            let (mut cum, mut tau) = (0.0, top[kk - 1]);
            for &x in top {
                cum += x.exp();
                if cum >= p * mass {
                    tau = x;
                    break;
                }
            }
            let tau = tau.min(zt[yi as usize]);
            let kept: Vec<f64> = zt.iter().copied().filter(|&x| x >= tau).collect();
            let lse = kept.iter().map(|x| x.exp()).sum::<f64>().ln();
            let ent = -kept
                .iter()
                .map(|x| (x - lse).exp() * (x - lse))
                .sum::<f64>();
            (zt[yi as usize] - lse, ent)
        })
        .collect()
}

#[test]
fn truncated_forward_matches_an_independent_reference() -> Result<()> {
    let (n, hd, v) = (150, 8, 700);
    let h = random_tensor(&[n, hd], 1.0, 31)?.to_dtype(DType::F64)?;
    let w = random_tensor(&[v, hd], 1.0, 32)?.to_dtype(DType::F64)?;
    let y = random_ids(&[n], v, 33)?;
    let z: Vec<Vec<f64>> = h.matmul(&w.t()?)?.to_vec2()?;
    let ids: Vec<u32> = y.to_vec1()?;
    for &(t, k, p) in &[(0.7, 20, 1.0), (1.0, 0, 0.9), (0.7, 20, 0.9), (1.3, 1, 1.0)] {
        let o = lm_head_logprobs(&h, &w, &y, truncated(t, k, p))?;
        let (lp, ent): (Vec<f64>, Vec<f64>) = (o.logprobs.to_vec1()?, o.entropy.to_vec1()?);
        for (i, (wlp, went)) in truncated_ref(&z, &ids, t, k, p).into_iter().enumerate() {
            assert!(
                (lp[i] - wlp).abs() < 1e-9,
                "row {i} (t {t} k {k} p {p}): {} vs {wlp}",
                lp[i]
            );
            assert!(
                (ent[i] - went).abs() < 1e-9,
                "row {i} entropy: {} vs {went}",
                ent[i]
            );
        }
    }
    Ok(())
}

#[test]
fn truncated_backward_matches_finite_differences_and_the_composed_path() -> Result<()> {
    let h = random_tensor(&[2, 4, 5], 1.0, 41)?.to_dtype(DType::F64)?;
    let w = random_tensor(&[40, 5], 1.0, 42)?.to_dtype(DType::F64)?;
    let y = random_ids(&[2, 4], 40, 43)?;
    let a = random_tensor(&[2, 4], 1.0, 44)?.to_dtype(DType::F64)?;
    let c = random_tensor(&[2, 4], 1.0, 45)?.to_dtype(DType::F64)?;
    let dist = truncated(0.7, 12, 0.9);
    let loss = |h: &Tensor, w: &Tensor| -> Result<Tensor> {
        let o = lm_head_logprobs(h, w, &y, dist)?;
        o.logprobs.mul(&a)?.sum_all()? + o.entropy.mul(&c)?.sum_all()?
    };
    finite_difference_check(&h, |h| loss(h, &w), 1e-6)?;
    finite_difference_check(&w, |w| loss(&h, w), 1e-6)?;
    // The composed path (the non-CPU fallback) gives the same values and gradients.
    let (hv, wv) = (Var::from_tensor(&h)?, Var::from_tensor(&w)?);
    let o = lm_head_logprobs(hv.as_tensor(), wv.as_tensor(), &y, dist)?;
    let g_fused = (o.logprobs.mul(&a)?.sum_all()? + o.entropy.mul(&c)?.sum_all()?)?.backward()?;
    let n = 8;
    let comp = composed(
        &hv.as_tensor().reshape((n, 5))?,
        wv.as_tensor(),
        &y.reshape(n)?,
        dist,
        None,
    )?;
    let (lp, ent) = (
        comp.narrow(1, 0, 1)?.reshape((2, 4))?,
        comp.narrow(1, 1, 1)?.reshape((2, 4))?,
    );
    assert_close(&o.logprobs, &lp, 1e-9, "composed log-probs")?;
    let g_comp = (lp.mul(&a)?.sum_all()? + ent.mul(&c)?.sum_all()?)?.backward()?;
    for (var, what) in [(&hv, "d hidden"), (&wv, "d weight")] {
        let x = g_fused.get(var.as_tensor()).expect("fused grad");
        let want = g_comp.get(var.as_tensor()).expect("composed grad");
        assert_close(x, want, 1e-9, what)?;
    }
    Ok(())
}

#[test]
fn a_target_outside_the_kept_set_widens_it() -> Result<()> {
    // Row logits 3, 2, 1, 0 (t = 1): top-k 1 keeps only token 0; scoring token 2 widens the
    // kept set to {0, 1, 2}.
    let h = Tensor::new(&[[1.0f64]], &Device::Cpu)?;
    let w = Tensor::new(&[[3.0f64], [2.0], [1.0], [0.0]], &Device::Cpu)?;
    let y = Tensor::new(&[2u32], &Device::Cpu)?;
    let lp: Vec<f64> = lm_head_logprobs(&h, &w, &y, truncated(1.0, 1, 1.0))?
        .logprobs
        .to_vec1()?;
    let want = 1.0 - (3.0f64.exp() + 2.0f64.exp() + 1.0f64.exp()).ln();
    assert!((lp[0] - want).abs() < 1e-12, "{} vs {want}", lp[0]);
    let y0 = Tensor::new(&[0u32], &Device::Cpu)?;
    let lp0: Vec<f64> = lm_head_logprobs(&h, &w, &y0, truncated(1.0, 1, 1.0))?
        .logprobs
        .to_vec1()?;
    assert_eq!(lp0[0], 0.0);
    Ok(())
}

/// `t` rounded to bf16 values (f32 storage).
fn bf16_values(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
}

/// bf16 products: the forward is the composed head on bf16-rounded hidden states and weight
/// (the same logits up to summation order); the gradients are the composed head's gradients
/// at those rounded operands, to the rounding of the logits' gradient (2^-9 relative per
/// element). Shapes cross row blocks and vocabulary chunks, with odd hidden sizes.
#[test]
fn bf16_products_are_the_composed_head_on_rounded_operands() -> Result<()> {
    for &(b, t, hd, v, temp) in &[
        (2, 70, 33, 1100, 0.9),
        (1, 5, 32, 37, 1.0),
        (3, 101, 16, 2900, 1.3),
    ] {
        let h = Var::from_tensor(&random_tensor(&[b, t, hd], 1.0, 31 + v as u64)?)?;
        let w = Var::from_tensor(&random_tensor(&[v, hd], 0.5, 32)?)?;
        let y = random_ids(&[b, t], v, 33)?;
        let a = random_tensor(&[b, t], 1.0, 34)?;
        let c = random_tensor(&[b, t], 0.3, 35)?;
        let loss = |lp: &Tensor, ent: &Tensor| -> Result<Tensor> {
            lp.mul(&a)?.sum_all()? + ent.mul(&c)?.sum_all()?
        };
        let fused = lm_head_logprobs_with(
            h.as_tensor(),
            w.as_tensor(),
            &y,
            tempered(temp),
            HeadProducts::Bf16,
            None,
        )?;
        let g_fused = loss(&fused.logprobs, &fused.entropy)?.backward()?;
        let (hr, wr) = (
            Var::from_tensor(&bf16_values(&h)?)?,
            Var::from_tensor(&bf16_values(&w)?)?,
        );
        let (lp, ent) = composed_ref(hr.as_tensor(), wr.as_tensor(), &y, temp)?;
        assert_close(&fused.logprobs, &lp, 5e-5, "bf16 log-probs")?;
        assert_close(&fused.entropy, &ent, 5e-5, "bf16 entropy")?;
        let g_comp = loss(&lp, &ent)?.backward()?;
        for (var, at, what) in [(&h, &hr, "d hidden"), (&w, &wr, "d weight")] {
            let got = g_fused.get(var.as_tensor()).expect("fused grad");
            let want = g_comp.get(at.as_tensor()).expect("composed grad");
            assert_close(got, want, 1e-2, what)?;
        }
        // Not the f32 head: the rounding is there.
        let f32_head = lm_head_logprobs(h.as_tensor(), w.as_tensor(), &y, tempered(temp))?;
        let gap = (f32_head.logprobs - &fused.logprobs)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(
            gap > 1e-6,
            "({b},{t},{hd},{v}): bf16 products equal f32's (gap {gap})"
        );
    }
    Ok(())
}

/// Every bf16 path of this CPU computes the same head, with the forward's logits kept for
/// the backward pass or recomputed there: forward outputs and both gradients agree between
/// the packed AVX-512 BF16 tile and the rounded f32 GEMM to f32 summation.
#[test]
fn every_bf16_path_computes_the_same_head() {
    use crate::matmul::Bf16Path;
    let d = HeadDims {
        n: 150,
        hidden: 45,
        vocab: 1300,
    };
    let h: Vec<f32> = random_tensor(&[d.n * d.hidden], 1.0, 41)
        .unwrap()
        .to_vec1()
        .unwrap();
    let w: Vec<f32> = random_tensor(&[d.vocab * d.hidden], 0.5, 42)
        .unwrap()
        .to_vec1()
        .unwrap();
    let y: Vec<u32> = (0..d.n).map(|i| (i * 37 % d.vocab) as u32).collect();
    let run = |(path, keep): (Bf16Path, bool)| {
        let fwd_head = super::Bf16Head::new(&w, (d.vocab, d.hidden), HeadPass::Forward, path);
        let cut = Truncation::OFF;
        let fwd = lm_head_cpu::forward(&h, &w, &y, d, 1.0f32, cut, fwd_head.as_ref(), keep);
        let (res, cache) = fwd;
        assert_eq!(
            cache.is_some(),
            keep,
            "a small head keeps its logits when asked"
        );
        let grad: Vec<f32> = (0..d.n * COLS)
            .map(|i| [0.7, -0.2, 0.0, 0.0][i % COLS])
            .collect();
        let rows = BackwardRows::select(&h, &y, &res, &grad, d.hidden);
        let pass = HeadPass::Backward {
            recompute_logits: !keep,
        };
        let head = super::Bf16Head::new(&w, (d.vocab, d.hidden), pass, path);
        let source = (w.as_slice(), cache.as_ref());
        let mut dh = lm_head_cpu::backward(rows, source, d, (1.0, true), head.as_ref());
        let dw = dh.split_off(d.n * d.hidden);
        (res, dh, dw)
    };
    let paths = Bf16Path::available();
    let runs: Vec<(Bf16Path, bool)> = paths
        .iter()
        .flat_map(|&p| [(p, false), (p, true)])
        .collect();
    let first = run(runs[0]);
    for &path in &runs[1..] {
        let other = run(path);
        for (what, a, b) in [
            ("forward", &first.0, &other.0),
            ("d hidden", &first.1, &other.1),
            ("d weight", &first.2, &other.2),
        ] {
            for (i, (x, z)) in a.iter().zip(b.iter()).enumerate() {
                let close = x == z || (x - z).abs() <= 1e-4 * (1.0 + z.abs());
                assert!(close, "{path:?} {what} at {i}: {x} vs {z}");
            }
        }
    }
    eprintln!("bf16 head paths compared: {paths:?}");
}

/// The forward keeps its logits for the backward pass only within the budget: a batch whose
/// `[n, V]` logits exceed it gets no cache (and the backward recomputes them).
#[test]
fn logits_are_kept_only_within_the_budget() {
    let fits = HeadDims {
        n: 2048,
        hidden: 512,
        vocab: 32000,
    };
    let mut kept = KeptLogits::<f32>::room(fits.n, fits.vocab).expect("8x256 at 32k fits");
    let width = kept.group_width();
    let held: usize = kept
        .row_blocks(fits.n)
        .iter()
        .flatten()
        .map(|g| g.len())
        .sum();
    assert_eq!(held, fits.n * fits.vocab);
    assert_eq!(kept.held(), fits.vocab.div_ceil(width));
    let over = HeadDims { n: 4096, ..fits };
    assert!(KeptLogits::<f32>::room(over.n, over.vocab).is_none());
    assert!(KeptLogits::<f64>::room(fits.n, fits.vocab).is_none());
}

/// With the logits kept by vocabulary group, the backward gives the bits of the backward
/// that recomputes them (f32 products: the same sums either way), over one pass of rows
/// and over several (more rows than one pass takes), and frees every group as it goes.
#[test]
fn kept_logits_give_the_recomputed_bits_and_are_freed() {
    for n in [150, 9000] {
        let d = HeadDims {
            n,
            hidden: 8,
            vocab: 1300,
        };
        let h: Vec<f32> = random_tensor(&[d.n * d.hidden], 1.0, 51)
            .unwrap()
            .to_vec1()
            .unwrap();
        let w: Vec<f32> = random_tensor(&[d.vocab * d.hidden], 0.5, 52)
            .unwrap()
            .to_vec1()
            .unwrap();
        let y: Vec<u32> = (0..d.n).map(|i| (i * 37 % d.vocab) as u32).collect();
        let grad: Vec<f32> = (0..d.n * COLS)
            .map(|i| [0.7, -0.2, 0.0, 0.0][i % COLS])
            .collect();
        let backward = |keep: bool| {
            let cut = Truncation::OFF;
            let (res, cache) = lm_head_cpu::forward(&h, &w, &y, d, 1.0f32, cut, None, keep);
            assert_eq!(cache.is_some(), keep);
            let rows = BackwardRows::select(&h, &y, &res, &grad, d.hidden);
            let out = lm_head_cpu::backward(rows, (&w, cache.as_ref()), d, (1.0, true), None);
            if let Some(cache) = &cache {
                assert_eq!(cache.held(), 0, "every group freed after the backward");
            }
            out
        };
        let (kept, recomputed) = (backward(true), backward(false));
        let same = kept
            .iter()
            .zip(&recomputed)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "n = {n}: kept and recomputed logits give other gradients"
        );
    }
}
