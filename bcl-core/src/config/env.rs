//! The one place where `BCL_*` environment variables become settings. Every numeric value
//! goes through the checked conversions of [`super::limits`].

use super::limits::{
    HANG_TIMEOUT, HEARTBEAT, RECORDER_OPS, SLICE_BYTES, SLOW_WINDOW, SOCKET_BUFFER, SOCKETS, SPIN,
    TIMEOUT,
};
use super::{CommConfig, TransportKind};
use crate::error::{Error, Result};
use crate::schedule::cost::MeasuredLink;

/// A source of settings by name: the process environment, or a map in tests.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

impl CommConfig {
    /// This config with the `BCL_*` overrides found through `get` applied:
    /// `BCL_DEVICE`, `BCL_DEVICE_PLUGIN`, `BCL_TRANSPORT`, `BCL_SOCKETS_PER_PEER`,
    /// `BCL_SOCKET_BUFFER`, `BCL_SOCKETS_PER_OP` (auto, or a number), `BCL_TCP_CONGESTION` (auto,
    /// or a name), `BCL_RDMA_DEVICE`,
    /// `BCL_RDMA_QPS`, `BCL_RDMA_TCP_FAILOVER` (on, off),
    /// `BCL_BIND_IP`, `BCL_INIT_TIMEOUT_S`, `BCL_TIMEOUT_S`, `BCL_SLICE_BYTES`, `BCL_ALGO`
    /// (auto, ring, rd, hd, tree, hier-ring, hier-rd, hier-hd, hier-tree), `BCL_HEALTH` (on, off), `BCL_HEARTBEAT_MS`,
    /// `BCL_HANG_TIMEOUT_MS`, `BCL_DUMP_DIR`, `BCL_FLIGHT_RECORDER_OPS`, `BCL_SLOW_WINDOW_MS`,
    /// `BCL_REPORT_FANOUT`,
    /// `BCL_SPIN_US`, `BCL_TOPOLOGY` ([`super::TopologySpec`]), `BCL_SHARES` (equal, speed),
    /// `BCL_LINK_INSIDE` and `BCL_LINK_BETWEEN` (`ALPHA_US,GBPS[,REDUCE_GBPS]`, or builtin). A value that does not parse, or lies outside its range, is an error
    /// naming the variable and the value.
    pub fn with_env(mut self, get: Env<'_>) -> Result<Self> {
        let invalid =
            |name: &str, e: &dyn std::fmt::Display| Error::InvalidArgument(format!("{name}: {e}"));
        if let Some(v) = get("BCL_DEVICE") {
            self.device = v.parse().map_err(|e| invalid("BCL_DEVICE", &e))?;
        }
        if let Some(v) = get("BCL_DEVICE_PLUGIN") {
            self.device_plugin = Some(v.into());
        }
        if let Some(v) = get("BCL_TRANSPORT") {
            self.transport = TransportKind::parse(&v).map_err(|e| match e {
                Error::InvalidArgument(why) => {
                    Error::InvalidArgument(format!("BCL_TRANSPORT: {why}"))
                }
                other => other,
            })?;
        }
        let count = |name: &str, limits: super::limits::Count| {
            get(name).map(|v| limits.parse(name, &v)).transpose()
        };
        let span = |name: &str, limits: super::limits::Span| {
            get(name).map(|v| limits.parse(name, &v)).transpose()
        };
        if let Some(n) = count("BCL_SOCKETS_PER_PEER", SOCKETS)? {
            self.sockets_per_peer = n;
        }
        if let Some(n) = count("BCL_SOCKET_BUFFER", SOCKET_BUFFER)? {
            self.socket_buffer = n;
        }
        if let Some(v) = get("BCL_SOCKETS_PER_OP") {
            self.sockets_per_op = match v.trim() {
                "auto" => None,
                n => Some(SOCKETS.parse("BCL_SOCKETS_PER_OP", n)?),
            };
        }
        if let Some(v) = get("BCL_TCP_CONGESTION") {
            self.tcp_congestion = match v.trim() {
                "auto" => None,
                name => {
                    super::check_congestion("BCL_TCP_CONGESTION", name)?;
                    Some(name.to_string())
                }
            };
        }
        if let Some(v) = get("BCL_RDMA_DEVICE") {
            self.rdma_device = Some(v).filter(|v| !v.is_empty());
        }
        if let Some(n) = count("BCL_RDMA_QPS", super::limits::RDMA_QPS)? {
            self.rdma_qps = n;
        }
        if let Some(v) = get("BCL_RDMA_TCP_FAILOVER") {
            self.rdma_tcp_failover = match v.trim() {
                "on" | "1" => true,
                "off" | "0" => false,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "BCL_RDMA_TCP_FAILOVER='{other}' (on, off)"
                    )));
                }
            };
        }
        if let Some(v) = get("BCL_BIND_IP") {
            self.bind_ip = v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("BCL_BIND_IP='{v}' is not an IP address"))
            })?;
        }
        if let Some(d) = span("BCL_INIT_TIMEOUT_S", TIMEOUT)? {
            self.init_timeout = d;
        }
        if let Some(d) = span("BCL_TIMEOUT_S", TIMEOUT)? {
            self.op_timeout = d;
        }
        if let Some(v) = get("BCL_ALGO") {
            self.algorithm = match v.as_str() {
                "auto" => None,
                other => Some(other.parse().map_err(|e| invalid("BCL_ALGO", &e))?),
            };
        }
        if let Some(v) = get("BCL_SHARES") {
            self.shares = super::Shares::parse("BCL_SHARES", &v)?;
        }
        if let Some(v) = get("BCL_TOPOLOGY") {
            self.topology = Some(super::TopologySpec::parse("BCL_TOPOLOGY", &v)?);
        }
        if let Some(d) = span("BCL_SPIN_US", SPIN)? {
            self.spin = Some(d);
        }
        if let Some(n) = count("BCL_SLICE_BYTES", SLICE_BYTES)? {
            self.slice_bytes = n;
        }
        if let Some(n) = count("BCL_LL_BYTES", super::limits::LINES_BYTES)? {
            self.lines_bytes = n;
        }
        if let Some(n) = count("BCL_SINGLE_COPY_BYTES", super::limits::SINGLE_COPY_BYTES)? {
            self.single_copy_bytes = n;
        }
        for (name, link) in [
            ("BCL_LINK_INSIDE", &mut self.link_inside),
            ("BCL_LINK_BETWEEN", &mut self.link_between),
        ] {
            if let Some(v) = get(name) {
                *link = match v.trim() {
                    "builtin" => None,
                    text => Some(MeasuredLink::parse(name, text).map_err(Error::InvalidArgument)?),
                };
            }
        }
        if let Some(v) = get("BCL_HEALTH") {
            self.health.enabled = match v.as_str() {
                "on" | "1" => true,
                "off" | "0" => false,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "BCL_HEALTH='{other}' (on, off)"
                    )));
                }
            };
        }
        if let Some(d) = span("BCL_HEARTBEAT_MS", HEARTBEAT)? {
            self.health.heartbeat = d;
        }
        if let Some(d) = span("BCL_HANG_TIMEOUT_MS", HANG_TIMEOUT)? {
            self.health.hang_timeout = d;
        }
        if let Some(v) = get("BCL_DUMP_DIR") {
            self.health.dump_dir = Some(v.into());
        }
        if let Some(d) = span("BCL_SLOW_WINDOW_MS", SLOW_WINDOW)? {
            self.health.window = d;
        }
        if let Some(n) = count("BCL_FLIGHT_RECORDER_OPS", RECORDER_OPS)? {
            self.health.recorder_ops = n;
        }
        if let Some(n) = count("BCL_REPORT_FANOUT", super::limits::REPORT_FANOUT)? {
            self.health.report_fanout = n;
        }
        Ok(self)
    }
}

