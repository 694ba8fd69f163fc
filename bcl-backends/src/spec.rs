//! Device specifications as users write them: `cpu`, `sim`, `sim:copy=8:reduce=4` (GB/s).

use crate::accelerator::{Accelerator, DeviceError};
use crate::cpu::CpuDevice;
use crate::sim::{SimConfig, SimDevice};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Which backend a rank uses, and its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSpec {
    Cpu,
    Sim(SimConfig),
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
            "cuda" => Err(DeviceError::Unavailable(format!(
                "'{text}': this build has no cuda backend"
            ))),
            other => Err(bad(format!("unknown backend '{other}' (cpu, sim)"))),
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
        }
    }
}

/// Open the device a spec names; `index` is the device's index among its vendor's.
pub fn open_device(spec: &DeviceSpec, index: u32) -> Arc<dyn Accelerator> {
    match spec {
        DeviceSpec::Cpu => Arc::new(CpuDevice::new(index)),
        DeviceSpec::Sim(config) => Arc::new(SimDevice::new(index, *config)),
    }
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
            "cuda:0",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }
}
