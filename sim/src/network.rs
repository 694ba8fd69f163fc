//! A topology as resources of the flow model: each rank's device and its ports inside its
//! host, each host's NICs (send and receive side), the leaf and pod switches' uplinks; and the
//! path and latency of a message between two ranks.
//!
//! In a symmetric run only the first `group` hosts have resources: a rank on host h uses
//! those of host h mod group (and, where only the first `locals` ranks of a host are
//! simulated, local rank i those of local rank i mod `locals`). That is exact when every
//! group of hosts carries the same load at the same time (`engine` checks the plans agree),
//! which the simulator relies on to run 10k-100k ranks by simulating one group.

use crate::flows::{Flows, ResourceId, Route};
use crate::topology::Topology;

/// A message's way through the network.
#[derive(Clone, Debug)]
pub struct Path {
    pub resources: Route,
    /// Seconds from the last byte leaving to its arrival counting as delivered.
    pub alpha: f64,
}

#[derive(Debug)]
pub struct Network {
    pub flows: Flows,
    topo: Topology,
    /// Hosts with resources (all, or one group in a symmetric run).
    group: usize,
    /// Ranks per host with resources (`per_host`, or fewer in a symmetric run).
    locals: usize,
    /// Each rank's device (capacity 1: a byte reduced costs 1/reduce, copied 1/copy).
    dev: Vec<ResourceId>,
    /// Each host's cores, where ranks are CPU threads.
    cpu: Vec<ResourceId>,
    up: Vec<ResourceId>,
    down: Vec<ResourceId>,
    tx: Vec<ResourceId>,
    rx: Vec<ResourceId>,
    /// Per (leaf of the group, plane).
    leaf_up: Vec<ResourceId>,
    leaf_down: Vec<ResourceId>,
    /// Per (pod of the group, plane).
    pod_up: Vec<ResourceId>,
    pod_down: Vec<ResourceId>,
}

impl Network {
    /// The resources of the first `group` hosts of `topo` (`group` = all hosts for an exact
    /// run; otherwise a multiple of the leaf size and of the vendor pattern's period).
    pub fn new(topo: &Topology, group: usize, locals: usize) -> Network {
        let mut flows = Flows::new();
        let (l, nics) = (locals, topo.nics);
        let mut dev = Vec::new();
        let mut cpu = Vec::new();
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for h in 0..group {
            let v = topo.vendor(h);
            // This machine's namespace hosts share its cores.
            if topo.cores > 0 && !(topo.local && h > 0) {
                cpu.push(flows.resource(topo.cores as f64));
            }
            for _ in 0..l {
                dev.push(flows.resource(1.0));
                up.push(flows.resource(v.intra.bandwidth));
                down.push(flows.resource(v.intra.bandwidth));
            }
        }
        let (mut tx, mut rx) = (Vec::new(), Vec::new());
        for h in 0..group {
            let bw = topo.vendor(h).nic.bandwidth;
            for _ in 0..nics {
                tx.push(flows.resource(bw));
                rx.push(flows.resource(bw));
            }
        }
        let planes = if topo.rails { nics } else { 1 };
        let nics_per_plane = nics / planes;
        let leaf = leaf_size(topo);
        let leaves = group.div_ceil(leaf);
        let (mut leaf_up, mut leaf_down) = (Vec::new(), Vec::new());
        for g in 0..leaves {
            let hosts = (g * leaf..((g + 1) * leaf).min(group)).collect::<Vec<_>>();
            let down_bw: f64 = hosts
                .iter()
                .map(|&h| topo.vendor(h).nic.bandwidth * nics_per_plane as f64)
                .sum();
            for _ in 0..planes {
                leaf_up.push(flows.resource(down_bw / topo.oversub));
                leaf_down.push(flows.resource(down_bw / topo.oversub));
            }
        }
        let pod_hosts = pod_size(topo);
        let (mut pod_up, mut pod_down) = (Vec::new(), Vec::new());
        for p in 0..group.div_ceil(pod_hosts) {
            let hosts = (p * pod_hosts..((p + 1) * pod_hosts).min(group)).collect::<Vec<_>>();
            // A group smaller than its pod gets its hosts' share of the pod's uplink.
            let down_bw: f64 = hosts
                .iter()
                .map(|&h| topo.vendor(h).nic.bandwidth * nics_per_plane as f64)
                .sum();
            for _ in 0..planes {
                let cap = down_bw / topo.oversub / topo.pod_oversub;
                pod_up.push(flows.resource(cap));
                pod_down.push(flows.resource(cap));
            }
        }
        Network {
            flows,
            topo: topo.clone(),
            group,
            locals,
            dev,
            cpu,
            up,
            down,
            tx,
            rx,
            leaf_up,
            leaf_down,
            pod_up,
            pod_down,
        }
    }

    fn res_rank(&self, rank: usize) -> usize {
        let l = self.topo.per_host;
        (rank / l % self.group) * self.locals + rank % l % self.locals
    }

