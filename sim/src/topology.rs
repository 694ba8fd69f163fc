//! The modelled cluster: hosts of ranks, the links inside a host, the NICs, the switch tiers,
//! and each vendor's device speeds. Given as a short spec string or a file of the same
//! `key=value` pairs (one per line or comma-separated, `#` comments):
//!
//! ```text
//! local                         this host (up to 8 ranks over shm; `transport=tcp` for loopback)
//! cluster                       the default cluster (below), hosts of 8 ranks
//! cluster,per-host=8,nic=8x50@8,leaf=32,pod=16,oversub=2,b-share=0.5,b-reduce=400
//! ```
//!
//! Keys (speeds in GB/s = 1e9 bytes/s, latencies in µs):
//! `per-host` ranks per host; `intra=GBPS@US` each rank's port inside a host and the
//! per-message latency there; `reduce`, `copy` a device's reduce and copy speed;
//! `nic=COUNTxGBPS@US` NICs per host, each one's speed, the per-message latency between hosts;
//! `leaf` hosts under one leaf switch (0: one switch for all), `pod` leaves under one pod
//! (0: two tiers), `oversub` / `pod-oversub` the leaf's / pod's down:up ratio; `rails=1`: NIC k
//! of every host joins leaf plane k (rail-optimised); `b-share=F` the fraction of hosts of a
//! second vendor, spread evenly, with `b-reduce`, `b-copy`, `b-intra`, `b-nic` its speeds
//! (default: the first vendor's); `links=cluster` hands BCL's selector these links' own
//! constants, as a deployment that measured them sets `BCL_LINK_INSIDE` and
//! `BCL_LINK_BETWEEN` (`links=builtin`, the default: its built-in ones, this project's VM's);
//! `channels` messages in flight per peer; `cores` per host when ranks are CPU threads
//! (0: devices); `transport` for
//! `local` (shm or tcp); `hosts=H` for `local`: the ranks on H network-namespace hosts of this
//! machine (shm inside, TCP between, `nic=1xGBPS@US` the shaped veth), sharing its cores:
//!
//! ```text
//! local,hosts=2,nic=1x0.25      2 namespace hosts, veths shaped to 2 Gbit/s (hier-bench.sh)
//! ```
//!
//! and, for `local`, constants measured alongside instead of the cost model's
//! ([`Calibration`]): `alpha2`, `alpha4` (µs), `beta`, `gamma` (GB/s), `tcp-alpha2`,
//! `tcp-alpha4`, `tcp-beta`, and `beta-curve=BYTES:GBPS/BYTES:GBPS/...`, the ranks' links by
//! the bytes of the operation's buffers on the whole machine, where one β cannot carry the
//! caches (see [`Topology::at_size`]).

use bcl_core::schedule::Fabric;
use bcl_core::schedule::cost::{self, LinkCost, MeasuredLink};
use std::borrow::Cow;

/// A class of link: per-message latency and bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Seconds per message.
    pub alpha: f64,
    /// Bytes per second.
    pub bandwidth: f64,
}

/// What one vendor's hosts are made of.
#[derive(Clone, Debug, PartialEq)]
pub struct Vendor {
    pub name: String,
    /// Bytes per second one device reduces into its destination.
    pub reduce: f64,
    /// Bytes per second one device copies.
    pub copy: f64,
    /// Each rank's port to the others of its host.
    pub intra: Link,
    /// Each NIC of a host (latency between hosts).
    pub nic: Link,
}

