//! The one unsafe edge shared by the transports: `poll(2)` over several descriptors (sockets,
//! the shm doorbell, pidfds).
#![allow(unsafe_code)]

use std::os::fd::RawFd;
use std::time::Duration;

/// Wait until one of `fds` is readable (or writable, where asked), or `timeout` passes.
/// `fds`: (descriptor, also wait for writability).
pub fn poll_fds(fds: &[(RawFd, bool)], timeout: Duration) -> std::io::Result<()> {
    // The usual few descriptors live on the stack: a wait allocates nothing.
    const ON_STACK: usize = 16;
    let unused = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    let mut on_stack = [unused; ON_STACK];
    let mut on_heap = Vec::new();
    let pfds: &mut [libc::pollfd] = if fds.len() <= ON_STACK {
        &mut on_stack[..fds.len()]
    } else {
        on_heap.resize(fds.len(), unused);
        &mut on_heap
    };
    for (pfd, &(fd, write)) in pfds.iter_mut().zip(fds) {
        pfd.fd = fd;
        pfd.events = libc::POLLIN | if write { libc::POLLOUT } else { 0 };
    }
    // Round up: a sub-millisecond timeout must still sleep rather than spin.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()` pollfd structs
    // that outlives the call; poll(2) only writes their `revents` fields.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Whether `fd` is readable right now (a pidfd: the process has exited).
pub fn readable_now(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd struct, exclusively borrowed for the call; a zero
    // timeout returns at once.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Descriptors checked together without blocking; reused between calls so that checking
/// allocates nothing.
#[derive(Default)]
pub struct ReadableSet {
    fds: Vec<libc::pollfd>,
}

impl std::fmt::Debug for ReadableSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadableSet({} fds)", self.fds.len())
    }
}

impl ReadableSet {
    pub fn clear(&mut self) {
        self.fds.clear();
    }

    pub fn push(&mut self, fd: RawFd) {
        self.fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// One poll(2) with a zero timeout over every pushed descriptor.
    pub fn check(&mut self) -> std::io::Result<()> {
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs;
        // poll(2) only writes their `revents` fields, and a zero timeout returns at once.
        let rc = unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, 0) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            for p in self.fds.iter_mut() {
                p.revents = libc::POLLIN;
            }
        }
        Ok(())
    }

    /// Whether the `i`-th pushed descriptor has something to read (or an error or hang-up to
    /// report) after the last [`ReadableSet::check`].
    pub fn readable(&self, i: usize) -> bool {
        self.fds
            .get(i)
            .is_none_or(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
    }
}