    /// What `bytes` of device work on `rank` use per byte: its device (and its host's cores
    /// where ranks are CPU threads), at the reduce speed or the copy speed.
    pub fn work(&self, rank: usize, reduce: bool) -> Route {
        let v = self.topo.vendor(rank / self.topo.per_host);
        let per_byte = 1.0 / if reduce { v.reduce } else { v.copy };
        let mut path = Route::new();
        path.push(self.dev[self.res_rank(rank)], per_byte);
        if self.topo.cores > 0 {
            path.push(self.cpu_of(rank), per_byte);
        }
        path
    }

    fn res_host(&self, rank: usize) -> usize {
        self.res_rank(rank) / self.locals
    }

    /// The cores `rank` runs on: its host's, or this machine's in the `local` model.
    fn cpu_of(&self, rank: usize) -> ResourceId {
        self.cpu[if self.topo.local {
            0
        } else {
            self.res_host(rank)
        }]
    }

    /// Where ranks are CPU threads, the sender's core and its host's cores move the bytes.
    fn sender_cpu(&self, src: usize, bandwidth: f64, path: &mut Route) {
        if self.topo.cores > 0 {
            path.push(self.dev[self.res_rank(src)], 1.0 / bandwidth);
            path.push(self.cpu_of(src), 1.0 / bandwidth);
        }
    }

    /// The way of a message from `src` to `dst` (ranks of the whole cluster).
    pub fn path(&self, src: usize, dst: usize) -> Path {
        let t = &self.topo;
        let (hs, hd) = (src / t.per_host, dst / t.per_host);
        if hs == hd {
            let mut resources = Route::from([
                (self.up[self.res_rank(src)], 1.0),
                (self.down[self.res_rank(dst)], 1.0),
            ]);
            self.sender_cpu(src, t.vendor(hs).intra.bandwidth, &mut resources);
            return Path {
                resources,
                alpha: t.vendor(hs).intra.alpha,
            };
        }
        let nic = |r: usize| r % t.per_host % self.locals % t.nics;
        let (ks, kd) = (nic(src), nic(dst));
        let (gs, gd) = (hs % self.group, hd % self.group);
        let mut resources = Route::from([
            (self.tx[gs * t.nics + ks], 1.0),
            (self.rx[gd * t.nics + kd], 1.0),
        ]);
        let planes = if t.rails { t.nics } else { 1 };
        let (ps, pd) = if t.rails { (ks, kd) } else { (0, 0) };
        let leaf = leaf_size(t);
        // An uplink no more oversubscribed than 1:1 carries at most what the NICs under it
        // send, so it never binds: left out, rates are the same and flows stay in small
        // components of the flow model (which keeps 10k-rank runs fast).
        if (hs / leaf != hd / leaf || ps != pd) && t.oversub > 1.0 {
            resources.push(self.leaf_up[(gs / leaf) * planes + ps], 1.0);
            resources.push(self.leaf_down[(gd / leaf) * planes + pd], 1.0);
        }
        if hs / leaf != hd / leaf || ps != pd {
            let pod = pod_size(t);
            if hs / pod != hd / pod && t.oversub * t.pod_oversub > 1.0 {
                resources.push(self.pod_up[(gs / pod) * planes + ps], 1.0);
                resources.push(self.pod_down[(gd / pod) * planes + pd], 1.0);
            }
        }
        let copy = if t.nic_cpu > 0.0 {
            t.nic_cpu
        } else {
            t.vendor(hs).nic.bandwidth
        };
        self.sender_cpu(src, copy, &mut resources);
        Path {
            resources,
            alpha: t.vendor(hs).nic.alpha.max(t.vendor(hd).nic.alpha),
        }
    }
}

/// Hosts under one leaf switch.
pub fn leaf_size(t: &Topology) -> usize {
    if t.leaf == 0 { t.hosts.max(1) } else { t.leaf }
}

/// Hosts under one pod switch (all of them with two tiers).
pub fn pod_size(t: &Topology) -> usize {
    if t.pod == 0 {
        usize::MAX / 2
    } else {
        leaf_size(t).saturating_mul(t.pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_climb_only_as_far_as_they_must() {
        let t = Topology::parse("cluster,per-host=2,nic=2x10@5,leaf=2,pod=2,oversub=2", 16)
            .expect("spec");
        let net = Network::new(&t, t.hosts, t.per_host);
        // Same host: the two ports.
        assert_eq!(net.path(0, 1).resources.len(), 2);
        // Hosts 0 and 1, same rail: NICs only (one leaf).
        assert_eq!(net.path(0, 2).resources.len(), 2);
        // Across rails inside a leaf: up through the spine.
        assert_eq!(net.path(0, 3).resources.len(), 4);
        // Hosts 0 and 2: another leaf, same pod.
        assert_eq!(net.path(0, 4).resources.len(), 4);
        // Hosts 0 and 4: another pod.
        assert_eq!(net.path(0, 8).resources.len(), 6);
        assert!((net.path(0, 8).alpha - 5e-6).abs() < 1e-12);
        // Without oversubscription the uplinks cannot bind and are left out.
        let flat = Topology::parse("cluster,per-host=2,nic=2x10@5,leaf=2,pod=2", 16).expect("spec");
        let net = Network::new(&flat, flat.hosts, flat.per_host);
        assert_eq!(net.path(0, 8).resources.len(), 2);
    }
}
