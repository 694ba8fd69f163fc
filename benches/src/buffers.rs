//! One rank's buffers for one (collective, count, dtype), in host memory or on the rank's
//! device, and the call that runs the collective on them.

use crate::pattern;
use bcl_backends::bytemuck;
use bcl_core::{Collective, Communicator, DeviceBuffer, Element, Result};

/// Where a rank keeps its data.
#[derive(Debug)]
pub enum Placement {
    /// Host slices through the blocking typed API (cpu ranks).
    Host,
    /// Device buffers through the enqueued device API (sim ranks: memory not host-addressable).
    Device,
    /// Device buffers through host staging on the device's default stream
    /// (`Communicator::submit_staged`, what the C ABI uses for GPU ranks).
    DeviceStaged,
}

/// The buffers of one rank for one call shape.
#[derive(Debug)]
pub struct RankBuffers<T: Element> {
    collective: Collective,
    count: usize,
    in_place: bool,
    input: Vec<T>,
    output: Vec<T>,
    device: Option<(Option<DeviceBuffer>, DeviceBuffer)>,
    staged: bool,
    /// Sendrecv: the rank this one sends its input to before `collective` (its receive).
    send_to: Option<usize>,
}

fn host_to_device<T: Element>(comm: &Communicator, host: &[T]) -> Result<DeviceBuffer> {
    let acc = comm.accelerator();
    let bytes: &[u8] = bytemuck::cast_slice(host);
    let buf = acc.allocate(bytes.len()).map_err(|e| device_err(comm, e))?;
    acc.copy_to_device(buf.full(), bytes, &acc.default_stream())
        .map_err(|e| device_err(comm, e))?;
    Ok(buf)
}

fn device_err(comm: &Communicator, source: bcl_backends::DeviceError) -> bcl_core::Error {
    bcl_core::Error::Device {
        rank: comm.rank(),
        device: comm.accelerator().info().to_string(),
        source,
    }
}

impl<T: Element> RankBuffers<T> {
    /// Buffers filled with the closed-form input pattern.
    pub fn new(
        comm: &Communicator,
        placement: &Placement,
        collective: Collective,
        count: usize,
        in_place: bool,
    ) -> Result<Self> {
        let (world, rank) = (comm.world_size(), comm.rank());
        let input = pattern::input_buffer::<T>(collective, count, world, rank, in_place);
        let (_, out) = collective.buffer_elems(count, world, rank);
        let (input, output) = if in_place {
            (Vec::new(), input)
        } else {
            (input, vec![T::from_i64(0); out.unwrap_or(0)])
        };
        let device = match placement {
            Placement::Host => None,
            Placement::Device | Placement::DeviceStaged => Some((
                if in_place {
                    None
                } else {
                    Some(host_to_device(comm, &input)?)
                },
                host_to_device(comm, &output)?,
            )),
        };
        Ok(RankBuffers {
            collective,
            count,
            in_place,
            input,
            output,
            device,
            staged: matches!(placement, Placement::DeviceStaged),
            send_to: None,
        })
    }

    /// Buffers for nccl-tests' sendrecv: `count` elements sent to `next`, and as many received
    /// from the previous rank (into the same buffer, in place).
    pub fn sendrecv(
        comm: &Communicator,
        placement: &Placement,
        next: usize,
        count: usize,
        in_place: bool,
    ) -> Result<Self> {
        let n = comm.world_size();
        let prev = (next + 2 * n - 2) % n;
        let mut bufs = Self::new(
            comm,
            placement,
            Collective::Send { peer: next },
            count,
            in_place,
        )?;
        if !in_place {
            bufs.output = vec![T::from_i64(0); count];
            if let Some((_, output)) = &mut bufs.device {
                *output = host_to_device(comm, &bufs.output)?;
            }
        }
        bufs.collective = Collective::Recv { peer: prev };
        bufs.send_to = Some(next);
        Ok(bufs)
    }

