//! Effective training time under failures: the share of wall time a job spends on training
//! steps it keeps, at a scale and with a way of recovering.
//!
//! Failures of the job's chips are a Poisson process (rate chips / chip MTBF). Each is
//! noticed after a detection latency (a dead peer, or a hung one, each with its own), then:
//!
//! - **restart**: the job is relaunched (`restart` seconds: scheduling, communicator init,
//!   loading the checkpoint) and redoes the work since its last checkpoint; checkpoints cost
//!   `checkpoint` seconds of stall every `interval` seconds of work;
//! - **in place** (BCL's shrink, then grow in the background): the survivors agree and go on
//!   after `shrink` seconds, redoing only the step that was cut; a share `fallback` of the
//!   failures is more than in-place recovery can take (a shard with no replica left) and
//!   restarts from the checkpoint as above.
//!
//! A failure during a recovery starts the recovery again; one during a checkpoint loses it.
//! Two answers: [`closed_form`] (first order in failures per cycle, the renewal argument of
//! Young and Daly) and [`monte_carlo`] (a seeded run of the process above, event by event),
//! which the tests hold to each other where first order holds.

/// A job and how it recovers.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub chips: f64,
    /// Mean time between failures of one chip (with its share of host, NIC, link), seconds.
    pub chip_mtbf: f64,
    /// Seconds per training step.
    pub step: f64,
    /// Detection latency of a dead peer and of a hung one; `hung_share` of failures hang.
    pub detect_dead: f64,
    pub detect_hung: f64,
    pub hung_share: f64,
    pub recovery: Recovery,
    /// Stall of one checkpoint, seconds.
    pub checkpoint: f64,
    /// Seconds of work between checkpoints; `None`: the Young/Daly optimum for the failures
    /// that need a checkpoint.
    pub interval: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Recovery {
    Restart {
        restart: f64,
    },
    InPlace {
        shrink: f64,
        fallback: f64,
        restart: f64,
    },
}

impl Scenario {
    /// Failures per second of the whole job.
    pub fn rate(&self) -> f64 {
        self.chips / self.chip_mtbf
    }

    /// Mean detection latency.
    pub fn detect(&self) -> f64 {
        self.hung_share * self.detect_hung + (1.0 - self.hung_share) * self.detect_dead
    }

    /// Failures per second that go back to the checkpoint.
    fn restart_rate(&self) -> f64 {
        match self.recovery {
            Recovery::Restart { .. } => self.rate(),
            Recovery::InPlace { fallback, .. } => self.rate() * fallback,
        }
    }

    /// Seconds of work between checkpoints: the one given, or Young/Daly's √(2·C·M) for the
    /// mean time M between failures that need one (none needed: no checkpoint at all).
    pub fn interval(&self) -> f64 {
        self.interval.unwrap_or_else(|| {
            let r = self.restart_rate();
            if r > 0.0 {
                (2.0 * self.checkpoint / r).sqrt()
            } else {
                f64::INFINITY
            }
        })
    }

    /// Bad settings named: negative, not finite, shares outside [0, 1].
    pub fn check(&self) -> Result<(), String> {
        let mut values = vec![
            ("chips", self.chips),
            ("chip-mtbf", self.chip_mtbf),
            ("step", self.step),
            ("detect-dead", self.detect_dead),
            ("detect-hung", self.detect_hung),
            ("checkpoint", self.checkpoint),
        ];
        match self.recovery {
            Recovery::Restart { restart } => values.push(("restart", restart)),
            Recovery::InPlace {
                shrink, restart, ..
            } => values.extend([("shrink", shrink), ("restart", restart)]),
        }
        if let Some(i) = self.interval {
            values.push(("interval", i));
        }
        for (name, v) in values {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{name} = {v}: must be finite and not negative"));
            }
        }
        for (name, v) in [("chips", self.chips), ("chip-mtbf", self.chip_mtbf)] {
            if v <= 0.0 {
                return Err(format!("{name} = {v}: must be positive"));
            }
        }
        if self.interval == Some(0.0) {
            return Err("interval = 0: no work between checkpoints".into());
        }
        let mut shares = vec![("hung-share", self.hung_share)];
        if let Recovery::InPlace { fallback, .. } = self.recovery {
            shares.push(("fallback", fallback));
        }
        for (name, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} = {v}: a share between 0 and 1"));
            }
        }
        Ok(())
    }
}

