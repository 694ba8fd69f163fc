//! The sweep one rank runs: for every size, dtype and op, out-of-place then in-place: warm
//! up, time back-to-back iterations, then check a fresh run against the closed form.
//! Times are the slowest rank's average per iteration; `#wrong` is summed over ranks.

use crate::args::{Args, CollectiveName};
use crate::buffers::{Placement, RankBuffers};
use crate::table::{self, Measurement};
use crate::with_element_type;
use bcl_core::{
    Collective, Communicator, DataType, Element, Exclude, ReduceOp, Result, ShrinkMode, Vendor,
};
use std::io::Write;
use std::time::Instant;

/// The collective a row runs on `rank` of `n` (sendrecv: its receive from the previous rank,
/// which sizes, checks and names the row; the send to the next goes with it).
pub fn collective_of(
    name: CollectiveName,
    op: ReduceOp,
    root: usize,
    rank: usize,
    n: usize,
) -> Collective {
    match name {
        CollectiveName::Sendrecv => Collective::Recv {
            peer: (rank + n - 1) % n,
        },
        CollectiveName::Allreduce => Collective::AllReduce { op },
        CollectiveName::Allgather => Collective::AllGather,
        CollectiveName::Reducescatter => Collective::ReduceScatter { op },
        CollectiveName::Broadcast => Collective::Broadcast { root },
        CollectiveName::Reduce => Collective::Reduce { op, root },
        CollectiveName::Alltoall => Collective::AllToAll,
        CollectiveName::Gather => Collective::Gather { root },
        CollectiveName::Scatter => Collective::Scatter { root },
    }
}

/// The size a row reports for `count` elements per rank, as nccl-tests reports it.
pub fn row_bytes(c: Collective, count: usize, esize: usize, n: usize) -> usize {
    match c {
        Collective::AllGather
        | Collective::ReduceScatter { .. }
        | Collective::AllToAll
        | Collective::Gather { .. }
        | Collective::Scatter { .. } => count * n * esize,
        _ => count * esize,
    }
}

/// Per-rank element count for a row of `bytes`, as nccl-tests counts it.
pub fn count_for(c: Collective, bytes: usize, esize: usize, n: usize) -> usize {
    match c {
        Collective::AllGather
        | Collective::ReduceScatter { .. }
        | Collective::AllToAll
        | Collective::Gather { .. }
        | Collective::Scatter { .. } => bytes / esize / n,
        _ => bytes / esize,
    }
}

