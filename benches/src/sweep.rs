//! The sweep one rank runs: for every size, dtype and op, out-of-place then in-place: warm
//! up, time back-to-back iterations, then check a fresh run against the closed form.
//! Times are the slowest rank's average per iteration; `#wrong` is summed over ranks.

use crate::args::{Args, CollectiveName};
use crate::buffers::{Placement, RankBuffers};
use crate::table::{self, Measurement};
use crate::with_element_type;
use bcl_core::{Collective, Communicator, DataType, Element, ReduceOp, Result, Vendor};
use std::io::Write;
use std::time::Instant;

fn collective_of(name: CollectiveName, op: ReduceOp, root: usize) -> Collective {
    match name {
        CollectiveName::Allreduce => Collective::AllReduce { op },
        CollectiveName::Allgather => Collective::AllGather,
        CollectiveName::Reducescatter => Collective::ReduceScatter { op },
        CollectiveName::Broadcast => Collective::Broadcast { root },
        CollectiveName::Reduce => Collective::Reduce { op, root },
        CollectiveName::Alltoall => Collective::AllToAll,
    }
}

/// Per-rank element count for a row of `bytes`, as nccl-tests counts it.
fn count_for(c: Collective, bytes: usize, esize: usize, n: usize) -> usize {
    match c {
        Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AllToAll => {
            bytes / esize / n
        }
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
    let mut bufs = RankBuffers::<T>::new(comm, placement, c, count, in_place)?;
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
        let mut fresh = RankBuffers::<T>::new(comm, placement, c, count, in_place)?;
        fresh.run(comm)?;
        wrong[0] = fresh.wrong(comm)? as u64;
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    Ok((time[0], wrong[0]))
}

/// Run the whole sweep on this rank. Rank 0 prints the table as it goes (when `print`) and
/// every rank returns the measurements.
pub fn run(comm: &Communicator, args: &Args, print: bool) -> Result<Vec<Measurement>> {
    let n = comm.world_size();
    let invalid = |e: String| bcl_core::Error::InvalidArgument(e);
    let dtypes = args.dtypes().map_err(invalid)?;
    let ops = args.ops().map_err(invalid)?;
    let placement = match comm.accelerator().info().vendor {
        Vendor::Cpu => Placement::Host,
        _ => Placement::Device,
    };
    let reduces = matches!(
        args.collective,
        CollectiveName::Allreduce | CollectiveName::Reducescatter | CollectiveName::Reduce
    );
    let ops = if reduces { ops } else { vec![ReduceOp::Sum] };
    let rooted = matches!(
        args.collective,
        CollectiveName::Broadcast | CollectiveName::Reduce
    );
    let mut all = Vec::new();
    // Lock stdout per line only: with ranks as threads, the others must not wait on it.
    let say = |line: String| {
        if print {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    say(table::header());
    let sizes = args.sizes();
    let mut progress =
        crate::progress::Progress::on_stderr(dtypes.len() * ops.len() * sizes.len(), print);
    for dtype in &dtypes {
        for op in &ops {
            for &bytes in &sizes {
                progress.row(&format!(
                    "{} {} {}",
                    dtype_name(*dtype),
                    op.name(),
                    bcl_core::human_bytes(bytes)
                ));
                let c = collective_of(args.collective, *op, args.root);
                let count = count_for(c, bytes, dtype.size(), n);
                let mut pair = Vec::new();
                for in_place in [false, true] {
                    let (time_us, wrong) = with_element_type!(*dtype, T => measure::<T>(comm, args, &placement, c, count, in_place))?;
                    let size = match c {
                        Collective::AllGather
                        | Collective::ReduceScatter { .. }
                        | Collective::AllToAll => count * n * dtype.size(),
                        _ => count * dtype.size(),
                    };
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
                        dtype: dtype_name(*dtype),
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
                    });
                }
                progress.clear();
                say(table::row(&pair[0], &pair[1]));
                all.extend(pair);
            }
        }
    }
    say(table::footer(&all));
    Ok(all)
}

fn dtype_name(d: DataType) -> String {
    d.name().to_string()
}
