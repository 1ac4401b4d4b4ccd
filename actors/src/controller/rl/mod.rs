//! The RL phase of a run, one folder read top to bottom: [`run_loop`] runs steps to
//! `run.steps` under supervision; [`step`] is one step's spine, calling the stages in order —
//! [`rollout`] (or a batch generated [`ahead`]), [`score`], [`experience`], [`update`],
//! [`refit`], [`report`]. The stages read their settings from [`loss_config`], [`shaping`]
//! and [`seeds`]; none imports another stage.

pub(crate) mod ahead;
pub(crate) mod experience;
pub(crate) mod loss_config;
pub(crate) mod refit;
pub(crate) mod report;
pub(crate) mod rollout;
pub(crate) mod run_loop;
pub(crate) mod score;
pub(crate) mod seeds;
pub(crate) mod shaping;
pub(crate) mod step;
pub(crate) mod update;
