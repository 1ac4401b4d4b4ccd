//! Joining the replicas' per-row answers (log-probs, values) back into one array in request
//! order. Shared by the policy, reference and critic.

use crate::batch::TokenArray;
use crate::error::RoleError;

/// Joins per-replica `[b_i, T-1]` results of `phase` along rows (skipping empty shards).
pub(crate) fn concat_rows(
    role: &str,
    phase: &'static str,
    parts: Vec<Option<TokenArray>>,
) -> Result<TokenArray, RoleError> {
    let parts: Vec<TokenArray> = parts.into_iter().flatten().collect();
    TokenArray::concat_rows(parts).map_err(|e| RoleError::new(role, phase, e))
}
