//! The one unsafe edge of device plugins: the C table of `include/bcl_device_plugin.h`, how
//! it is loaded and checked, and every call through it. Each wrapper takes Rust values
//! (slices whose lengths are the byte counts passed on) and turns a failure into a
//! [`Failure`] naming the entry and the plugin's own message.
#![allow(unsafe_code)]

use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;

/// `bclDevResult_t`.
type Code = c_int;
/// `bclDevMem_t`, `bclDevStream_t`, `bclDevTicket_t`.
type Handle = u64;

/// `bclDevicePlugin_v1_t`, field for field (a NULL entry reads as `None`).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawTable {
    name: *const c_char,
    version: c_int,
    init: Option<unsafe extern "C" fn() -> Code>,
    finalize: Option<unsafe extern "C" fn() -> Code>,
    devices: Option<unsafe extern "C" fn(*mut c_int) -> Code>,
    get_properties: Option<unsafe extern "C" fn(c_int, *mut RawProperties) -> Code>,
    mem_alloc: Option<unsafe extern "C" fn(c_int, usize, *mut Handle) -> Code>,
    mem_free: Option<unsafe extern "C" fn(c_int, Handle) -> Code>,
    copy_to_device:
        Option<unsafe extern "C" fn(c_int, Handle, usize, *const c_void, usize, Handle) -> Code>,
    copy_to_host:
        Option<unsafe extern "C" fn(c_int, *mut c_void, Handle, usize, usize, Handle) -> Code>,
    copy_on_device:
        Option<unsafe extern "C" fn(c_int, Handle, usize, Handle, usize, usize, Handle) -> Code>,
    reduce_from_host: Option<
        unsafe extern "C" fn(
            c_int,
            Handle,
            usize,
            *const c_void,
            usize,
            c_int,
            c_int,
            Handle,
        ) -> Code,
    >,
    reduce_on_device: Option<
        unsafe extern "C" fn(
            c_int,
            Handle,
            usize,
            Handle,
            usize,
            usize,
            c_int,
            c_int,
            Handle,
        ) -> Code,
    >,
    divide: Option<unsafe extern "C" fn(c_int, Handle, usize, usize, c_int, usize, Handle) -> Code>,
    stream_create: Option<unsafe extern "C" fn(c_int, *mut Handle) -> Code>,
    stream_synchronize: Option<unsafe extern "C" fn(c_int, Handle) -> Code>,
    event_record: Option<unsafe extern "C" fn(c_int, Handle, *mut Handle) -> Code>,
    event_query: Option<unsafe extern "C" fn(c_int, Handle, *mut c_int) -> Code>,
    last_error: Option<unsafe extern "C" fn() -> *const c_char>,
}

/// `bclDeviceProperties_v1_t`.
#[repr(C)]
struct RawProperties {
    model: [c_char; 128],
    copy_gbps: f64,
    reduce_gbps: f64,
}

/// The version of the table this build understands, and the symbol it is exported as.
pub(super) const VERSION: c_int = 1;
const SYMBOL: &str = "bclDevicePlugin_v1";
/// Tables of other versions a plugin may export instead, to say what it is.
const OTHER_SYMBOLS: [&str; 3] = [
    "bclDevicePlugin_v0",
    "bclDevicePlugin_v2",
    "bclDevicePlugin_v3",
];

/// An entry that failed: its name, its code, and what the plugin said.
#[derive(Debug)]
pub(super) struct Failure {
    pub entry: &'static str,
    pub code: Code,
    pub text: String,
}

impl Failure {
    /// `bclDevResult_t` in words.
    pub fn meaning(&self) -> &'static str {
        match self.code {
            1 => "invalid argument",
            2 => "out of memory",
            3 => "internal error",
            _ => "unknown result code",
        }
    }
}

/// A loaded, checked plugin: its library (kept loaded while the table is in use), its name,
/// and the entries, every one present.
pub(super) struct Table {
    raw: RawTable,
    pub name: String,
    _library: Library,
}

// SAFETY: the table holds function pointers into a library kept loaded for its lifetime, and
// a name pointer never read after `load`; bcl_device_plugin.h requires every entry to be
// thread-safe, so calls from several threads at once are allowed.
unsafe impl Send for Table {}
// SAFETY: as for Send: entries are thread-safe by the header's contract.
unsafe impl Sync for Table {}

macro_rules! entry {
    ($self:ident . $field:ident) => {
        // Every entry was checked present in `load`.
        match $self.raw.$field {
            Some(f) => f,
            None => unreachable!(concat!("entry ", stringify!($field), " checked at load")),
        }
    };
}