    /// Sendrecv: the send (from the input, or in place from the one buffer), then the receive;
    /// a send is done once BCL holds its bytes, so every rank sending first cannot deadlock.
    fn run_sendrecv(&mut self, comm: &Communicator, next: usize) -> Result<()> {
        let (send, recv) = (Collective::Send { peer: next }, self.collective);
        let (count, dtype) = (self.count, T::DATA_TYPE);
        if let Some((input, output)) = &self.device {
            let source = input.as_ref().unwrap_or(output);
            if self.staged {
                let stream = comm.accelerator().default_stream();
                comm.submit_staged(send, count, dtype, Some(source), None, &stream)?
                    .wait()?;
                return comm
                    .submit_staged(recv, count, dtype, None, Some(output), &stream)?
                    .wait();
            }
            comm.submit(send, count, dtype, Some(source), None)?
                .wait()?;
            return comm.submit(recv, count, dtype, None, Some(output))?.wait();
        }
        let Collective::Recv { peer: prev } = recv else {
            return Err(bcl_core::Error::InvalidArgument(format!(
                "sendrecv buffers receive, not {recv}"
            )));
        };
        if self.in_place {
            comm.send(&self.output, next)?;
        } else {
            comm.send(&self.input, next)?;
        }
        comm.recv(&mut self.output, prev)
    }

    /// Run the collective once.
    pub fn run(&mut self, comm: &Communicator) -> Result<()> {
        if let Some(next) = self.send_to {
            return self.run_sendrecv(comm, next);
        }
        let (c, ip) = (self.collective, self.in_place);
        if let Some((input, output)) = &self.device {
            let output = (!matches!(c, Collective::Send { .. })).then_some(output);
            if self.staged {
                let stream = comm.accelerator().default_stream();
                return comm
                    .submit_staged(c, self.count, T::DATA_TYPE, input.as_ref(), output, &stream)?
                    .wait();
            }
            return comm
                .submit(c, self.count, T::DATA_TYPE, input.as_ref(), output)?
                .wait();
        }
        let (inp, out) = (&self.input[..], &mut self.output[..]);
        match c {
            Collective::AllReduce { op } if ip => comm.all_reduce_in_place(out, op),
            Collective::AllReduce { op } => comm.all_reduce(inp, out, op),
            Collective::AllGather if ip => comm.all_gather_in_place(out),
            Collective::AllGather => comm.all_gather(inp, out),
            Collective::ReduceScatter { op } if ip => comm.reduce_scatter_in_place(out, op),
            Collective::ReduceScatter { op } => comm.reduce_scatter(inp, out, op),
            Collective::Broadcast { root } if ip => comm.broadcast_in_place(out, root),
            Collective::Broadcast { root } => comm.broadcast(inp, out, root),
            Collective::Reduce { op, root } if ip => comm.reduce_in_place(out, op, root),
            Collective::Reduce { op, root } => comm.reduce(inp, out, op, root),
            Collective::AllToAll if ip => comm.all_to_all_in_place(out),
            Collective::AllToAll => comm.all_to_all(inp, out),
            Collective::Gather { root } if ip => comm.gather_in_place(out, root),
            Collective::Gather { root } => comm.gather(inp, out, root),
            Collective::Scatter { root } if ip => comm.scatter_in_place(out, root),
            Collective::Scatter { root } => comm.scatter(inp, out, root),
            Collective::Send { peer } => comm.send(inp, peer),
            Collective::Recv { peer } => comm.recv(out, peer),
            Collective::Barrier => comm.barrier(),
            other => Err(bcl_core::Error::InvalidArgument(format!(
                "bcl-bench has no host call for {other}"
            ))),
        }
    }

    /// The output as host values (copied back from the device where it lives there).
    pub fn output(&mut self, comm: &Communicator) -> Result<&[T]> {
        if let Some((_, out)) = &self.device {
            let acc = comm.accelerator();
            acc.copy_to_host(
                bytemuck::cast_slice_mut(&mut self.output),
                out.full(),
                &acc.default_stream(),
            )
            .map_err(|e| device_err(comm, e))?;
        }
        Ok(&self.output)
    }

    /// Elements of the output that differ from the closed form.
    pub fn wrong(&mut self, comm: &Communicator) -> Result<usize> {
        let (c, n, w, r, ip) = (
            self.collective,
            self.count,
            comm.world_size(),
            comm.rank(),
            self.in_place,
        );
        let out = self.output(comm)?;
        pattern::count_wrong(c, n, w, r, ip, out).map_err(|why| {
            bcl_core::Error::InvalidArgument(format!("cannot check the result: {why}"))
        })
    }
}
