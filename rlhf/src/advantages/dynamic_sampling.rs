//! DAPO's dynamic sampling (Yu et al. 2025, §3.2): a group whose samples all got the same score
//! has zero group-relative advantage and teaches nothing, so it is dropped, and more prompts
//! are drawn until the batch holds the wanted number of informative groups. This file decides
//! which groups a step trains on; drawing and generating are the caller's.

use crate::error::{Result, RlhfError};

/// Per group of `group_size` consecutive `scores`, whether its scores differ (it has signal).
///
/// * `scores`: one score per sample, `[groups × group_size]`, groups consecutive.
/// * Errors when `group_size` is 0 or does not divide the number of scores.
pub fn informative_groups(scores: &[f32], group_size: usize) -> Result<Vec<bool>> {
    if group_size == 0 || !scores.len().is_multiple_of(group_size) {
        return Err(RlhfError::invalid(
            "group_size",
            group_size,
            format!("must be > 0 and divide the {} scores", scores.len()),
        ));
    }
    Ok(scores
        .chunks(group_size)
        .map(|g| g.iter().any(|&s| s != g[0]))
        .collect())
}

/// The groups a step trains on, drawn over one or more generation rounds.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct GroupSelection {
    /// `(round, group within the round)` of each kept group, in draw order: the first
    /// `target` informative groups, then, when the rounds ran out, the earliest uninformative
    /// ones so the batch is full.
    pub kept: Vec<(usize, usize)>,
    /// Uninformative groups drawn and not trained on.
    pub dropped: usize,
    /// Uninformative groups trained on because the round cap was hit.
    pub filled: usize,
    /// Informative groups drawn beyond `target` (discarded, as in DAPO).
    pub surplus: usize,
}

/// Chooses `target` groups from the rounds' informativeness flags (`rounds[r][g]` for group
/// `g` of round `r`, as [`informative_groups`] returns them): informative groups first, in
/// draw order; short of `target`, the batch is filled with the earliest uninformative groups.
/// With fewer than `target` groups in all, every group is kept.
pub fn select_groups(rounds: &[Vec<bool>], target: usize) -> GroupSelection {
    let all = || {
        rounds
            .iter()
            .enumerate()
            .flat_map(|(r, g)| g.iter().enumerate().map(move |(i, &ok)| ((r, i), ok)))
    };
    let informative: Vec<_> = all().filter(|(_, ok)| *ok).map(|(at, _)| at).collect();
    let uninformative: Vec<_> = all().filter(|(_, ok)| !*ok).map(|(at, _)| at).collect();
    let n_inf = informative.len().min(target);
    let filled = (target - n_inf).min(uninformative.len());
    let mut kept: Vec<_> = informative[..n_inf]
        .iter()
        .chain(&uninformative[..filled])
        .copied()
        .collect();
    kept.sort_unstable();
    GroupSelection {
        kept,
        dropped: uninformative.len() - filled,
        filled,
        surplus: informative.len() - n_inf,
    }
}

/// How many informative groups the rounds so far hold: drawing stops once it reaches the
/// target.
pub fn informative_count(rounds: &[Vec<bool>]) -> usize {
    rounds.iter().flatten().filter(|&&ok| ok).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_scores_are_dropped_and_a_short_batch_is_filled() -> Result<()> {
        let flags = informative_groups(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2)?;
        assert_eq!(flags, vec![false, true, false]);
        assert!(informative_groups(&[1.0; 3], 2).is_err());
        // Two rounds of three groups, target 3: the 3 informative ones are kept.
        let rounds = vec![flags.clone(), vec![true, true, false]];
        let s = select_groups(&rounds, 3);
        assert_eq!(s.kept, vec![(0, 1), (1, 0), (1, 1)]);
        assert_eq!((s.dropped, s.filled, s.surplus), (3, 0, 0));
        // One round only: one informative, the two earliest uninformative fill the batch.
        let s = select_groups(&rounds[..1], 3);
        assert_eq!(s.kept, vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!((s.dropped, s.filled), (0, 2));
        // Target 1 over both rounds: the surplus informative groups are discarded.
        let s = select_groups(&rounds, 1);
        assert_eq!((s.kept.clone(), s.surplus, s.dropped), (vec![(0, 1)], 2, 3));
        Ok(())
    }
}
