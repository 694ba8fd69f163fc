//! `plugin:N` devices: device N of a vendor's shared object implementing
//! `include/bcl_device_plugin.h`, loaded at run time from the path `BCL_DEVICE_PLUGIN` names.
//!
//! ```text
//!   PluginDevice (Accelerator) ──► Library (one per path, shared by its devices;
//!        │ handles checked here        init once, finalize after the last device)
//!        ▼                                   │
//!   table.rs: the C table, checked at load ──► vendor.so: bclDevicePlugin_v1
//! ```
//!
//! Buffers, streams and tickets are the plugin's handles inside BCL's handle types, tagged
//! with the device's uid; ranges, lengths and element counts are checked here before the
//! plugin sees them, and a failing entry becomes a [`DeviceError::Driver`] that names the
//! plugin file, the entry and what the plugin said.

mod table;

use crate::accelerator::{
    Accelerator, BufferOwner, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo,
    DeviceSlice, Event, Stream, Vendor, check_lengths, new_device_uid,
};
use crate::dtype::{DataType, ReduceOp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use table::{Failure, Table};

/// A loaded plugin, shared by every device opened from its path.
struct Library {
    path: PathBuf,
    table: Table,
    devices: c_int,
}

impl Drop for Library {
    fn drop(&mut self) {
        // The last device is gone: let the plugin release what it holds. Nothing can be done
        // about a failure here but saying so.
        if let Err(f) = self.table.finalize() {
            eprintln!(
                "bcl: device plugin {}: finalize failed ({}): {}",
                self.path.display(),
                f.meaning(),
                f.text
            );
        }
    }
}

/// Plugins by path: loaded once, and unloaded (finalized) when their last device goes.
static LOADED: Mutex<Option<HashMap<PathBuf, Weak<Library>>>> = Mutex::new(None);

impl Library {
    fn get(path: &Path) -> Result<Arc<Library>, DeviceError> {
        let mut loaded = LOADED.lock();
        let map = loaded.get_or_insert_with(HashMap::new);
        if let Some(lib) = map.get(path).and_then(Weak::upgrade) {
            return Ok(lib);
        }
        let unavailable = DeviceError::Unavailable;
        let table = Table::load(path).map_err(unavailable)?;
        let shown = path.display();
        table.init().map_err(|f| {
            DeviceError::Unavailable(format!(
                "device plugin {shown} ({}): entry init failed ({}): {}",
                table.name,
                f.meaning(),
                f.text
            ))
        })?;
        // From here on, dropping the library finalizes the plugin.
        let mut lib = Library {
            devices: 0,
            path: path.to_path_buf(),
            table,
        };
        lib.devices = lib.table.devices().map_err(|f| lib.failed_to_load(&f))?;
        if lib.devices < 1 {
            return Err(DeviceError::Unavailable(format!(
                "device plugin {shown} ({}): entry devices reports {} devices",
                lib.table.name, lib.devices
            )));
        }
        let lib = Arc::new(lib);
        map.insert(path.to_path_buf(), Arc::downgrade(&lib));
        Ok(lib)
    }

    fn failed_to_load(&self, f: &Failure) -> DeviceError {
        DeviceError::Unavailable(format!(
            "device plugin {} ({}): entry {} failed ({}): {}",
            self.path.display(),
            self.table.name,
            f.entry,
            f.meaning(),
            f.text
        ))
    }
}

/// Gives a buffer's memory back to the plugin when its last handle goes.
struct Owner {
    library: Arc<Library>,
    device: c_int,
}

impl BufferOwner for Owner {
    fn release(&self, id: u64) {
        // A plugin that cannot free is the plugin's problem; BCL has nothing left to do.
        let _ = self.library.table.mem_free(self.device, id);
    }
}

/// A device of a device plugin.
pub struct PluginDevice {
    info: DeviceInfo,
    uid: u64,
    device: c_int,
    owner: Arc<Owner>,
}

impl std::fmt::Debug for PluginDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PluginDevice({} from {})",
            self.info,
            self.owner.library.path.display()
        )
    }
}

impl PluginDevice {
    /// Device `index` of the plugin at `path` (loading it on first use). Fails, naming the
    /// file and the entry, where the plugin cannot be loaded, its table is wrong, an entry
    /// fails, or it has no such device.
    pub fn open(path: &Path, index: u32) -> Result<Self, DeviceError> {
        let library = Library::get(path)?;
        let shown = path.display();
        let name = library.table.name.clone();
        let device = c_int::try_from(index)
            .ok()
            .filter(|d| *d < library.devices)
            .ok_or_else(|| {
                DeviceError::Unavailable(format!(
                    "plugin:{index}: device plugin {shown} ({name}) has {} devices",
                    library.devices
                ))
            })?;
        let (model, copy, reduce) = library
            .table
            .properties(device)
            .map_err(|f| library.failed_to_load(&f))?;
        let known = |gbps: f64| (gbps.is_finite() && gbps > 0.0).then_some(gbps);
        let info = DeviceInfo {
            vendor: Vendor::Other(name),
            model,
            index,
            host_id: crate::host::host_identity(),
            capabilities: DeviceCapabilities {
                host_addressable: false,
                external_memory: false,
                copy_gbps: known(copy),
                reduce_gbps: known(reduce),
            },
        };
        Ok(PluginDevice {
            info,
            uid: new_device_uid(),
            device,
            owner: Arc::new(Owner { library, device }),
        })
    }

