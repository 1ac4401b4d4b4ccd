//! RLOO advantages (Kool et al. 2019; Ahmadian et al. 2024): each completion's baseline is the
//! mean score of the other completions of the same prompt. No normalisation, no token broadcast.

use candle_core::Tensor;

use crate::advantages::group::check_groups;
use crate::error::Result;
use crate::mask::{from_host, host_f64};

/// Leave-one-out advantages `A_i = r_i − mean_{j≠i, j in group(i)} r_j`, one per sequence.
///
/// * `scores`: `[prompts * group_size]` float; rows `g*G .. (g+1)*G` share a prompt.
/// * `group_size`: `G >= 2`.
/// * Returns `[prompts * group_size]` in `scores`' dtype, detached.
pub fn rloo_advantages(scores: &Tensor, group_size: usize) -> Result<Tensor> {
    let n = check_groups(scores, group_size, 2)?;
    let r = host_f64(scores)?;
    let mut out = vec![0.0; n];
    for (group, dst) in r.chunks(group_size).zip(out.chunks_mut(group_size)) {
        let total: f64 = group.iter().sum();
        let others = (group.len() - 1) as f64;
        for (d, x) in dst.iter_mut().zip(group) {
            *d = x - (total - x) / others;
        }
    }
    from_host(out, &[n], scores.dtype(), scores)
}
