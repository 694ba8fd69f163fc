//! The health port's accept thread: takes each connection and hands it to a helper that
//! authenticates and serves it (`service::handshake`), within a bound on handshakes in flight.
//!
//! On a thread of its own, not the health thread's. Measured with 64 ranks on this 2-core
//! machine, helpers already started elsewhere: rank 0, which every rank reports to, still
//! spent 1-12 s in one round of accepts on its health thread, sent no heartbeat meanwhile,
//! and was named unresponsive. (Handing a connection over takes locks that helpers also take,
//! the admission queue's and the spawner's; a helper preempted holding one is the likely
//! wait: the two were not timed apart.)

use super::Inner;
use super::helpers::spawn_helper;
use super::service::handshake;
use bcl_transport::admission::Admission;
use bcl_transport::tcp::wait_readable;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Handshakes of strangers (beyond two per peer) in flight at once on the health port.
const STRANGERS_IN_FLIGHT: usize = 32;
/// Connections taken per round, between looks at the stop flag.
const ACCEPTS_PER_ROUND: usize = 16;
/// The longest the thread sleeps without looking at the stop flag (shutdown also wakes it).
const POLL: Duration = Duration::from_millis(500);

/// Accept until shutdown (`inner.stop`, with a byte on `woken`).
pub(super) fn run(inner: Arc<Inner>, listener: TcpListener, woken: UnixDatagram) {
    // Sized once the peers are known (the first connections come after bootstrap): every
    // peer may probe or deliver to this rank at once during a diagnosis.
    let mut admission: Option<Arc<Admission>> = None;
    while !inner.stop.load(Ordering::Acquire) {
        for _ in 0..ACCEPTS_PER_ROUND {
            match listener.accept() {
                Ok((stream, from)) => {
                    let admission = admission.get_or_insert_with(|| {
                        Admission::new(2 * inner.peers().len() + STRANGERS_IN_FLIGHT)
                    });
                    let ticket = admission.enter(&stream);
                    let inner2 = inner.clone();
                    spawn_helper(&inner, "accept", move || {
                        handshake(&inner2, stream, from, ticket);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(rank = inner.rank, "health accept failed: {e}");
                    break;
                }
            }
        }
        if let Err(e) = wait_readable(&[listener.as_fd(), woken.as_fd()], POLL) {
            tracing::debug!(rank = inner.rank, "health accept poll failed: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut drain = [0u8; 64];
        while woken.recv(&mut drain).is_ok() {}
    }
}
