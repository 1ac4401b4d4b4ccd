//! Placement: the device group each role runs on, parsed from the recipe's `[placement]`.
//!
//! A group is a comma-separated list of device specs (`"cpu"`, `"cpu:0,cpu:1"`, `"cuda:0"`)
//! and ranges of them (`"cuda:0-3"`).
//! With N devices a role runs N data-parallel replicas. This file only parses and opens
//! devices; it does not start anything.
//!
//! A role may also name a node of the recipe's `[cluster]` before its devices
//! (`"node1:cpu"`, `"node2:cuda:0,cuda:1"`): [`RolePlacement::parse`] splits the two, and the
//! device group is then opened by the worker on that node, not here.

use candle_core::Device;
use oxalign_kernels::device::{DeviceError, DeviceSpec};

/// The devices one role owns, in replica order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceGroup {
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
        let group = Self::parse_unopened(spec)?;
        for s in group.specs.iter().filter(|s| s.is_cuda()) {
            s.open()?;
        }
        Ok(group)
    }

    /// [`DeviceGroup::parse`] without opening anything: for devices on another node,
    /// which this process may not have.
    pub fn parse_unopened(spec: &str) -> Result<Self, PlacementError> {
        let mut specs: Vec<DeviceSpec> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            for s in expand_range(part)? {
                if specs.contains(&s) {
                    return Err(PlacementError::Group(format!(
                        "{spec:?} names {s} twice: expected each device once"
                    )));
                }
                specs.push(s);
            }
        }
        if specs.is_empty() {
            return Err(PlacementError::Group(
                "empty device group: expected e.g. \"cpu\" or \"cpu:0,cpu:1\"".into(),
            ));
        }
        Ok(Self { specs })
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

/// One spec of a group, or a range of them: `"cuda:0-3"` is `cuda:0` to `cuda:3`.
fn expand_range(part: &str) -> Result<Vec<DeviceSpec>, PlacementError> {
    let Some((kind, range)) = part.split_once(':') else {
        return Ok(vec![DeviceSpec::parse(part)?]);
    };
    let Some((lo, hi)) = range.split_once('-') else {
        return Ok(vec![DeviceSpec::parse(part)?]);
    };
    let first = DeviceSpec::parse(&format!("{kind}:{lo}"))?;
    let last = DeviceSpec::parse(&format!("{kind}:{hi}"))?;
    if last.index < first.index {
        return Err(PlacementError::Group(format!(
            "{part:?}: expected a range low-high with low <= high, e.g. \"cuda:0-3\""
        )));
    }
    Ok((first.index..=last.index)
        .map(|index| DeviceSpec { index, ..first })
        .collect())
}

/// A role's placement string split into the node/// A role's placement string split into the node that hosts it (a key of
/// `[cluster] nodes`, or `None` for this process) and the device group there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RolePlacement<'a> {
    /// The node, when the string starts with a name that is not a device kind.
    pub node: Option<&'a str>,
    /// The device group on that node (`"cpu"`, `"cuda:0,cuda:1"`).
    pub devices: &'a str,
}

impl<'a> RolePlacement<'a> {
    /// Splits `"node1:cpu"` into node `node1` and devices `cpu`; `"cpu:0,cpu:1"` and
    /// `"cuda:0"` have no node. Only the split: the devices are checked by
    /// [`DeviceGroup::parse`] and the node against `[cluster]` by the recipe check.
    pub fn parse(spec: &'a str) -> Self {
        let spec = spec.trim();
        match spec.split_once(':') {
            Some((head, rest)) if !is_device_kind(head) => Self {
                node: Some(head.trim()),
                devices: rest.trim(),
            },
            _ => Self {
                node: None,
                devices: spec,
            },
        }
    }

    /// The device group: opened here when the role runs in this process
    /// ([`DeviceGroup::parse`]), only parsed when a node hosts it
    /// ([`DeviceGroup::parse_unopened`]: this process, e.g. a controller on a login node,
    /// need not have that node's GPUs; the worker opens them).
    pub fn device_group(&self) -> Result<DeviceGroup, PlacementError> {
        match self.node {
            Some(_) => DeviceGroup::parse_unopened(self.devices),
            None => DeviceGroup::parse(self.devices),
        }
    }
}

/// True for the device kinds a spec may start with (`cpu`, `cuda`).
fn is_device_kind(word: &str) -> bool {
    matches!(word.trim().to_ascii_lowercase().as_str(), "cpu" | "cuda")
}

#[cfg(test)]
mod role_placement_tests {
    use super::RolePlacement;

    #[test]
    fn a_node_name_comes_before_the_devices() {
        let p = RolePlacement::parse("node1:cpu");
        assert_eq!((p.node, p.devices), (Some("node1"), "cpu"));
        let p = RolePlacement::parse("gpu-box:cuda:0,cuda:1");
        assert_eq!((p.node, p.devices), (Some("gpu-box"), "cuda:0,cuda:1"));
        let p = RolePlacement::parse("cpu:0,cpu:1");
        assert_eq!((p.node, p.devices), (None, "cpu:0,cpu:1"));
        let p = RolePlacement::parse("CUDA:0");
        assert_eq!((p.node, p.devices), (None, "CUDA:0"));
    }
}

#[cfg(test)]
mod device_group_tests {
    use super::DeviceGroup;
    use oxalign_kernels::device::DeviceSpec;

    #[test]
    fn a_group_on_another_node_is_parsed_without_opening_it() {
        let g = DeviceGroup::parse_unopened("cuda:0, cuda:3").unwrap();
        assert_eq!(g.specs, [DeviceSpec::cuda(0), DeviceSpec::cuda(3)]);
        let twice = DeviceGroup::parse_unopened("cuda:1,cuda:1").unwrap_err();
        assert!(twice.to_string().contains("names cuda:1 twice"), "{twice}");
        assert!(DeviceGroup::parse_unopened(" , ").is_err());
        assert!(DeviceGroup::parse_unopened("gpu:0").is_err());
    }

    #[test]
    fn a_range_names_every_device_in_it() {
        let g = DeviceGroup::parse_unopened("cuda:0-3").unwrap();
        assert_eq!(g.specs, (0..4).map(DeviceSpec::cuda).collect::<Vec<_>>());
        let g = DeviceGroup::parse_unopened("cpu:0-1, cpu:5").unwrap();
        assert_eq!(g.specs.len(), 3);
        let e = DeviceGroup::parse_unopened("cuda:0-2,cuda:2").unwrap_err();
        assert!(e.to_string().contains("names cuda:2 twice"), "{e}");
        let e = DeviceGroup::parse_unopened("cuda:3-1").unwrap_err();
        assert!(e.to_string().contains("low <= high"), "{e}");
        assert!(DeviceGroup::parse_unopened("cuda:0-").is_err());
        assert!(DeviceGroup::parse_unopened("cuda:a-2").is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_group_here_opens_its_gpus() {
        let e = DeviceGroup::parse("cpu,cuda:0").unwrap_err();
        assert!(e.to_string().contains("without the `cuda` feature"), "{e}");
        assert_eq!(DeviceGroup::parse("cpu:0,cpu:1").unwrap().specs.len(), 2);
    }
}