/// The process environment, for [`CommConfig::with_env`] and [`crate::launch::Launch::from_env`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An environment made of `pairs`, for tests of what reads the environment.
#[cfg(test)]
pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn environment_overrides() {
        let c = CommConfig::default()
            .with_env(&env(&[
                ("BCL_DEVICE", "sim:copy=2"),
                ("BCL_TIMEOUT_S", "1.5"),
                ("BCL_HEALTH", "off"),
                ("BCL_HEARTBEAT_MS", "50"),
                ("BCL_HANG_TIMEOUT_MS", "700"),
                ("BCL_DUMP_DIR", "/tmp/bcl-dumps"),
                ("BCL_SOCKET_BUFFER", "0"),
                ("BCL_SPIN_US", "0"),
            ]))
            .expect("config");
        assert_eq!(c.socket_buffer, 0);
        assert_eq!(c.spin, Some(Duration::ZERO));
        assert_eq!(CommConfig::default().socket_buffer, 4 << 20);
        let forced = |v: &str| {
            CommConfig::default()
                .with_env(&env(&[("BCL_SOCKETS_PER_OP", v)]))
                .map(|c| c.sockets_per_op)
        };
        assert_eq!(forced("1").expect("1"), Some(1));
        let congestion = |v: &str| {
            CommConfig::default()
                .with_env(&env(&[("BCL_TCP_CONGESTION", v)]))
                .map(|c| c.tcp_congestion)
        };
        assert_eq!(congestion("reno").expect("reno"), Some("reno".to_string()));
        assert_eq!(congestion("auto").expect("auto"), None);
        for bad in ["", "cubic;reno", "a-name-far-too-long", "c ubic"] {
            let e = congestion(bad).expect_err(bad);
            assert!(e.to_string().contains("BCL_TCP_CONGESTION"), "{e}");
        }
        assert_eq!(forced("auto").expect("auto"), None);
        let e = forced("all").expect_err("not a number");
        assert!(e.to_string().contains("BCL_SOCKETS_PER_OP='all'"), "{e}");
        let failover = |v: &str| {
            CommConfig::default()
                .with_env(&env(&[("BCL_RDMA_TCP_FAILOVER", v)]))
                .map(|c| c.rdma_tcp_failover)
        };
        assert!(CommConfig::default().rdma_tcp_failover);
        assert!(!failover("off").expect("off") && !failover("0").expect("0"));
        assert!(failover("on").expect("on"));
        let e = failover("maybe").expect_err("not on or off");
        assert!(
            e.to_string().contains("BCL_RDMA_TCP_FAILOVER='maybe'"),
            "{e}"
        );
        assert!(!c.health.enabled);
        assert_eq!(c.health.heartbeat, Duration::from_millis(50));
        assert_eq!(c.health.hang_timeout, Duration::from_millis(700));
        assert_eq!(
            c.health.dump_dir.as_deref(),
            Some(std::path::Path::new("/tmp/bcl-dumps"))
        );
        let e = CommConfig::default()
            .with_env(&env(&[("BCL_HEALTH", "maybe")]))
            .expect_err("bad switch");
        assert!(e.to_string().contains("BCL_HEALTH='maybe'"), "{e}");
        assert_eq!(c.device.to_string(), "sim:copy=2");
        assert_eq!(c.op_timeout, Duration::from_millis(1500));
        let e = CommConfig::default()
            .with_env(&env(&[("BCL_DEVICE", "tpu")]))
            .expect_err("bad device");
        assert!(e.to_string().contains("tpu"), "{e}");
        let shares = |v: &str| {
            CommConfig::default()
                .with_env(&env(&[("BCL_SHARES", v)]))
                .map(|c| c.shares)
        };
        assert_eq!(CommConfig::default().shares, crate::config::Shares::BySpeed);
        assert_eq!(
            shares("equal").expect("equal"),
            crate::config::Shares::Equal
        );
        assert_eq!(
            shares("speed").expect("speed"),
            crate::config::Shares::BySpeed
        );
        let e = shares("fair").expect_err("bad shares");
        assert!(e.to_string().contains("BCL_SHARES='fair'"), "{e}");
        let links = CommConfig::default()
            .with_env(&env(&[
                ("BCL_LINK_INSIDE", "3,370,1000"),
                ("BCL_LINK_BETWEEN", " 8.5 , 50 "),
            ]))
            .expect("links");
        let link = |alpha_ns, bytes_per_second, reduce_bytes_per_second| MeasuredLink {
            alpha_ns,
            bytes_per_second,
            reduce_bytes_per_second,
        };
        let reduce = Some(1_000_000_000_000);
        assert_eq!(links.link_inside, Some(link(3000, 370_000_000_000, reduce)));
        assert_eq!(links.link_between, Some(link(8500, 50_000_000_000, None)));
        let builtin = links
            .with_env(&env(&[("BCL_LINK_BETWEEN", "builtin")]))
            .expect("builtin");
        assert!(builtin.link_between.is_none() && builtin.link_inside.is_some());
        assert!(CommConfig::default().link_between.is_none());
        for bad in [
            "8", "8,50,1,2", "x,50", "8,0", "-1,50", "8,inf", "nan,50", "8,50,0", "2e7,1",
        ] {
            let e = CommConfig::default()
                .with_env(&env(&[("BCL_LINK_BETWEEN", bad)]))
                .expect_err(bad);
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
            assert!(
                e.to_string().contains(&format!("BCL_LINK_BETWEEN='{bad}'")),
                "{e}"
            );
        }
    }

    /// Every numeric variable, with every kind of bad value: a clear invalid-argument error
    /// naming the variable and the value, never a panic nor a silent clamp.
    #[test]
    fn every_numeric_variable_refuses_bad_values() {
        let all = [
            (
                "BCL_TIMEOUT_S",
                &["-1", "0", "inf", "nan", "1e400", "1e300", "x"][..],
            ),
            (
                "BCL_INIT_TIMEOUT_S",
                &["-1", "0", "inf", "nan", "1e400", "1e300"],
            ),
            ("BCL_SPIN_US", &["-1", "inf", "nan", "1e400", "2e6"]),
            ("BCL_HEARTBEAT_MS", &["-5", "0", "inf", "nan", "1e12"]),
            (
                "BCL_HANG_TIMEOUT_MS",
                &["-5", "0", "5", "inf", "nan", "1e300"],
            ),
            ("BCL_SLOW_WINDOW_MS", &["-5", "0", "inf", "nan", "1e12"]),
            (
                "BCL_SOCKETS_PER_PEER",
                &["-1", "0", "65", "1.5", "inf", "99999999999999999999"],
            ),
            ("BCL_SOCKETS_PER_OP", &["-1", "0", "65", "nan"]),
            ("BCL_RDMA_QPS", &["-1", "0", "9", "1.5", "inf"]),
            ("BCL_SOCKET_BUFFER", &["-1", "4M", "1e9", "99999999999999"]),
            (
                "BCL_SLICE_BYTES",
                &["-1", "0", "63", "inf", "99999999999999"],
            ),
            (
                "BCL_FLIGHT_RECORDER_OPS",
                &["-1", "0", "inf", "99999999999"],
            ),
            ("BCL_BIND_IP", &["-1", "300.1.1.1", "inf"]),
            (
                "BCL_REPORT_FANOUT",
                &["-1", "0", "1.5", "inf", "99999999999"],
            ),
        ];
        for (name, values) in all {
            for bad in values {
                let e = CommConfig::default()
                    .with_env(&env(&[(name, bad)]))
                    .expect_err(&format!("{name}={bad} accepted"));
                let text = e.to_string();
                assert!(
                    matches!(e, Error::InvalidArgument(_)),
                    "{name}={bad}: {text}"
                );
                assert!(
                    text.contains(&format!("{name}='{bad}'")),
                    "{name}={bad}: {text}"
                );
            }
        }
    }
}