/// The cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// How it was given (for the table's header and the JSON's transport field).
    pub name: String,
    pub hosts: usize,
    pub per_host: usize,
    pub nics: usize,
    /// Hosts under one leaf switch (0: all under one).
    pub leaf: usize,
    /// Leaves under one pod switch (0: no third tier).
    pub pod: usize,
    pub oversub: f64,
    pub pod_oversub: f64,
    pub rails: bool,
    /// The first vendor, and the second with the share of hosts it has.
    pub a: Vendor,
    pub b: Option<(f64, Vendor)>,
    /// Every link inside a host is shared memory (the `local` model over shm).
    pub shared_memory: bool,
    /// This machine's model: its ranks on `local_hosts` hosts (network namespaces joined by
    /// shaped veths, or one host), every host sharing the machine's cores.
    pub local: bool,
    pub local_hosts: usize,
    /// Bytes per second a core moves over the transport between hosts (TCP's copy, where
    /// the wire is shaped slower); 0: the NIC's speed.
    pub nic_cpu: f64,
    /// `leaf` and `pod` were given (else [`Topology::fit`] sizes them to the hosts).
    pub switches_given: bool,
    /// Ranks are CPU threads on this many cores per host (0: devices with their own copy
    /// engines): a rank's own core moves the bytes it sends and does its reduces, and the
    /// ranks of a host share its cores (`local`).
    pub cores: usize,
    /// Messages in flight at once from one rank to one peer (the rest wait their turn, as
    /// on a shared-memory ring or a socket): TCP's connections per peer, 1 otherwise.
    pub channels: usize,
    /// The `local` model's links inside a host by the operation's buffers on the whole
    /// machine (bytes of all ranks, bytes per second; ascending sizes), measured alongside
    /// (`beta-curve`); empty: `a.intra` at every size. See [`Topology::at_size`].
    pub intra_by_size: Vec<(f64, f64)>,
    /// BCL's selector is told this cluster's own link constants, as a deployment that
    /// measured them sets `BCL_LINK_INSIDE` / `BCL_LINK_BETWEEN` (`links=cluster`); false,
    /// the default: BCL's built-in ones, this project's test VM's (`links=builtin`), which
    /// `local`'s real runs use too.
    pub own_links: bool,
}

/// Hosts under one leaf switch in the default cluster (at most; see [`Topology::fit`]).
pub const DEFAULT_LEAF: usize = 32;
/// Leaves under one pod switch in the default cluster (at most).
pub const DEFAULT_POD: usize = 16;

/// The default cluster (`docs/simulator.md` gives the sources): hosts of 8 accelerators
/// joined inside by 370 GB/s ports (NVLink-class busbw), reduce and copy at 1000 GB/s, 8 NICs
/// of 50 GB/s (400 Gbit/s) per host at 8 µs per message, rail-optimised leaves of up to 32
/// hosts, pods of up to 16 leaves (sized so hosts fill them evenly), no oversubscription.
pub fn default_cluster() -> Topology {
    let a = Vendor {
        name: "a".into(),
        reduce: 1000e9,
        copy: 1000e9,
        intra: Link {
            alpha: 3e-6,
            bandwidth: 370e9,
        },
        nic: Link {
            alpha: 8e-6,
            bandwidth: 50e9,
        },
    };
    Topology {
        name: "cluster".into(),
        hosts: 1,
        per_host: 8,
        nics: 8,
        leaf: DEFAULT_LEAF,
        pod: DEFAULT_POD,
        oversub: 1.0,
        pod_oversub: 1.0,
        rails: true,
        a,
        b: None,
        shared_memory: false,
        local: false,
        local_hosts: 1,
        nic_cpu: 0.0,
        switches_given: false,
        cores: 0,
        channels: 1,
        intra_by_size: Vec::new(),
        own_links: false,
    }
}

/// The cores of the machine the cost model's constants were measured on (2 vCPUs).
pub const LOCAL_CORES: usize = 2;

/// This host as the cost model measured it: `world` ranks over shared memory (or loopback
/// TCP) on [`LOCAL_CORES`] cores. β and γ are the 2-rank constants (one rank per core); a
/// rank's core both sends and reduces, and the ranks share the host's cores, so more ranks
/// than cores slow every byte without a constant of their own. α grows with the ranks per
/// core, linearly through the 2- and 4-rank fits (α₂ + (α₄ − α₂)·(w/cores − 1)): a message
/// waits for its receiver's turn on a core.
pub fn local(world: usize, shm: bool) -> Topology {
    local_calibrated(world, shm, &Calibration::cost_model(shm))
}

