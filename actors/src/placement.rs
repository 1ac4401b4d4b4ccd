//! Placement: the device group each role runs on, parsed from the recipe's `[placement]`.
//!
//! A group is a comma-separated list of device specs (`"cpu"`, `"cpu:0,cpu:1"`, `"cuda:0"`).
//! With N devices a role runs N data-parallel replicas. This file only parses and opens
//! devices; it does not start anything.

use candle_core::Device;
use oxalign_kernels::device::{DeviceError, DeviceSpec};

/// The devices one role owns, in replica order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceGroup {
    /// One spec per data-parallel replica.
    pub specs: Vec<DeviceSpec>,
}

/// Why a placement string is unusable.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// A spec in the list is malformed or its device cannot be opened.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The list is empty or names one device twice.
    #[error("{0}")]
    Group(String),
}

impl DeviceGroup {
    /// Parses `"cpu:0,cpu:1"`, checks for duplicates, and opens each CUDA device once to
    /// make sure it exists (so `cuda:0` on a machine without CUDA fails before the run).
    pub fn parse(spec: &str) -> Result<Self, PlacementError> {
        let mut specs = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let s = DeviceSpec::parse(part)?;
            if specs.contains(&s) {
                return Err(PlacementError::Group(format!(
                    "{spec:?} names {part} twice: expected each device once"
                )));
            }
            if s.is_cuda() {
                s.open()?;
            }
            specs.push(s);
        }
        if specs.is_empty() {
            return Err(PlacementError::Group(
                "empty device group: expected e.g. \"cpu\" or \"cpu:0,cpu:1\"".into(),
            ));
        }
        Ok(Self { specs })
    }

    /// Number of data-parallel replicas.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Always false for a parsed group.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Opens every device in replica order.
    pub fn devices(&self) -> Result<Vec<Device>, DeviceError> {
        self.specs.iter().map(|s| s.open()).collect()
    }

    /// Human-readable names, e.g. `["cpu:0", "cpu:1"]`.
    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.to_string()).collect()
    }
}
