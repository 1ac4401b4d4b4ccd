//! Compares every formula against tools/rlhf_reference.py's independent implementation
//! (tests/fixtures/reference.json), in f64 (1e-6) and f32 (1e-5).

mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use common::*;
use oxalign_rlhf::advantages::{
    distill_advantages, gae, group_relative_advantages, informative_count, informative_groups,
    masked_whiten, reinforce_pp_advantages, rloo_advantages, select_groups, GaeBootstrap,
    GaeConfig, GroupNorm, WhitenOptions,
};
use oxalign_rlhf::losses::{
    bradley_terry_loss, dpo_loss, entropy_bonus, kl_loss, kl_per_token, kl_shaped_rewards,
    ppo_policy_loss, sft_loss, truncated_is_weights, value_loss, DpoLoss, KlEstimator, LossAgg,
    PolicyObjective, PpoConfig, PreferenceLogprobs, RolloutCorrection,
};
use oxalign_rlhf::optim::{clip_grad_norm, AdamW, AdamWConfig, LrSchedule, ParamGroup};
use oxalign_rlhf::{AdaptiveKl, KlController};
use serde_json::Value;

fn agg(name: &str) -> LossAgg {
    match name {
        "token-mean" => LossAgg::TokenMean,
        "seq-mean-token-sum" => LossAgg::SeqMeanTokenSum,
        "seq-mean-token-mean" => LossAgg::SeqMeanTokenMean,
        other => panic!("unknown agg {other}"),
    }
}

#[test]
fn gae_matches_reference() {
    for dtype in DTYPES {
        for case in fixture()["gae"].as_array().unwrap() {
            let rewards = tensor(&case["rewards"], dtype);
            let values = tensor(&case["values"], dtype);
            let mask = tensor(&case["mask"], dtype);
            let last = tensor(&case["last_value"], dtype);
            let trunc = tensor(&case["truncated"], dtype);
            let cfg = GaeConfig {
                gamma: f(&case["gamma"]),
                lambda: f(&case["lam"]),
            };
            let bootstrap = case["bootstrap"]
                .as_bool()
                .unwrap()
                .then_some(GaeBootstrap {
                    last_value: &last,
                    truncated: &trunc,
                });
            let out = gae(&rewards, &values, &mask, cfg, bootstrap).unwrap();
            assert_eq!(out.advantages.dtype(), dtype);
            assert_close(
                "gae advantages",
                &host(&out.advantages),
                &flat(&case["advantages"]),
                tol(dtype),
            );
            assert_close(
                "gae returns",
                &host(&out.returns),
                &flat(&case["returns"]),
                tol(dtype),
            );
        }
    }
}

#[test]
fn group_advantages_match_reference() {
    let case = &fixture()["group"];
    let g = case["group_size"].as_u64().unwrap() as usize;
    for dtype in DTYPES {
        let scores = tensor(&case["scores"], dtype);
        let eps = f(&case["eps"]);
        let grpo = group_relative_advantages(&scores, g, GroupNorm::MeanStd, eps).unwrap();
        assert_close("grpo", &host(&grpo), &flat(&case["grpo"]), tol(dtype));
        let dr = group_relative_advantages(&scores, g, GroupNorm::MeanOnly, eps).unwrap();
        assert_close("dr grpo", &host(&dr), &flat(&case["dr_grpo"]), tol(dtype));
        let rloo = rloo_advantages(&scores, g).unwrap();
        assert_close("rloo", &host(&rloo), &flat(&case["rloo"]), tol(dtype));
    }
}

#[test]
fn reinforce_pp_and_whiten_match_reference() {
    let case = &fixture()["reinforce_pp"];
    for dtype in DTYPES {
        let rewards = tensor(&case["rewards"], dtype);
        let mask = tensor(&case["mask"], dtype);
        let out =
            reinforce_pp_advantages(&rewards, &mask, f(&case["gamma"]), WhitenOptions::default())
                .unwrap();
        assert_close(
            "reinforce++ returns",
            &host(&out.returns),
            &flat(&case["returns"]),
            tol(dtype),
        );
        assert_close(
            "reinforce++ adv",
            &host(&out.advantages),
            &flat(&case["advantages"]),
            tol(dtype),
        );
        for w in fixture()["whiten"].as_array().unwrap() {
            let opts = WhitenOptions {
                shift_mean: w["shift_mean"].as_bool().unwrap(),
                eps: f(&w["eps"]),
            };
            let out =
                masked_whiten(&tensor(&w["x"], dtype), &tensor(&w["mask"], dtype), opts).unwrap();
            assert_close("whiten", &host(&out), &flat(&w["out"]), tol(dtype));
        }
    }
}

