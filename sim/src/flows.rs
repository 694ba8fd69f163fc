//! Flows sharing resources, max-min fair, in virtual time: the network half of the simulator.
//!
//! A resource is anything with a capacity per second (a link direction, a NIC, a switch
//! uplink, a device's reduce engine). A flow moves `bytes` and, at rate `r` bytes/s, uses
//! `r · coef` of each resource on its path. Rates are max-min fair (progressive filling:
//! raise every unfrozen flow's rate together until some resource is full, freeze the flows
//! through it, repeat). No clock is read here: the caller asks when the next flow ends and
//! advances virtual time to it.
//!
//! Cost per event, so that 10k-rank runs stay fast: max-min rates split over connected
//! components (flows linked by the resources they share), so when a flow starts or ends only
//! its component is recomputed; a flow's bytes are brought up to date only when its rate
//! changes (each flow keeps the time of its last rate), and flows' ends wait in a heap, where
//! an end made stale by a new rate is skipped. Max-min rates depend only on the flows' paths,
//! so a flow started over the path of one that just ended takes its rate and nothing is
//! recomputed: the next slice of a message queued behind the last one.
//!
//! At 100k ranks one component can hold most flows (the NICs of a pipelined
//! halving-doubling link them), so a change is first settled where it happened: rates kept
//! (new flows given what their paths have left) where every flow it touches still has a
//! bottleneck (a full resource where no flow runs faster: the definition of max-min fair
//! rates). Else rates are recomputed only above the level at which the change can first
//! matter: progressive filling freezes flows in order of rate, and below the lowest of (the
//! rates of the flows that ended, the levels at which the changed resources now fill) it
//! runs as before, so the flows frozen there keep their rates and are held; only the flows
//! above it that the change reaches are filled again (see `Flows::fill_level`). A test holds
//! the rates and ends to the definition's through random changes.

use crate::fast_hash::FastMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A resource's index.
pub type ResourceId = usize;
/// A flow's handle, stable while it runs.
pub type FlowId = usize;

/// The most resources a flow's path may hold (a message between pods: two NICs, two leaf
/// and two pod uplinks, the sender's device and cores).
pub const MAX_PATH: usize = 8;

/// The resources a flow uses, with the units each byte costs there: held inline, as runs of
/// 10k ranks start millions of flows and a heap allocation each cost more than their rates.
/// The resources come first, in 32 bits: finding a component reads only them, one cache line
/// a flow.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Route {
    ids: [u32; MAX_PATH],
    coefs: [f64; MAX_PATH],
    len: u32,
}

impl Route {
    pub fn new() -> Self {
        Route {
            ids: [0; MAX_PATH],
            coefs: [0.0; MAX_PATH],
            len: 0,
        }
    }

    /// Add a resource used at `coef` units per byte; panics past [`MAX_PATH`] (a topology
    /// this model does not have) or past 2^32 resources.
    pub fn push(&mut self, resource: ResourceId, coef: f64) {
        let k = self.len as usize;
        assert!(k < MAX_PATH, "a path of more than {MAX_PATH} resources");
        assert!(resource <= u32::MAX as usize, "more than 2^32 resources");
        self.ids[k] = resource as u32;
        self.coefs[k] = coef;
        self.len += 1;
    }

