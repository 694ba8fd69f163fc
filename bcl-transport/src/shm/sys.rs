//! The one unsafe edge of the shm transport: POSIX shared-memory segments mapped into this
//! process, the accesses to them, and the process probes (pidfd, kill 0) that tell a dead peer.
//!
//! Every other file of the transport works through [`Segment`]'s safe, bounds-checked methods.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A shared-memory segment mapped read-write (`MAP_SHARED`) into this process, unmapped on drop.
///
/// Another process maps the same pages and writes them concurrently: the ring protocol says
/// which bytes each side may touch when, and publishes them through the atomics.
#[derive(Debug)]
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value until drop; every access goes through
// atomics or byte copies that do not depend on which thread performs them.
unsafe impl Send for Segment {}
// SAFETY: as for Send; `&Segment` exposes only atomics and copies, no `&mut` to the bytes.
unsafe impl Sync for Segment {}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Segment {
    /// Create the segment `name` (exclusively, mode 0600), `len` bytes of zeros, and map it.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let c = c_name(name)?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let fd = check(unsafe {
            libc::shm_open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        })?;
        // SAFETY: shm_open returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        let mapped = {
            use std::os::fd::AsRawFd;
            // SAFETY: `fd` is a valid open descriptor.
            check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })
                .and_then(|_| {
                    // Reserve the pages now: a tmpfs that runs out of room later would kill
                    // the process with SIGBUS on first touch instead of returning an error.
                    // SAFETY: `fd` is a valid open descriptor; the range is the file's size.
                    match unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, size) } {
                        0 => Ok(()),
                        code => Err(io::Error::from_raw_os_error(code)),
                    }
                })
                .and_then(|_| map(&fd, len))
        };
        if mapped.is_err() {
            let _ = unlink(name);
        }
        mapped
    }

    /// Open and map the existing segment `name`. `Ok(None)`: it does not exist yet, or its
    /// creator has not sized it yet. Refused when another user owns it.
    pub fn open(name: &str) -> io::Result<Option<Segment>> {
        use std::os::fd::AsRawFd;
        let c = c_name(name)?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: shm_open returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is valid and `st` is a writable stat struct.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        if st.st_uid != effective_uid() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("segment {name} belongs to uid {}, not to us", st.st_uid),
            ));
        }
        if st.st_size <= 0 {
            return Ok(None);
        }
        map(&fd, st.st_size as usize).map(Some)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn at(&self, offset: usize, len: usize, align: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len)
                && offset.is_multiple_of(align),
            "segment access {offset}+{len} outside {} bytes or misaligned",
            self.len
        );
        // SAFETY: `offset + len <= self.len` was just checked, so the result stays inside
        // the mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// The 8-byte atomic at `offset` (a multiple of 8).
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        let p = self.at(offset, 8, 8);
        // SAFETY: `p` is in bounds and 8-aligned, the mapping lives as long as `&self`, and every
        // process touches this word only through atomic operations.
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }

    /// The `n` 8-byte atomics from `offset` (a multiple of 8) on.
    pub fn atomic_words(&self, offset: usize, n: usize) -> &[AtomicU64] {
        let p = self.at(offset, n * 8, 8);
        // SAFETY: as for `atomic_u64`, for each of the `n` words: the range is in bounds
        // (checked by `at`) and 8-aligned, and `AtomicU64` has `u64`'s size, so the words lie
        // side by side as a slice does.
        unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), n) }
    }

    /// The 4-byte atomic at `offset` (a multiple of 4).
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        let p = self.at(offset, 4, 4);
        // SAFETY: as for `atomic_u64`, with 4-byte alignment.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// Copy `data` into the segment at `offset`.
    ///
    /// # Safety
    /// No other process may read or write the range until this side publishes it (a release
    /// store the reader acquires): the range is this side's by the ring protocol.
    pub unsafe fn write(&self, offset: usize, data: &[u8]) {
        let p = self.at(offset, data.len(), 1);
        // SAFETY: the destination range is inside the mapping (checked by `at`) and cannot
        // overlap `data` (this process's memory outside the mapping, or a part of it given to
        // this side alone); nobody else touches it meanwhile (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
    }

    /// The `len` bytes at `offset`, lent to this side to write in place (a device copies a
    /// message straight into the ring).
    ///
    /// # Safety
    /// As for [`Segment::write`], for as long as the borrow lasts: the range is this side's
    /// free space, which no other process reads or writes until this side publishes it, and
    /// this side makes no other borrow of it meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        let p = self.at(offset, len, 1);
        // SAFETY: the range is inside the mapping (checked by `at`), which outlives the borrow
        // of `self`; it is this side's alone until published (the caller's contract), so the
        // borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// The `len` bytes at `offset`, borrowed in place.
    ///
    /// # Safety
    /// The range must have been published to this side (the writer's release store, acquired
    /// by this side's load) and no process may write it while the borrow lasts: the ring
    /// protocol hands it back only after the borrow ends.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        let p = self.at(offset, len, 1);
        // SAFETY: the range is inside the mapping (checked by `at`), which outlives the borrow
        // of `self`; nobody writes it while borrowed (the caller's contract).
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// Copy `out.len()` bytes from the segment at `offset` into `out`.
    ///
    /// # Safety
    /// As for [`Segment::slice`], for the duration of the copy.
    pub unsafe fn read(&self, offset: usize, out: &mut [u8]) {
        let p = self.at(offset, out.len(), 1);
        // SAFETY: the source range is inside the mapping (checked by `at`); `out` is exclusively
        // borrowed memory of this process; nobody writes the range meanwhile (the caller's
        // contract).
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) }
    }
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<Segment> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of `len` bytes of a valid descriptor at an address the
    // kernel picks; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            // Populated now: faulting the pages in one by one on first use cost ~1 µs per 4 KiB
            // page on this VM (a 32 KiB allreduce took 35-60 µs instead of 6-10 until each ring
            // had wrapped once).
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base =
        NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
    Ok(Segment { base, len })
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe exactly the mapping made in `map`; no reference into it
        // outlives `self` (every accessor borrows `self`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Remove the name `name`; mappings of it stay valid until unmapped.
pub fn unlink(name: &str) -> io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { libc::shm_unlink(c.as_ptr()) }).map(|_| ())
}

/// A descriptor that becomes readable when process `pid` exits (Linux ≥ 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether process `pid` exists (signal 0: permission errors still mean it exists).
pub fn process_exists(pid: u32) -> bool {
    // SAFETY: signal 0 performs only the existence and permission checks.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Bytes free on the filesystem holding `path` (for `/dev/shm`: how much shared memory may still
/// be created), if it can be told.
pub fn free_bytes(path: &str) -> Option<u64> {
    let c = c_name(path).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value for statvfs to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs struct.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Copy `out.len()` bytes at address `addr` of process `pid` into `out` (cross-memory attach,
/// `process_vm_readv(2)`: one copy, by the kernel, from the other process's pages into ours).
/// The kernel checks that this process may read the other's memory (same user, and the ptrace
/// rules): refused with EPERM otherwise, EFAULT where the range is not mapped there.
pub fn read_process(pid: u32, addr: u64, out: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < out.len() {
        let local = libc::iovec {
            iov_base: out[done..].as_mut_ptr().cast(),
            iov_len: out.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: out.len() - done,
        };
        // SAFETY: `local` describes the unread tail of `out`, memory of this process that is
        // exclusively borrowed for the call; `remote` is only an address in the other process,
        // which the kernel checks (EFAULT) and never dereferences in ours.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read {done} of {} bytes", out.len()),
            ));
        }
        done += n as usize;
    }
    Ok(())
}