/// The constants of the `local` model: the 2- and 4-rank costs of the ranks' transport and of
/// TCP (between namespace hosts). The cost model's by default; `alpha2`, `alpha4` (µs),
/// `beta`, `gamma` (GB/s) and `tcp-alpha2`, `tcp-alpha4`, `tcp-beta` replace them with
/// figures measured alongside (scripts/sim-validate.sh).
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub two: LinkCost,
    pub four: LinkCost,
    pub tcp_two: LinkCost,
    pub tcp_four: LinkCost,
    /// `beta-curve`: the links' speed by operation size (bytes, bytes per second).
    pub beta_curve: Vec<(f64, f64)>,
}

impl Calibration {
    pub fn cost_model(shm: bool) -> Self {
        Calibration {
            two: cost::link_cost(Fabric::flat(2, shm, true)),
            four: cost::link_cost(Fabric::flat(4, shm, true)),
            tcp_two: cost::link_cost(Fabric::flat(2, false, true)),
            tcp_four: cost::link_cost(Fabric::flat(4, false, true)),
            beta_curve: Vec::new(),
        }
    }

    /// Apply one `key=value` if it is a calibration key (Ok(false) if not).
    fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let us = |v: &str| positive(key, v).map(|x| x * 1e-6);
        let per_gb = |v: &str| positive(key, v).map(|x| 1.0 / (x * 1e9));
        match key {
            "alpha2" => self.two.alpha = us(value)?,
            "alpha4" => self.four.alpha = us(value)?,
            "beta" => {
                self.two.beta = per_gb(value)?;
                self.four.beta = self.two.beta;
            }
            "gamma" => {
                self.two.gamma = per_gb(value)?;
                self.four.gamma = self.two.gamma;
            }
            "tcp-alpha2" => self.tcp_two.alpha = us(value)?,
            "tcp-alpha4" => self.tcp_four.alpha = us(value)?,
            "tcp-beta" => {
                self.tcp_two.beta = per_gb(value)?;
                self.tcp_four.beta = self.tcp_two.beta;
            }
            "beta-curve" => self.beta_curve = curve(key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// [`local`] with the given constants.
pub fn local_calibrated(world: usize, shm: bool, cal: &Calibration) -> Topology {
    let (two, four) = (cal.two, cal.four);
    let per_core = world as f64 / LOCAL_CORES as f64;
    let c = LinkCost {
        alpha: two.alpha + (four.alpha - two.alpha) * (per_core - 1.0).max(0.0),
        ..two
    };
    let vendor = Vendor {
        name: "cpu".into(),
        reduce: 1.0 / c.gamma,
        copy: 1.0 / c.gamma,
        intra: Link {
            alpha: c.alpha,
            bandwidth: 1.0 / c.beta,
        },
        nic: Link {
            alpha: c.alpha,
            bandwidth: 1.0 / c.beta,
        },
    };
    // Between namespace hosts: TCP, its α scaled like the rest, its copy at TCP's β.
    let (tcp2, tcp4) = (cal.tcp_two, cal.tcp_four);
    let tcp_alpha = tcp2.alpha + (tcp4.alpha - tcp2.alpha) * (per_core - 1.0).max(0.0);
    let vendor = Vendor {
        nic: Link {
            alpha: tcp_alpha,
            bandwidth: 1.0 / tcp2.beta,
        },
        ..vendor
    };
    Topology {
        name: format!("local-{}", if shm { "shm" } else { "tcp" }),
        hosts: 1,
        per_host: world,
        nics: 1,
        leaf: 0,
        pod: 0,
        oversub: 1.0,
        pod_oversub: 1.0,
        rails: false,
        a: vendor,
        b: None,
        shared_memory: shm,
        local: true,
        local_hosts: 1,
        nic_cpu: 1.0 / tcp2.beta,
        switches_given: true,
        cores: LOCAL_CORES,
        // BCL's default: shm one ring per peer, TCP two connections per peer.
        channels: if shm { 1 } else { 2 },
        intra_by_size: cal.beta_curve.clone(),
        own_links: false,
    }
}

/// The speed at `x` on a curve of (size, speed) points, sizes ascending: linear in log2 of
/// the size between points, the end point's outside them.
fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    let i = points.partition_point(|p| p.0 <= x);
    if i == 0 {
        return points[0].1;
    }
    if i == points.len() {
        return points[i - 1].1;
    }
    let ((x0, y0), (x1, y1)) = (points[i - 1], points[i]);
    let f = (x.log2() - x0.log2()) / (x1.log2() - x0.log2());
    y0 + f * (y1 - y0)
}

/// `BYTES:GBPS/BYTES:GBPS/...`: points of a speed by size, sizes ascending (bytes, bytes/s).
fn curve(key: &str, value: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut points: Vec<(f64, f64)> = Vec::new();
    for point in value.split('/') {
        let (size, speed) = point
            .split_once(':')
            .ok_or_else(|| format!("topology: {key}: '{point}' is not BYTES:GBPS"))?;
        let size = positive(key, size)?;
        if let Some(&(last, _)) = points.last().filter(|&&(last, _)| size <= last) {
            return Err(format!(
                "topology: {key}={value}: sizes must ascend ({size} after {last})"
            ));
        }
        points.push((size, positive(key, speed)? * 1e9));
    }
    Ok(points)
}

fn number(key: &str, value: &str) -> Result<f64, String> {
    let v: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("topology: {key}={value} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "topology: {key}={value} must be finite and not negative"
        ));
    }
    Ok(v)
}

