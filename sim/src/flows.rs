//! Flows sharing resources, max-min fair, in virtual time: the network half of the simulator.
//!
//! A resource is anything with a capacity per second (a link direction, a NIC, a switch
//! uplink, a device's reduce engine). A flow moves `bytes` and, at rate `r` bytes/s, uses
//! `r · coef` of each resource on its path. Rates are max-min fair (progressive filling:
//! raise every unfrozen flow's rate together until some resource is full, freeze the flows
//! through it, repeat), recomputed only when the set of flows changes. No clock here: the
//! caller asks when the next flow ends and advances time to it.

/// A resource's index.
pub type ResourceId = usize;
/// A flow's handle, stable while it runs.
pub type FlowId = usize;

#[derive(Clone, Debug)]
struct Flow {
    remaining: f64,
    path: Vec<(ResourceId, f64)>,
    rate: f64,
    live: bool,
}

/// The resources and the flows running over them.
#[derive(Clone, Debug, Default)]
pub struct Flows {
    capacity: Vec<f64>,
    flows: Vec<Flow>,
    free: Vec<FlowId>,
    /// Ended at the last `advance`: reused only from the next, so the caller can handle them
    /// all (and start new flows) before an id comes back.
    retired: Vec<FlowId>,
    live: Vec<FlowId>,
    dirty: bool,
    // Scratch of the rate computation, kept to avoid allocating per event.
    left: Vec<f64>,
    weight: Vec<f64>,
}

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
        self.capacity.len() - 1
    }

    pub fn capacity(&self, r: ResourceId) -> f64 {
        self.capacity[r]
    }

    /// Start a flow of `bytes` over `path` ((resource, units per byte) pairs, not empty).
    pub fn start(&mut self, bytes: f64, path: Vec<(ResourceId, f64)>) -> FlowId {
        debug_assert!(!path.is_empty(), "a flow needs a resource");
        let flow = Flow {
            remaining: bytes.max(0.0),
            path,
            rate: 0.0,
            live: true,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.flows[id] = flow;
                id
            }
            None => {
                self.flows.push(flow);
                self.flows.len() - 1
            }
        };
        self.live.push(id);
        self.dirty = true;
        id
    }

    pub fn running(&self) -> usize {
        self.live.len()
    }

    pub fn rate(&mut self, id: FlowId) -> f64 {
        self.settle();
        self.flows[id].rate
    }

    /// Seconds until the next flow ends (`None`: no flow runs).
    pub fn next_end(&mut self) -> Option<f64> {
        self.settle();
        self.live
            .iter()
            .map(|&id| {
                let f = &self.flows[id];
                if f.remaining <= DONE {
                    0.0
                } else {
                    f.remaining / f.rate
                }
            })
            .min_by(f64::total_cmp)
    }

    /// Move every flow on by `dt` seconds; returns the flows that ended, in start order.
    pub fn advance(&mut self, dt: f64) -> Vec<FlowId> {
        self.settle();
        self.free.append(&mut self.retired);
        let mut ended = Vec::new();
        let flows = &mut self.flows;
        self.live.retain(|&id| {
            let f = &mut flows[id];
            f.remaining -= f.rate * dt;
            // A flow whose rest would take under a picosecond ends now: otherwise float
            // rounding leaves slivers that cost an event each.
            if f.remaining <= DONE || f.remaining <= f.rate * 1e-12 {
                f.live = false;
                ended.push(id);
                false
            } else {
                true
            }
        });
        if !ended.is_empty() {
            self.retired.extend(&ended);
            self.dirty = true;
        }
        ended
    }

    /// Recompute the max-min fair rates if the flows changed.
    fn settle(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        let n = self.capacity.len();
        self.left.clear();
        self.left.extend_from_slice(&self.capacity);
        self.weight.clear();
        self.weight.resize(n, 0.0);
        let mut unfrozen: Vec<FlowId> = self.live.clone();
        for &id in &unfrozen {
            self.flows[id].rate = 0.0;
            for &(r, c) in &self.flows[id].path {
                self.weight[r] += c;
            }
        }
        let mut level = 0.0;
        while !unfrozen.is_empty() {
            // The smallest further raise some resource allows.
            let mut step = f64::INFINITY;
            for &id in &unfrozen {
                for &(r, _) in &self.flows[id].path {
                    if self.weight[r] > 0.0 {
                        step = step.min(self.left[r] / self.weight[r]);
                    }
                }
            }
            if !step.is_finite() {
                break;
            }
            level += step.max(0.0);
            for &id in &unfrozen {
                for &(r, c) in &self.flows[id].path {
                    self.left[r] -= step * c;
                }
            }
            // Freeze the flows through a full resource.
            let (capacity, left, weight, flows) = (
                &self.capacity,
                &mut self.left,
                &mut self.weight,
                &mut self.flows,
            );
            unfrozen.retain(|&id| {
                let full = flows[id]
                    .path
                    .iter()
                    .any(|&(r, _)| left[r] <= capacity[r] * 1e-12);
                if full {
                    flows[id].rate = level;
                    for &(r, c) in &flows[id].path {
                        weight[r] -= c;
                    }
                }
                !full
            });
        }
        for id in unfrozen {
            self.flows[id].rate = level;
        }
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
        f.start(1000.0, vec![(link, 1.0)]);
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
        let f1 = f.start(1e9, vec![(a, 1.0)]);
        let f2 = f.start(1e9, vec![(a, 1.0), (b, 1.0)]);
        let f3 = f.start(1e9, vec![(b, 1.0)]);
        assert!(close(f.rate(f1), 8.0));
        assert!(close(f.rate(f2), 2.0));
        assert!(close(f.rate(f3), 2.0));
    }

    #[test]
    fn coefficients_scale_use_and_rates_rise_when_a_flow_ends() {
        let mut f = Flows::new();
        let cpu = f.resource(2.0);
        // Each byte costs 0.5 units: one flow alone runs at 4 bytes/s.
        let short = f.start(4.0, vec![(cpu, 0.5)]);
        let long = f.start(100.0, vec![(cpu, 0.5)]);
        assert!(close(f.rate(short), 2.0) && close(f.rate(long), 2.0));
        let t = f.next_end().expect("flows run");
        assert!(close(t, 2.0));
        assert_eq!(f.advance(t), vec![short]);
        assert!(close(f.rate(long), 4.0));
        assert!(f.is_live(long) && !f.is_live(short));
    }
}
