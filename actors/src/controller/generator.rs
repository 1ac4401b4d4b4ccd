//! [`Generator`]: who completes rollout requests in a run — the engine role when the recipe
//! places one (`placement.engine`), else the policy, whose engine lives with its trainers.
//! The stages, the evaluations and the generation ahead ask it, never a role by name.

use crate::batch::{RolloutBatch, RolloutRequest};
use crate::error::RoleError;
use crate::roles::{EngineRole, Generate, PolicyRole};
use async_trait::async_trait;

/// The role that generates, borrowed from the run's roles.
#[derive(Clone, Copy)]
pub(crate) struct Generator<'a> {
    policy: &'a dyn PolicyRole,
    engine: Option<&'a dyn EngineRole>,
}

impl<'a> Generator<'a> {
    /// `engine` when there is one, else `policy`.
    pub fn new(policy: &'a dyn PolicyRole, engine: Option<&'a dyn EngineRole>) -> Self {
        Self { policy, engine }
    }

    /// The name its work is timed under (`engine` or `policy`).
    pub fn actor(&self) -> &'static str {
        match self.engine {
            Some(_) => crate::roles::ENGINE_ROLE,
            None => "policy",
        }
    }
}

#[async_trait]
impl Generate for Generator<'_> {
    async fn generate(
        &self,
        request: RolloutRequest,
        label: String,
    ) -> Result<RolloutBatch, RoleError> {
        match self.engine {
            Some(e) => e.generate(request, label).await,
            None => self.policy.generate(request, label).await,
        }
    }
}
