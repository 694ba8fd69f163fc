//! The range of every numeric setting, and the checked conversions that enforce it wherever a
//! value comes from: an environment variable, a field of [`super::CommConfig`], a field of the
//! C ABI's `bclConfig_t`, a `bcl-bench` flag. A value out of range (negative, zero where zero
//! means nothing, infinite, not a number, too large for a deadline) is an
//! [`Error::InvalidArgument`] that names the setting and the value; nothing is clamped
//! silently.

use crate::error::{Error, Result};
use std::fmt::Display;
use std::time::Duration;

/// A whole-number setting and its range.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    pub min: usize,
    pub max: usize,
    /// What one unit is, for messages ("connections", "bytes").
    pub unit: &'static str,
}

/// A duration setting, its unit and its range.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub unit: Unit,
    pub min: Duration,
    pub max: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Millis,
    Micros,
}

impl Unit {
    fn per_second(self) -> f64 {
        match self {
            Unit::Seconds => 1.0,
            Unit::Millis => 1e3,
            Unit::Micros => 1e6,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Seconds => "seconds",
            Unit::Millis => "milliseconds",
            Unit::Micros => "microseconds",
        }
    }
}

/// A year: the longest deadline any setting may ask for (a deadline is an instant, and far
/// enough in the future it does not exist).
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

pub const TIMEOUT: Span = Span {
    unit: Unit::Seconds,
    min: Duration::from_millis(1),
    max: YEAR,
};
pub const SPIN: Span = Span {
    unit: Unit::Micros,
    min: Duration::ZERO,
    max: Duration::from_secs(1),
};
pub const HEARTBEAT: Span = Span {
    unit: Unit::Millis,
    min: Duration::from_millis(1),
    max: Duration::from_secs(3600),
};
pub const HANG_TIMEOUT: Span = Span {
    unit: Unit::Millis,
    min: Duration::from_millis(10),
    max: YEAR,
};
pub const SLOW_WINDOW: Span = Span {
    unit: Unit::Millis,
    min: Duration::from_millis(10),
    max: Duration::from_secs(3600),
};
/// RDMA queue pairs per peer (lanes; see `bcl_transport::rdma::lanes`).
pub const RDMA_QPS: Count = Count {
    min: 1,
    max: 8,
    unit: "queue pairs",
};
pub const SOCKETS: Count = Count {
    min: 1,
    max: 64,
    unit: "connections",
};
pub const SOCKET_BUFFER: Count = Count {
    min: 0,
    max: 1 << 30,
    unit: "bytes",
};
pub const SLICE_BYTES: Count = Count {
    min: 64,
    max: 1 << 30,
    unit: "bytes",
};
/// At most what the lines hold beside the operation's signature.
pub const LINES_BYTES: Count = Count {
    min: 0,
    max: bcl_transport::shm::LINES_MAX_PAYLOAD - crate::signature::SIGNATURE_BYTES,
    unit: "bytes",
};
pub const SINGLE_COPY_BYTES: Count = Count {
    min: 0,
    max: 1 << 30,
    unit: "bytes",
};
/// Children per rank in the slow-node reports' tree.
pub const REPORT_FANOUT: Count = Count {
    min: 1,
    max: 1 << 20,
    unit: "children",
};
pub const RECORDER_OPS: Count = Count {
    min: 1,
    max: 1 << 20,
    unit: "operations",
};

fn invalid(name: &str, value: &dyn Display, why: String) -> Error {
    Error::InvalidArgument(format!("{name}='{value}' {why}"))
}

impl Count {
    fn range(&self) -> String {
        format!(
            "a whole number of {} from {} to {}",
            self.unit, self.min, self.max
        )
    }

    /// Why `v` is not a value of this setting, if it is not.
    fn refuse(&self, v: u64) -> Option<String> {
        (v < self.min as u64 || v > self.max as u64)
            .then(|| format!("is out of range: it must be {}", self.range()))
    }

    /// `text` as a value of this setting, called `name` in the message.
    pub fn parse(&self, name: &str, text: &str) -> Result<usize> {
        let v: u64 = text
            .trim()
            .parse()
            .map_err(|_| invalid(name, &text, format!("is not {}", self.range())))?;
        match self.refuse(v) {
            Some(why) => Err(invalid(name, &text, why)),
            None => Ok(v as usize),
        }
    }

