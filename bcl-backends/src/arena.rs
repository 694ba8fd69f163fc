//! Device memory for the backends whose memory lives in this process (cpu, sim): a map of
//! handle → bytes, so that nobody outside the backend can dereference it.

use crate::accelerator::{BufferOwner, DeviceBuffer, DeviceError, DeviceSlice, Event, Stream};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
struct Buffers {
    map: Mutex<HashMap<u64, Vec<u8>>>,
}

impl BufferOwner for Buffers {
    fn release(&self, id: u64) {
        self.map.lock().remove(&id);
    }
}

/// The memory and handle bookkeeping of one in-process device.
pub(crate) struct Arena {
    uid: u64,
    name: String,
    buffers: Arc<Buffers>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("device", &self.name)
            .field("buffers", &self.buffers.map.lock().len())
            .finish()
    }
}

impl Arena {
    pub(crate) fn new(uid: u64, name: String) -> Self {
        Arena {
            uid,
            name,
            buffers: Arc::new(Buffers::default()),
            next_id: AtomicU64::new(1),
        }
    }

    pub(crate) fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|e| DeviceError::OutOfMemory {
                device: self.name.clone(),
                bytes: len,
                reason: e.to_string(),
            })?;
        bytes.resize(len, 0);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.buffers.map.lock().insert(id, bytes);
        let owner: Arc<dyn BufferOwner> = self.buffers.clone();
        Ok(DeviceBuffer::new(id, len, self.uid, owner))
    }

    pub(crate) fn stream(&self, id: u64) -> Stream {
        Stream {
            device_uid: self.uid,
            id,
        }
    }

    pub(crate) fn new_stream(&self) -> Stream {
        self.stream(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn check_stream(&self, stream: &Stream) -> Result<(), DeviceError> {
        self.owns(stream.device_uid, "stream")
    }

    pub(crate) fn event(&self, stream: &Stream) -> Result<Event, DeviceError> {
        self.check_stream(stream)?;
        Ok(Event {
            device_uid: self.uid,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub(crate) fn check_event(&self, event: &Event) -> Result<(), DeviceError> {
        self.owns(event.device_uid, "event")
    }

    fn owns(&self, uid: u64, what: &'static str) -> Result<(), DeviceError> {
        if uid == self.uid {
            Ok(())
        } else {
            Err(DeviceError::ForeignHandle {
                device: self.name.clone(),
                what,
            })
        }
    }

    fn range(&self, s: &DeviceSlice<'_>) -> Result<std::ops::Range<usize>, DeviceError> {
        s.checked(self.uid, &self.name)
    }

    /// Run `f` over the bytes of `s`.
    pub(crate) fn with_mut<R>(
        &self,
        s: DeviceSlice<'_>,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, DeviceError> {
        let range = self.range(&s)?;
        let mut map = self.buffers.map.lock();
        let bytes = map
            .get_mut(&s.buffer.id())
            .ok_or_else(|| DeviceError::ForeignHandle {
                device: self.name.clone(),
                what: "buffer",
            })?;
        Ok(f(&mut bytes[range]))
    }

    /// A writer of `len` bytes at `offset` of `buffer` that outlives this borrow (the sim
    /// backend's staged collectives write their result when they finish).
    pub(crate) fn writer(
        &self,
        buffer: &DeviceBuffer,
        offset: usize,
    ) -> Result<impl FnOnce(&[u8]) + Send + 'static, DeviceError> {
        self.owns(buffer.device_uid(), "buffer")?;
        let (buffers, id, handle) = (self.buffers.clone(), buffer.id(), buffer.clone());
        Ok(move |data: &[u8]| {
            let _keep_alive = &handle;
            if let Some(bytes) = buffers.map.lock().get_mut(&id)
                && let Some(dst) = bytes.get_mut(offset..offset + data.len())
            {
                dst.copy_from_slice(data);
            }
        })
    }

    /// Copy `src` to `dst` inside the arena.
    pub(crate) fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
    ) -> Result<(), DeviceError> {
        let dr = self.range(&dst)?;
        let sr = self.range(&src)?;
        if dr.len() != sr.len() {
            return Err(DeviceError::Kernel {
                device: self.name.clone(),
                source: crate::kernels::KernelError::LengthMismatch {
                    dst: dr.len(),
                    src: sr.len(),
                },
            });
        }
        let mut map = self.buffers.map.lock();
        if dst.buffer.id() == src.buffer.id() {
            let bytes = map.get_mut(&dst.buffer.id()).ok_or_else(|| self.gone())?;
            bytes.copy_within(sr, dr.start);
            return Ok(());
        }
        let [d, s] = map.get_disjoint_mut([&dst.buffer.id(), &src.buffer.id()]);
        let (d, s) = (d.ok_or_else(|| self.gone())?, s.ok_or_else(|| self.gone())?);
        d[dr].copy_from_slice(&s[sr]);
        Ok(())
    }

    fn gone(&self) -> DeviceError {
        DeviceError::ForeignHandle {
            device: self.name.clone(),
            what: "buffer",
        }
    }

    pub(crate) fn kernel_error(&self, source: crate::kernels::KernelError) -> DeviceError {
        DeviceError::Kernel {
            device: self.name.clone(),
            source,
        }
    }

    pub(crate) fn length_check(&self, dst: usize, src: usize) -> Result<(), DeviceError> {
        crate::accelerator::check_lengths(&self.name, dst, src, None)
    }
}