#[test]
fn ppo_loss_gradient_and_stats_match_reference() {
    for dtype in DTYPES {
        for case in fixture()["ppo"].as_array().unwrap() {
            let c = &case["config"];
            let cfg = PpoConfig {
                clip_low: f(&c["clip_low"]),
                clip_high: f(&c["clip_high"]),
                dual_clip: c["dual_clip"].as_f64(),
                agg: agg(c["agg"].as_str().unwrap()),
            };
            let logp = Var::from_tensor(&tensor(&case["logprobs"], dtype)).unwrap();
            let old = tensor(&case["old_logprobs"], dtype);
            let adv = tensor(&case["advantages"], dtype);
            let mask = tensor(&case["mask"], dtype);
            let weights = match c["tis"].as_f64() {
                Some(cap) => {
                    let rollout = tensor(&case["rollout_logprobs"], dtype);
                    Some(truncated_is_weights(&old, &rollout, &mask, cap).unwrap().0)
                }
                None => None,
            };
            let (loss, stats) =
                ppo_policy_loss(logp.as_tensor(), &old, &adv, &mask, &cfg, weights.as_ref())
                    .unwrap();
            let t = tol(dtype);
            assert_close1("ppo loss", scalar(&loss), f(&case["loss"]), t);
            assert_close1("ppo loss stat", stats.loss, f(&case["loss"]), t);
            assert_close1("clip_frac", stats.clip_frac, f(&case["clip_frac"]), t);
            assert_close1(
                "dual_clip_frac",
                stats.dual_clip_frac,
                f(&case["dual_clip_frac"]),
                t,
            );
            assert_close1("approx_kl", stats.approx_kl, f(&case["approx_kl"]), t);
            let grads = loss.backward().unwrap();
            let g = grads.get(logp.as_tensor()).unwrap();
            assert_close("ppo grad", &host(g), &flat(&case["grad"]), t);
        }
    }
}

#[test]
fn value_loss_matches_reference() {
    for dtype in DTYPES {
        for case in fixture()["value"].as_array().unwrap() {
            let v = Var::from_tensor(&tensor(&case["values"], dtype)).unwrap();
            let (loss, stats) = value_loss(
                v.as_tensor(),
                &tensor(&case["old_values"], dtype),
                &tensor(&case["returns"], dtype),
                &tensor(&case["mask"], dtype),
                case["clip"].as_f64(),
                agg(case["agg"].as_str().unwrap()),
            )
            .unwrap();
            let t = tol(dtype);
            assert_close1("value loss", scalar(&loss), f(&case["loss"]), t);
            assert_close1("value clip_frac", stats.clip_frac, f(&case["clip_frac"]), t);
            let grads = loss.backward().unwrap();
            assert_close(
                "value grad",
                &host(grads.get(v.as_tensor()).unwrap()),
                &flat(&case["grad"]),
                t,
            );
        }
    }
}

