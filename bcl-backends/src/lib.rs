//! The device side of BCL: what the collectives core may ask of an accelerator.
//!
//! ```text
//!   bcl-core executor
//!        │  reduce / copy requests over (DeviceBuffer, offset, len), never raw pointers
//!        ▼
//!   dyn Accelerator ──► cpu  (host memory, reference kernels)
//!                   └─► sim  (a second "vendor": arena memory behind handles, paced copies)
//!                   └─► cuda (feature `cuda`: cudarc, NVRTC kernels, pinned staging)
//!                   └─► plugin (a vendor's shared object, `include/bcl_device_plugin.h`)
//!                   └─► any implementation passed in by the caller
//! ```
//!
//! [`DataType`] and [`ReduceOp`] fix the element types and operations; [`kernels`] holds the
//! host reduction kernels whose results every backend must reproduce.

pub mod accelerator;
mod arena;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod host;
pub mod kernels;
pub mod plugin;
pub mod sim;
pub mod spec;

pub use accelerator::{
    Accelerator, BufferOwner, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo,
    DeviceSlice, Download, Event, HostStaged, Stream, StreamHold, Vendor, check_lengths,
    new_device_uid,
};
pub use bytemuck;
pub use dtype::{DataType, Element, ReduceOp};
pub use half;
pub use spec::{DeviceOptions, DeviceSpec, open_device};
