//! Binding a plan's symbolic buffers to memory: caller host slices or device buffers.
//! Host regions use the reference kernels directly; device regions go through the
//! Accelerator, so the executor never dereferences device memory.

use super::{ExecError, OpContext};
use crate::schedule::{BufferId, Region};
use bcl_backends::{DeviceBuffer, DeviceSlice, kernels};

/// Memory bound to one symbolic buffer.
#[derive(Debug)]
pub enum Memory<'a> {
    /// Caller host memory that the operation only reads.
    HostRead(&'a [u8]),
    /// Caller (or executor scratch) host memory the operation writes.
    HostWrite(&'a mut [u8]),
    /// Device memory, reached only through the Accelerator.
    Device(&'a DeviceBuffer),
}

/// The memory behind Input, Output and Scratch for one operation.
#[derive(Debug, Default)]
pub struct Bindings<'a> {
    pub input: Option<Memory<'a>>,
    pub output: Option<Memory<'a>>,
    pub scratch: Option<Memory<'a>>,
}

fn unbound(id: BufferId) -> ExecError {
    ExecError::Binding(format!(
        "the plan uses {id:?}, which this call did not provide"
    ))
}

impl<'a> Bindings<'a> {
    fn get(&self, id: BufferId) -> Result<&Memory<'a>, ExecError> {
        match id {
            BufferId::Input => self.input.as_ref(),
            BufferId::Output => self.output.as_ref(),
            BufferId::Scratch => self.scratch.as_ref(),
        }
        .ok_or_else(|| unbound(id))
    }

    fn get_mut(&mut self, id: BufferId) -> Result<&mut Memory<'a>, ExecError> {
        match id {
            BufferId::Input => self.input.as_mut(),
            BufferId::Output => self.output.as_mut(),
            BufferId::Scratch => self.scratch.as_mut(),
        }
        .ok_or_else(|| unbound(id))
    }

    /// The bytes of `r`, staged through `staging` when they live on a device.
    pub(super) fn read<'s>(
        &'s self,
        r: Region,
        esize: usize,
        ctx: &OpContext<'_>,
        staging: &'s mut Vec<u8>,
    ) -> Result<&'s [u8], ExecError> {
        if r.len == 0 {
            return Ok(&[]);
        }
        let range = byte_range(r, esize);
        match self.get(r.buffer)? {
            Memory::HostRead(b) => slice(b, range, r),
            Memory::HostWrite(b) => slice(b, range, r),
            Memory::Device(buf) => {
                staging.resize(range.len(), 0);
                ctx.accelerator.copy_to_host(
                    staging,
                    buf.slice(range.start, range.len()),
                    &ctx.stream,
                )?;
                ctx.accelerator.synchronize(&ctx.stream)?;
                Ok(&staging[..])
            }
        }
    }

    /// The device slice behind `r`, where it lies in device memory.
    pub(super) fn device_slice(&self, r: Region, esize: usize) -> Option<DeviceSlice<'_>> {
        match self.get(r.buffer).ok()? {
            Memory::Device(buf) => {
                let range = byte_range(r, esize);
                Some(buf.slice(range.start, range.len()))
            }
            _ => None,
        }
    }

    /// Overwrite `r` with `data`.
    pub(super) fn write(
        &mut self,
        r: Region,
        esize: usize,
        data: &[u8],
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        if r.len == 0 {
            return Ok(());
        }
        let range = byte_range(r, esize);
        match self.get_mut(r.buffer)? {
            Memory::HostWrite(b) => {
                slice_mut(b, range, r)?.copy_from_slice(data);
                Ok(())
            }
            Memory::Device(buf) => Ok(ctx.accelerator.copy_to_device(
                buf.slice(range.start, range.len()),
                data,
                &ctx.stream,
            )?),
            Memory::HostRead(_) => Err(read_only(r.buffer)),
        }
    }

    /// The bytes of `r`, where they lie in host memory (`None`: on a device).
    pub(super) fn host(&self, r: Region, esize: usize) -> Result<Option<&[u8]>, ExecError> {
        let range = byte_range(r, esize);
        match self.get(r.buffer)? {
            Memory::HostRead(b) => slice(b, range, r).map(Some),
            Memory::HostWrite(b) => slice(b, range, r).map(Some),
            Memory::Device(_) => Ok(None),
        }
    }

    /// The bytes of `r` to be written, where they lie in host memory (`None`: on a device,
    /// reached through the Accelerator only).
    pub(super) fn host_mut(
        &mut self,
        r: Region,
        esize: usize,
    ) -> Result<Option<&mut [u8]>, ExecError> {
        let range = byte_range(r, esize);
        match self.get_mut(r.buffer)? {
            Memory::HostWrite(b) => slice_mut(b, range, r).map(Some),
            Memory::Device(_) => Ok(None),
            Memory::HostRead(_) => Err(read_only(r.buffer)),
        }
    }

    /// `r = r (op) data`.
    pub(super) fn reduce_into(
        &mut self,
        r: Region,
        esize: usize,
        data: &[u8],
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        let range = byte_range(r, esize);
        match self.get_mut(r.buffer)? {
            Memory::HostWrite(b) => host_reduce(slice_mut(b, range, r)?, data, ctx),
            Memory::Device(buf) => Ok(ctx.accelerator.reduce_from_host(
                buf.slice(range.start, range.len()),
                data,
                ctx.dtype,
                ctx.op,
                &ctx.stream,
            )?),
            Memory::HostRead(_) => Err(read_only(r.buffer)),
        }
    }

    /// `r = r / world` (the end of `avg`).
    pub(super) fn divide(
        &mut self,
        r: Region,
        esize: usize,
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        let range = byte_range(r, esize);
        match self.get_mut(r.buffer)? {
            Memory::HostWrite(b) => {
                kernels::divide_bytes(slice_mut(b, range, r)?, ctx.dtype, ctx.world)
                    .map_err(|e| ExecError::Binding(e.to_string()))
            }
            Memory::Device(buf) => Ok(ctx.accelerator.divide(
                buf.slice(range.start, range.len()),
                ctx.dtype,
                ctx.world,
                &ctx.stream,
            )?),
            Memory::HostRead(_) => Err(read_only(r.buffer)),
        }
    }

    /// `into = seed (op) data`: an out-of-place reduction's first touch of `into`. Where both
    /// are host memory of different buffers, one pass reads the seed and the data and writes
    /// the result; otherwise the seed is copied, then `data` reduced into it.
    pub(super) fn reduce_seeded(
        &mut self,
        seed: Region,
        into: Region,
        esize: usize,
        data: &[u8],
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        {
            let Bindings {
                input,
                output,
                scratch,
            } = &mut *self;
            let pair = match (seed.buffer, into.buffer) {
                (BufferId::Input, BufferId::Output) => Some((input.as_ref(), output.as_mut())),
                (BufferId::Input, BufferId::Scratch) => Some((input.as_ref(), scratch.as_mut())),
                (BufferId::Output, BufferId::Scratch) => Some((output.as_ref(), scratch.as_mut())),
                (BufferId::Scratch, BufferId::Output) => Some((scratch.as_ref(), output.as_mut())),
                _ => None,
            };
            if let Some((Some(src), Some(Memory::HostWrite(dst)))) = pair {
                let a = match src {
                    Memory::HostRead(s) => Some(slice(s, byte_range(seed, esize), seed)?),
                    Memory::HostWrite(s) => Some(slice(s, byte_range(seed, esize), seed)?),
                    Memory::Device(_) => None,
                };
                if let Some(a) = a {
                    let d = slice_mut(dst, byte_range(into, esize), into)?;
                    return kernels::combine_bytes(d, a, data, ctx.dtype, ctx.op)
                        .map_err(|e| ExecError::Binding(e.to_string()));
                }
            }
        }
        self.copy(seed, into, esize, ctx)?;
        self.reduce_into(into, esize, data, ctx)
    }

    /// Copy `from` to `to` (different buffers, or disjoint ranges of one).
    pub(super) fn copy(
        &mut self,
        from: Region,
        to: Region,
        esize: usize,
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        let (fr, tr) = (byte_range(from, esize), byte_range(to, esize));
        if from.buffer == to.buffer {
            return match self.get_mut(to.buffer)? {
                Memory::HostWrite(b) => {
                    slice(b, fr.clone(), from)?;
                    slice(b, tr.clone(), to)?;
                    b.copy_within(fr, tr.start);
                    Ok(())
                }
                Memory::Device(buf) => Ok(ctx.accelerator.copy_within(
                    buf.slice(tr.start, tr.len()),
                    buf.slice(fr.start, fr.len()),
                    &ctx.stream,
                )?),
                Memory::HostRead(_) => Err(read_only(to.buffer)),
            };
        }
        let Bindings {
            input,
            output,
            scratch,
        } = self;
        let (src, dst) = match (from.buffer, to.buffer) {
            (BufferId::Input, BufferId::Output) => (input.as_ref(), output.as_mut()),
            (BufferId::Input, BufferId::Scratch) => (input.as_ref(), scratch.as_mut()),
            (BufferId::Output, BufferId::Scratch) => (output.as_ref(), scratch.as_mut()),
            (BufferId::Scratch, BufferId::Output) => (scratch.as_ref(), output.as_mut()),
            (BufferId::Output, BufferId::Input) | (BufferId::Scratch, BufferId::Input) => {
                return Err(read_only(BufferId::Input));
            }
            _ => return Err(ExecError::Binding("copy within one buffer".into())),
        };
        let src = src.ok_or_else(|| unbound(from.buffer))?;
        let dst = dst.ok_or_else(|| unbound(to.buffer))?;
        match (src, dst) {
            (Memory::Device(s), Memory::Device(d)) => Ok(ctx.accelerator.copy_within(
                d.slice(tr.start, tr.len()),
                s.slice(fr.start, fr.len()),
                &ctx.stream,
            )?),
            (Memory::Device(s), Memory::HostWrite(d)) => Ok(ctx.accelerator.copy_to_host(
                slice_mut(d, tr, to)?,
                s.slice(fr.start, fr.len()),
                &ctx.stream,
            )?),
            (Memory::HostRead(s), Memory::Device(d)) => Ok(ctx.accelerator.copy_to_device(
                d.slice(tr.start, tr.len()),
                slice(s, fr, from)?,
                &ctx.stream,
            )?),
            (Memory::HostWrite(s), Memory::Device(d)) => Ok(ctx.accelerator.copy_to_device(
                d.slice(tr.start, tr.len()),
                slice(s, fr, from)?,
                &ctx.stream,
            )?),
            (Memory::HostRead(s), Memory::HostWrite(d)) => {
                slice_mut(d, tr, to)?.copy_from_slice(slice(s, fr, from)?);
                Ok(())
            }
            (Memory::HostWrite(s), Memory::HostWrite(d)) => {
                slice_mut(d, tr, to)?.copy_from_slice(slice(s, fr, from)?);
                Ok(())
            }
            (_, Memory::HostRead(_)) => Err(read_only(to.buffer)),
        }
    }
}

fn read_only(id: BufferId) -> ExecError {
    ExecError::Binding(format!("the plan writes {id:?}, which is bound read-only"))
}

fn slice(b: &[u8], range: std::ops::Range<usize>, r: Region) -> Result<&[u8], ExecError> {
    let len = b.len();
    b.get(range).ok_or_else(|| {
        ExecError::Binding(format!("region {r:?} is outside a buffer of {len} bytes"))
    })
}

fn slice_mut(
    b: &mut [u8],
    range: std::ops::Range<usize>,
    r: Region,
) -> Result<&mut [u8], ExecError> {
    let len = b.len();
    b.get_mut(range).ok_or_else(|| {
        ExecError::Binding(format!("region {r:?} is outside a buffer of {len} bytes"))
    })
}

/// Host-side reduction used for host-memory regions: the reference kernels.
fn host_reduce(dst: &mut [u8], src: &[u8], ctx: &OpContext<'_>) -> Result<(), ExecError> {
    kernels::reduce_bytes(dst, src, ctx.dtype, ctx.op)
        .map_err(|e| ExecError::Binding(e.to_string()))
}

fn byte_range(r: Region, esize: usize) -> std::ops::Range<usize> {
    r.offset * esize..(r.offset + r.len) * esize
}
