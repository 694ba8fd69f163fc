//! A sweep of sizes, as `bcl-bench` runs one: each row out of place then in place, the
//! algorithm BCL's selector would pick (or the one asked), bcl-bench's table and JSON rows.

use crate::args::Args;
use crate::engine::{self, Case, Group};
use crate::network::leaf_size;
use crate::topology::Topology;
use bcl_bench::args::CollectiveName;
use bcl_bench::sweep::{collective_of, count_for, row_bytes};
use bcl_bench::table::{self, Measurement};
use bcl_core::schedule::select;
use bcl_core::{Algorithm, DataType, ReduceOp};

/// Worlds up to this many ranks are simulated rank by rank unless `--group` says otherwise.
pub const EXACT_UP_TO: usize = 1024;

/// The topology the flags describe.
pub fn topology(args: &Args) -> Result<Topology, String> {
    let spec = match &args.topology {
        Some(s) => s.clone(),
        None if args.nranks <= 8 => "local".into(),
        None => "cluster".into(),
    };
    Topology::parse(&spec, args.nranks)
}

/// The hosts simulated for all: `--group`, or every host up to [`EXACT_UP_TO`] ranks, or the
/// smallest multiple of the leaf and of the vendor pattern that divides the hosts.
pub fn group(args: &Args, topo: &Topology) -> usize {
    match args.group {
        Some(0) => topo.hosts,
        Some(g) => g,
        None if topo.world() <= EXACT_UP_TO => topo.hosts,
        None => {
            let leaf = leaf_size(topo).min(topo.hosts);
            let period = topo.vendor_period();
            let mut g = leaf;
            while !g.is_multiple_of(period) {
                g += leaf;
            }
            if topo.hosts.is_multiple_of(g) {
                g
            } else {
                topo.hosts
            }
        }
    }
}

/// The ranks of each host simulated for all: `--locals`, or one beyond [`EXACT_UP_TO`] ranks
/// where a host's ranks share nothing, or all.
pub fn locals(args: &Args, topo: &Topology) -> usize {
    match args.locals {
        Some(0) => topo.per_host,
        Some(l) => l,
        None if topo.world() > EXACT_UP_TO
            && args.group != Some(0)
            && engine::ranks_share_nothing(topo) =>
        {
            1
        }
        None => topo.per_host,
    }
}

/// The groups to try in turn: the one asked or chosen, then (where it was chosen, and a
/// plan turns out not symmetric) every host with its chosen ranks, then every rank.
fn groups(args: &Args, topo: &Topology) -> Vec<Group> {
    let first = Group {
        hosts: group(args, topo),
        locals: locals(args, topo),
    };
    let mut out = vec![first];
    if args.group.is_none() && args.locals.is_none() {
        for g in [
            Group {
                hosts: topo.hosts,
                locals: first.locals,
            },
            Group::all(topo),
        ] {
            if !out.contains(&g) {
                out.push(g);
            }
        }
    }
    out
}

/// What each group stands for, for the header.
fn describe(g: Group, topo: &Topology) -> String {
    match (g.hosts == topo.hosts, g.locals == topo.per_host) {
        (true, true) => "every rank".into(),
        (false, true) => "one group of hosts stands for all".into(),
        (true, false) => format!(
            "{} rank(s) of each host stand for its {}",
            g.locals, topo.per_host
        ),
        (false, false) => format!(
            "one group of hosts stands for all, {} rank(s) of each for its {}",
            g.locals, topo.per_host
        ),
    }
}

/// What a sweep simulated.
#[derive(Debug)]
pub struct Sweep {
    pub rows: Vec<Measurement>,
    /// The sizes (bytes) of rows too large to simulate: each said in a comment line, the
    /// sweep going on past it.
    pub skipped: Vec<usize>,
}

