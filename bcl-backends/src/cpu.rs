//! The `cpu` backend: device memory is host memory owned by the backend, and every operation
//! runs the reference kernels synchronously on the calling thread.

use crate::accelerator::{
    Accelerator, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo, DeviceSlice, Event,
    Stream, Vendor, new_device_uid,
};
use crate::arena::Arena;
use crate::dtype::{DataType, ReduceOp};
use crate::kernels;

/// The host CPU as an accelerator.
#[derive(Debug)]
pub struct CpuDevice {
    info: DeviceInfo,
    arena: Arena,
}

impl CpuDevice {
    pub fn new(index: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let info = DeviceInfo {
            vendor: Vendor::Cpu,
            model: format!("host cpu ({cores} cores)"),
            index,
            host_id: crate::host::host_identity(),
            capabilities: DeviceCapabilities {
                host_addressable: true,
                external_memory: false,
                copy_gbps: None,
                reduce_gbps: None,
            },
        };
        let arena = Arena::new(new_device_uid(), format!("cpu:{index}"));
        CpuDevice { info, arena }
    }
}

impl Accelerator for CpuDevice {
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
        self.arena.with_mut(dst, |d| d.copy_from_slice(src))
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena.length_check(dst.len(), src.len)?;
        self.arena.with_mut(src, |s| dst.copy_from_slice(s))
    }

    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        self.arena.check_stream(stream)?;
        self.arena.copy_within(dst, src)
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
            .map_err(|e| self.arena.kernel_error(e))
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
            .map_err(|e| self.arena.kernel_error(e))
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
}
