//! Device specs from recipe / CLI strings ("cpu", "cpu:N", "cuda:N") and their candle devices.
//! This file only parses and opens devices; which role runs on which device (placement) is
//! decided elsewhere, from the [`DeviceSpec`]s parsed here.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

/// Errors from parsing a device spec or opening the device it names.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The spec is not of the form `cpu`, `cpu:N`, `cuda` or `cuda:N`.
    #[error("invalid device spec {spec:?}: expected \"cpu\", \"cpu:N\", \"cuda\" or \"cuda:N\" (N a non-negative integer)")]
    Invalid {
        /// The spec as given.
        spec: String,
    },
    /// A CUDA device was asked for, but this binary has no CUDA support compiled in.
    #[error("{spec} requested but oxalign was built without the `cuda` feature (rebuild with `--features cuda`)")]
    CudaNotCompiled {
        /// The spec as given, normalised (e.g. `cuda:0`).
        spec: String,
    },
    /// The CUDA device could not be opened (no GPU, bad ordinal, driver problem).
    #[error("cannot open {spec}: {reason}")]
    CudaUnavailable {
        /// The spec, normalised (e.g. `cuda:1`).
        spec: String,
        /// What CUDA reported.
        reason: String,
    },
}

/// The kind of device a [`DeviceSpec`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DeviceKind {
    /// The host CPU. Several `cpu:N` specs are separate data-parallel replicas that all run
    /// on the same candle [`Device::Cpu`].
    Cpu,
    /// An NVIDIA GPU, by CUDA ordinal.
    Cuda,
}

/// A parsed device spec: a kind and an index (the CPU replica number or the CUDA ordinal).
///
/// `"cpu"` is `cpu:0`, `"cuda"` is `cuda:0`. Placement code keeps the index to tell CPU
/// replicas apart even though they share one candle device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// CPU or CUDA.
    pub kind: DeviceKind,
    /// CPU replica number, or CUDA device ordinal.
    pub index: usize,
}

impl DeviceSpec {
    /// The CPU replica `index`.
    pub fn cpu(index: usize) -> Self {
        Self {
            kind: DeviceKind::Cpu,
            index,
        }
    }

    /// The CUDA device with ordinal `index`.
    pub fn cuda(index: usize) -> Self {
        Self {
            kind: DeviceKind::Cuda,
            index,
        }
    }

    /// Parses `cpu`, `cpu:N`, `cuda` or `cuda:N` (surrounding whitespace and ASCII case are
    /// ignored). Does not touch any hardware.
    pub fn parse(spec: &str) -> Result<Self, DeviceError> {
        let invalid = || DeviceError::Invalid {
            spec: spec.to_string(),
        };
        let norm = spec.trim().to_ascii_lowercase();
        let (kind, index) = match norm.split_once(':') {
            None => (norm.as_str(), None),
            Some((kind, index)) => (kind, Some(index)),
        };
        let kind = match kind {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            _ => return Err(invalid()),
        };
        let index = match index {
            None => 0,
            Some(digits) => {
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                digits.parse::<usize>().map_err(|_| invalid())?
            }
        };
        Ok(Self { kind, index })
    }

    /// Opens the candle device: [`Device::Cpu`] for any CPU replica, `Device::new_cuda(index)`
    /// for CUDA (an error when built without the `cuda` feature or when the GPU is missing).
    pub fn open(&self) -> Result<Device, DeviceError> {
        match self.kind {
            DeviceKind::Cpu => Ok(Device::Cpu),
            DeviceKind::Cuda => open_cuda(self.index),
        }
    }

