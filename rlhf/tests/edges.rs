//! Argument errors (messages name the argument) and edge cases: empty rows, all-zero masks,
//! degenerate groups, extreme log-sigmoid inputs, aggregation by hand.

mod common;

use candle_core::{DType, Var};
use common::*;
use oxalign_rlhf::advantages::{
    gae, group_relative_advantages, rloo_advantages, GaeConfig, GroupNorm,
};
use oxalign_rlhf::losses::{
    aggregate_loss, aggregate_loss_with_denominator, kl_shaped_rewards, log_sigmoid,
    ppo_policy_loss, sft_loss, KlEstimator, LossAgg, PpoConfig,
};
use oxalign_rlhf::{broadcast_to_tokens, masked_mean, KlController, RlhfError};

#[test]
fn shape_and_dtype_errors_name_the_argument() {
    let a = from_vec(vec![0.0; 6], &[2, 3], DType::F32);
    let wrong = from_vec(vec![0.0; 4], &[2, 2], DType::F32);
    let m = from_vec(vec![1.0; 6], &[2, 3], DType::F32);
    let err = gae(&a, &wrong, &m, GaeConfig::default(), None).unwrap_err();
    assert!(
        matches!(err, RlhfError::Shape { ref name, .. } if name == "values"),
        "{err}"
    );
    assert!(err.to_string().contains("[2, 3]"), "{err}");
    let a64 = a.to_dtype(DType::F64).unwrap();
    let err = ppo_policy_loss(&a, &a64, &a, &m, &PpoConfig::default(), None).unwrap_err();
    assert!(
        err.to_string().contains("old_logprobs") && err.to_string().contains("F32"),
        "{err}"
    );
    let ids = a.to_dtype(DType::U32).unwrap();
    assert!(sft_loss(&ids, &m)
        .unwrap_err()
        .to_string()
        .contains("token_logprobs"));
    let err = gae(
        &a,
        &a,
        &m,
        GaeConfig {
            gamma: 1.5,
            lambda: 0.9,
        },
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("gamma"), "{err}");
    let cfg = PpoConfig {
        dual_clip: Some(0.5),
        ..Default::default()
    };
    assert!(ppo_policy_loss(&a, &a, &a, &m, &cfg, None)
        .unwrap_err()
        .to_string()
        .contains("dual_clip"));
}

#[test]
fn group_size_errors() {
    let s = from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0], &[5], DType::F64);
    assert!(group_relative_advantages(&s, 2, GroupNorm::MeanStd, 1e-6)
        .unwrap_err()
        .to_string()
        .contains("scores"));
    let s = from_vec(vec![1.0, 2.0], &[2], DType::F64);
    assert!(group_relative_advantages(&s, 1, GroupNorm::MeanStd, 1e-6)
        .unwrap_err()
        .to_string()
        .contains("group_size"));
    assert_eq!(
        host(&group_relative_advantages(&s, 1, GroupNorm::MeanOnly, 1e-6).unwrap()),
        vec![0.0, 0.0]
    );
    assert!(rloo_advantages(&s, 1).is_err());
    assert_eq!(host(&rloo_advantages(&s, 2).unwrap()), vec![-1.0, 1.0]);
}