fn positive(key: &str, value: &str) -> Result<f64, String> {
    let v = number(key, value)?;
    if v == 0.0 {
        return Err(format!("topology: {key}={value} must be above 0"));
    }
    Ok(v)
}

fn count(key: &str, value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("topology: {key}={value} is not a whole number"))
}

/// `GBPS[@US]` → a link (the latency kept from `old` when not given).
fn link(key: &str, value: &str, old: Link) -> Result<Link, String> {
    let (bw, lat) = match value.split_once('@') {
        Some((b, l)) => (b, Some(l)),
        None => (value, None),
    };
    Ok(Link {
        bandwidth: positive(key, bw)? * 1e9,
        alpha: match lat {
            Some(l) => number(key, l)? * 1e-6,
            None => old.alpha,
        },
    })
}

impl Topology {
    /// Parse a spec for `world` ranks: `local`, `cluster` (the default when the first word is
    /// a key), then keys that change it. A spec naming an existing file is read from it.
    pub fn parse(spec: &str, world: usize) -> Result<Topology, String> {
        let text = if std::path::Path::new(spec).is_file() {
            std::fs::read_to_string(spec).map_err(|e| format!("topology file {spec}: {e}"))?
        } else {
            spec.to_string()
        };
        let words: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(|l| l.split(','))
            .map(|w| w.trim().to_string())
            .filter(|w| !w.is_empty())
            .collect();
        let mut it = words.iter().peekable();
        let base = match it.peek().map(|w| w.as_str()) {
            Some("local") => {
                it.next();
                "local"
            }
            Some("cluster") => {
                it.next();
                "cluster"
            }
            _ => "cluster",
        };
        let rest: Vec<(String, String)> = it
            .map(|w| {
                w.split_once('=')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .ok_or_else(|| format!("topology: '{w}' is not key=value"))
            })
            .collect::<Result<_, _>>()?;
        let mut t = if base == "local" {
            let shm = match rest.iter().find(|(k, _)| k == "transport") {
                Some((_, v)) if v == "shm" => true,
                Some((_, v)) if v == "tcp" => false,
                Some((_, v)) => {
                    return Err(format!("topology: transport={v} (local: shm or tcp)"));
                }
                None => true,
            };
            let mut cal = Calibration::cost_model(shm);
            for (k, v) in &rest {
                cal.set(k, v)?;
            }
            local_calibrated(world, shm, &cal)
        } else {
            default_cluster()
        };
        let mut b: Option<(f64, Vendor)> = None;
        for (k, v) in &rest {
            let (k, v) = (k.as_str(), v.as_str());
            match k {
                "transport" | "alpha2" | "alpha4" | "beta" | "gamma" | "tcp-alpha2"
                | "tcp-alpha4" | "tcp-beta" | "beta-curve"
                    if base == "local" => {}
                "hosts" if base == "local" => {
                    t.local_hosts = count(k, v)?.max(1);
                    t.shared_memory = false;
                }
                "per-host" => t.per_host = count(k, v)?,
                "intra" => t.a.intra = link(k, v, t.a.intra)?,
                "reduce" => t.a.reduce = positive(k, v)? * 1e9,
                "copy" => t.a.copy = positive(k, v)? * 1e9,
                "nic" => {
                    let (n, l) = v
                        .split_once('x')
                        .ok_or_else(|| format!("topology: nic={v} is not COUNTxGBPS[@US]"))?;
                    t.nics = count(k, n)?;
                    t.a.nic = link(k, l, t.a.nic)?;
                }
                "leaf" => {
                    t.leaf = count(k, v)?;
                    t.switches_given = true;
                }
                "pod" => {
                    t.pod = count(k, v)?;
                    t.switches_given = true;
                }
                "oversub" => t.oversub = positive(k, v)?,
                "pod-oversub" => t.pod_oversub = positive(k, v)?,
                "rails" => t.rails = count(k, v)? != 0,
                "channels" => t.channels = count(k, v)?.max(1),
                "cores" => t.cores = count(k, v)?,
                "links" => {
                    t.own_links = match v {
                        "cluster" => true,
                        "builtin" => false,
                        _ => return Err(format!("topology: links={v} (cluster, builtin)")),
                    }
                }
                "b-share" | "b-reduce" | "b-copy" | "b-intra" | "b-nic" => {
                    let (share, vendor) = b.get_or_insert_with(|| {
                        (
                            0.5,
                            Vendor {
                                name: "b".into(),
                                ..t.a.clone()
                            },
                        )
                    });
                    match k {
                        "b-share" => {
                            *share = number(k, v)?;
                            if *share > 1.0 {
                                return Err(format!("topology: b-share={v} is above 1"));
                            }
                        }
                        "b-reduce" => vendor.reduce = positive(k, v)? * 1e9,
                        "b-copy" => vendor.copy = positive(k, v)? * 1e9,
                        "b-intra" => vendor.intra = link(k, v, vendor.intra)?,
                        _ => vendor.nic = link(k, v, vendor.nic)?,
                    }
                }
                other => return Err(format!("topology: unknown key '{other}'")),
            }
        }
        t.b = b;
        t.name = if words.is_empty() {
            "cluster".into()
        } else {
            words.join(",")
        };
        t.fit(world)?;
        Ok(t)
    }

