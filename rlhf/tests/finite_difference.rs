//! Central finite-difference checks (f64) of the analytic gradients of the DPO/IPO/cDPO,
//! Bradley–Terry, PPO (with dual clip and TIS weights) and clipped value losses.

mod common;

use candle_core::{DType, Tensor, Var};
use common::*;
use oxalign_rlhf::losses::{
    bradley_terry_loss, dpo_loss, kl_loss, ppo_policy_loss, value_loss, DpoLoss, KlEstimator,
    LossAgg, PpoConfig, PreferenceLogprobs,
};

const H: f64 = 1e-6;

/// Compares `d loss / d x` from candle's backward with central differences at `x0`.
/// `skip(i)` leaves out coordinates sitting on a kink of the loss.
fn check(
    what: &str,
    x0: &[f64],
    dims: &[usize],
    loss: impl Fn(&Tensor) -> Tensor,
    skip: impl Fn(usize) -> bool,
) {
    let var = Var::from_tensor(&from_vec(x0.to_vec(), dims, DType::F64)).unwrap();
    let l = loss(var.as_tensor());
    let grad = host(l.backward().unwrap().get(var.as_tensor()).unwrap());
    let mut checked = 0;
    for i in 0..x0.len() {
        if skip(i) {
            continue;
        }
        let eval = |delta: f64| {
            let mut x = x0.to_vec();
            x[i] += delta;
            scalar(&loss(&from_vec(x, dims, DType::F64)))
        };
        let fd = (eval(H) - eval(-H)) / (2.0 * H);
        let bound = 1e-6 * fd.abs().max(1.0);
        assert!(
            (grad[i] - fd).abs() <= bound,
            "{what}[{i}]: analytic {} vs finite difference {fd}",
            grad[i]
        );
        checked += 1;
    }
    assert!(checked > 0, "{what}: nothing checked");
}

#[test]
fn dpo_variants_match_finite_differences() {
    let mut rng = SplitMix::new(3);
    let n = 6;
    let pc: Vec<f64> = rng.normals(n, 3.0).iter().map(|x| x - 30.0).collect();
    let pr: Vec<f64> = rng.normals(n, 3.0).iter().map(|x| x - 32.0).collect();
    let rc = from_vec(
        pc.iter()
            .zip(rng.normals(n, 1.0))
            .map(|(a, b)| a + b)
            .collect(),
        &[n],
        DType::F64,
    );
    let rr = from_vec(
        pr.iter()
            .zip(rng.normals(n, 1.0))
            .map(|(a, b)| a + b)
            .collect(),
        &[n],
        DType::F64,
    );
    let pr_t = from_vec(pr.clone(), &[n], DType::F64);
    let pc_t = from_vec(pc.clone(), &[n], DType::F64);
    for (beta, kind) in [
        (
            0.1,
            DpoLoss::Sigmoid {
                label_smoothing: 0.0,
            },
        ),
        (
            0.7,
            DpoLoss::Sigmoid {
                label_smoothing: 0.2,
            },
        ),
        (0.1, DpoLoss::Ipo),
    ] {
        check(
            &format!("dpo {kind:?} chosen"),
            &pc,
            &[n],
            |x| {
                let logps = PreferenceLogprobs {
                    policy_chosen: x,
                    policy_rejected: &pr_t,
                    reference_chosen: &rc,
                    reference_rejected: &rr,
                };
                dpo_loss(logps, beta, kind).unwrap().0
            },
            |_| false,
        );
        check(
            &format!("dpo {kind:?} rejected"),
            &pr,
            &[n],
            |x| {
                let logps = PreferenceLogprobs {
                    policy_chosen: &pc_t,
                    policy_rejected: x,
                    reference_chosen: &rc,
                    reference_rejected: &rr,
                };
                dpo_loss(logps, beta, kind).unwrap().0
            },
            |_| false,
        );
    }
    // Bradley–Terry with margins, including a pair exactly at zero logit.
    let mut c = rng.normals(n, 1.0);
    let r = rng.normals(n, 1.0);
    c[0] = r[0];
    let r_t = from_vec(r, &[n], DType::F64);
    let margin = from_vec(vec![0.0, 0.5, 0.1, 0.0, 1.0, 0.3], &[n], DType::F64);
    check(
        "bradley-terry",
        &c,
        &[n],
        |x| bradley_terry_loss(x, &r_t, Some(&margin)).unwrap().0,
        |_| false,
    );
}

#[test]
fn ppo_and_value_losses_match_finite_differences() {
    let mut rng = SplitMix::new(5);
    let (b, t) = (3, 7);
    let dims = [b, t];
    let mask = rng.mask(b, t);
    let m = from_vec(mask.clone(), &dims, DType::F64);
    let old: Vec<f64> = rng.normals(b * t, 0.5).iter().map(|x| x - 1.0).collect();
    let logp: Vec<f64> = old
        .iter()
        .zip(rng.normals(b * t, 0.4))
        .map(|(o, d)| o + d)
        .collect();
    let adv = rng.normals(b * t, 1.0);
    let rollout: Vec<f64> = old
        .iter()
        .zip(rng.normals(b * t, 0.3))
        .map(|(o, d)| o + d)
        .collect();
    let (old_t, adv_t) = (
        from_vec(old.clone(), &dims, DType::F64),
        from_vec(adv.clone(), &dims, DType::F64),
    );
    let weights = oxalign_rlhf::losses::truncated_is_weights(
        &old_t,
        &from_vec(rollout, &dims, DType::F64),
        &m,
        1.5,
    )
    .unwrap()
    .0;
    for agg in [
        LossAgg::TokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenMean,
    ] {
        let cfg = PpoConfig {
            clip_low: 0.2,
            clip_high: 0.3,
            dual_clip: Some(1.8),
            agg,
        };
        // Kinks at r = 1 − ε_low, 1 + ε_high and c: skip tokens within 1e-4 of one.
        let near_kink = |i: usize| {
            let r = (logp[i] - old[i]).exp();
            [1.0 - cfg.clip_low, 1.0 + cfg.clip_high, 1.8]
                .iter()
                .any(|k| (r - k).abs() < 1e-4)
        };
        check(
            &format!("ppo {agg:?}"),
            &logp,
            &dims,
            |x| {
                ppo_policy_loss(x, &old_t, &adv_t, &m, &cfg, Some(&weights))
                    .unwrap()
                    .0
            },
            near_kink,
        );
        check(
            &format!("kl k3 {agg:?}"),
            &logp,
            &dims,
            |x| kl_loss(x, &old_t, &m, KlEstimator::K3, 0.3, agg).unwrap().0,
            |_| false,
        );

        let old_v = rng.normals(b * t, 1.0);
        let v: Vec<f64> = old_v
            .iter()
            .zip(rng.normals(b * t, 0.3))
            .map(|(o, d)| o + d)
            .collect();
        let ret = from_vec(rng.normals(b * t, 1.0), &dims, DType::F64);
        let old_vt = from_vec(old_v.clone(), &dims, DType::F64);
        let near = |i: usize| ((v[i] - old_v[i]).abs() - 0.2).abs() < 1e-4;
        check(
            &format!("value {agg:?}"),
            &v,
            &dims,
            |x| value_loss(x, &old_vt, &ret, &m, Some(0.2), agg).unwrap().0,
            near,
        );
    }
}