    /// The resources, in the order pushed.
    pub fn resources(&self) -> impl Iterator<Item = ResourceId> + '_ {
        self.ids[..self.len as usize].iter().map(|&r| r as usize)
    }

    /// (resource, units per byte), in the order pushed.
    pub fn uses(&self) -> impl Iterator<Item = (ResourceId, f64)> + '_ {
        self.resources().zip(self.coefs.iter().copied())
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// The route as a map key: its resources and the bits of their coefficients (the places
    /// past `len` are zero in every route, as `new` left them).
    fn key(&self) -> RouteKey {
        (self.len, self.ids, self.coefs.map(f64::to_bits))
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Route {
    fn default() -> Self {
        Route::new()
    }
}

impl From<&[(ResourceId, f64)]> for Route {
    fn from(uses: &[(ResourceId, f64)]) -> Self {
        let mut r = Route::new();
        for &(id, c) in uses {
            r.push(id, c);
        }
        r
    }
}

impl<const N: usize> From<[(ResourceId, f64); N]> for Route {
    fn from(uses: [(ResourceId, f64); N]) -> Self {
        Route::from(&uses[..])
    }
}

/// A [`Route`] as a map key: its length, resources and coefficients' bits.
type RouteKey = (u32, [u32; MAX_PATH], [u64; MAX_PATH]);

/// The route first (see [`Route`]).
#[derive(Clone, Debug)]
#[repr(C)]
struct Flow {
    path: Route,
    /// Bytes left at `stamp`.
    remaining: f64,
    stamp: f64,
    rate: f64,
    /// Start order: flows that end together are reported in it.
    seq: u64,
    /// Bumped at every new rate: a heap entry with an older one is stale.
    version: u64,
    /// The rate before the last computation began (its end stands if the rate is unchanged).
    before: f64,
    live: bool,
}

impl Flow {
    /// Units of resource `q` a byte of this flow costs (nothing if `q` is not on its path).
    fn coef(&self, q: ResourceId) -> f64 {
        (self.path.uses().find(|&(r, _)| r == q)).map_or(0.0, |(_, c)| c)
    }

    /// What this flow uses of resource `q` at its rate.
    fn use_of(&self, q: ResourceId) -> f64 {
        self.coef(q) * self.rate
    }
}

/// An expected end: (time as ordered bits, start order, flow, version).
type End = Reverse<(u64, u64, FlowId, u64)>;

/// The resources and the flows running over them.
#[derive(Clone, Debug, Default)]
pub struct Flows {
    capacity: Vec<f64>,
    /// Live flows through each resource.
    users: Vec<Vec<FlowId>>,
    flows: Vec<Flow>,
    free: Vec<FlowId>,
    /// Ended at the last `advance`: reused only from the next, so the caller can handle them
    /// all (and start new flows) before an id comes back.
    retired: Vec<FlowId>,
    running: usize,
    now: f64,
    seq: u64,
    /// Resources whose set of flows changed since rates were last computed.
    dirty: Vec<ResourceId>,
    /// Paths of flows ended since rates were last computed, with the rate flows over each ran
    /// at (max-min gives flows over the same path the same rate) and how many ended: a flow
    /// started over one of them before then takes a place (see the module's doc); the rest make
    /// their resources dirty when rates are next computed.
    vacated: FastMap<RouteKey, (f64, usize)>,
    /// Rate computations so far (each over one or more components).
    computations: u64,
    /// How changes to the flows were settled (see [`RateStats`]).
    stats: RateStats,
    ends: BinaryHeap<End>,
    // Scratch of the rate computation, kept to avoid allocating per event.
    epoch: u64,
    res_mark: Vec<u64>,
    flow_mark: Vec<u64>,
    left: Vec<f64>,
    weight: Vec<f64>,
    /// Unfrozen flows through each resource while rates are computed.
    unfrozen: Vec<usize>,
    /// (rate, units per byte) of a resource's flows while its fill level is found.
    levels: Vec<(f64, f64)>,
}

/// How the changes to the flows were settled (`bcl-sim --rate-stats`): what the cost of a
/// run's rate computations follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateStats {
    /// Moments at which the flows had changed (starts and ends settled together).
    pub changes: u64,
    /// Changes that kept every rate, checked locally.
    pub kept: u64,
    /// Changes for which rates were computed (above the change's level), the flows those
    /// computations filled, and the flows they held (below the level, on resources shared
    /// with flows filled).
    pub computed: u64,
    pub computed_flows: u64,
    pub held: u64,
}

/// A load within this fraction of a capacity is full, and a rate within it of the top rate
/// on a resource is the top (rounding leaves them so); see `Flows::has_bottleneck`.
const EPS: f64 = 1e-9;

/// Below this many bytes a flow counts as finished (rounding of rate × time).
const DONE: f64 = 1e-6;

impl Flows {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a resource of `capacity` units per second (must be positive and finite).
    pub fn resource(&mut self, capacity: f64) -> ResourceId {
        assert!(
            capacity.is_finite() && capacity > 0.0,
            "resource capacity {capacity} must be positive and finite"
        );
        self.capacity.push(capacity);
        self.users.push(Vec::new());
        self.res_mark.push(0);
        self.left.push(0.0);
        self.weight.push(0.0);
        self.unfrozen.push(0);
        self.capacity.len() - 1
    }

    pub fn capacity(&self, r: ResourceId) -> f64 {
        self.capacity[r]
    }

