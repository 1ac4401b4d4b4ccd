//! A model's description: `config.json` read and checked ([`model_config`], [`json`],
//! [`bounds`]), the families that declare their keys and parameters ([`family`]), the
//! parameter layout and named sizes.

pub mod bounds;
mod derived;
pub mod family;
pub(crate) mod json;
pub mod layout;
pub mod model_config;
pub mod param_spec;
pub mod preset;
pub(crate) mod raw;
mod validate;