#[test]
fn entropy_kl_tis_sft_match_reference() {
    let fx = fixture();
    for dtype in DTYPES {
        let t = tol(dtype);
        let e = &fx["entropy"];
        let (loss, stats) = entropy_bonus(
            &tensor(&e["entropy"], dtype),
            &tensor(&e["mask"], dtype),
            f(&e["coef"]),
            LossAgg::TokenMean,
        )
        .unwrap();
        assert_close1("entropy loss", scalar(&loss), f(&e["loss"]), t);
        assert_close1("entropy mean", stats.entropy, f(&e["entropy_mean"]), t);

        let k = &fx["kl"];
        let (logp, refp, mask) = (
            tensor(&k["logprobs"], dtype),
            tensor(&k["ref_logprobs"], dtype),
            tensor(&k["mask"], dtype),
        );
        let scores = tensor(&k["scores"], dtype);
        for (name, est) in [
            ("k1", KlEstimator::K1),
            ("k2", KlEstimator::K2),
            ("k3", KlEstimator::K3),
        ] {
            let kl = kl_per_token(&logp, &refp, &mask, est).unwrap();
            assert_close(name, &host(&kl), &flat(&k[name]), t);
            let (shaped, stats) =
                kl_shaped_rewards(&scores, &logp, &refp, &mask, f(&k["beta"]), est).unwrap();
            assert_close(
                "shaped rewards",
                &host(&shaped),
                &flat(&k["shaped"][name]),
                t,
            );
            if est == KlEstimator::K3 {
                assert_close1("kl seq mean", stats.kl_seq_mean, f(&k["k3_seq_mean"]), t);
                assert_close1(
                    "kl token mean",
                    stats.kl_token_mean,
                    f(&k["k3_token_mean"]),
                    t,
                );
            }
        }

        let c = &fx["tis"];
        let (w, stats) = truncated_is_weights(
            &tensor(&c["trainer_old_logprobs"], dtype),
            &tensor(&c["rollout_logprobs"], dtype),
            &tensor(&c["mask"], dtype),
            f(&c["cap"]),
        )
        .unwrap();
        assert_close("tis weights", &host(&w), &flat(&c["weights"]), t);
        assert_close1(
            "mismatch mean",
            stats.mismatch_abs_mean,
            f(&c["mismatch_abs_mean"]),
            t,
        );
        assert_close1(
            "mismatch max",
            stats.mismatch_abs_max,
            f(&c["mismatch_abs_max"]),
            t,
        );
        assert_close1("weight mean", stats.weight_mean, f(&c["weight_mean"]), t);
        assert_close1(
            "truncated frac",
            stats.truncated_frac,
            f(&c["truncated_frac"]),
            t,
        );

        let s = &fx["sft"];
        let (loss, stats) = sft_loss(
            &tensor(&s["token_logprobs"], dtype),
            &tensor(&s["mask"], dtype),
        )
        .unwrap();
        assert_close1("sft loss", scalar(&loss), f(&s["loss"]), t);
        assert_eq!(stats.num_tokens as u64, s["num_tokens"].as_u64().unwrap());
    }
}

#[test]
fn dpo_and_bradley_terry_match_reference() {
    for dtype in DTYPES {
        let t = tol(dtype);
        for case in fixture()["dpo"].as_array().unwrap() {
            let pc = Var::from_tensor(&tensor(&case["policy_chosen"], dtype)).unwrap();
            let pr = Var::from_tensor(&tensor(&case["policy_rejected"], dtype)).unwrap();
            let rc = tensor(&case["reference_chosen"], dtype);
            let rr = tensor(&case["reference_rejected"], dtype);
            let kind = match case["kind"].as_str().unwrap() {
                "sigmoid" => DpoLoss::Sigmoid {
                    label_smoothing: f(&case["label_smoothing"]),
                },
                _ => DpoLoss::Ipo,
            };
            let logps = PreferenceLogprobs {
                policy_chosen: pc.as_tensor(),
                policy_rejected: pr.as_tensor(),
                reference_chosen: &rc,
                reference_rejected: &rr,
            };
            let (loss, stats) = dpo_loss(logps, f(&case["beta"]), kind).unwrap();
            // Summed log-probs are ~-40: f32 carries ~4e-6 absolute error into h.
            let t = if dtype == DType::F32 { 1e-4 } else { t };
            assert_close1("dpo loss", scalar(&loss), f(&case["loss"]), t);
            assert_close1(
                "dpo acc",
                stats.reward_accuracy,
                f(&case["reward_accuracy"]),
                1e-12,
            );
            assert_close1(
                "dpo margin",
                stats.reward_margin,
                f(&case["reward_margin"]),
                t,
            );
            assert_close1(
                "dpo chosen",
                stats.chosen_reward,
                f(&case["chosen_reward"]),
                t,
            );
            assert_close1(
                "dpo rejected",
                stats.rejected_reward,
                f(&case["rejected_reward"]),
                t,
            );
            let grads = loss.backward().unwrap();
            assert_close(
                "dpo grad c",
                &host(grads.get(pc.as_tensor()).unwrap()),
                &flat(&case["grad_chosen"]),
                t,
            );
            assert_close(
                "dpo grad r",
                &host(grads.get(pr.as_tensor()).unwrap()),
                &flat(&case["grad_rejected"]),
                t,
            );
        }
        for case in fixture()["bradley_terry"].as_array().unwrap() {
            let c = Var::from_tensor(&tensor(&case["chosen"], dtype)).unwrap();
            let r = tensor(&case["rejected"], dtype);
            let margin = (!case["margin"].is_null()).then(|| tensor(&case["margin"], dtype));
            let (loss, stats) = bradley_terry_loss(c.as_tensor(), &r, margin.as_ref()).unwrap();
            assert_close1("bt loss", scalar(&loss), f(&case["loss"]), t);
            assert_close1("bt acc", stats.accuracy, f(&case["accuracy"]), 1e-12);
            assert_close1(
                "bt margin",
                stats.reward_margin,
                f(&case["reward_margin"]),
                t,
            );
            let grads = loss.backward().unwrap();
            assert_close(
                "bt grad",
                &host(grads.get(c.as_tensor()).unwrap()),
                &flat(&case["grad_chosen"]),
                t,
            );
        }
    }
}

