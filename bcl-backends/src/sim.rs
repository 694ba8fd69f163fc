//! The `sim` backend: a simulated second vendor.
//!
//! Its memory lives in an arena behind handles (host code cannot dereference it), and its
//! copies and reductions take the time a device of the configured bandwidth would take:
//! the device is modelled as one serial engine whose busy time advances by `bytes / rate` per
//! operation, and each call returns when its operation would have finished. This proves the
//! Accelerator abstraction is real and lets tests build mixed rings and slow devices without
//! hardware. Results are bit-identical to the cpu reference.

use crate::accelerator::{
    Accelerator, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo, DeviceSlice, Event,
    HostStaged, Stream, Vendor, new_device_uid,
};
use crate::arena::Arena;
use crate::dtype::{DataType, ReduceOp};
use crate::kernels;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Speeds of a simulated device, in GB/s (10^9 bytes per second). `None`: as fast as the host.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SimConfig {
    pub copy_gbps: Option<f64>,
    pub reduce_gbps: Option<f64>,
}

/// A simulated accelerator.
#[derive(Debug)]
pub struct SimDevice {
    info: DeviceInfo,
    config: SimConfig,
    arena: Arena,
    busy_until: Mutex<Instant>,
}

impl SimDevice {
    pub fn new(index: u32, config: SimConfig) -> Self {
        let show = |r: Option<f64>| r.map_or("host".to_string(), |g| format!("{g}GB/s"));
        let info = DeviceInfo {
            vendor: Vendor::Sim,
            model: format!(
                "sim copy={} reduce={}",
                show(config.copy_gbps),
                show(config.reduce_gbps)
            ),
            index,
            host_id: crate::host::host_identity(),
            capabilities: DeviceCapabilities {
                host_addressable: false,
                external_memory: false,
                copy_gbps: config.copy_gbps,
                reduce_gbps: config.reduce_gbps,
            },
        };
        let arena = Arena::new(new_device_uid(), format!("sim:{index}"));
        SimDevice {
            info,
            config,
            arena,
            busy_until: Mutex::new(Instant::now()),
        }
    }

    /// Occupy the simulated engine for `bytes` at `gbps`, returning when the work would end.
    fn pace(&self, bytes: usize, gbps: Option<f64>) {
        let Some(gbps) = gbps.filter(|g| *g > 0.0) else {
            return;
        };
        let cost = Duration::from_secs_f64(bytes as f64 / (gbps * 1e9));
        let end = {
            let mut busy = self.busy_until.lock();
            let start = (*busy).max(Instant::now());
            *busy = start + cost;
            *busy
        };
        let now = Instant::now();
        if end > now {
            std::thread::sleep(end - now);
        }
    }
}

impl Accelerator for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError> {
        self.arena.allocate(len)
    }

    fn default_stream(&self) -> Stream {
        self.arena.stream(0)
    }

    fn create_stream(&self) -> Result<Stream, DeviceError> {
        Ok(self.arena.new_stream())
    }

    fn copy_to_device(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena.length_check(dst.len, src.len())?;
        self.arena.with_mut(dst, |d| d.copy_from_slice(src))?;
        self.pace(src.len(), self.config.copy_gbps);
        Ok(())
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena.length_check(dst.len(), src.len)?;
        self.arena.with_mut(src, |s| dst.copy_from_slice(s))?;
        self.pace(dst.len(), self.config.copy_gbps);
        Ok(())
    }

    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena.copy_within(dst, src)?;
        self.pace(dst.len, self.config.copy_gbps);
        Ok(())
    }

    fn reduce_from_host(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena
            .with_mut(dst, |d| kernels::reduce_bytes(d, src, dtype, op))?
            .map_err(|e| self.arena.kernel_error(e))?;
        self.pace(src.len(), self.config.reduce_gbps);
        Ok(())
    }

    fn divide(
        &self,
        dst: DeviceSlice<'_>,
        dtype: DataType,
        divisor: usize,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena
            .with_mut(dst, |d| kernels::divide_bytes(d, dtype, divisor))?
            .map_err(|e| self.arena.kernel_error(e))?;
        self.pace(dst.len, self.config.reduce_gbps);
        Ok(())
    }

    fn record_event(&self, stream: &Stream) -> Result<Event, DeviceError> {
        self.arena.event(stream)
    }

    fn event_complete(&self, event: &Event) -> Result<bool, DeviceError> {
        self.arena.check_event(event)?;
        Ok(true)
    }

    fn synchronize(&self, stream: &Stream) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)
    }

    /// The sim device's streams never run ahead, so staging is immediate: the mirrors are
    /// copies made now, and finishing writes the output mirror back. Lets the staged path
    /// of the core (what the C ABI uses for GPUs) run on machines without one.
    fn stage_through_host(
        &self,
        input: Option<DeviceSlice<'_>>,
        output: Option<DeviceSlice<'_>>,
        stream: &Stream,
    ) -> Result<Box<dyn HostStaged>, DeviceError> {
        self.arena.check_stream(stream)?;
        let copy = |s: DeviceSlice<'_>| self.arena.with_mut(s, |b| b.to_vec());
        let input_mirror = input.map(copy).transpose()?;
        let (output_mirror, upload) = match output {
            Some(o) => (
                Some(copy(o)?),
                Some(Box::new(self.arena.writer(o.buffer, o.offset)?)
                    as Box<dyn FnOnce(&[u8]) + Send>),
            ),
            None => (None, None),
        };
        let bytes =
            input_mirror.as_ref().map_or(0, Vec::len) + output_mirror.as_ref().map_or(0, Vec::len);
        self.pace(bytes, self.config.copy_gbps);
        Ok(Box::new(SimStaged {
            input: input_mirror,
            output: output_mirror,
            upload,
        }))
    }
}

/// Writes a staged collective's output back into device memory.
type Upload = Box<dyn FnOnce(&[u8]) + Send>;

/// A collective staged through host memory on the sim device.
struct SimStaged {
    input: Option<Vec<u8>>,
    output: Option<Vec<u8>>,
    upload: Option<Upload>,
}

impl std::fmt::Debug for SimStaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStaged")
            .field("input", &self.input.as_ref().map(Vec::len))
            .field("output", &self.output.as_ref().map(Vec::len))
            .finish()
    }
}

impl HostStaged for SimStaged {
    fn ready(&self) -> bool {
        true
    }

    fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>) {
        (self.input.as_deref(), self.output.as_deref_mut())
    }

    fn finish(self: Box<Self>) {
        drop(self);
    }
}

impl Drop for SimStaged {
    fn drop(&mut self) {
        if let (Some(upload), Some(output)) = (self.upload.take(), self.output.as_ref()) {
            upload(output);
        }
    }
}