#[test]
fn aggregation_modes_by_hand() {
    // Row 0: tokens 1, 2 (mean 1.5, sum 3); row 1: token 4; row 2: empty.
    let loss = from_vec(
        vec![1.0, 2.0, 9.0, 4.0, 9.0, 9.0, 9.0, 9.0, 9.0],
        &[3, 3],
        DType::F64,
    );
    let mask = from_vec(
        vec![1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        &[3, 3],
        DType::F64,
    );
    let agg = |a| scalar(&aggregate_loss(&loss, &mask, a).unwrap());
    assert_close1("token-mean", agg(LossAgg::TokenMean), 7.0 / 3.0, 1e-12);
    assert_close1(
        "seq-mean-token-sum",
        agg(LossAgg::SeqMeanTokenSum),
        (3.0 + 4.0) / 2.0,
        1e-12,
    );
    assert_close1(
        "seq-mean-token-mean",
        agg(LossAgg::SeqMeanTokenMean),
        (1.5 + 4.0) / 2.0,
        1e-12,
    );
    // Dr. GRPO: token sums over a constant horizon of 4, mean over the 2 non-empty sequences.
    assert_close1(
        "seq-mean-token-sum-norm",
        agg(LossAgg::SeqMeanTokenSumNorm { horizon: 4 }),
        (3.0 + 4.0) / 4.0 / 2.0,
        1e-12,
    );
    assert!(aggregate_loss(&loss, &mask, LossAgg::SeqMeanTokenSumNorm { horizon: 0 }).is_err());
    let d = aggregate_loss_with_denominator(&loss, &mask, LossAgg::TokenMean, 10.0).unwrap();
    assert_close1("global denominator", scalar(&d), 0.7, 1e-12);
    let zero = from_vec(vec![0.0; 9], &[3, 3], DType::F64);
    for a in [
        LossAgg::TokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenMean,
        LossAgg::SeqMeanTokenSumNorm { horizon: 3 },
    ] {
        assert_eq!(scalar(&aggregate_loss(&loss, &zero, a).unwrap()), 0.0);
    }
    assert_close1(
        "masked_mean",
        scalar(&masked_mean(&loss, &mask).unwrap()),
        7.0 / 3.0,
        1e-12,
    );
    let b = broadcast_to_tokens(&from_vec(vec![2.0, -1.0, 5.0], &[3], DType::F64), &mask).unwrap();
    assert_eq!(host(&b), vec![2.0, 2.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn kl_shaped_rewards_reject_empty_rows() {
    let lp = from_vec(vec![-1.0; 4], &[2, 2], DType::F64);
    let mask = from_vec(vec![1.0, 1.0, 0.0, 0.0], &[2, 2], DType::F64);
    let scores = from_vec(vec![1.0, 2.0], &[2], DType::F64);
    let err = kl_shaped_rewards(&scores, &lp, &lp, &mask, 0.1, KlEstimator::K1).unwrap_err();
    assert!(matches!(err, RlhfError::EmptyRow { row: 1, .. }), "{err}");
}

#[test]
fn log_sigmoid_is_stable_with_exact_gradient_at_zero() {
    for dtype in DTYPES {
        let x = Var::from_tensor(&from_vec(
            vec![-1000.0, -30.0, 0.0, 30.0, 1000.0],
            &[5],
            dtype,
        ))
        .unwrap();
        let y = log_sigmoid(x.as_tensor()).unwrap();
        let yv = host(&y);
        assert_close1("ls(-1000)", yv[0], -1000.0, 1e-12);
        assert_close1("ls(0)", yv[2], -(2f64.ln()), tol(dtype));
        assert!(yv[4] <= 0.0 && yv[4] > -1e-12);
        let g = host(
            y.sum_all()
                .unwrap()
                .backward()
                .unwrap()
                .get(x.as_tensor())
                .unwrap(),
        );
        assert!(g.iter().all(|v| v.is_finite()), "{g:?}");
        assert_close1("d ls(0)", g[2], 0.5, 1e-12);
        assert_close1("d ls(-1000)", g[0], 1.0, 1e-12);
        assert_close1("d ls(1000)", g[4], 0.0, 1e-12);
    }
}

#[test]
fn kl_controller_fixed_and_errors() {
    let mut fixed: KlController = serde_json::from_str(r#"{"type":"fixed","beta":0.05}"#).unwrap();
    fixed.update(100.0, 64).unwrap();
    assert_eq!(fixed.beta(), 0.05);
    assert!(fixed.update(f64::NAN, 1).is_err());
    assert!(
        serde_json::from_str::<KlController>(r#"{"type":"fixed","beta":0.05,"bogus":1}"#).is_err()
    );
    let bad: KlController =
        serde_json::from_str(r#"{"type":"adaptive","beta":0.1,"target":0.0,"horizon":10}"#)
            .unwrap();
    assert!(bad.validate().unwrap_err().to_string().contains("target"));
}
