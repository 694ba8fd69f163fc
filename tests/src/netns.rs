//! Test "hosts" made of network namespaces (they need root; CI runs as root): three
//! namespaces meshed pairwise by veth pairs, each with one address, removed on drop.

use std::process::Command;

/// Run `ip` with `args`; fail the test loudly if it cannot.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run `ip` (install iproute2; this test needs root): {e}")
    });
    assert!(
        out.status.success(),
        "ip {} failed (this test needs root): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces in a full mesh of veth pairs; removed on drop.
#[derive(Debug)]
pub struct Mesh {
    pub namespaces: Vec<String>,
    /// Unique among the meshes of this process: the pid, then a counter.
    id: String,
}

static MESHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Mesh {
    pub fn address(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    pub fn veth(&self, from: usize, to: usize) -> String {
        format!("b{}_{from}{to}", self.id)
    }

    pub fn create() -> Mesh {
        let n = MESHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let id = format!("{}{n}", std::process::id());
        let mesh = Mesh {
            namespaces: (0..3).map(|i| format!("bcl{id}n{i}")).collect(),
            id,
        };
        for (i, ns) in mesh.namespaces.iter().enumerate() {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/32", Mesh::address(i)),
                "dev",
                "lo",
            ]);
        }
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let (a, b) = (mesh.veth(i, j), mesh.veth(j, i));
            let (na, nb) = (&mesh.namespaces[i], &mesh.namespaces[j]);
            ip(&[
                "link", "add", &a, "netns", na, "type", "veth", "peer", "name", &b, "netns", nb,
            ]);
            for (ns, dev, me, peer) in [(na, &a, i, j), (nb, &b, j, i)] {
                ip(&["-n", ns, "link", "set", dev, "up"]);
                ip(&[
                    "-n",
                    ns,
                    "route",
                    "add",
                    &format!("{}/32", Mesh::address(peer)),
                    "dev",
                    dev,
                    "src",
                    &Mesh::address(me),
                ]);
            }
        }
        mesh
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Test "hosts" as a cluster: `hosts` namespaces, each with one veth ("NIC") into a bridge
/// (the "switch") in a namespace of its own, addresses 10.78.X.(i+1)/24; removed on drop.
/// With a rate, every host's NIC sends at most that (`tc tbf` on its egress), so each
/// host's traffic to all the others shares one shaped link, as with one NIC per host.
/// [`Cluster::with_nics`] gives each host several NICs into the same switch, NIC k on subnet
/// 10.(78+k).X.0/24, each shaped alone: a rank bound to NIC k's address reaches the others'
/// NIC k over it (a rail per NIC, as on a rail-optimised cluster).
#[derive(Debug)]
pub struct Cluster {
    pub namespaces: Vec<String>,
    switch: String,
    subnet: usize,
    nics: usize,
}

impl Cluster {
    pub fn create(hosts: usize, rate: Option<&str>) -> Cluster {
        Self::with_nics(hosts, 1, rate)
    }

    /// `hosts` namespaces of `nics` NICs each (named `nic` when one, else `nic0`, `nic1`, ...).
    pub fn with_nics(hosts: usize, nics: usize, rate: Option<&str>) -> Cluster {
        let n = MESHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let id = format!("{}{n}", std::process::id());
        let cluster = Cluster {
            namespaces: (0..hosts).map(|i| format!("bcl{id}h{i}")).collect(),
            switch: format!("bcl{id}sw"),
            subnet: 100 + (std::process::id() as usize * 10 + n) % 150,
            nics: nics.max(1),
        };
        let sw = cluster.switch.as_str();
        ip(&["netns", "add", sw]);
        ip(&["-n", sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", sw, "link", "set", "br0", "up"]);
        for (i, ns) in cluster.namespaces.iter().enumerate() {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            for k in 0..cluster.nics {
                let port = format!("p{i}n{k}");
                let nic = cluster.nic(k);
                ip(&[
                    "link", "add", &nic, "netns", ns, "type", "veth", "peer", "name", &port,
                    "netns", sw,
                ]);
                ip(&["-n", sw, "link", "set", &port, "master", "br0"]);
                ip(&["-n", sw, "link", "set", &port, "up"]);
                ip(&["-n", ns, "link", "set", &nic, "up"]);
                let cidr = format!("{}/24", cluster.address_on(i, k));
                ip(&["-n", ns, "addr", "add", &cidr, "dev", &nic]);
                if let Some(rate) = rate {
                    tc(
                        ns,
                        &[
                            "qdisc", "add", "dev", &nic, "root", "tbf", "rate", rate, "burst",
                            "256kb", "latency", "10ms",
                        ],
                    );
                }
            }
        }
        cluster
    }

    /// NICs per host.
    pub fn nics(&self) -> usize {
        self.nics
    }

    /// The name of NIC `k` inside every host.
    pub fn nic(&self, k: usize) -> String {
        if self.nics == 1 {
            "nic".into()
        } else {
            format!("nic{k}")
        }
    }

    /// The address of host `i` (on its first NIC).
    pub fn address(&self, i: usize) -> String {
        self.address_on(i, 0)
    }

    /// The address of host `i` on its NIC `k`.
    pub fn address_on(&self, i: usize, k: usize) -> String {
        format!("10.{}.{}.{}", 78 + k, self.subnet, i + 1)
    }

    /// Bytes host `i` has sent on its NIC `k` so far.
    pub fn tx_bytes(&self, i: usize, k: usize) -> u64 {
        let path = format!("/sys/class/net/{}/statistics/tx_bytes", self.nic(k));
        let out = Command::new("ip")
            .args(["netns", "exec", &self.namespaces[i], "cat", &path])
            .output()
            .unwrap_or_else(|e| panic!("cannot read {path} in {}: {e}", self.namespaces[i]));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{path} in {}: {out:?}", self.namespaces[i]))
    }
}

/// Run `tc args` inside namespace `ns`; fail the test loudly if it cannot.
pub fn tc(ns: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "tc"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `tc` (install iproute2; needs root): {e}"));
    assert!(
        out.status.success(),
        "tc {} in {ns} failed (this test needs root and sch_tbf): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