    /// Size the host count for `world` ranks.
    pub fn fit(&mut self, world: usize) -> Result<(), String> {
        if world == 0 {
            return Err("a world of 0 ranks".into());
        }
        if self.per_host == 0 || self.nics == 0 {
            return Err("topology: per-host and the NIC count must be at least 1".into());
        }
        if self.local {
            if !world.is_multiple_of(self.local_hosts) {
                return Err(format!(
                    "{world} ranks do not fill {} hosts (hosts=...)",
                    self.local_hosts
                ));
            }
            self.per_host = world / self.local_hosts;
        }
        if !world.is_multiple_of(self.per_host) {
            return Err(format!(
                "{world} ranks do not fill hosts of {} (per-host=...)",
                self.per_host
            ));
        }
        self.hosts = world / self.per_host;
        if !self.switches_given {
            // Leaves and pods filled evenly: the largest divisor of the hosts up to the
            // default leaf size, then of the leaves up to the default pod size.
            let divisor =
                |n: usize, most: usize| (1..=most.min(n)).rev().find(|d| n.is_multiple_of(*d));
            self.leaf = divisor(self.hosts, DEFAULT_LEAF).unwrap_or(1);
            self.pod = divisor(self.hosts / self.leaf, DEFAULT_POD).unwrap_or(1);
        }
        Ok(())
    }