fn measure<T: Element>(
    comm: &Communicator,
    args: &Args,
    placement: &Placement,
    c: Collective,
    count: usize,
    in_place: bool,
) -> Result<(f64, u64)> {
    let buffers = || match args.collective {
        CollectiveName::Sendrecv => {
            let next = (comm.rank() + 1) % comm.world_size();
            RankBuffers::<T>::sendrecv(comm, placement, next, count, in_place)
        }
        _ => RankBuffers::<T>::new(comm, placement, c, count, in_place),
    };
    let mut bufs = buffers()?;
    for _ in 0..args.warmup {
        bufs.run(comm)?;
    }
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..args.iters.max(1) {
        bufs.run(comm)?;
    }
    let mut time = [start.elapsed().as_secs_f64() * 1e6 / args.iters.max(1) as f64];
    comm.all_reduce_in_place(&mut time, ReduceOp::Max)?;
    let mut wrong = [0u64];
    if args.check != 0 {
        let mut fresh = buffers()?;
        fresh.run(comm)?;
        wrong[0] = fresh.wrong(comm)? as u64;
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    Ok((time[0], wrong[0]))
}

/// One row: out-of-place then in-place.
fn row(
    comm: &Communicator,
    args: &Args,
    placement: &Placement,
    dtype: DataType,
    op: ReduceOp,
    bytes: usize,
) -> Result<Vec<Measurement>> {
    let n = comm.world_size();
    let (reduces, rooted) = (args.collective.reduces(), args.collective.rooted());
    let c = collective_of(args.collective, op, args.root, comm.rank(), n);
    let count = count_for(c, bytes, dtype.size(), n);
    let mut pair = Vec::new();
    for in_place in [false, true] {
        let (time_us, wrong) = with_element_type!(dtype, T => measure::<T>(comm, args, placement, c, count, in_place))?;
        let size = row_bytes(c, count, dtype.size(), n);
        let algbw = if time_us > 0.0 {
            size as f64 / time_us / 1e3
        } else {
            0.0
        };
        pair.push(Measurement {
            collective: format!("{:?}", args.collective).to_lowercase(),
            nranks: n,
            devices: args.devices.clone(),
            transport: args.transport.clone(),
            size_bytes: size,
            count,
            dtype: dtype_name(dtype),
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
            wrong,
            simulated: false,
            algorithm: match args.collective {
                // Point to point: no collective algorithm runs.
                CollectiveName::Sendrecv => "p2p".into(),
                _ if comm.uses_lines(c, count * dtype.size()) => "ll".into(),
                _ => comm.algorithm_for(c, count * dtype.size()).name().into(),
            },
        });
    }
    Ok(pair)
}

/// Run the whole sweep on this rank. Rank 0 prints the table as it goes (when `print`) and
/// every rank returns the measurements. With `--recover V`, rank V dies at the start of the
/// middle row and the others repair the communicator and go on (see `recover`).
pub fn run(comm: &Communicator, args: &Args, print: bool) -> Result<Vec<Measurement>> {
    let invalid = |e: String| bcl_core::Error::InvalidArgument(e);
    if args.collective == CollectiveName::Sendrecv && comm.world_size() < 2 {
        return Err(invalid(
            "sendrecv needs 2 ranks or more: each sends to the next and receives from the \
             previous, and a BCL rank does not send to itself"
                .into(),
        ));
    }
    let dtypes = args.dtypes().map_err(invalid)?;
    let ops = args.ops().map_err(invalid)?;
    let placement = match comm.accelerator().info().vendor {
        Vendor::Cpu => Placement::Host,
        _ => Placement::Device,
    };
    let ops = if args.collective.reduces() {
        ops
    } else {
        vec![ReduceOp::Sum]
    };
    let mut all = Vec::new();
    // The survivors' communicator once `--recover` has repaired it.
    let mut shrunk: Option<Communicator> = None;
    let mut print = print;
    // Lock stdout per line only: with ranks as threads, the others must not wait on it.
    let say = |print: bool, line: String| {
        if print {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    say(print, table::header());
    let sizes = args.sizes();
    let rows = dtypes.len() * ops.len() * sizes.len();
    let mut progress = crate::progress::Progress::on_stderr(rows, print);
    let mut index = 0;
    for dtype in &dtypes {
        for op in &ops {
            for &bytes in &sizes {
                progress.row(&format!(
                    "{} {} {}",
                    dtype_name(*dtype),
                    op.name(),
                    bcl_core::human_bytes(bytes)
                ));
                let c = shrunk.as_ref().unwrap_or(comm);
                let pair = match args.recover {
                    Some(victim) if index == rows / 2 && shrunk.is_none() => {
                        let (survivors, report) =
                            recover(c, victim, || row(c, args, &placement, *dtype, *op, bytes))?;
                        print = survivors.rank() == 0;
                        progress.clear();
                        progress = crate::progress::Progress::on_stderr(rows - index, print);
                        say(print, report);
                        let pair = row(&survivors, args, &placement, *dtype, *op, bytes)?;
                        shrunk = Some(survivors);
                        pair
                    }
                    _ => row(c, args, &placement, *dtype, *op, bytes)?,
                };
                index += 1;
                progress.clear();
                say(print, table::row(&pair[0], &pair[1]));
                all.extend(pair);
            }
        }
    }
    say(print, table::footer(&all));
    Ok(all)
}

/// `--recover`: every rank meets in a barrier, then `victim` aborts (a crash: no word to
/// anyone) and the others run `row` on the old communicator, which fails once the health
/// layer names the dead rank. They shrink with `Exclude::Failed` (`BCL_SHRINK_FAILED`) and
/// check an allreduce on the survivors. Returns the survivors' communicator and the report
/// line (the slowest survivor's times, measured from the barrier that the victim left).
fn recover(
    comm: &Communicator,
    victim: usize,
    row: impl FnOnce() -> Result<Vec<Measurement>>,
) -> Result<(Communicator, String)> {
    comm.barrier()?;
    let t0 = Instant::now();
    if comm.rank() == victim {
        eprintln!(
            "bcl-bench: rank {victim} (pid {}) dies now (--recover)",
            std::process::id()
        );
        std::process::abort();
    }
    let caught = match row() {
        Ok(_) => {
            return Err(bcl_core::Error::Internal(format!(
                "--recover: rank {} finished a row without rank {victim}",
                comm.rank()
            )));
        }
        Err(e) => e,
    };
    let detected = t0.elapsed();
    let survivors = comm.shrink(Exclude::Failed, ShrinkMode::Abort)?;
    let shrunk = t0.elapsed();
    let mut one = [1f32];
    survivors.all_reduce_in_place(&mut one, ReduceOp::Sum)?;
    if one[0] != survivors.world_size() as f32 {
        return Err(bcl_core::Error::Internal(format!(
            "--recover: the first allreduce on the survivors gave {} where {} was expected",
            one[0],
            survivors.world_size()
        )));
    }
    let mut ms = [
        detected.as_secs_f64() * 1e3,
        shrunk.as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64() * 1e3,
    ];
    survivors.all_reduce_in_place(&mut ms, ReduceOp::Max)?;
    let first = caught.to_string();
    let first = first.lines().next().unwrap_or_default();
    Ok((
        survivors,
        format!(
            "# recover: rank {victim} was killed; the survivors caught it after {:.0} ms, \
             shrank to {} ranks by {:.0} ms and ran their first correct allreduce {:.0} ms \
             after the kill (slowest survivor); the sweep goes on\n# recover: first error: {first}",
            ms[0],
            comm.world_size() - 1,
            ms[1],
            ms[2]
        ),
    ))
}

fn dtype_name(d: DataType) -> String {
    d.name().to_string()
}