impl Table {
    /// Load `path` and check its table: the symbol, the version, the name and every entry.
    /// Nothing of the plugin runs before the table has passed (`init` is the caller's call).
    pub fn load(path: &Path) -> Result<Table, String> {
        let shown = path.display();
        // SAFETY: loading runs the library's initialisers: BCL_DEVICE_PLUGIN names a library
        // the user trusts to be a device plugin, which is what loading it means.
        let library = unsafe { Library::new(path) }
            .map_err(|e| format!("device plugin {shown}: cannot be loaded: {e}"))?;
        // SAFETY: the symbol is a `const bclDevicePlugin_v1_t`, whose layout RawTable mirrors;
        // its address stays valid while `library` is loaded (it is kept in the Table).
        let symbol = unsafe { library.get::<*const RawTable>(SYMBOL.as_bytes()) };
        let raw = match symbol {
            // SAFETY: as above; the pointer is the table's address, read once here.
            Ok(table) if !table.is_null() => unsafe { **table },
            _ => {
                let found = OTHER_SYMBOLS.iter().find(|s| {
                    // SAFETY: only asked for existence; the symbol is not read.
                    unsafe { library.get::<*const c_void>(s.as_bytes()) }.is_ok()
                });
                return Err(match found {
                    Some(other) => format!(
                        "device plugin {shown}: exports {other}, not {SYMBOL}: it was built for \
                         another version of bcl_device_plugin.h"
                    ),
                    None => format!(
                        "device plugin {shown}: no symbol {SYMBOL} (is it a BCL device plugin?)"
                    ),
                });
            }
        };
        if raw.version != VERSION {
            return Err(format!(
                "device plugin {shown}: its table says version {}, this BCL reads version \
                 {VERSION} (rebuild it against this bcl_device_plugin.h)",
                raw.version
            ));
        }
        if raw.name.is_null() {
            return Err(format!("device plugin {shown}: entry name is NULL"));
        }
        // SAFETY: non-null, and the header requires a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(raw.name) }
            .to_string_lossy()
            .into_owned();
        let missing = [
            ("init", raw.init.is_none()),
            ("finalize", raw.finalize.is_none()),
            ("devices", raw.devices.is_none()),
            ("getProperties", raw.get_properties.is_none()),
            ("memAlloc", raw.mem_alloc.is_none()),
            ("memFree", raw.mem_free.is_none()),
            ("copyToDevice", raw.copy_to_device.is_none()),
            ("copyToHost", raw.copy_to_host.is_none()),
            ("copyOnDevice", raw.copy_on_device.is_none()),
            ("reduceFromHost", raw.reduce_from_host.is_none()),
            ("reduceOnDevice", raw.reduce_on_device.is_none()),
            ("divide", raw.divide.is_none()),
            ("streamCreate", raw.stream_create.is_none()),
            ("streamSynchronize", raw.stream_synchronize.is_none()),
            ("eventRecord", raw.event_record.is_none()),
            ("eventQuery", raw.event_query.is_none()),
            ("lastError", raw.last_error.is_none()),
        ];
        if let Some((entry, _)) = missing.iter().find(|(_, null)| *null) {
            return Err(format!(
                "device plugin {shown} ({name}): entry {entry} is NULL"
            ));
        }
        Ok(Table {
            raw,
            name,
            _library: library,
        })
    }

    /// The plugin's text for the calling thread's last failure.
    fn last_error(&self) -> String {
        let f = entry!(self.last_error);
        // SAFETY: the header: lastError returns a NUL-terminated string (never NULL, but a
        // NULL is tolerated) valid until the thread's next call into the plugin.
        let text = unsafe { f() };
        if text.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated, read before any other call on this thread.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, entry: &'static str, code: Code) -> Result<(), Failure> {
        if code == 0 {
            return Ok(());
        }
        Err(Failure {
            entry,
            code,
            text: self.last_error(),
        })
    }

    pub fn init(&self) -> Result<(), Failure> {
        // SAFETY: called once per load, before any other entry (the header's life cycle).
        self.check("init", unsafe { entry!(self.init)() })
    }

    pub fn finalize(&self) -> Result<(), Failure> {
        // SAFETY: called once, after every device of this plugin is gone.
        self.check("finalize", unsafe { entry!(self.finalize)() })
    }