    /// True for CUDA specs.
    pub fn is_cuda(&self) -> bool {
        self.kind == DeviceKind::Cuda
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => write!(f, "cpu:{}", self.index),
            DeviceKind::Cuda => write!(f, "cuda:{}", self.index),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Parses a device spec (`cpu`, `cpu:N`, `cuda`, `cuda:N`) and opens the candle device.
///
/// Every `cpu:N` maps to [`Device::Cpu`]; use [`DeviceSpec::parse`] to keep the replica index.
pub fn parse_device(spec: &str) -> Result<Device, DeviceError> {
    DeviceSpec::parse(spec)?.open()
}

/// How many CUDA devices this process sees (after `CUDA_VISIBLE_DEVICES`), as ordinals
/// `0..n`: the driver's count, 0 when the driver reports an error, and always 0 without
/// the `cuda` feature. Opens no device.
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        cudarc::driver::CudaContext::device_count()
            .map(|n| usize::try_from(n).unwrap_or(0))
            .unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(index: usize) -> Result<Device, DeviceError> {
    Device::new_cuda(index).map_err(|e| DeviceError::CudaUnavailable {
        spec: DeviceSpec::cuda(index).to_string(),
        reason: e.to_string(),
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(index: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::CudaNotCompiled {
        spec: DeviceSpec::cuda(index).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_forms() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::cpu(0));
        assert_eq!(DeviceSpec::parse("cpu:0").unwrap(), DeviceSpec::cpu(0));
        assert_eq!(DeviceSpec::parse(" CPU:3 ").unwrap(), DeviceSpec::cpu(3));
        assert_eq!(DeviceSpec::parse("cpu:12").unwrap().index, 12);
    }

    #[test]
    fn parses_cuda_forms() {
        assert_eq!(DeviceSpec::parse("cuda").unwrap(), DeviceSpec::cuda(0));
        assert_eq!(DeviceSpec::parse("cuda:1").unwrap(), DeviceSpec::cuda(1));
        assert!(DeviceSpec::parse("cuda:7").unwrap().is_cuda());
    }

    #[test]
    fn rejects_malformed_specs() {
        for bad in [
            "", "gpu", "cpu:", "cpu:-1", "cpu:x", "cuda:1:2", "cuda:+1", "cpu0", "metal:0",
            "cuda: 1",
        ] {
            let err = DeviceSpec::parse(bad).unwrap_err();
            assert!(
                matches!(err, DeviceError::Invalid { .. }),
                "{bad:?} gave {err:?}"
            );
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn display_round_trips() {
        for spec in ["cpu:0", "cpu:5", "cuda:0", "cuda:3"] {
            let parsed: DeviceSpec = spec.parse().unwrap();
            assert_eq!(parsed.to_string(), spec);
        }
    }

    #[test]
    fn cpu_specs_open_the_cpu_device() {
        assert!(matches!(parse_device("cpu").unwrap(), Device::Cpu));
        assert!(matches!(parse_device("cpu:2").unwrap(), Device::Cpu));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_feature_is_a_clear_error() {
        let err = parse_device("cuda:0").unwrap_err();
        assert!(matches!(err, DeviceError::CudaNotCompiled { .. }));
        assert_eq!(
            err.to_string(),
            "cuda:0 requested but oxalign was built without the `cuda` feature (rebuild with `--features cuda`)"
        );
        let err = parse_device("cuda").unwrap_err();
        assert!(err.to_string().starts_with("cuda:0 requested"), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_no_cuda_device_is_seen() {
        assert_eq!(cuda_device_count(), 0);
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_with_feature_opens_or_explains() {
        match parse_device("cuda:0") {
            Ok(dev) => assert!(dev.is_cuda()),
            Err(err) => {
                assert!(matches!(err, DeviceError::CudaUnavailable { .. }));
                assert!(err.to_string().starts_with("cannot open cuda:0: "), "{err}");
                eprintln!("no usable CUDA device: {err}");
            }
        }
        // An absurd ordinal never opens.
        let err = parse_device("cuda:4096").unwrap_err();
        assert!(err.to_string().contains("cuda:4096"), "{err}");
        // The count names exactly the ordinals that open.
        let n = cuda_device_count();
        assert!(
            parse_device(&format!("cuda:{n}")).is_err(),
            "cuda:{n} is past the count"
        );
        if n > 0 {
            assert!(
                parse_device(&format!("cuda:{}", n - 1)).is_ok(),
                "{n} devices"
            );
        }
    }
}