/// The rows of the sweep.
pub fn run(args: &Args, topo: &Topology, mut print: impl FnMut(&str)) -> Result<Sweep, String> {
    let n = topo.world();
    if args.collective == CollectiveName::Sendrecv && n < 2 {
        return Err("sendrecv needs 2 ranks or more".into());
    }
    if args.root >= n {
        return Err(format!("root {} is outside a world of {n}", args.root));
    }
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let forced: Option<Algorithm> = match args.algo.as_str() {
        "auto" => None,
        a => Some(a.parse()?),
    };
    let groups = groups(args, topo);
    let (reduces, rooted) = (args.collective.reduces(), args.collective.rooted());
    print(&format!("# bcl-sim: {n} ranks, {}", topo.describe()));
    print(&format!(
        "# simulated: {} of {n} ranks ({})",
        groups[0].hosts * groups[0].locals,
        describe(groups[0], topo)
    ));
    print(&table::header());
    let mut all = Vec::new();
    let mut skipped = Vec::new();
    for bytes in args.sizes() {
        // sendrecv: every rank's receive sizes the row, its send goes beside it.
        let c = collective_of(args.collective, op, args.root, 0, n);
        let count = count_for(c, bytes, dtype.size(), n);
        let size = row_bytes(c, count, dtype.size(), n);
        let algorithm = match args.collective {
            CollectiveName::Sendrecv => Algorithm::Ring,
            _ => forced
                .unwrap_or_else(|| select(c, count * dtype.size(), topo.fabric()))
                .for_collective(c),
        };
        let case = |in_place| Case {
            collective: c,
            sendrecv: args.collective == CollectiveName::Sendrecv,
            algorithm,
            count,
            elem_bytes: dtype.size(),
            in_place,
            slice_elems: (args.slice_bytes / dtype.size()).max(1),
        };
        let row = topo.at_size(count * dtype.size());
        // Plans that are not symmetric (recursive doubling's pairing step on hosts that are
        // not a power of two, halving-doubling by groups, trees) run with the next group:
        // every host, then every rank.
        let mut tried = groups.iter().peekable();
        let both = loop {
            let Some(&g) = tried.next() else {
                return Err("no group of ranks to simulate".into());
            };
            let max = args.max_steps.unwrap_or(engine::MAX_STEPS);
            match engine::simulate_both_within(&row, &case(false), &case(true), g, max) {
                Err(e) if e.contains("not symmetric") => {
                    let Some(&&next) = tried.peek() else {
                        return Err(e);
                    };
                    print(&format!(
                        "# {size} B: {} plans not symmetric where {}; now {}",
                        algorithm.name(),
                        describe(g, topo),
                        describe(next, topo)
                    ));
                }
                // One row too large for memory: said, and the sweep goes on to the next.
                Err(e) if e.contains("too large to simulate") => {
                    print(&format!("# {size} B: not simulated: {e}"));
                    break None;
                }
                other => break Some(other?),
            }
        };
        let Some(both) = both else {
            skipped.push(size);
            continue;
        };
        let rates = both.first.rates;
        let mut pair = Vec::new();
        for (in_place, out) in [(false, both.first), (true, both.second)] {
            let time_us = out.seconds * 1e6;
            let algbw = if time_us > 0.0 {
                size as f64 / time_us / 1e3
            } else {
                0.0
            };
            pair.push(Measurement {
                collective: format!("{:?}", args.collective).to_lowercase(),
                nranks: n,
                devices: match &topo.b {
                    Some((f, _)) if *f > 0.0 => format!("{},{}", topo.a.name, "b"),
                    _ => topo.a.name.clone(),
                },
                transport: format!("sim:{}", topo.name),
                size_bytes: size,
                count,
                dtype: dtype.name().to_string(),
                redop: if reduces {
                    op.name().to_string()
                } else {
                    "none".into()
                },
                root: if rooted { args.root as i64 } else { -1 },
                in_place,
                time_us,
                algbw_gbs: algbw,
                busbw_gbs: algbw * table::busbw_factor(c, n),
                wrong: 0,
                algorithm: match args.collective {
                    CollectiveName::Sendrecv => "p2p".into(),
                    _ => algorithm.name().into(),
                },
                simulated: true,
            });
        }
        print(&table::row(&pair[0], &pair[1]));
        if args.rate_stats {
            print(&format!(
                "# {size} B, rates: {} changes, {} kept, {} computed above the change's level \
                 ({} flows, {:.0} each)",
                rates.changes,
                rates.kept,
                rates.computed,
                rates.computed_flows,
                rates.computed_flows as f64 / rates.computed.max(1) as f64
            ));
        }
        all.extend(pair);
    }
    print(&table::footer(&all));
    Ok(Sweep { rows: all, skipped })
}