    pub fn devices(&self) -> Result<c_int, Failure> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int for the call.
        self.check("devices", unsafe { entry!(self.devices)(&mut n) })?;
        Ok(n)
    }

    /// (model, copy GB/s, reduce GB/s) of `device`.
    pub fn properties(&self, device: c_int) -> Result<(String, f64, f64), Failure> {
        let mut props = RawProperties {
            model: [0; 128],
            copy_gbps: 0.0,
            reduce_gbps: 0.0,
        };
        // SAFETY: `props` is a valid, writable bclDeviceProperties_v1_t.
        self.check("getProperties", unsafe {
            entry!(self.get_properties)(device, &mut props)
        })?;
        let bytes: Vec<u8> = props
            .model
            .iter()
            .map(|c| *c as u8)
            .take_while(|b| *b != 0)
            .collect();
        let model = String::from_utf8_lossy(&bytes).into_owned();
        Ok((model, props.copy_gbps, props.reduce_gbps))
    }

    pub fn mem_alloc(&self, device: c_int, bytes: usize) -> Result<Handle, Failure> {
        let mut mem: Handle = 0;
        // SAFETY: `mem` is a valid, writable handle.
        self.check("memAlloc", unsafe {
            entry!(self.mem_alloc)(device, bytes, &mut mem)
        })?;
        Ok(mem)
    }

    pub fn mem_free(&self, device: c_int, mem: Handle) -> Result<(), Failure> {
        // SAFETY: no pointers; `mem` came from memAlloc and has no handle left in BCL.
        self.check("memFree", unsafe { entry!(self.mem_free)(device, mem) })
    }

    pub fn copy_to_device(
        &self,
        device: c_int,
        dst: (Handle, usize),
        src: &[u8],
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: `src` is readable for `src.len()` bytes during the call, and the header lets
        // BCL reuse it once the call returns.
        self.check("copyToDevice", unsafe {
            entry!(self.copy_to_device)(
                device,
                dst.0,
                dst.1,
                src.as_ptr().cast(),
                src.len(),
                stream,
            )
        })
    }

    pub fn copy_to_host(
        &self,
        device: c_int,
        dst: &mut [u8],
        src: (Handle, usize),
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: `dst` is writable for `dst.len()` bytes during the call, and the header
        // requires the data to be written when the call returns (never later).
        self.check("copyToHost", unsafe {
            entry!(self.copy_to_host)(
                device,
                dst.as_mut_ptr().cast(),
                src.0,
                src.1,
                dst.len(),
                stream,
            )
        })
    }

    pub fn copy_on_device(
        &self,
        device: c_int,
        dst: (Handle, usize),
        src: (Handle, usize),
        bytes: usize,
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: no host pointers: handles and offsets checked against the allocations.
        self.check("copyOnDevice", unsafe {
            entry!(self.copy_on_device)(device, dst.0, dst.1, src.0, src.1, bytes, stream)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce_from_host(
        &self,
        device: c_int,
        dst: (Handle, usize),
        src: &[u8],
        dtype: c_int,
        op: c_int,
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: `src` is readable for `src.len()` bytes during the call (reusable after).
        self.check("reduceFromHost", unsafe {
            entry!(self.reduce_from_host)(
                device,
                dst.0,
                dst.1,
                src.as_ptr().cast(),
                src.len(),
                dtype,
                op,
                stream,
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce_on_device(
        &self,
        device: c_int,
        dst: (Handle, usize),
        src: (Handle, usize),
        bytes: usize,
        dtype: c_int,
        op: c_int,
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: no host pointers.
        self.check("reduceOnDevice", unsafe {
            entry!(self.reduce_on_device)(
                device, dst.0, dst.1, src.0, src.1, bytes, dtype, op, stream,
            )
        })
    }

    pub fn divide(
        &self,
        device: c_int,
        dst: (Handle, usize),
        bytes: usize,
        dtype: c_int,
        divisor: usize,
        stream: Handle,
    ) -> Result<(), Failure> {
        // SAFETY: no host pointers.
        self.check("divide", unsafe {
            entry!(self.divide)(device, dst.0, dst.1, bytes, dtype, divisor, stream)
        })
    }

    pub fn stream_create(&self, device: c_int) -> Result<Handle, Failure> {
        let mut stream: Handle = 0;
        // SAFETY: `stream` is a valid, writable handle.
        self.check("streamCreate", unsafe {
            entry!(self.stream_create)(device, &mut stream)
        })?;
        Ok(stream)
    }

    pub fn stream_synchronize(&self, device: c_int, stream: Handle) -> Result<(), Failure> {
        // SAFETY: no pointers.
        self.check("streamSynchronize", unsafe {
            entry!(self.stream_synchronize)(device, stream)
        })
    }

    pub fn event_record(&self, device: c_int, stream: Handle) -> Result<Handle, Failure> {
        let mut ticket: Handle = 0;
        // SAFETY: `ticket` is a valid, writable handle.
        self.check("eventRecord", unsafe {
            entry!(self.event_record)(device, stream, &mut ticket)
        })?;
        Ok(ticket)
    }

    pub fn event_query(&self, device: c_int, ticket: Handle) -> Result<bool, Failure> {
        let mut done: c_int = 0;
        // SAFETY: `done` is a valid, writable int.
        self.check("eventQuery", unsafe {
            entry!(self.event_query)(device, ticket, &mut done)
        })?;
        Ok(done != 0)
    }
}
