//! The policy role: the actor ([`actor`]) that owns the trainer replicas ([`replica`]) and,
//! unless the recipe places an engine role, their rollout engines ([`engine`]); its
//! updates — PPO-family steps and SFT steps ([`train`]), DPO steps ([`dpo`]).

mod actor;
mod dpo;
mod engine;
mod replica;
mod train;

pub use actor::{Policy, PolicyMsg, PolicyState};
pub use dpo::{DpoSummary, DpoWork};
pub(crate) use engine::generate;
pub use engine::{EngineReplica, ENGINE_LANE};
pub use replica::PolicyReplica;
pub use train::{PolicyTrainSummary, PolicyWork, SftStepSummary};
