//! The KL estimators against exact expectations: with a small vocabulary every token can be
//! enumerated, so `E_{y~π}[k(y)]` and `E_{y~π}[∇_θ k(y)]` are finite sums that must equal the
//! divergences and their gradients in closed form (Schulman 2020):
//!
//! * values: `E[k1] = E[k3] = KL(π ‖ ref)`; `E[k2] = ½ E[(log π − log ref)²]`;
//! * gradients (as a loss on on-policy samples): `E[∇k1] = 0`, `E[∇k2] = ∇KL(π ‖ ref)`,
//!   `E[∇k3] = ∇KL(ref ‖ π)`.
//!
//! The closed forms are checked against central finite differences first, so the test does
//! not trust any autograd.

use candle_core::{DType, Device, Tensor, Var};
use oxalign_rlhf::losses::{kl_per_token, KlEstimator};

const LOGITS: [f64; 6] = [0.3, -1.2, 2.0, 0.0, -0.4, 1.1];
const REF_LOGITS: [f64; 6] = [1.0, 0.2, 0.5, -0.7, 0.9, -1.5];

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    z.iter().map(|x| x - lse).collect()
}

/// KL(p ‖ q) from log-probabilities.
fn kl(lp: &[f64], lq: &[f64]) -> f64 {
    lp.iter().zip(lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Central finite-difference gradient of `f` at the logits.
fn fd_grad(f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..LOGITS.len())
        .map(|j| {
            let (mut up, mut down) = (LOGITS, LOGITS);
            up[j] += h;
            down[j] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect()
}

/// `Σ_y π(y) k(y)` as a differentiable scalar (π as constant weights, as sampling gives),
/// and its value and gradient with respect to the policy's logits.
fn expected(estimator: KlEstimator) -> (f64, Vec<f64>) {
    let dev = Device::Cpu;
    let v = LOGITS.len();
    let theta = Var::from_slice(&LOGITS, v, &dev).unwrap();
    let t = theta.as_tensor();
    let lse = t.exp().unwrap().sum_keepdim(0).unwrap().log().unwrap();
    let logp = t.broadcast_sub(&lse).unwrap();
    let pi = logp.exp().unwrap().detach();
    // One row per vocabulary entry: the token sampled is y, its log-prob log π(y).
    let logprobs = logp.reshape((v, 1)).unwrap();
    let lref = Tensor::new(log_softmax(&REF_LOGITS), &dev)
        .unwrap()
        .reshape((v, 1))
        .unwrap();
    let mask = Tensor::ones((v, 1), DType::F64, &dev).unwrap();
    let k = kl_per_token(&logprobs, &lref, &mask, estimator).unwrap();
    let e = (k.reshape(v).unwrap() * pi).unwrap().sum_all().unwrap();
    let grads = e.backward().unwrap();
    let g = grads
        .get(theta.as_tensor())
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    (e.to_scalar::<f64>().unwrap(), g)
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    for (j, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() < 1e-7,
            "{what}[{j}]: {a} vs {b}\n{got:?}\n{want:?}"
        );
    }
}

#[test]
fn the_closed_forms_match_finite_differences() {
    let lq = log_softmax(&REF_LOGITS);
    let lp = log_softmax(&LOGITS);
    let p: Vec<f64> = lp.iter().map(|x| x.exp()).collect();
    let q: Vec<f64> = lq.iter().map(|x| x.exp()).collect();
    let forward = kl(&lp, &lq);
    // ∂/∂θ_j KL(π ‖ ref) = π_j (log π_j − log ref_j − KL)
    let closed: Vec<f64> = (0..p.len())
        .map(|j| p[j] * (lp[j] - lq[j] - forward))
        .collect();
    assert_close(
        &closed,
        &fd_grad(|z| kl(&log_softmax(z), &lq)),
        "∇KL(π‖ref)",
    );
    // ∂/∂θ_j KL(ref ‖ π) = π_j − ref_j
    let closed: Vec<f64> = (0..p.len()).map(|j| p[j] - q[j]).collect();
    assert_close(
        &closed,
        &fd_grad(|z| kl(&lq, &log_softmax(z))),
        "∇KL(ref‖π)",
    );
}

#[test]
fn k1_and_k3_are_unbiased_for_the_reverse_kl_and_k2_is_half_the_squared_log_ratio() {
    let (lp, lq) = (log_softmax(&LOGITS), log_softmax(&REF_LOGITS));
    let reverse = kl(&lp, &lq);
    let (e1, _) = expected(KlEstimator::K1);
    let (e3, _) = expected(KlEstimator::K3);
    assert!((e1 - reverse).abs() < 1e-10, "E[k1] {e1} vs KL {reverse}");
    assert!((e3 - reverse).abs() < 1e-10, "E[k3] {e3} vs KL {reverse}");
    let half_sq: f64 = lp
        .iter()
        .zip(&lq)
        .map(|(a, b)| 0.5 * a.exp() * (a - b).powi(2))
        .sum();
    let (e2, _) = expected(KlEstimator::K2);
    assert!((e2 - half_sq).abs() < 1e-10, "E[k2] {e2} vs {half_sq}");
    assert!(e2 > reverse, "k2 is biased upward here: {e2} vs {reverse}");
}

#[test]
fn on_policy_k2_gradients_follow_the_reverse_kl_and_k3_the_forward_kl() {
    let (lp, lq) = (log_softmax(&LOGITS), log_softmax(&REF_LOGITS));
    let p: Vec<f64> = lp.iter().map(|x| x.exp()).collect();
    let q: Vec<f64> = lq.iter().map(|x| x.exp()).collect();
    let reverse = kl(&lp, &lq);
    let grad_reverse: Vec<f64> = (0..p.len())
        .map(|j| p[j] * (lp[j] - lq[j] - reverse))
        .collect();
    let grad_forward: Vec<f64> = (0..p.len()).map(|j| p[j] - q[j]).collect();

    let (_, g1) = expected(KlEstimator::K1);
    assert_close(&g1, &vec![0.0; p.len()], "E[∇k1]");
    let (_, g2) = expected(KlEstimator::K2);
    assert_close(&g2, &grad_reverse, "E[∇k2] vs ∇KL(π‖ref)");
    let (_, g3) = expected(KlEstimator::K3);
    assert_close(&g3, &grad_forward, "E[∇k3] vs ∇KL(ref‖π)");
}
