//! oxalign-actors: the role actors (policy, reference, reward, critic), the controller that
//! runs the training loop, placement of roles on device groups, recipes, and the monitor.
//! Actors are thin async facades: tensor math lives in `oxalign-rlhf` and `oxalign-models`.

pub mod batch;
pub mod cluster;
pub(crate) mod collective_groups;
pub mod controller;
pub mod environment;
pub mod error;
pub mod executor;
pub mod faults;
pub mod monitor;
pub mod placement;
pub mod recipe;
pub mod replicas;
pub mod roles;
pub(crate) mod service;
