//! What a worker offers a role: its devices and the ones the roles it hosts already hold
//! ([`Inventory`], the answer to `Request::Inventory`), and the worker's register of those
//! holds ([`Holdings`]). The controller reads an inventory before it moves a role to a spare
//! node (`spare_fit.rs` decides); this file only reports, it refuses nothing.
//!
//! The devices are `cpu:0`, then `cuda:0..N` for the GPUs the worker's process sees (counted
//! by `oxalign_kernels::device::cuda_device_count`; none without the `cuda` feature). A role
//! holds its device group from its spawn until it is stopped (released before the `Stop` is
//! answered) or its connection ends.

use oxalign_kernels::device::{cuda_device_count, DeviceSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A worker's devices and the devices its hosted roles hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The devices the worker can give a role: `cpu:0` (every `cpu:N` replica runs on the
    /// one host CPU), then `cuda:0..n` for the GPUs its process sees.
    pub devices: Vec<DeviceSpec>,
    /// Each device a role hosted there holds, in the order the roles were built.
    pub held: Vec<Held>,
}

/// One device held by a hosted role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The role (`policy`, `reference`, ...).
    pub role: String,
    /// The device.
    pub device: DeviceSpec,
}

/// The devices of this machine as a worker offers them: `cpu:0` and each CUDA ordinal the
/// process sees (none without the `cuda` feature).
pub(crate) fn local_devices() -> Vec<DeviceSpec> {
    std::iter::once(DeviceSpec::cpu(0))
        .chain((0..cuda_device_count()).map(DeviceSpec::cuda))
        .collect()
}

/// A worker's register of what its hosted roles hold, shared by its connections.
#[derive(Debug, Clone)]
pub(crate) struct Holdings {
    devices: Vec<DeviceSpec>,
    held: Arc<Mutex<Register>>,
}

#[derive(Debug, Default)]
struct Register {
    next: u64,
    by_role: BTreeMap<u64, (String, Vec<DeviceSpec>)>,
}

/// A role's hold on its devices; dropping it releases them.
#[derive(Debug)]
pub(crate) struct Hold {
    key: u64,
    held: Arc<Mutex<Register>>,
}

impl Holdings {
    /// A register for a worker whose devices are `devices`, holding nothing yet.
    pub fn new(devices: Vec<DeviceSpec>) -> Self {
        Self {
            devices,
            held: Arc::default(),
        }
    }

    /// Records that `role` holds `devices` until the returned [`Hold`] is dropped.
    pub fn hold(&self, role: &str, devices: &[DeviceSpec]) -> Hold {
        let mut r = self.held.lock().unwrap();
        let key = r.next;
        r.next += 1;
        r.by_role.insert(key, (role.to_string(), devices.to_vec()));
        Hold {
            key,
            held: self.held.clone(),
        }
    }

    /// The devices and what is held now.
    pub fn inventory(&self) -> Inventory {
        let r = self.held.lock().unwrap();
        let held = r
            .by_role
            .values()
            .flat_map(|(role, devices)| {
                devices.iter().map(|d| Held {
                    role: role.clone(),
                    device: *d,
                })
            })
            .collect();
        Inventory {
            devices: self.devices.clone(),
            held,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut r) = self.held.lock() {
            r.by_role.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_reported_until_it_is_dropped() {
        let h = Holdings::new(vec![DeviceSpec::cpu(0), DeviceSpec::cuda(0)]);
        assert!(h.inventory().held.is_empty());
        let policy = h.hold("policy", &[DeviceSpec::cuda(0)]);
        let reward = h.hold("reward", &[DeviceSpec::cpu(0), DeviceSpec::cpu(1)]);
        let inv = h.inventory();
        assert_eq!(inv.devices, vec![DeviceSpec::cpu(0), DeviceSpec::cuda(0)]);
        let held: Vec<(&str, String)> = inv
            .held
            .iter()
            .map(|x| (x.role.as_str(), x.device.to_string()))
            .collect();
        assert_eq!(
            held,
            [
                ("policy", "cuda:0".to_string()),
                ("reward", "cpu:0".to_string()),
                ("reward", "cpu:1".to_string())
            ]
        );
        drop(policy);
        let inv = h.inventory();
        assert!(inv.held.iter().all(|x| x.role == "reward"), "{inv:?}");
        drop(reward);
        assert!(h.inventory().held.is_empty());
    }

    #[test]
    fn this_machine_always_offers_its_cpu_first() {
        let d = local_devices();
        assert_eq!(d[0], DeviceSpec::cpu(0));
        assert!(d[1..].iter().all(DeviceSpec::is_cuda), "{d:?}");
        assert_eq!(d.len(), 1 + cuda_device_count());
    }
}