#[test]
fn adaptive_kl_matches_reference() {
    let c = &fixture()["adaptive_kl"];
    let mut ctl = KlController::Adaptive(
        AdaptiveKl::new(f(&c["init_beta"]), f(&c["target"]), f(&c["horizon"])).unwrap(),
    );
    let n = c["n_steps"].as_u64().unwrap();
    for (kl, want) in flat(&c["kls"]).into_iter().zip(flat(&c["betas"])) {
        ctl.update(kl, n).unwrap();
        assert_close1("beta", ctl.beta(), want, 1e-12);
    }
    // The state round-trips through JSON and keeps adapting identically.
    let json = serde_json::to_string(&ctl).unwrap();
    let mut back: KlController = serde_json::from_str(&json).unwrap();
    assert_eq!(back, ctl);
    back.update(7.0, n).unwrap();
    ctl.update(7.0, n).unwrap();
    assert_eq!(back.beta(), ctl.beta());
}

fn vars_from(values: &Value, shapes: &Value) -> Vec<Var> {
    values
        .as_array()
        .unwrap()
        .iter()
        .zip(shapes.as_array().unwrap())
        .map(|(v, s)| {
            let shape: Vec<usize> = s
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            Var::from_tensor(
                &Tensor::from_vec(flat(v), shape, &Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap(),
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn adamw_with_groups_matches_torch() {
    let c = &fixture()["adamw"];
    let names: Vec<String> = c["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    let vars = vars_from(&c["init"], &c["shapes"]);
    let groups: Vec<ParamGroup> = serde_json::from_value(c["groups"].clone()).unwrap();
    let membership: Vec<usize> = c["membership"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_u64().unwrap() as usize)
        .collect();
    // The fixture's groups are exactly the default rule (norms and biases: no decay).
    for (name, g) in names.iter().zip(&membership) {
        assert_eq!(oxalign_rlhf::optim::default_group_of(name), *g, "{name}");
    }
    let cfg = AdamWConfig {
        lr: f(&c["lr"]),
        beta1: f(&c["beta1"]),
        beta2: f(&c["beta2"]),
        eps: f(&c["eps"]),
        weight_decay: 0.1,
    };
    let named: Vec<(String, Var)> = names.iter().cloned().zip(vars.iter().cloned()).collect();
    let lookup = names.clone();
    let mut opt = AdamW::with_groups(named, cfg, groups, move |n| {
        membership[lookup.iter().position(|x| x == n).unwrap()]
    })
    .unwrap();
    assert_eq!(opt.group_of(&names[0]).unwrap().weight_decay, 0.1);
    for (k, step) in c["steps"].as_array().unwrap().iter().enumerate() {
        let mut grads = GradStore::default();
        for (var, g) in vars.iter().zip(step["grads"].as_array().unwrap()) {
            if !g.is_null() {
                let gt = Tensor::from_vec(flat(g), var.as_tensor().shape(), &Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                grads.insert(var.as_tensor(), gt);
            }
        }
        opt.step(&grads).unwrap();
        for ((var, want), name) in vars
            .iter()
            .zip(step["params"].as_array().unwrap())
            .zip(&names)
        {
            assert_close(
                &format!("step {k} {name}"),
                &host(var.as_tensor()),
                &flat(want),
                1e-6,
            );
        }
    }
    let steps: Vec<u64> = opt.param_state().map(|(_, s, _, _)| s).collect();
    assert_eq!(
        steps,
        vec![4, 4, 3],
        "per-parameter step counts (score.bias skipped once)"
    );
}

#[test]
fn clip_grad_norm_matches_torch() {
    for case in fixture()["clip"].as_array().unwrap() {
        let grads_v = case["grads"].as_array().unwrap();
        let vars: Vec<Var> = grads_v
            .iter()
            .map(|g| Var::zeros(dims(g), DType::F32, &Device::Cpu).unwrap())
            .collect();
        let mut store = GradStore::default();
        for (v, g) in vars.iter().zip(grads_v) {
            store.insert(v.as_tensor(), tensor(g, DType::F32));
        }
        let norm = clip_grad_norm(&mut store, vars.iter(), f(&case["max_norm"])).unwrap();
        assert_close1("norm", norm, f(&case["norm"]), 1e-5);
        for (v, want) in vars.iter().zip(case["clipped"].as_array().unwrap()) {
            assert_close(
                "clipped",
                &host(store.get(v.as_tensor()).unwrap()),
                &flat(want),
                1e-5,
            );
        }
    }
}

#[test]
fn schedules_match_reference() {
    let c = &fixture()["schedule"];
    let (peak, min, warmup, total) = (
        f(&c["peak_lr"]),
        f(&c["min_lr"]),
        c["warmup_steps"].as_u64().unwrap(),
        c["total_steps"].as_u64().unwrap(),
    );
    let cosine = LrSchedule::WarmupCosine {
        peak_lr: peak,
        min_lr: min,
        warmup_steps: warmup,
        total_steps: total,
    };
    let linear = LrSchedule::WarmupLinear {
        peak_lr: peak,
        min_lr: min,
        warmup_steps: warmup,
        total_steps: total,
    };
    cosine.validate().unwrap();
    for (s, (wc, wl)) in flat(&c["cosine"])
        .into_iter()
        .zip(flat(&c["linear"]))
        .enumerate()
    {
        assert_close1(&format!("cosine[{s}]"), cosine.lr_at(s as u64), wc, 1e-12);
        assert_close1(&format!("linear[{s}]"), linear.lr_at(s as u64), wl, 1e-12);
    }
    assert_eq!(cosine.lr_at(total + 100), min);
    assert_eq!(LrSchedule::Constant { lr: 0.5 }.lr_at(1_000), 0.5);
}

/// KL as a loss term, differentiated as written: values and gradients against torch
/// autograd for each estimator (k1's gradient has zero mean under π, k2's is that of
/// KL(π‖π_ref), k3's that of KL(π_ref‖π); see `losses/kl.rs`).
#[test]
fn kl_loss_gradients_match_reference() {
    for dtype in DTYPES {
        for case in fixture()["kl_loss"].as_array().unwrap() {
            let mask = tensor(&case["mask"], dtype);
            let refp = tensor(&case["ref_logprobs"], dtype);
            for (name, est) in [
                ("k1", KlEstimator::K1),
                ("k2", KlEstimator::K2),
                ("k3", KlEstimator::K3),
            ] {
                let logp = Var::from_tensor(&tensor(&case["logprobs"], dtype)).unwrap();
                let a = agg(case["agg"].as_str().unwrap());
                let (loss, _) =
                    kl_loss(logp.as_tensor(), &refp, &mask, est, f(&case["coef"]), a).unwrap();
                let t = tol(dtype);
                assert_close1(name, scalar(&loss), f(&case["loss"][name]), t);
                let g = loss.backward().unwrap();
                let g = g.get(logp.as_tensor()).unwrap();
                assert_close(name, &host(g), &flat(&case["grad"][name]), t);
            }
        }
    }
}

/// GSPO's sequence-ratio loss (the paper's sequence form and its GSPO-token form) and
/// CISPO's clipped-weight loss: values, gradients and clip fractions against the published
/// formulas in torch.
#[test]
fn gspo_and_cispo_match_reference() {
    for dtype in DTYPES {
        let t = tol(dtype);
        let mut cases: Vec<(&str, &Value)> = fixture()["gspo"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| ("gspo", c))
            .collect();
        cases.push(("cispo", &fixture()["cispo"]));
        for (kind, case) in cases {
            let cfg = PpoConfig {
                clip_low: f(&case["clip_low"]),
                clip_high: f(&case["clip_high"]),
                dual_clip: None,
                agg: agg(case["agg"].as_str().unwrap()),
            };
            let objective = if kind == "gspo" {
                PolicyObjective::Gspo
            } else {
                PolicyObjective::Cispo
            };
            let logp = Var::from_tensor(&tensor(&case["logprobs"], dtype)).unwrap();
            let (old, adv, mask) = (
                tensor(&case["old_logprobs"], dtype),
                tensor(&case["advantages"], dtype),
                tensor(&case["mask"], dtype),
            );
            let (loss, stats) = objective
                .loss(logp.as_tensor(), &old, &adv, &mask, &cfg, None)
                .unwrap();
            assert_close1(kind, scalar(&loss), f(&case["loss"]), t);
            assert_close1("clip_frac", stats.clip_frac, f(&case["clip_frac"]), t);
            let g = loss.backward().unwrap();
            let g = g.get(logp.as_tensor()).unwrap();
            assert_close(kind, &host(g), &flat(&case["grad"]), t);
        }
    }
}

/// Sequence-level masking (geometric-mean ratio) and IcePop's token masking: weights and
/// masked fractions against the published definitions.
#[test]
fn rollout_corrections_match_reference() {
    for dtype in DTYPES {
        let t = tol(dtype);
        for case in fixture()["rollout_correction"].as_array().unwrap() {
            let (lower, upper) = (f(&case["lower"]), f(&case["upper"]));
            let mode = match case["mode"].as_str().unwrap() {
                "seq_mask" => RolloutCorrection::SeqMask { lower, upper },
                "icepop" => RolloutCorrection::Icepop { lower, upper },
                other => panic!("unknown mode {other}"),
            };
            let (w, stats) = mode
                .weights(
                    &tensor(&case["trainer_old_logprobs"], dtype),
                    &tensor(&case["rollout_logprobs"], dtype),
                    &tensor(&case["mask"], dtype),
                )
                .unwrap()
                .unwrap();
            let name = case["mode"].as_str().unwrap();
            assert_close(name, &host(&w), &flat(&case["weights"]), t);
            assert_close1("weight mean", stats.weight_mean, f(&case["weight_mean"]), t);
            assert_close1(
                "masked frac",
                stats.masked_frac,
                f(&case["masked_frac"]),
                1e-12,
            );
            assert_close1(
                "masked seq frac",
                stats.masked_seq_frac,
                f(&case["masked_seq_frac"]),
                1e-12,
            );
            assert!(
                stats.masked_frac > 0.0 && stats.masked_frac < 1.0,
                "{name}: {stats:?}"
            );
        }
    }
}

/// DAPO's dynamic sampling: which groups are informative, when drawing stops, and which
/// groups the batch keeps (dropped, filled and surplus counts), against the paper's rule.
#[test]
fn dynamic_sampling_matches_reference() {
    for case in fixture()["dynamic_sampling"].as_array().unwrap() {
        let g = case["group_size"].as_u64().unwrap() as usize;
        let target = case["target"].as_u64().unwrap() as usize;
        let mut rounds = Vec::new();
        for scores in case["scores"].as_array().unwrap() {
            let scores: Vec<f32> = flat(scores).iter().map(|&s| s as f32).collect();
            rounds.push(informative_groups(&scores, g).unwrap());
            if informative_count(&rounds) >= target {
                break;
            }
        }
        assert_eq!(rounds.len() as u64, case["rounds_used"].as_u64().unwrap());
        let s = select_groups(&rounds, target);
        let kept: Vec<(usize, usize)> = case["kept"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p[0].as_u64().unwrap() as usize,
                    p[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        assert_eq!(s.kept, kept);
        for (what, got) in [
            ("dropped", s.dropped),
            ("filled", s.filled),
            ("surplus", s.surplus),
        ] {
            assert_eq!(got as u64, case[what].as_u64().unwrap(), "{what}");
        }
    }
}

/// On-policy distillation's per-token advantage, the negative reverse-KL estimate (plus the
/// centred task reward when weighted), against the published definition.
#[test]
fn distill_advantages_match_reference() {
    for dtype in DTYPES {
        let t = tol(dtype);
        for case in fixture()["distill"].as_array().unwrap() {
            let a = distill_advantages(
                &tensor(&case["student_logprobs"], dtype),
                &tensor(&case["teacher_logprobs"], dtype),
                &tensor(&case["mask"], dtype),
                &tensor(&case["scores"], dtype),
                f(&case["reward_coef"]),
            )
            .unwrap();
            assert_close(
                "distill advantages",
                &host(&a),
                &flat(&case["advantages"]),
                t,
            );
        }
    }
}