    fn table(&self) -> &Table {
        &self.owner.library.table
    }

    /// A failed entry as this device's error.
    fn failed(&self, f: Failure) -> DeviceError {
        DeviceError::Driver {
            device: self.info.to_string(),
            call: f.entry,
            reason: format!(
                "device plugin {}: {}: {}",
                self.owner.library.path.display(),
                f.meaning(),
                f.text
            ),
        }
    }

    fn foreign(&self, what: &'static str) -> DeviceError {
        DeviceError::ForeignHandle {
            device: self.info.to_string(),
            what,
        }
    }

    /// The plugin's (handle, offset) for `s`, checked to lie inside a buffer of this device.
    fn range(&self, s: &DeviceSlice<'_>) -> Result<(u64, usize), DeviceError> {
        let range = s.checked(self.uid, &self.info)?;
        Ok((s.buffer.id(), range.start))
    }

    fn stream(&self, stream: &Stream) -> Result<u64, DeviceError> {
        if stream.device_uid() != self.uid {
            return Err(self.foreign("stream"));
        }
        Ok(stream.id())
    }

    fn lengths(&self, dst: usize, src: usize, dtype: Option<DataType>) -> Result<(), DeviceError> {
        check_lengths(&self.info, dst, src, dtype)
    }
}

impl Accelerator for PluginDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let mem = (self.table().mem_alloc(self.device, len)).map_err(|f| match f.code {
            2 => DeviceError::OutOfMemory {
                device: self.info.to_string(),
                bytes: len,
                reason: format!(
                    "device plugin {}: memAlloc: {}",
                    self.owner.library.path.display(),
                    f.text
                ),
            },
            _ => self.failed(f),
        })?;
        let owner: Arc<dyn BufferOwner> = self.owner.clone();
        Ok(DeviceBuffer::new(mem, len, self.uid, owner))
    }

    fn default_stream(&self) -> Stream {
        Stream::new(self.uid, 0)
    }

    fn create_stream(&self) -> Result<Stream, DeviceError> {
        let id = (self.table().stream_create(self.device)).map_err(|f| self.failed(f))?;
        Ok(Stream::new(self.uid, id))
    }

    fn copy_to_device(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, s) = (self.range(&dst)?, self.stream(stream)?);
        self.lengths(dst.len, src.len(), None)?;
        (self.table().copy_to_device(self.device, d, src, s)).map_err(|f| self.failed(f))
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (from, s) = (self.range(&src)?, self.stream(stream)?);
        self.lengths(dst.len(), src.len, None)?;
        (self.table().copy_to_host(self.device, dst, from, s)).map_err(|f| self.failed(f))
    }

    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, from, s) = (self.range(&dst)?, self.range(&src)?, self.stream(stream)?);
        self.lengths(dst.len, src.len, None)?;
        (self
            .table()
            .copy_on_device(self.device, d, from, dst.len, s))
        .map_err(|f| self.failed(f))
    }

    fn reduce_from_host(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, s) = (self.range(&dst)?, self.stream(stream)?);
        self.lengths(dst.len, src.len(), Some(dtype))?;
        let op = op.accumulate_op().code();
        (self
            .table()
            .reduce_from_host(self.device, d, src, dtype.code(), op, s))
        .map_err(|f| self.failed(f))
    }

    fn reduce_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, from, s) = (self.range(&dst)?, self.range(&src)?, self.stream(stream)?);
        self.lengths(dst.len, src.len, Some(dtype))?;
        let op = op.accumulate_op().code();
        (self
            .table()
            .reduce_on_device(self.device, d, from, dst.len, dtype.code(), op, s))
        .map_err(|f| self.failed(f))
    }

    fn divide(
        &self,
        dst: DeviceSlice<'_>,
        dtype: DataType,
        divisor: usize,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, s) = (self.range(&dst)?, self.stream(stream)?);
        self.lengths(dst.len, dst.len, Some(dtype))?;
        (self
            .table()
            .divide(self.device, d, dst.len, dtype.code(), divisor, s))
        .map_err(|f| self.failed(f))
    }

    fn record_event(&self, stream: &Stream) -> Result<Event, DeviceError> {
        let s = self.stream(stream)?;
        let ticket = (self.table().event_record(self.device, s)).map_err(|f| self.failed(f))?;
        Ok(Event::new(self.uid, ticket))
    }

    fn event_complete(&self, event: &Event) -> Result<bool, DeviceError> {
        if event.device_uid() != self.uid {
            return Err(self.foreign("event"));
        }
        (self.table().event_query(self.device, event.id())).map_err(|f| self.failed(f))
    }

    fn synchronize(&self, stream: &Stream) -> Result<(), DeviceError> {
        let s = self.stream(stream)?;
        (self.table().stream_synchronize(self.device, s)).map_err(|f| self.failed(f))
    }
}
