//! Property tests: GAE(λ=1, γ=1) is the Monte-Carlo return minus the value; PPO has exactly
//! zero gradient where its clipped branch is active; k3 ≥ 0; masked positions never change any
//! output or gradient (perturbed with large values, inf and NaN).

mod common;

use candle_core::{DType, Tensor, Var};
use common::*;
use oxalign_rlhf::advantages::{
    gae, masked_whiten, reinforce_pp_advantages, GaeBootstrap, GaeConfig, WhitenOptions,
};
use oxalign_rlhf::losses::{
    aggregate_loss, entropy_bonus, kl_loss, kl_per_token, kl_shaped_rewards, ppo_policy_loss,
    sft_loss, truncated_is_weights, value_loss, KlEstimator, LossAgg, PpoConfig,
};
use proptest::prelude::*;

const AGGS: [LossAgg; 3] = [
    LossAgg::TokenMean,
    LossAgg::SeqMeanTokenSum,
    LossAgg::SeqMeanTokenMean,
];

fn mask_strategy(b: usize, t: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop::bool::weighted(0.6), b * t).prop_map(move |bits| {
        let mut m: Vec<f64> = bits
            .into_iter()
            .map(|x| if x { 1.0 } else { 0.0 })
            .collect();
        for row in 0..b {
            m[row * t + (row % t)] = 1.0; // at least one response token per row
        }
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// With γ = λ = 1, Â_t = Σ_{k≥t} r_k (+ bootstrap value) − V(s_t) over the response tokens.
    #[test]
    fn gae_lambda_one_is_monte_carlo_minus_value(
        rewards in prop::collection::vec(-3.0f64..3.0, 3 * 6),
        values in prop::collection::vec(-3.0f64..3.0, 3 * 6),
        mask in mask_strategy(3, 6),
        last in prop::collection::vec(-3.0f64..3.0, 3),
        trunc in prop::collection::vec(prop::bool::ANY, 3),
    ) {
        let (b, t) = (3, 6);
        let dims = [b, t];
        let r = from_vec(rewards.clone(), &dims, DType::F64);
        let v = from_vec(values.clone(), &dims, DType::F64);
        let m = from_vec(mask.clone(), &dims, DType::F64);
        let lv = from_vec(last.clone(), &[b], DType::F64);
        let tr = from_vec(trunc.iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(), &[b], DType::F64);
        let cfg = GaeConfig { gamma: 1.0, lambda: 1.0 };
        let out = gae(&r, &v, &m, cfg, Some(GaeBootstrap { last_value: &lv, truncated: &tr })).unwrap();
        let adv = host(&out.advantages);
        let ret = host(&out.returns);
        for row in 0..b {
            for col in 0..t {
                let i = row * t + col;
                if mask[i] == 0.0 {
                    prop_assert_eq!(adv[i], 0.0);
                    prop_assert_eq!(ret[i], 0.0);
                    continue;
                }
                let mut mc: f64 = (col..t).filter(|&c| mask[row * t + c] != 0.0).map(|c| rewards[row * t + c]).sum();
                if trunc[row] { mc += last[row]; }
                prop_assert!((adv[i] - (mc - values[i])).abs() < 1e-9, "adv {} vs {}", adv[i], mc - values[i]);
                prop_assert!((ret[i] - mc).abs() < 1e-9);
            }
        }
    }

    /// k3 = exp(−d) + d − 1 ≥ 0 for any log-probs (and k2 ≥ 0).
    #[test]
    fn k3_and_k2_are_nonnegative(
        logp in prop::collection::vec(-30.0f64..0.0, 2 * 8),
        refp in prop::collection::vec(-30.0f64..0.0, 2 * 8),
        mask in mask_strategy(2, 8),
    ) {
        // Far apart, and within 3e-4 of each other (where f32 rounding could go negative).
        let near: Vec<f64> = logp.iter().zip(&refp).map(|(l, r)| l + (r + 15.0) * 2e-5).collect();
        for (dtype, refp) in [DType::F64, DType::F32].into_iter().flat_map(|d| [(d, refp.clone()), (d, near.clone())]) {
            let dims = [2, 8];
            let (lp, rp, m) = (from_vec(logp.clone(), &dims, dtype), from_vec(refp, &dims, dtype), from_vec(mask.clone(), &dims, dtype));
            for est in [KlEstimator::K2, KlEstimator::K3] {
                let kl = host(&kl_per_token(&lp, &rp, &m, est).unwrap());
                prop_assert!(kl.iter().all(|&k| k >= 0.0), "{est:?} {kl:?}");
            }
        }
    }
}

/// Which tokens the PPO objective clips (constant branch), from the definition.
fn clipped_tokens(logp: &[f64], old: &[f64], adv: &[f64], cfg: &PpoConfig) -> Vec<bool> {
    logp.iter()
        .zip(old)
        .zip(adv)
        .map(|((lp, o), a)| {
            let r = (lp - o).exp();
            let high = *a > 0.0 && r > 1.0 + cfg.clip_high;
            let low = *a < 0.0 && r < 1.0 - cfg.clip_low;
            let dual = *a < 0.0 && cfg.dual_clip.is_some_and(|c| r > c);
            high || low || dual
        })
        .collect()
}

#[test]
fn ppo_gradient_is_zero_exactly_where_clipped() {
    let mut rng = SplitMix::new(7);
    let (b, t) = (4, 9);
    let mut seen_clipped = 0;
    for case in 0..40 {
        let cfg = PpoConfig {
            clip_low: 0.2,
            clip_high: if case % 2 == 0 { 0.2 } else { 0.28 },
            dual_clip: (case % 3 == 0).then_some(2.5),
            agg: AGGS[case % 3],
        };
        let old: Vec<f64> = rng.normals(b * t, 0.5).iter().map(|x| x - 1.0).collect();
        let logp: Vec<f64> = old
            .iter()
            .zip(rng.normals(b * t, 0.5))
            .map(|(o, d)| o + d)
            .collect();
        let adv = rng.normals(b * t, 1.0);
        let mask = rng.mask(b, t);
        let dims = [b, t];
        let var = Var::from_tensor(&from_vec(logp.clone(), &dims, DType::F64)).unwrap();
        let (loss, stats) = ppo_policy_loss(
            var.as_tensor(),
            &from_vec(old.clone(), &dims, DType::F64),
            &from_vec(adv.clone(), &dims, DType::F64),
            &from_vec(mask.clone(), &dims, DType::F64),
            &cfg,
            None,
        )
        .unwrap();
        let grad = host(loss.backward().unwrap().get(var.as_tensor()).unwrap());
        let clipped = clipped_tokens(&logp, &old, &adv, &cfg);
        let n_resp = mask.iter().filter(|&&m| m != 0.0).count();
        let n_clip = clipped
            .iter()
            .zip(&mask)
            .filter(|(c, m)| **c && **m != 0.0)
            .count();
        seen_clipped += n_clip;
        // verl's clip fraction: tokens where the clipped term exceeds the unclipped one
        // (range clipping only; dual-clipped tokens are counted by dual_clip_frac).
        let want_frac = (0..b * t)
            .filter(|&i| {
                let r = (logp[i] - old[i]).exp();
                mask[i] != 0.0
                    && ((adv[i] > 0.0 && r > 1.0 + cfg.clip_high)
                        || (adv[i] < 0.0 && r < 1.0 - cfg.clip_low))
            })
            .count() as f64
            / n_resp as f64;
        assert!(
            (stats.clip_frac - want_frac).abs() < 1e-12,
            "clip_frac {} vs {want_frac}",
            stats.clip_frac
        );
        for i in 0..b * t {
            if mask[i] == 0.0 || clipped[i] {
                assert_eq!(
                    grad[i], 0.0,
                    "case {case} token {i}: clipped/masked but grad {}",
                    grad[i]
                );
            } else {
                assert!(
                    grad[i] != 0.0,
                    "case {case} token {i}: unclipped but zero grad"
                );
                assert_eq!(
                    grad[i].signum(),
                    -adv[i].signum(),
                    "descent raises logp iff A > 0"
                );
            }
        }
    }
    assert!(
        seen_clipped > 20,
        "the random cases must exercise clipping ({seen_clipped})"
    );
}

/// Replaces masked entries by wild values.
fn perturb(x: &[f64], mask: &[f64], rng: &mut SplitMix) -> Vec<f64> {
    x.iter()
        .zip(mask)
        .enumerate()
        .map(|(i, (&v, &m))| {
            if m != 0.0 {
                return v;
            }
            match i % 4 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => -1e30,
                _ => rng.normal() * 1e3,
            }
        })
        .collect()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn masked_positions_never_change_any_result() {
    let mut rng = SplitMix::new(11);
    let (b, t) = (3, 8);
    let dims = [b, t];
    for dtype in DTYPES {
        for case in 0..12 {
            let mask = rng.mask(b, t);
            let m = from_vec(mask.clone(), &dims, dtype);
            let base: Vec<Vec<f64>> = (0..5)
                .map(|_| rng.normals(b * t, 0.7).iter().map(|x| x - 1.0).collect())
                .collect();
            let wild: Vec<Vec<f64>> = base.iter().map(|x| perturb(x, &mask, &mut rng)).collect();
            let scores = from_vec(rng.normals(b, 1.0), &[b], dtype);
            let lv = from_vec(rng.normals(b, 1.0), &[b], dtype);
            let tr = from_vec(vec![1.0, 0.0, 1.0], &[b], dtype);
            let agg = AGGS[case % 3];
            let cfg = PpoConfig {
                clip_low: 0.2,
                clip_high: 0.25,
                dual_clip: Some(3.0),
                agg,
            };

            // Every output (values, stats and gradients) as one vector of f64.
            let run = |x: &[Vec<f64>]| -> Vec<f64> {
                let ts: Vec<Tensor> = x
                    .iter()
                    .map(|v| from_vec(v.clone(), &dims, dtype))
                    .collect();
                let var = Var::from_tensor(&ts[0]).unwrap();
                let lp = var.as_tensor();
                let mut out = vec![];
                let g = gae(
                    &ts[1],
                    &ts[2],
                    &m,
                    GaeConfig {
                        gamma: 0.99,
                        lambda: 0.9,
                    },
                    Some(GaeBootstrap {
                        last_value: &lv,
                        truncated: &tr,
                    }),
                )
                .unwrap();
                out.extend(host(&g.advantages));
                out.extend(host(&g.returns));
                let rpp =
                    reinforce_pp_advantages(&ts[1], &m, 0.97, WhitenOptions::default()).unwrap();
                out.extend(host(&rpp.advantages));
                out.extend(host(
                    &masked_whiten(
                        &ts[2],
                        &m,
                        WhitenOptions {
                            shift_mean: false,
                            eps: 1e-8,
                        },
                    )
                    .unwrap(),
                ));
                let (w, tis) = truncated_is_weights(&ts[3], &ts[4], &m, 2.0).unwrap();
                out.extend(host(&w));
                out.extend([
                    tis.mismatch_abs_mean,
                    tis.mismatch_abs_max,
                    tis.weight_mean,
                    tis.truncated_frac,
                ]);
                let (ppo, ps) = ppo_policy_loss(lp, &ts[3], &ts[1], &m, &cfg, Some(&w)).unwrap();
                out.extend([
                    ps.clip_frac,
                    ps.dual_clip_frac,
                    ps.approx_kl,
                    ps.ratio_mean,
                    ps.loss,
                ]);
                let (vl, vs) = value_loss(lp, &ts[2], &ts[1], &m, Some(0.2), agg).unwrap();
                out.extend([vs.clip_frac, vs.value_mean, vs.mse, vs.loss]);
                let (ent, _) = entropy_bonus(&lp.neg().unwrap(), &m, 0.01, agg).unwrap();
                let (kl, _) = kl_loss(lp, &ts[4], &m, KlEstimator::K3, 0.1, agg).unwrap();
                let (shaped, ks) =
                    kl_shaped_rewards(&scores, lp, &ts[4], &m, 0.05, KlEstimator::K2).unwrap();
                out.extend(host(&shaped));
                out.extend([ks.kl_seq_mean, ks.kl_token_mean]);
                let (sft, ss) = sft_loss(lp, &m).unwrap();
                out.push(ss.nll);
                out.push(scalar(&aggregate_loss(&ts[1], &m, agg).unwrap()));
                let total = (((((ppo + vl).unwrap() + ent).unwrap() + kl).unwrap()) + sft).unwrap();
                out.push(scalar(&total));
                let grad = host(total.backward().unwrap().get(lp).unwrap());
                for (gi, mi) in grad.iter().zip(&mask) {
                    if *mi == 0.0 {
                        assert_eq!(*gi, 0.0, "masked gradient must be exactly zero");
                    }
                }
                out.extend(grad);
                out
            };
            let clean = run(&base);
            assert!(clean.iter().all(|x| x.is_finite()), "clean outputs finite");
            let dirty = run(&wild);
            assert_eq!(
                bits(&clean),
                bits(&dirty),
                "dtype {dtype:?} case {case}: masked inputs changed a result"
            );
        }
    }
}