    pub fn world(&self) -> usize {
        self.hosts * self.per_host
    }

    /// Whether host `h` is of the second vendor (spread evenly: host h is when
    /// ⌊(h+1)·F⌋ > ⌊h·F⌋).
    pub fn is_b(&self, h: usize) -> bool {
        self.b
            .as_ref()
            .is_some_and(|(f, _)| ((h + 1) as f64 * f).floor() > (h as f64 * f).floor())
    }

    pub fn vendor(&self, h: usize) -> &Vendor {
        match &self.b {
            Some((_, v)) if self.is_b(h) => v,
            _ => &self.a,
        }
    }

    /// The period, in hosts, after which the vendor pattern repeats (1 with one vendor).
    pub fn vendor_period(&self) -> usize {
        let Some((f, _)) = &self.b else { return 1 };
        (1..=self.hosts)
            .find(|&p| {
                self.hosts.is_multiple_of(p)
                    && (0..self.hosts).all(|h| self.is_b(h) == self.is_b(h % p))
            })
            .unwrap_or(self.hosts)
            .max(if *f > 0.0 && *f < 1.0 { 2 } else { 1 })
            .min(self.hosts)
    }

    /// What BCL's selector is told about this cluster (as `Communicator::init` builds it).
    pub fn fabric(&self) -> Fabric {
        let mixed = self
            .b
            .as_ref()
            .is_some_and(|(f, v)| *f > 0.0 && (v.reduce != self.a.reduce || v.copy != self.a.copy));
        Fabric {
            world: self.world(),
            all_shared_memory: self.shared_memory,
            one_host: self.hosts == 1,
            hosts: self.hosts,
            largest_host: self.per_host,
            shm_inside_hosts: self.shared_memory || self.hosts > 1,
            mixed_speeds: mixed,
            nics_per_host: self.nics,
            // The default (`Communicator::init` takes it from the configuration), so the
            // selector picks here what it picks for real; the network model does not tell a
            // lent message from one through the rings.
            single_copy_from: Some(bcl_core::config::SINGLE_COPY_BYTES),
            inside_link: self.own_links.then(|| self.measured(|v| v.intra)),
            between_link: (self.own_links && self.hosts > 1).then(|| self.measured(|v| v.nic)),
        }
    }

    /// One link class as a deployment would measure it on this cluster: the slowest of its
    /// vendors' (largest α, lowest bandwidth, slowest reduce), as the slowest link paces a
    /// collective.
    fn measured(&self, class: impl Fn(&Vendor) -> Link) -> MeasuredLink {
        let vendors =
            std::iter::once(&self.a).chain(self.b.iter().filter(|(f, _)| *f > 0.0).map(|(_, v)| v));
        let (mut alpha, mut bandwidth, mut reduce) = (0.0f64, f64::INFINITY, f64::INFINITY);
        for v in vendors {
            let l = class(v);
            alpha = alpha.max(l.alpha);
            bandwidth = bandwidth.min(l.bandwidth);
            reduce = reduce.min(v.reduce);
        }
        MeasuredLink {
            alpha_ns: (alpha * 1e9).round() as u64,
            bytes_per_second: (bandwidth.round() as u64).max(1),
            reduce_bytes_per_second: Some((reduce.round() as u64).max(1)),
        }
    }

