//! On-policy distillation advantages (Agarwal et al. 2024, GKD; Thinking Machines 2025,
//! "On-policy distillation"; NeMo RL, AReaL): the student samples, a frozen teacher scores
//! the student's tokens, and each token's advantage is the negative per-token reverse KL
//! estimate `−(log π_student − log π_teacher)`, a target (stop-gradient, no discount), trained
//! with the policy-gradient loss. Optionally a task reward is added, centred over the batch.

use crate::error::{Result, RlhfError};
use crate::mask::{
    broadcast_to_tokens, expect_1d, expect_2d, expect_float, expect_like, predicate,
    zero_unmasked_out,
};
use candle_core::Tensor;

/// `A_t = −(log π_student(y_t) − log π_teacher(y_t)) + reward_coef · (r_i − mean_j r_j)` at
/// response tokens, 0 elsewhere.
///
/// * `student_logprobs`, `teacher_logprobs`: `[batch, seq]` float, log-probs of the sampled
///   tokens under the student (π_old, the rollout policy) and the teacher (nats), both
///   under the distribution sampled.
/// * `mask`: `[batch, seq]`, non-zero = response token.
/// * `scores`: `[batch]` task rewards; only read when `reward_coef ≠ 0`.
/// * Returns detached `[batch, seq]` advantages of the log-probs' dtype.
pub fn distill_advantages(
    student_logprobs: &Tensor,
    teacher_logprobs: &Tensor,
    mask: &Tensor,
    scores: &Tensor,
    reward_coef: f64,
) -> Result<Tensor> {
    let dtype = expect_float("student_logprobs", student_logprobs)?;
    let (b, t) = expect_2d("student_logprobs", student_logprobs)?;
    expect_like(
        "teacher_logprobs",
        teacher_logprobs,
        &[b, t],
        dtype,
        "student_logprobs",
    )?;
    if expect_1d("scores", scores)? != b {
        return Err(RlhfError::invalid(
            "scores",
            format!("{:?}", scores.dims()),
            format!("expected one score per row ({b})"),
        ));
    }
    let pred = predicate(mask)?;
    let reverse_kl = (zero_unmasked_out(&student_logprobs.detach(), &pred)?
        - zero_unmasked_out(&teacher_logprobs.detach(), &pred)?)?;
    let adv = reverse_kl.neg()?;
    if reward_coef == 0.0 {
        return Ok(adv);
    }
    let s = scores.to_dtype(dtype)?.detach();
    let centred = s.broadcast_sub(&s.mean_all()?)?.affine(reward_coef, 0.0)?;
    Ok((adv + broadcast_to_tokens(&centred, mask)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A token the teacher likes more than the student gets a positive advantage of the
    /// log-prob gap; the task reward adds its centred value to every response token.
    #[test]
    fn advantage_is_the_negative_reverse_kl_plus_the_centred_reward() -> Result<()> {
        let dev = Device::Cpu;
        let student = Tensor::new(&[[-1f32, -2.0], [-0.5, -0.5]], &dev)?;
        let teacher = Tensor::new(&[[-0.5f32, -2.5], [-0.5, -9.0]], &dev)?;
        let mask = Tensor::new(&[[1f32, 1.0], [1.0, 0.0]], &dev)?;
        let scores = Tensor::new(&[1f32, 0.0], &dev)?;
        let a = distill_advantages(&student, &teacher, &mask, &scores, 0.0)?.to_vec2::<f32>()?;
        assert_eq!(a, vec![vec![0.5, -0.5], vec![0.0, 0.0]]);
        let a = distill_advantages(&student, &teacher, &mask, &scores, 2.0)?.to_vec2::<f32>()?;
        assert_eq!(a, vec![vec![1.5, 0.5], vec![-1.0, 0.0]]);
        Ok(())
    }
}
