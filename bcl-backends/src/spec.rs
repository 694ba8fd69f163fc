//! Device specifications as users write them: `cpu`, `sim`, `sim:copy=8:reduce=4` (GB/s),
//! `cuda:N` (the N-th CUDA device of the host; `cuda` alone is `cuda:0`), `plugin:N` (device N
//! of the device plugin `BCL_DEVICE_PLUGIN` names; `plugin` alone is `plugin:0`).

use crate::accelerator::{Accelerator, DeviceError};
use crate::cpu::CpuDevice;
use crate::sim::{SimConfig, SimDevice};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Which backend a rank uses, and its settings.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DeviceSpec {
    Cpu,
    Sim(SimConfig),
    /// A CUDA device by its ordinal. Parsed in every build; opened only by builds with the
    /// `cuda` feature (others answer "unavailable").
    Cuda(u32),
    /// A device of the vendor's device plugin ([`DeviceOptions::plugin`]), by its index.
    Plugin(u32),
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;
    fn from_str(text: &str) -> Result<Self, DeviceError> {
        let bad = |reason: String| DeviceError::BadSpec {
            spec: text.to_string(),
            reason,
        };
        let mut parts = text.trim().split(':');
        match parts.next().unwrap_or_default() {
            "cpu" => match parts.next() {
                None => Ok(DeviceSpec::Cpu),
                Some(p) => Err(bad(format!("cpu takes no settings, got '{p}'"))),
            },
            "sim" => {
                let mut config = SimConfig::default();
                for part in parts {
                    let (key, value) = part
                        .split_once('=')
                        .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
                    let gbps: f64 = value
                        .parse()
                        .ok()
                        .filter(|v: &f64| v.is_finite() && *v > 0.0)
                        .ok_or_else(|| bad(format!("'{value}' is not a positive GB/s figure")))?;
                    match key {
                        "copy" => config.copy_gbps = Some(gbps),
                        "reduce" => config.reduce_gbps = Some(gbps),
                        other => {
                            return Err(bad(format!(
                                "unknown sim setting '{other}' (copy, reduce)"
                            )));
                        }
                    }
                }
                Ok(DeviceSpec::Sim(config))
            }
            backend @ ("cuda" | "plugin") => {
                let index = match parts.next() {
                    None => 0,
                    Some(n) => n.parse().map_err(|_| {
                        bad(format!(
                            "'{n}' is not a device number ({backend}:0, {backend}:1, ...)"
                        ))
                    })?,
                };
                match (parts.next(), backend) {
                    (None, "cuda") => Ok(DeviceSpec::Cuda(index)),
                    (None, _) => Ok(DeviceSpec::Plugin(index)),
                    (Some(p), _) => Err(bad(format!(
                        "{backend} takes a device number only, got '{p}'"
                    ))),
                }
            }
            other => Err(bad(format!(
                "unknown backend '{other}' (cpu, sim, cuda, plugin)"
            ))),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Sim(c) => {
                f.write_str("sim")?;
                if let Some(g) = c.copy_gbps {
                    write!(f, ":copy={g}")?;
                }
                if let Some(g) = c.reduce_gbps {
                    write!(f, ":reduce={g}")?;
                }
                Ok(())
            }
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Plugin(n) => write!(f, "plugin:{n}"),
        }
    }
}

/// What opening a device needs besides its spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The shared object `plugin:N` devices come from (`BCL_DEVICE_PLUGIN`).
    pub plugin: Option<std::path::PathBuf>,
}

/// Open the device a spec names; `index` is the device's index among its vendor's (a cuda
/// spec names its own). Fails, never panics, where the backend cannot run here: a build
/// without the `cuda` feature, no CUDA driver, no such device.
pub fn open_device(
    spec: &DeviceSpec,
    index: u32,
    options: &DeviceOptions,
) -> Result<Arc<dyn Accelerator>, DeviceError> {
    match spec {
        DeviceSpec::Cpu => Ok(Arc::new(CpuDevice::new(index))),
        DeviceSpec::Sim(config) => Ok(Arc::new(SimDevice::new(index, *config))),
        DeviceSpec::Cuda(ordinal) => open_cuda(*ordinal),
        DeviceSpec::Plugin(n) => match &options.plugin {
            Some(path) => Ok(Arc::new(crate::plugin::PluginDevice::open(path, *n)?)),
            None => Err(DeviceError::Unavailable(format!(
                "plugin:{n}: no device plugin is loaded: set BCL_DEVICE_PLUGIN=/path/libvendor.so"
            ))),
        },
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: u32) -> Result<Arc<dyn Accelerator>, DeviceError> {
    Ok(Arc::new(crate::cuda::CudaDevice::open(ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(ordinal: u32) -> Result<Arc<dyn Accelerator>, DeviceError> {
    Err(DeviceError::Unavailable(format!(
        "cuda:{ordinal}: this build of BCL has no cuda backend (build with `--features cuda`)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!("cpu".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cpu));
        assert_eq!(
            "sim:copy=8:reduce=4".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Sim(SimConfig {
                copy_gbps: Some(8.0),
                reduce_gbps: Some(4.0)
            }))
        );
        assert_eq!(
            "sim:copy=0.3"
                .parse::<DeviceSpec>()
                .map(|s| s.to_string())
                .ok(),
            Some("sim:copy=0.3".to_string())
        );
        for bad in [
            "gpu",
            "sim:copy",
            "sim:copy=-1",
            "sim:speed=3",
            "cpu:x=1",
            "cuda:x",
            "cuda:0:1",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        assert_eq!("cuda".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cuda(0)));
        assert_eq!(
            "plugin".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Plugin(0))
        );
        assert_eq!(
            "plugin:2".parse::<DeviceSpec>().map(|s| s.to_string()).ok(),
            Some("plugin:2".to_string())
        );
        assert!("plugin:x".parse::<DeviceSpec>().is_err());
        let e = open_device(&DeviceSpec::Plugin(0), 0, &DeviceOptions::default())
            .expect_err("no plugin named");
        assert!(e.to_string().contains("BCL_DEVICE_PLUGIN"), "{e}");
        assert_eq!(
            "cuda:3".parse::<DeviceSpec>().map(|s| s.to_string()).ok(),
            Some("cuda:3".to_string())
        );
    }

    /// Opening a cuda device fails with an error that says why, never a panic: a build
    /// without the feature says so; a build with it on a host without a driver names the
    /// missing library; a host with a GPU has no 10000th device.
    #[test]
    fn cuda_that_cannot_open_is_an_error() {
        let Err(e) = open_device(&DeviceSpec::Cuda(9999), 0, &DeviceOptions::default()) else {
            panic!("cuda:9999 opened");
        };
        let text = e.to_string();
        assert!(matches!(e, DeviceError::Unavailable(_)), "{text}");
        assert!(text.contains("cuda:9999"), "{text}");
        if cfg!(not(feature = "cuda")) {
            assert!(text.contains("--features cuda"), "{text}");
        }
    }
}