    /// This topology for an operation of `bytes` per rank. Where `intra_by_size` is given,
    /// the links inside a host run at its speed for the operation's buffers on the whole
    /// machine (`bytes` × the ranks: the `local` model's ranks share its caches), interpolated
    /// in log2 of that size between the measured points, the nearest point's outside them.
    /// What a byte costs on this machine depends on whether the buffers still fit the caches:
    /// one β fitted in them was 35-53% fast past them (docs/simulator.md).
    pub fn at_size(&self, bytes: usize) -> Cow<'_, Topology> {
        if self.intra_by_size.is_empty() {
            return Cow::Borrowed(self);
        }
        let mut t = self.clone();
        let machine = bytes as f64 * self.world() as f64;
        t.a.intra.bandwidth = interpolate(&self.intra_by_size, machine);
        Cow::Owned(t)
    }

    /// One line for the table's header.
    pub fn describe(&self) -> String {
        let gb = |b: f64| b / 1e9;
        let mut s = format!(
            "{} hosts × {} ranks; inside a host {:.1} GB/s per rank, {:.1} µs; reduce {:.1} GB/s",
            self.hosts,
            self.per_host,
            gb(self.a.intra.bandwidth),
            self.a.intra.alpha * 1e6,
            gb(self.a.reduce)
        );
        if !self.intra_by_size.is_empty() {
            let points: Vec<String> = self
                .intra_by_size
                .iter()
                .map(|&(size, speed)| format!("{size} B {:.2}", gb(speed)))
                .collect();
            s += &format!(" (by the machine's bytes, GB/s: {})", points.join(", "));
        }
        if self.hosts > 1 {
            s += &format!(
                "; {} NICs × {:.1} GB/s, {:.1} µs; leaf {} hosts (oversub {}), pod {} leaves (oversub {}){}",
                self.nics,
                gb(self.a.nic.bandwidth),
                self.a.nic.alpha * 1e6,
                self.leaf,
                self.oversub,
                self.pod,
                self.pod_oversub,
                if self.rails { ", rail-optimised" } else { "" }
            );
        }
        if let Some((f, v)) = &self.b {
            s += &format!(
                "; {:.0}% of hosts vendor b: reduce {:.1} GB/s, inside {:.1} GB/s, NIC {:.1} GB/s",
                f * 100.0,
                gb(v.reduce),
                gb(v.intra.bandwidth),
                gb(v.nic.bandwidth)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_hand_the_selector_the_clusters_own_constants_or_none() {
        let own = Topology::parse(
            "cluster,links=cluster,b-share=0.5,b-nic=25@12,b-reduce=400",
            64,
        )
        .expect("parses")
        .fabric();
        // The slower vendor's NIC, and its reduce: the slowest link paces the collective.
        let between = MeasuredLink {
            alpha_ns: 12_000,
            bytes_per_second: 25_000_000_000,
            reduce_bytes_per_second: Some(400_000_000_000),
        };
        assert_eq!(own.between_link, Some(between));
        let inside = own.inside_link.expect("inside a host");
        assert_eq!(
            (inside.alpha_ns, inside.bytes_per_second),
            (3_000, 370_000_000_000)
        );
        for spec in [
            "cluster",
            "cluster,links=builtin",
            "local",
            "local,hosts=2,nic=1x0.25",
        ] {
            let f = Topology::parse(spec, 8).expect(spec).fabric();
            assert!(
                f.inside_link.is_none() && f.between_link.is_none(),
                "{spec}"
            );
        }
        let e = Topology::parse("cluster,links=mine", 16).expect_err("bad links");
        assert!(e.contains("links=mine"), "{e}");
    }

    #[test]
    fn measured_constants_replace_the_cost_models() {
        let t = Topology::parse("local,alpha2=10,alpha4=30,beta=2,gamma=4", 4).expect("parses");
        // 4 ranks on 2 cores: α through the 2- and 4-rank figures at 2 ranks per core.
        assert!(
            (t.a.intra.alpha - 30e-6).abs() < 1e-12,
            "{}",
            t.a.intra.alpha
        );
        assert!((t.a.intra.bandwidth - 2e9).abs() < 1.0);
        assert!((t.a.reduce - 4e9).abs() < 1.0);
        for bad in ["local,beta=0", "local,alpha2=-1", "local,gamma=x"] {
            let e = Topology::parse(bad, 2).expect_err(bad);
            let key = bad
                .trim_start_matches("local,")
                .split('=')
                .next()
                .unwrap_or("");
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn a_beta_curve_sets_the_links_by_operation_size() {
        let t =
            Topology::parse("local,beta=9,beta-curve=1024:4/4096:2/65536:1", 2).expect("parses");
        let at = |bytes: usize| t.at_size(bytes).a.intra.bandwidth / 1e9;
        // Looked up at the 2 ranks' bytes together: the end points' speeds outside the
        // curve, the points' own at them, and halfway in log2 of the size between two (2048
        // lies halfway between 1024 and 4096).
        for (bytes, want) in [(1, 4.0), (512, 4.0), (1024, 3.0), (2048, 2.0), (8192, 1.5)] {
            assert!((at(bytes) - want).abs() < 1e-9, "{bytes} B: {}", at(bytes));
        }
        assert!((at(1 << 30) - 1.0).abs() < 1e-9);
        // Only the links inside a host move; without a curve, nothing does.
        assert_eq!(t.at_size(2048).a.reduce, t.a.reduce);
        let plain = Topology::parse("local,beta=9", 2).expect("parses");
        assert!((plain.at_size(1 << 20).a.intra.bandwidth - 9e9).abs() < 1.0);
        for bad in [
            "local,beta-curve=4096:2/1024:4",
            "local,beta-curve=1024:0",
            "local,beta-curve=1024",
            "cluster,beta-curve=1024:1",
        ] {
            let e = Topology::parse(bad, 2).expect_err(bad);
            assert!(e.contains("beta-curve"), "{bad}: {e}");
        }
    }

    #[test]
    fn namespace_hosts_split_this_machines_ranks() {
        let t = Topology::parse("local,hosts=2,nic=1x0.25", 8).expect("parses");
        assert_eq!((t.hosts, t.per_host), (2, 4));
        assert!((t.a.nic.bandwidth - 0.25e9).abs() < 1.0);
        // The core's cost of a TCP byte stays TCP's, not the shaped wire's.
        assert!(t.nic_cpu > 1e9, "{}", t.nic_cpu);
        assert!(!t.fabric().one_host && t.fabric().shm_inside_hosts);
        let e = Topology::parse("local,hosts=3", 8).expect_err("8 ranks on 3 hosts");
        assert!(e.contains("3 hosts"), "{e}");
    }

    #[test]
    fn specs_parse_and_bad_ones_name_the_key() {
        let t = Topology::parse("cluster,per-host=4,nic=2x25@5,leaf=8", 64).expect("parses");
        assert_eq!((t.hosts, t.per_host, t.nics, t.leaf), (16, 4, 2, 8));
        assert_eq!(t.a.nic.bandwidth, 25e9);
        assert!((t.a.nic.alpha - 5e-6).abs() < 1e-12);
        let l = Topology::parse("local,transport=tcp", 4).expect("parses");
        assert_eq!((l.hosts, l.per_host, l.shared_memory), (1, 4, false));
        for (bad, names) in [
            ("cluster,nic=8", "nic=8"),
            ("cluster,reduce=-1", "reduce=-1"),
            ("cluster,reduce=inf", "reduce=inf"),
            ("cluster,speed=3", "speed"),
            ("cluster,per-host=3", "hosts of 3"),
            ("cluster,b-share=2", "b-share=2"),
        ] {
            let e = Topology::parse(bad, 64).expect_err(bad);
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn the_second_vendor_is_spread_evenly() {
        let t = Topology::parse("cluster,b-share=0.5,b-reduce=100", 64).expect("parses");
        let b: Vec<bool> = (0..t.hosts).map(|h| t.is_b(h)).collect();
        assert_eq!(b.iter().filter(|x| **x).count(), 4);
        assert!(b.windows(2).all(|w| w[0] != w[1]), "{b:?}");
        assert_eq!(t.vendor_period(), 2);
        assert!(t.fabric().mixed_speeds);
        let q = Topology::parse("cluster,b-share=0.25", 64).expect("parses");
        assert_eq!((0..q.hosts).filter(|&h| q.is_b(h)).count(), 2);
        assert_eq!(q.vendor_period(), 4);
    }
}
