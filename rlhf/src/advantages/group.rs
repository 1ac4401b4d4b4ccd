//! Group-relative advantages (GRPO, Shao et al. 2024) and the Dr. GRPO variant without the std
//! division (Liu et al. 2025). One score per sequence; it does not broadcast to tokens (see
//! [`crate::mask::broadcast_to_tokens`]).

use candle_core::Tensor;

use crate::error::{Result, RlhfError};
use crate::mask::{expect_1d, expect_float, from_host, host_f64};

/// How scores are normalised inside a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupNorm {
    /// GRPO: `(r - mean_g) / (std_g + eps)`, std with Bessel's correction (n − 1), as
    /// `torch.std` in the reference implementations. Needs a group size of at least 2.
    MeanStd,
    /// Dr. GRPO: `r - mean_g` (no std division, no length normalisation here).
    MeanOnly,
}

/// Splits `n` scores into groups of `group_size`, validating both.
pub(crate) fn check_groups(scores: &Tensor, group_size: usize, min: usize) -> Result<usize> {
    expect_float("scores", scores)?;
    let n = expect_1d("scores", scores)?;
    if group_size < min {
        return Err(RlhfError::invalid(
            "group_size",
            group_size,
            format!("must be at least {min}"),
        ));
    }
    if n % group_size != 0 {
        return Err(RlhfError::Shape {
            name: "scores".into(),
            expected: format!("[prompts * group_size] with group_size = {group_size}"),
            got: vec![n],
        });
    }
    Ok(n)
}

/// Group-relative advantages, one per sequence.
///
/// * `scores`: `[prompts * group_size]` float; rows `g*G .. (g+1)*G` are the `G = group_size`
///   completions of prompt `g`.
/// * `eps`: added to the std (not inside the sqrt); 1e-6 is the usual value.
/// * Returns `[prompts * group_size]` in `scores`' dtype, detached. Use
///   [`crate::mask::broadcast_to_tokens`] to spread it over the response tokens.
pub fn group_relative_advantages(
    scores: &Tensor,
    group_size: usize,
    norm: GroupNorm,
    eps: f64,
) -> Result<Tensor> {
    let min = match norm {
        GroupNorm::MeanStd => 2,
        GroupNorm::MeanOnly => 1,
    };
    let n = check_groups(scores, group_size, min)?;
    crate::error::check_min("eps", eps, 0.0)?;
    let r = host_f64(scores)?;
    let mut out = vec![0.0; n];
    for (group, dst) in r.chunks(group_size).zip(out.chunks_mut(group_size)) {
        let g = group.len() as f64;
        let mean = group.iter().sum::<f64>() / g;
        let scale = match norm {
            GroupNorm::MeanOnly => 1.0,
            GroupNorm::MeanStd => {
                let var = group.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (g - 1.0);
                1.0 / (var.sqrt() + eps)
            }
        };
        for (d, x) in dst.iter_mut().zip(group) {
            *d = (x - mean) * scale;
        }
    }
    from_host(out, &[n], scores.dtype(), scores)
}
