//! Whether a spare node can take over a role ([`fit`]): the spare's [`Inventory`] must have
//! every device the role's placement names, and none of those GPUs may be held by a role
//! the spare already hosts. CPU replicas (`cpu:N`) all run on the host CPU, which any
//! number of roles share, so a spare with a CPU fits any CPU placement. Pure: the inventory
//! comes from the worker (`Request::Inventory`); connecting is `remote.rs`'s.

use super::error::Unfit;
use super::inventory::Inventory;

use oxalign_kernels::device::{DeviceKind, DeviceSpec};

/// `Ok` when a worker with `inventory` can host a role on `wanted` (the placement's devices
/// on the node, e.g. `cuda:0,cuda:1`); else what it lacks, or which wanted GPUs are held.
pub fn fit(wanted: &[DeviceSpec], inventory: &Inventory) -> Result<(), Unfit> {
    let has_cpu = inventory.devices.iter().any(|d| d.kind == DeviceKind::Cpu);
    let missing: Vec<DeviceSpec> = wanted
        .iter()
        .filter(|w| match w.kind {
            DeviceKind::Cpu => !has_cpu,
            DeviceKind::Cuda => !inventory.devices.contains(w),
        })
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(Unfit::Lacks {
            wanted: wanted.to_vec(),
            missing,
            has: inventory.devices.clone(),
        });
    }
    let taken: Vec<DeviceSpec> = wanted
        .iter()
        .filter(|w| w.is_cuda() && inventory.held.iter().any(|h| h.device == **w))
        .copied()
        .collect();
    if !taken.is_empty() {
        return Err(Unfit::Held {
            wanted: wanted.to_vec(),
            taken,
            held: inventory.held.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::error::PassedOver;
    use crate::cluster::inventory::Held;

    fn cpu(i: usize) -> DeviceSpec {
        DeviceSpec::cpu(i)
    }

    fn gpu(i: usize) -> DeviceSpec {
        DeviceSpec::cuda(i)
    }

    fn held(role: &str, device: DeviceSpec) -> Held {
        Held {
            role: role.into(),
            device,
        }
    }

    fn inventory(devices: &[DeviceSpec], held: &[Held]) -> Inventory {
        Inventory {
            devices: devices.to_vec(),
            held: held.to_vec(),
        }
    }

    #[test]
    fn cpu_roles_fit_any_spare_with_a_cpu_however_many_share_it() {
        let busy = inventory(
            &[cpu(0)],
            &[held("reference", cpu(0)), held("reward", cpu(0))],
        );
        assert!(fit(&[cpu(0)], &busy).is_ok());
        // Replicas cpu:N all run on the one host CPU.
        assert!(fit(&[cpu(0), cpu(1), cpu(2)], &busy).is_ok());
        let gpus = inventory(&[cpu(0), gpu(0)], &[held("policy", gpu(0))]);
        assert!(fit(&[cpu(0)], &gpus).is_ok());
    }

    #[test]
    fn a_spare_without_the_gpus_is_refused_naming_them() {
        let cpu_only = inventory(&[cpu(0)], &[]);
        let e = fit(&[gpu(0)], &cpu_only).unwrap_err();
        assert!(
            matches!(&e, Unfit::Lacks { missing, .. } if *missing == [gpu(0)]),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "lacks cuda:0 (wants cuda:0; has cpu:0)");
        // node1:cuda:0-3 on a spare with two GPUs.
        let two = inventory(&[cpu(0), gpu(0), gpu(1)], &[]);
        let want = [gpu(0), gpu(1), gpu(2), gpu(3)];
        let e = fit(&want, &two).unwrap_err();
        assert_eq!(
            e.to_string(),
            "lacks cuda:2, cuda:3 (wants cuda:0, cuda:1, cuda:2, cuda:3; has cpu:0, cuda:0, cuda:1)"
        );
        // Ordinals are compared, not counts: cuda:1 alone needs the second GPU.
        assert!(fit(&[gpu(1)], &inventory(&[cpu(0), gpu(0)], &[])).is_err());
        assert!(fit(
            &want,
            &inventory(&[cpu(0), gpu(0), gpu(1), gpu(2), gpu(3)], &[])
        )
        .is_ok());
    }

    #[test]
    fn a_gpu_held_by_a_hosted_role_is_refused_naming_the_holder() {
        let spare = inventory(
            &[cpu(0), gpu(0), gpu(1)],
            &[held("reference", gpu(1)), held("reward", cpu(0))],
        );
        let e = fit(&[gpu(0), gpu(1)], &spare).unwrap_err();
        assert!(
            matches!(&e, Unfit::Held { taken, .. } if *taken == [gpu(1)]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "cuda:1 already held (wants cuda:0, cuda:1; holds cuda:1 for the reference, cpu:0 \
             for the reward)"
        );
        // The free GPU alone fits.
        assert!(fit(&[gpu(0)], &spare).is_ok());
        // A CPU and a GPU: only the GPU's hold counts.
        assert!(fit(&[cpu(0), gpu(0)], &spare).is_ok());
        assert!(fit(&[cpu(0), gpu(1)], &spare).is_err());
    }

    #[test]
    fn missing_devices_are_reported_before_held_ones() {
        let spare = inventory(&[cpu(0), gpu(0)], &[held("critic", gpu(0))]);
        let e = fit(&[gpu(0), gpu(1)], &spare).unwrap_err();
        assert!(
            matches!(&e, Unfit::Lacks { missing, .. } if *missing == [gpu(1)]),
            "{e:?}"
        );
    }

    #[test]
    fn a_worker_reporting_no_cpu_lacks_it() {
        let e = fit(&[cpu(0)], &inventory(&[gpu(0)], &[])).unwrap_err();
        assert_eq!(e.to_string(), "lacks cpu:0 (wants cpu:0; has cuda:0)");
        let e = fit(&[cpu(0)], &inventory(&[], &[])).unwrap_err();
        assert_eq!(e.to_string(), "lacks cpu:0 (wants cpu:0; has none)");
    }

    #[test]
    fn a_passed_over_spare_is_named_with_its_reason() {
        let why = fit(&[gpu(0)], &inventory(&[cpu(0)], &[])).unwrap_err();
        let p = PassedOver {
            spare: "node3".into(),
            why,
        };
        assert_eq!(
            p.to_string(),
            "spare node3: lacks cuda:0 (wants cuda:0; has cpu:0)"
        );
        let silent = PassedOver {
            spare: "node4".into(),
            why: Unfit::Silent { seconds: 60.0 },
        };
        assert_eq!(
            silent.to_string(),
            "spare node4: no answer to the inventory request within 60 s"
        );
    }
}
