//! The collective group of a role's device group, chosen by its devices: CUDA devices get an
//! NCCL group (`NcclCollective`, feature `cuda`), anything else the in-process CPU group
//! (`ThreadCollective`). An NCCL group needs a unique id from its owner: the controller, which
//! makes it when the role lives in its process, and hands it over in the spawn request when
//! the role lives on a worker ([`GroupSettings::handed`]). This file builds groups; it runs no
//! collective.

use crate::error::Cause;
use oxalign_kernels::collective::{Collective, NcclUniqueId, ThreadCollective, DEFAULT_TIMEOUT};
use oxalign_kernels::device::DeviceSpec;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a process builds collective groups: the time limit of every collective call, and the
/// NCCL ids the controller handed to this process (used in order, one per NCCL group; when
/// none is left, the process makes its own, being the group's owner).
#[derive(Clone)]
pub struct GroupSettings {
    timeout: Duration,
    handed: Arc<Mutex<VecDeque<NcclUniqueId>>>,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            handed: Arc::default(),
        }
    }
}

impl GroupSettings {
    /// Settings that use `ids` (from the controller) for the first NCCL groups built.
    pub fn handed(ids: Vec<NcclUniqueId>) -> Self {
        Self {
            handed: Arc::new(Mutex::new(ids.into())),
            ..Self::default()
        }
    }

    /// The same settings with collective calls failing after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The time limit of one collective call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The next handed id, if any is left.
    fn take_handed(&self) -> Option<NcclUniqueId> {
        self.handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

/// True when the group of `specs` is served by NCCL: several devices, all CUDA.
pub(crate) fn uses_nccl(specs: &[DeviceSpec]) -> bool {
    specs.len() > 1 && specs.iter().all(DeviceSpec::is_cuda)
}

/// The ids the controller hands to a role built elsewhere on `specs` that builds `groups`
/// collective groups: fresh NCCL ids when the group is NCCL's, else none.
pub(crate) fn ids_for(specs: &[DeviceSpec], groups: usize) -> Result<Vec<NcclUniqueId>, Cause> {
    if !uses_nccl(specs) {
        return Ok(Vec::new());
    }
    (0..groups).map(|_| new_id()).collect()
}

/// A fresh collective group over `specs` (one handle per device, rank order).
pub fn collective_group(
    specs: &[DeviceSpec],
    settings: &GroupSettings,
) -> Result<Vec<Arc<dyn Collective>>, Cause> {
    if uses_nccl(specs) {
        let id = match settings.take_handed() {
            Some(id) => id,
            None => new_id()?,
        };
        return nccl_group(id, specs, settings.timeout);
    }
    Ok(
        ThreadCollective::group_with_timeout(specs.len(), settings.timeout)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Collective>)
            .collect(),
    )
}

#[cfg(feature = "cuda")]
fn new_id() -> Result<NcclUniqueId, Cause> {
    Ok(NcclUniqueId::generate()?)
}

#[cfg(feature = "cuda")]
fn nccl_group(
    id: NcclUniqueId,
    specs: &[DeviceSpec],
    timeout: Duration,
) -> Result<Vec<Arc<dyn Collective>>, Cause> {
    let ordinals: Vec<usize> = specs.iter().map(|s| s.index).collect();
    let group = oxalign_kernels::collective::NcclGroup::create(id, &ordinals, timeout)?;
    Ok(group
        .into_iter()
        .map(|c| Arc::new(c) as Arc<dyn Collective>)
        .collect())
}

#[cfg(not(feature = "cuda"))]
fn new_id() -> Result<NcclUniqueId, Cause> {
    Err(not_compiled())
}

#[cfg(not(feature = "cuda"))]
fn nccl_group(
    _id: NcclUniqueId,
    _specs: &[DeviceSpec],
    _timeout: Duration,
) -> Result<Vec<Arc<dyn Collective>>, Cause> {
    Err(not_compiled())
}

#[cfg(not(feature = "cuda"))]
fn not_compiled() -> Cause {
    Cause::Unsupported(crate::error::Unsupported::Nccl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_groups_are_thread_groups_and_need_no_id() {
        let specs = [DeviceSpec::cpu(0), DeviceSpec::cpu(1)];
        assert!(!uses_nccl(&specs));
        assert!(ids_for(&specs, 2).unwrap().is_empty());
        let g = collective_group(&specs, &GroupSettings::default()).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!((g[1].rank(), g[1].world_size()), (1, 2));
    }

    #[test]
    fn only_several_cuda_devices_use_nccl() {
        assert!(uses_nccl(&[DeviceSpec::cuda(0), DeviceSpec::cuda(1)]));
        assert!(!uses_nccl(&[DeviceSpec::cuda(0)]));
        assert!(!uses_nccl(&[DeviceSpec::cuda(0), DeviceSpec::cpu(0)]));
    }

    #[test]
    fn handed_ids_are_used_in_order() {
        let ids = [1u8, 2].map(|b| NcclUniqueId::from_bytes([b; 128]));
        let s = GroupSettings::handed(ids.to_vec());
        assert_eq!(s.take_handed(), Some(ids[0]));
        assert_eq!(s.clone().take_handed(), Some(ids[1]));
        assert_eq!(s.take_handed(), None);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cuda_group_without_the_feature_is_a_clear_error() {
        let specs = [DeviceSpec::cuda(0), DeviceSpec::cuda(1)];
        let e = collective_group(&specs, &GroupSettings::default())
            .err()
            .unwrap();
        assert!(
            e.is_bad_input() && e.to_string().contains("--features cuda"),
            "{e}"
        );
    }
}