    /// A signed value of this setting (a C `int`, say).
    pub fn from_i64(&self, name: &str, v: i64) -> Result<usize> {
        let why = match u64::try_from(v) {
            Ok(u) => match self.refuse(u) {
                None => return Ok(u as usize),
                Some(why) => why,
            },
            Err(_) => format!("is negative: it must be {}", self.range()),
        };
        Err(invalid(name, &v, why))
    }

    /// A value set in code (a [`super::CommConfig`] field).
    pub fn check(&self, name: &str, v: usize) -> Result<usize> {
        match self.refuse(v as u64) {
            Some(why) => Err(invalid(name, &v, why)),
            None => Ok(v),
        }
    }
}

impl Span {
    fn range(&self) -> String {
        let show = |d: Duration| {
            let v = d.as_secs_f64() * self.unit.per_second();
            if v >= 1e6 {
                format!("{v:e}")
            } else {
                format!("{v}")
            }
        };
        format!(
            "a number of {} from {} to {}",
            self.unit.name(),
            show(self.min),
            show(self.max)
        )
    }

    /// `v` (in this setting's unit) as a duration, or why it is not one.
    fn convert(&self, v: f64) -> std::result::Result<Duration, String> {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("is not {}", self.range()));
        }
        match Duration::try_from_secs_f64(v / self.unit.per_second()) {
            Ok(d) if d >= self.min && d <= self.max => Ok(d),
            _ => Err(format!("is out of range: it must be {}", self.range())),
        }
    }

    /// `text` (a decimal number in this setting's unit) as a duration.
    pub fn parse(&self, name: &str, text: &str) -> Result<Duration> {
        let v: f64 = text
            .trim()
            .parse()
            .map_err(|_| invalid(name, &text, format!("is not {}", self.range())))?;
        self.convert(v).map_err(|why| invalid(name, &text, why))
    }

    /// `v`, in this setting's unit, as a duration: NaN, infinities, negatives and values
    /// outside the range are errors.
    pub fn from_f64(&self, name: &str, v: f64) -> Result<Duration> {
        self.convert(v).map_err(|why| invalid(name, &v, why))
    }

    /// A value set in code (a [`super::CommConfig`] field).
    pub fn check(&self, name: &str, d: Duration) -> Result<Duration> {
        if d < self.min || d > self.max {
            let v = d.as_secs_f64() * self.unit.per_second();
            return Err(invalid(
                name,
                &v,
                format!("is out of range: it must be {}", self.range()),
            ));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_duration_is_refused_naming_it() {
        for bad in [
            "-1", "inf", "-inf", "nan", "1e400", "1e300", "0", "", "ten", "1.5s",
        ] {
            let e = TIMEOUT.parse("BCL_TIMEOUT_S", bad).expect_err(bad);
            let text = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {text}");
            assert!(text.contains("BCL_TIMEOUT_S="), "{bad}: {text}");
            assert!(text.contains("seconds"), "{bad}: {text}");
        }
        assert_eq!(
            TIMEOUT.parse("t", " 1.5 ").ok(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(SPIN.parse("s", "0").ok(), Some(Duration::ZERO));
        assert!(SPIN.parse("s", "2000000").is_err());
        assert!(TIMEOUT.from_f64("x", f64::MAX).is_err());
        assert!(TIMEOUT.from_f64("x", f64::MIN_POSITIVE).is_err());
    }

    #[test]
    fn every_bad_count_is_refused_naming_it() {
        for bad in [
            "-1",
            "0",
            "65",
            "1e3",
            "inf",
            "nan",
            "4M",
            "99999999999999999999999",
        ] {
            let e = SOCKETS.parse("BCL_SOCKETS_PER_PEER", bad).expect_err(bad);
            assert!(
                e.to_string().contains("BCL_SOCKETS_PER_PEER="),
                "{bad}: {e}"
            );
            assert!(e.to_string().contains("from 1 to 64"), "{bad}: {e}");
        }
        assert_eq!(SOCKETS.parse("x", "64").ok(), Some(64));
        assert_eq!(SOCKET_BUFFER.parse("x", "0").ok(), Some(0));
        let e = SOCKETS
            .from_i64("config.socketsPerPeer", -3)
            .expect_err("negative");
        assert!(e.to_string().contains("negative"), "{e}");
    }
}