    /// Start a flow of `bytes` over `path` ((resource, units per byte) pairs, not empty).
    pub fn start(&mut self, bytes: f64, path: impl Into<Route>) -> FlowId {
        let path = path.into();
        debug_assert!(!path.is_empty(), "a flow needs a resource");
        self.seq += 1;
        let flow = Flow {
            remaining: bytes.max(0.0),
            stamp: self.now,
            path,
            rate: 0.0,
            live: true,
            seq: self.seq,
            version: 0,
            before: -1.0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                let version = self.flows[id].version + 1;
                self.flows[id] = Flow { version, ..flow };
                id
            }
            None => {
                self.flows.push(flow);
                self.flow_mark.push(0);
                self.flows.len() - 1
            }
        };
        let key = path.key();
        let rate = match self.vacated.get_mut(&key) {
            Some((rate, left)) if *left > 0 && *rate > 0.0 => {
                *left -= 1;
                Some(*rate)
            }
            _ => None,
        };
        match rate {
            Some(rate) => {
                // The same paths as before: every rate stands, this flow runs at the rate of
                // the one it replaces.
                let f = &mut self.flows[id];
                (f.rate, f.before) = (rate, rate);
                let end = if f.remaining <= DONE {
                    self.now
                } else {
                    self.now + f.remaining / rate
                };
                self.ends
                    .push(Reverse((end.to_bits(), f.seq, id, f.version)));
                for r in path.resources() {
                    self.users[r].push(id);
                }
            }
            None => {
                for r in path.resources() {
                    self.users[r].push(id);
                    self.dirty.push(r);
                }
            }
        }
        self.running += 1;
        id
    }

    pub fn running(&self) -> usize {
        self.running
    }

    /// How many times rates were computed so far.
    pub fn computations(&self) -> u64 {
        self.computations
    }

    pub fn rate(&mut self, id: FlowId) -> f64 {
        self.settle();
        self.flows[id].rate
    }

    /// Seconds until the next flow ends (`None`: no flow runs).
    pub fn next_end(&mut self) -> Option<f64> {
        self.settle();
        while let Some(&Reverse((t, _, id, version))) = self.ends.peek() {
            let f = &self.flows[id];
            if f.live && f.version == version {
                return Some((f64::from_bits(t) - self.now).max(0.0));
            }
            self.ends.pop();
        }
        None
    }

    /// Move virtual time on by `dt` seconds; returns the flows that ended, in start order.
    pub fn advance(&mut self, dt: f64) -> Vec<FlowId> {
        self.settle();
        self.free.append(&mut self.retired);
        self.now += dt.max(0.0);
        let mut ended = Vec::new();
        while let Some(&Reverse((t, _, id, version))) = self.ends.peek() {
            let f = &self.flows[id];
            if !(f.live && f.version == version) {
                self.ends.pop();
                continue;
            }
            // A flow whose rest would take under a picosecond (or is under DONE bytes) ends
            // now: otherwise float rounding leaves slivers that cost an event each.
            let rest = f64::from_bits(t) - self.now;
            if rest > 1e-12 && rest * f.rate > DONE {
                break;
            }
            self.ends.pop();
            ended.push(id);
        }
        ended.sort_by_key(|&id| self.flows[id].seq);
        for &id in &ended {
            let f = &mut self.flows[id];
            f.live = false;
            f.remaining = 0.0;
            for r in f.path.resources() {
                let users = &mut self.users[r];
                if let Some(k) = users.iter().position(|&u| u == id) {
                    users.swap_remove(k);
                }
            }
            self.vacated.entry(f.path.key()).or_insert((f.rate, 0)).1 += 1;
        }
        self.running -= ended.len();
        self.retired.extend(&ended);
        ended
    }

    /// Recompute the max-min fair rates of the flows linked to a resource whose flows changed:
    /// first without moving a rate, else above the level where the change first matters.
    fn settle(&mut self) {
        // Paths left with no flow to take them: their flows' shares go to the others.
        let mut ended_lowest = f64::INFINITY;
        if !self.vacated.is_empty() {
            for ((len, ids, _), (rate, left)) in self.vacated.drain() {
                if left > 0 {
                    ended_lowest = ended_lowest.min(rate);
                    self.dirty
                        .extend(ids[..len as usize].iter().map(|&r| r as usize));
                }
            }
        }
        if self.dirty.is_empty() {
            return;
        }
        self.stats.changes += 1;
        if self.settle_locally() {
            self.dirty.clear();
            self.stats.kept += 1;
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        let mut floor = ended_lowest;
        for &r in &dirty {
            floor = floor.min(self.fill_level(r));
        }
        self.compute(&dirty, floor);
    }

    /// The level at which resource `r` fills now, if its flows that have rates keep them up
    /// to there and its new flows rise from zero (progressive filling over `r` alone).
    ///
    /// Why the flows below [`Flows::settle`]'s floor keep their rates: progressive filling
    /// raises every unfrozen flow together and freezes a flow when a resource on its path
    /// fills. Before and after a change it runs alike until a resource whose flows changed
    /// fills, or a flow that ended would have frozen (its old rate). The changed resources
    /// filled no lower than the ended flows' rates before the change (each of those ran
    /// until its bottleneck filled), and fill at this level after it; below the least of
    /// these, every flow freezes where it did. Rounding can only lower the result.
    fn fill_level(&mut self, r: ResourceId) -> f64 {
        let mut users = std::mem::take(&mut self.levels);
        users.clear();
        users.extend(self.users[r].iter().map(|&h| {
            let f = &self.flows[h];
            // A flow never given a rate rises from zero with the level.
            let rate = if f.before < 0.0 {
                f64::INFINITY
            } else {
                f.rate
            };
            (rate, f.coef(r))
        }));
        users.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut used, mut weight) = (0.0, users.iter().map(|u| u.1).sum::<f64>());
        let mut fills = f64::INFINITY;
        for &(rate, c) in &users {
            if weight <= 0.0 {
                break;
            }
            // The level at which r fills with the flows below this one frozen at their rates.
            let level = (self.capacity[r] - used).max(0.0) / weight;
            if level <= rate * (1.0 + EPS) {
                fills = level.min(rate) * (1.0 - EPS);
                break;
            }
            used += rate * c;
            weight -= c;
        }
        self.levels = users;
        fills
    }

    /// Max-min rates for the flows reachable from `dirty` through flows that run at `floor`
    /// or above, or have no rate yet; flows below it keep theirs (see [`Flows::fill_level`])
    /// and their use is taken off the capacity of the resources they share with those filled.
    /// With the held flows at their final rates, filling the others alone gives the same
    /// rates as filling the whole component: max-min fair rates are the unique feasible rates
    /// in which every flow has a bottleneck, and the whole component's satisfy that for the
    /// part filled.
    fn compute(&mut self, dirty: &[ResourceId], floor: f64) {
        self.computations += 1;
        self.stats.computed += 1;
        self.epoch += 1;
        let epoch = self.epoch;
        let rising = |f: &Flow| f.before < 0.0 || f.rate >= floor * (1.0 - EPS);
        // The flows to fill: reachable from the changed resources through flows at or above
        // the floor; `res`: the resources on their paths, where held flows' use is counted.
        let (mut res, mut comp) = (Vec::new(), Vec::new());
        let mut stack = dirty.to_vec();
        while let Some(r) = stack.pop() {
            if self.res_mark[r] == epoch {
                continue;
            }
            self.res_mark[r] = epoch;
            res.push(r);
            for &id in &self.users[r] {
                if self.flow_mark[id] == epoch || !rising(&self.flows[id]) {
                    continue;
                }
                self.flow_mark[id] = epoch;
                comp.push(id);
                for q in self.flows[id].path.resources() {
                    if self.res_mark[q] != epoch {
                        stack.push(q);
                    }
                }
            }
        }
        self.stats.computed_flows += comp.len() as u64;
        // What the held flows use of each resource is not there to fill.
        let now = self.now;
        for &r in &res {
            let mut held = 0.0;
            for &h in self.users[r]
                .iter()
                .filter(|&&h| self.flow_mark[h] != epoch)
            {
                held += self.flows[h].use_of(r);
                self.stats.held += 1;
            }
            self.left[r] = self.capacity[r] - held;
            self.weight[r] = 0.0;
            self.unfrozen[r] = 0;
        }
        // Bring the filled flows' bytes up to now, at the rates they had.
        for &id in &comp {
            let f = &mut self.flows[id];
            f.remaining = (f.remaining - f.rate * (now - f.stamp)).max(0.0);
            f.stamp = now;
            f.before = f.rate;
            f.rate = 0.0;
            for (r, c) in f.path.uses() {
                self.weight[r] += c;
                self.unfrozen[r] += 1;
            }
        }
        // Progressive filling, a resource at a time: every unfrozen flow runs at the same
        // level, so resource r fills at level left[r] / weight[r] (left: its capacity less
        // what frozen and held flows use). Take the resource that fills first, freeze the
        // flows through it at that level, update the resources on their paths; a heap keeps
        // the next (an entry below its resource's level now goes back in, see below), so the
        // cost grows with the flows filled and their paths, not with them times the number
        // of levels.
        let fills = |left: f64, weight: f64| (left.max(0.0) / weight).to_bits();
        let mut heap: BinaryHeap<Reverse<(u64, ResourceId)>> = res
            .iter()
            .filter(|&&r| self.weight[r] > 0.0)
            .map(|&r| Reverse((fills(self.left[r], self.weight[r]), r)))
            .collect();
        let frozen = epoch.wrapping_neg();
        let mut level = 0.0;
        while let Some(Reverse((bits, r))) = heap.pop() {
            if self.unfrozen[r] == 0 {
                continue;
            }
            // Freezing flows at the lowest level only raises the level at which the other
            // resources on their paths fill ((left − L·c)/(weight − c) ≥ left/weight when
            // L ≤ left/weight), so an entry is a lower bound: one whose resource has moved
            // up goes back in at its level now, instead of an entry per update.
            let now_fills = fills(self.left[r], self.weight[r]);
            if now_fills != bits {
                if self.weight[r] > 0.0 {
                    heap.push(Reverse((now_fills, r)));
                }
                continue;
            }
            level = f64::from_bits(bits);
            for k in 0..self.users[r].len() {
                let id = self.users[r][k];
                // Frozen already, or held below the floor.
                if self.flow_mark[id] != epoch {
                    continue;
                }
                self.flow_mark[id] = frozen;
                self.flows[id].rate = level;
                for (q, c) in self.flows[id].path.uses() {
                    self.left[q] -= level * c;
                    self.weight[q] -= c;
                    self.unfrozen[q] -= 1;
                }
            }
        }
        // A flow with no positive use of any resource is not held back by one.
        for &id in &comp {
            if self.flow_mark[id] != frozen {
                self.flows[id].rate = level;
            }
        }
        for id in comp {
            let f = &mut self.flows[id];
            // Same rate, same end: the heap's entry stands (a large component would
            // otherwise fill the heap with stale ends at every event).
            if f.rate == f.before && f.rate > 0.0 && f.remaining > DONE {
                continue;
            }
            f.version += 1;
            if f.remaining <= DONE {
                self.ends
                    .push(Reverse((now.to_bits(), f.seq, id, f.version)));
            } else if f.rate > 0.0 {
                let t = now + f.remaining / f.rate;
                self.ends.push(Reverse((t.to_bits(), f.seq, id, f.version)));
            }
        }
    }

    /// Keep every running flow's rate and give each new flow what its path has left, where
    /// that is still max-min fair; checked on the changed resources' flows only, so a change
    /// that moves no rate costs its neighbourhood, not its component (at 100k ranks the NICs
    /// of a pipelined halving-doubling link most flows into one component). Max-min fair
    /// rates are the feasible rates in which every flow has a bottleneck: a full resource
    /// on its path where no flow runs faster. Flows off the changed resources keep theirs
    /// (their resources' loads and rates are as before), so checking the flows on them
    /// proves the whole allocation. Within `1e-9` of a full resource or a top rate counts
    /// as one, as rounding leaves them. False (nothing changed) where the check fails or the
    /// neighbourhood is large: rates are then computed around the change, or over the whole
    /// component.
    fn settle_locally(&mut self) -> bool {
        const MOST: usize = 256;
        self.epoch += 1;
        let epoch = self.epoch;
        let (mut touched, mut fresh) = (Vec::new(), Vec::new());
        for k in 0..self.dirty.len() {
            let r = self.dirty[k];
            if self.res_mark[r] == epoch {
                continue;
            }
            self.res_mark[r] = epoch;
            for &id in &self.users[r] {
                if self.flow_mark[id] == epoch {
                    continue;
                }
                self.flow_mark[id] = epoch;
                let f = &self.flows[id];
                if f.path.uses().any(|(_, c)| c <= 0.0) || touched.len() == MOST {
                    return false;
                }
                touched.push(id);
                // A flow never given a rate (`before` is set at every computation).
                if f.before < 0.0 {
                    fresh.push(id);
                }
            }
        }
        // New flows in start order, each the least its path has left after those before.
        fresh.sort_by_key(|&id| self.flows[id].seq);
        let mut ok = true;
        for &id in &fresh {
            let path = self.flows[id].path;
            let rate = (path.uses())
                .map(|(q, c)| (self.capacity[q] - self.load(q)) / c)
                .fold(f64::INFINITY, f64::min);
            if !(rate > 0.0 && rate.is_finite()) {
                ok = false;
                break;
            }
            self.flows[id].rate = rate;
        }
        ok = ok
            && touched.iter().all(|&id| self.has_bottleneck(id))
            && (self.dirty.iter()).all(|&q| self.load(q) <= self.capacity[q] * (1.0 + EPS));
        if !ok {
            for &id in &fresh {
                self.flows[id].rate = 0.0;
            }
            return false;
        }
        let now = self.now;
        for &id in &fresh {
            let f = &mut self.flows[id];
            f.before = f.rate;
            let end = if f.remaining <= DONE {
                now
            } else {
                now + f.remaining / f.rate
            };
            self.ends
                .push(Reverse((end.to_bits(), f.seq, id, f.version)));
        }
        true
    }

    /// What the running flows use of resource `q` at their rates.
    fn load(&self, q: ResourceId) -> f64 {
        (self.users[q].iter())
            .map(|&h| self.flows[h].use_of(q))
            .sum()
    }

    /// Whether flow `id` runs and has a bottleneck: a full resource on its path where no
    /// flow runs faster (within [`EPS`], as rounding leaves them).
    fn has_bottleneck(&self, id: FlowId) -> bool {
        let f = &self.flows[id];
        f.rate > 0.0
            && f.path.resources().any(|q| {
                self.load(q) >= self.capacity[q] * (1.0 - EPS)
                    && (self.users[q].iter()).all(|&h| self.flows[h].rate <= f.rate * (1.0 + EPS))
            })
    }

    /// How the changes so far were settled.
    pub fn stats(&self) -> RateStats {
        self.stats
    }

    /// Whether `id` still runs.
    pub fn is_live(&self, id: FlowId) -> bool {
        self.flows.get(id).is_some_and(|f| f.live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn one_flow_takes_bytes_over_capacity() {
        let mut f = Flows::new();
        let link = f.resource(100.0);
        f.start(1000.0, [(link, 1.0)]);
        let t = f.next_end().expect("a flow runs");
        assert!(close(t, 10.0), "{t}");
        assert_eq!(f.advance(t).len(), 1);
        assert_eq!(f.running(), 0);
    }

    #[test]
    fn max_min_gives_the_unconstrained_flow_the_rest() {
        // Classic example: link a (cap 10) carries flows 1 and 2, link b (cap 4) carries
        // flows 2 and 3. Max-min: flows 2 and 3 get 2 each on b, flow 1 gets 10 - 2 = 8.
        let mut f = Flows::new();
        let a = f.resource(10.0);
        let b = f.resource(4.0);
        let f1 = f.start(1e9, [(a, 1.0)]);
        let f2 = f.start(1e9, [(a, 1.0), (b, 1.0)]);
        let f3 = f.start(1e9, [(b, 1.0)]);
        assert!(close(f.rate(f1), 8.0));
        assert!(close(f.rate(f2), 2.0));
        assert!(close(f.rate(f3), 2.0));
    }

    #[test]
    fn coefficients_scale_use_and_rates_rise_when_a_flow_ends() {
        let mut f = Flows::new();
        let cpu = f.resource(2.0);
        // Each byte costs 0.5 units: one flow alone runs at 4 bytes/s.
        let short = f.start(4.0, [(cpu, 0.5)]);
        let long = f.start(100.0, [(cpu, 0.5)]);
        assert!(close(f.rate(short), 2.0) && close(f.rate(long), 2.0));
        let t = f.next_end().expect("flows run");
        assert!(close(t, 2.0));
        assert_eq!(f.advance(t), vec![short]);
        assert!(close(f.rate(long), 4.0));
        assert!(f.is_live(long) && !f.is_live(short));
    }

    #[test]
    fn a_flow_keeps_its_bytes_while_other_components_change() {
        // a (cap 10) carries `long` alone for 2 s while `other` runs on b; then `short`
        // joins a: both at 5/s until `short` (10 bytes) ends at 4 s, `long` with 100 - 20 -
        // 10 = 70 left then runs at 10/s again and ends at 11 s.
        let mut f = Flows::new();
        let a = f.resource(10.0);
        let b = f.resource(1.0);
        let long = f.start(100.0, [(a, 1.0)]);
        let other = f.start(2.0, [(b, 1.0)]);
        let mut now = 0.0;
        let mut step = |f: &mut Flows| {
            let dt = f.next_end().expect("flows run");
            now += dt;
            (now, f.advance(dt))
        };
        let (t, ended) = step(&mut f);
        assert!(close(t, 2.0) && ended == vec![other], "{t} {ended:?}");
        let short = f.start(10.0, [(a, 1.0)]);
        assert!(close(f.rate(long), 5.0) && close(f.rate(short), 5.0));
        let (t, ended) = step(&mut f);
        assert!(close(t, 4.0) && ended == vec![short], "{t} {ended:?}");
        let (t, ended) = step(&mut f);
        assert!(close(t, 11.0) && ended == vec![long], "{t} {ended:?}");
        assert_eq!(f.running(), 0);
        assert!(f.next_end().is_none());
    }

    #[test]
    fn a_flow_in_the_place_of_one_just_ended_runs_at_its_rate_without_a_computation() {
        // a (cap 10) carries x and y, b (cap 4) carries y and z: x 8, y 2, z 2 (as above).
        // x ends at 1 s; x2 starts over x's path: every rate stands and none is computed.
        // When z and x2 end with nothing to take their places, y's rate is computed anew.
        let build = || {
            let mut f = Flows::new();
            let a = f.resource(10.0);
            let b = f.resource(4.0);
            (f, a, b)
        };
        let (mut f, a, b) = build();
        let x = f.start(8.0, [(a, 1.0)]);
        let y = f.start(1e3, [(a, 1.0), (b, 1.0)]);
        let z = f.start(6.0, [(b, 1.0)]);
        let dt = f.next_end().expect("flows run");
        assert!(close(dt, 1.0), "{dt}");
        assert_eq!(f.advance(dt), vec![x]);
        let computed = f.computations();
        let x2 = f.start(16.0, [(a, 1.0)]);
        assert!(close(f.rate(x2), 8.0) && close(f.rate(y), 2.0) && close(f.rate(z), 2.0));
        assert_eq!(
            f.computations(),
            computed,
            "a flow in another's place computed rates"
        );
        // The same flows started afresh have the same rates.
        let (mut g, a2, b2) = build();
        let fresh = [
            g.start(16.0, [(a2, 1.0)]),
            g.start(1e3, [(a2, 1.0), (b2, 1.0)]),
            g.start(4.0, [(b2, 1.0)]),
        ];
        let rates = fresh.map(|id| g.rate(id));
        assert!(close(rates[0], 8.0) && close(rates[1], 2.0) && close(rates[2], 2.0));
        // z (4 left at 2/s) ends at 3 s, x2 (16 at 8/s) too: y alone then runs at 4.
        let dt = f.next_end().expect("flows run");
        assert!(close(dt, 2.0), "{dt}");
        let mut ended = f.advance(dt);
        ended.sort();
        let mut both = vec![z, x2];
        both.sort();
        assert_eq!(ended, both);
        assert!(close(f.rate(y), 4.0), "{}", f.rate(y));
        assert!(f.computations() > computed);
        // A flow over a path none vacated is computed as ever.
        let w = f.start(1e3, [(a, 1.0)]);
        assert!(close(f.rate(w), 6.0) && close(f.rate(y), 4.0));
    }

    /// Max-min rates by their definition, for the test below: raise every unfrozen flow
    /// together; at the lowest level some resource fills, its flows freeze there; repeat.
    fn max_min(caps: &[f64], flows: &[Vec<(usize, f64)>]) -> Vec<f64> {
        let mut rate = vec![0.0; flows.len()];
        let mut frozen = vec![false; flows.len()];
        while frozen.iter().any(|f| !f) {
            let level = |r: usize| {
                let (mut used, mut weight) = (0.0, 0.0);
                for (i, path) in flows.iter().enumerate() {
                    for &(_, c) in path.iter().filter(|(q, _)| *q == r) {
                        if frozen[i] {
                            used += c * rate[i];
                        } else {
                            weight += c;
                        }
                    }
                }
                (weight > 0.0).then(|| (caps[r] - used).max(0.0) / weight)
            };
            let levels: Vec<Option<f64>> = (0..caps.len()).map(level).collect();
            let low = levels
                .iter()
                .flatten()
                .fold(f64::INFINITY, |a, &b| a.min(b));
            for (i, path) in flows.iter().enumerate() {
                if !frozen[i]
                    && path
                        .iter()
                        .any(|&(q, _)| levels[q].is_some_and(|l| l <= low))
                {
                    frozen[i] = true;
                    rate[i] = low;
                }
            }
        }
        rate
    }

    /// The rates after every change, whichever way they were reached (kept, computed near
    /// the change, or over the whole component), are the definition's: random paths over
    /// a few dozen resources, so components run past the sizes computed near a change.
    #[test]
    fn rates_after_each_change_are_max_min_whichever_way_they_were_reached() {
        let mut next = crate::xorshift::below(0x2545_f491_4f6c_dd1d);
        let mut f = Flows::new();
        let caps: Vec<f64> = (0..48).map(|k| [10.0, 10.0, 25.0, 7.5][k % 4]).collect();
        let res: Vec<ResourceId> = caps.iter().map(|&c| f.resource(c)).collect();
        // Each live flow: its id, path and bytes left by the definition's rates.
        type Path = Vec<(usize, f64)>;
        let mut live: Vec<(FlowId, Path, f64)> = Vec::new();
        let mut checked = 0;
        for round in 0..1500 {
            if live.len() > 20 && (live.len() > 400 || next(3) == 0) {
                // Time moves to the next end: the flows the definition's rates run out
                // then are the ones that end.
                let paths: Vec<Path> = live.iter().map(|l| l.1.clone()).collect();
                let want = max_min(&caps, &paths);
                let first = (live.iter().zip(&want))
                    .map(|(l, w)| l.2 / w)
                    .fold(f64::INFINITY, f64::min);
                let dt = f.next_end().expect("flows run");
                assert!(
                    (dt - first).abs() <= 1e-6 * first,
                    "round {round}: next end {dt}, {first}"
                );
                let ended = f.advance(dt);
                for (l, w) in live.iter_mut().zip(&want) {
                    l.2 -= w * dt;
                    let out = ended.contains(&l.0);
                    assert!(out || l.2 > 1e-6, "round {round}: flow {} ran out", l.0);
                    assert!(
                        !out || l.2 < 1e-3,
                        "round {round}: flow {} ended early",
                        l.0
                    );
                }
                live.retain(|l| !ended.contains(&l.0));
            } else {
                let hops = 1 + next(3) as usize;
                let mut path: Vec<(usize, f64)> = Vec::new();
                while path.len() < hops {
                    let r = next(res.len() as u64) as usize;
                    if path.iter().all(|&(q, _)| q != r) {
                        path.push((r, [1.0, 1.0, 0.5, 2.0][next(4) as usize]));
                    }
                }
                let route: Vec<(ResourceId, f64)> =
                    path.iter().map(|&(r, c)| (res[r], c)).collect();
                let bytes = 1.0 + next(1000) as f64;
                let id = f.start(bytes, &route[..]);
                live.push((id, path, bytes));
            }
            if round % 3 == 0 {
                let paths: Vec<Path> = live.iter().map(|l| l.1.clone()).collect();
                let want = max_min(&caps, &paths);
                for ((id, _, _), w) in live.iter().zip(&want) {
                    let got = f.rate(*id);
                    assert!(
                        (got - w).abs() <= 1e-6 * w.max(1.0),
                        "round {round}: flow {id} at {got}, max-min {w}"
                    );
                }
                checked += 1;
            }
        }
        // Every way of settling ran: rates kept, and computed with flows held below the
        // change's level.
        let stats = f.stats();
        assert!(
            checked > 400 && stats.kept > 0 && stats.computed > 0 && stats.held > 0,
            "{checked} checks, {stats:?}"
        );
        assert!(
            live.len() > 64,
            "components large enough: {} flows",
            live.len()
        );
    }
}