/// First-order effective training time: the checkpoints' share τ/(τ+C) of the time, less per
/// failure its detection, recovery and the work redone (half a checkpoint cycle for a
/// restart, half a step in place), each failure's loss taken once (no failure during
/// another's recovery).
pub fn closed_form(s: &Scenario) -> f64 {
    let tau = s.interval();
    let (c, d) = (s.checkpoint, s.detect());
    let ckpt_share = if tau.is_finite() {
        tau / (tau + c)
    } else {
        1.0
    };
    let cycle_half = if tau.is_finite() {
        (tau + c) / 2.0
    } else {
        0.0
    };
    let loss_per_second = match s.recovery {
        Recovery::Restart { restart } => s.rate() * (d + restart + cycle_half),
        Recovery::InPlace {
            shrink,
            fallback,
            restart,
        } => {
            // In place, a failure in a step redoes half a step on average, one in a
            // checkpoint half the checkpoint.
            let (work, ckpt) = if tau.is_finite() {
                (tau / (tau + c), c / (tau + c))
            } else {
                (1.0, 0.0)
            };
            let redo = work * s.step / 2.0 + ckpt * c / 2.0;
            s.rate() * (d + (1.0 - fallback) * (shrink + redo) + fallback * (restart + cycle_half))
        }
    };
    (ckpt_share * (1.0 - loss_per_second)).max(0.0)
}

/// SplitMix64: a small seeded generator, so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
    fn exp(&mut self, rate: f64) -> f64 {
        if rate > 0.0 {
            -self.unit().ln() / rate
        } else {
            f64::INFINITY
        }
    }
}

/// What the job is doing.
#[derive(Clone, Copy, Debug)]
enum Phase {
    Work,
    Checkpoint {
        left: f64,
    },
    /// `restart`: relaunching (else shrinking); `then_checkpoint`: the checkpoint a shrink
    /// cut is taken again first.
    Recover {
        left: f64,
        restart: bool,
        then_checkpoint: bool,
    },
}

/// The job's books: work kept, work since the last checkpoint (lost by a restart), work in
/// the step under way (lost by any failure).
#[derive(Default)]
struct Books {
    kept: f64,
    since_checkpoint: f64,
    partial: f64,
}

impl Books {
    fn work(&mut self, dt: f64, step: f64) {
        self.partial += dt;
        let whole = if step > 0.0 {
            (self.partial / step).floor() * step
        } else {
            self.partial
        };
        self.kept += whole;
        self.since_checkpoint += whole;
        self.partial -= whole;
    }
    fn lose_since_checkpoint(&mut self) {
        self.kept -= self.since_checkpoint;
        self.since_checkpoint = 0.0;
        self.partial = 0.0;
    }
}

/// Run the job for `horizon` seconds of wall time, failures drawn with `seed`; returns the
/// share of that time whose work was kept.
pub fn monte_carlo(s: &Scenario, horizon: f64, seed: u64) -> f64 {
    let mut rng = Rng(seed);
    let tau = s.interval();
    let rate = s.rate();
    let mut now = 0.0;
    let mut b = Books::default();
    let mut phase = Phase::Work;
    let mut next_failure = rng.exp(rate);
    while now < horizon {
        let length = match phase {
            // Up to the next checkpoint (taken between steps' work, the step under way
            // counted in).
            Phase::Work => (tau - b.since_checkpoint - b.partial).max(0.0),
            Phase::Checkpoint { left } | Phase::Recover { left, .. } => left,
        };
        let end = (now + length).min(horizon);
        if next_failure >= end {
            let dt = end - now;
            now = end;
            if now >= horizon {
                if let Phase::Work = phase {
                    b.work(dt, s.step);
                }
                break;
            }
            phase = match phase {
                Phase::Work => {
                    b.work(dt, s.step);
                    b.kept += b.partial;
                    b.since_checkpoint += b.partial;
                    b.partial = 0.0;
                    Phase::Checkpoint { left: s.checkpoint }
                }
                Phase::Checkpoint { .. } => {
                    b.since_checkpoint = 0.0;
                    Phase::Work
                }
                Phase::Recover {
                    then_checkpoint: true,
                    ..
                } => Phase::Checkpoint { left: s.checkpoint },
                Phase::Recover { .. } => Phase::Work,
            };
            continue;
        }
        // A failure.
        let dt = next_failure - now;
        now = next_failure;
        next_failure = now + rng.exp(rate);
        let detect = if rng.unit() <= s.hung_share {
            s.detect_hung
        } else {
            s.detect_dead
        };
        let (mut restart, shrink, relaunch) = match s.recovery {
            Recovery::Restart { restart } => (true, 0.0, restart),
            Recovery::InPlace {
                shrink,
                fallback,
                restart,
            } => (rng.unit() <= fallback, shrink, restart),
        };
        let mut then_checkpoint = false;
        match phase {
            Phase::Work => {
                b.work(dt, s.step);
                b.partial = 0.0;
            }
            Phase::Checkpoint { .. } => then_checkpoint = true,
            Phase::Recover {
                restart: earlier,
                then_checkpoint: t,
                ..
            } => {
                // A relaunch under way starts again whatever the new failure is.
                restart |= earlier;
                then_checkpoint = t;
            }
        }
        if restart {
            b.lose_since_checkpoint();
            then_checkpoint = false;
        }
        phase = Phase::Recover {
            left: detect + if restart { relaunch } else { shrink },
            restart,
            then_checkpoint,
        };
    }
    b.kept / horizon
}
