//! A bound on the connections still proving themselves on one listener.
//!
//! Every BCL listener (the store, the tcp and rdma setup sockets, the health channel) hands
//! each accepted connection to a thread that runs the handshake, so that a silent stranger
//! cannot block the others. Without a bound, a flood of idle connections costs a thread and a
//! descriptor each for the handshake's whole time limit. With it, at most `limit` handshakes
//! are in flight: a newcomer beyond that shuts down the oldest one still waiting. A member of
//! the job finishes its handshake in a round trip, so only a stranger that has said nothing
//! for longer than `limit` newer arrivals is cut: the flood evicts itself and the ranks get
//! in (a SYN flood, below accept, stays the kernel's business).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// How often a dialler tries again when its handshake was cut (a flood evicting it).
pub const ATTEMPTS: usize = 5;

/// Whether a handshake error is the server's end going away mid-handshake, as an eviction
/// does (a wrong secret or a stranger's reply is `PermissionDenied`, never this): the dialler
/// should try again, up to [`ATTEMPTS`] times, while its deadline allows.
pub fn was_cut(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// The handshakes in flight on one listener; shared by its accept loop and handshake threads.
#[derive(Debug)]
pub struct Admission {
    limit: usize,
    pending: Mutex<VecDeque<(u64, TcpStream)>>,
    next: AtomicU64,
    evicted: AtomicU64,
}

/// Held by a handshake while it runs; dropping it (handshake done, or failed) frees the slot.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
}

impl Admission {
    /// At most `limit` handshakes in flight (at least 1).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Admission {
            limit: limit.max(1),
            pending: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// Take a slot for `stream`'s handshake, shutting down the oldest one in flight if all are
    /// taken (its thread's blocked read then ends at once and its handshake fails).
    pub fn enter(self: &Arc<Self>, stream: &TcpStream) -> Ticket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock();
        while pending.len() >= self.limit {
            if let Some((_, oldest)) = pending.pop_front() {
                let _ = oldest.shutdown(Shutdown::Both);
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Without a copy to shut down the handshake is still bounded by its own time limit.
        if let Ok(copy) = stream.try_clone() {
            pending.push_back((id, copy));
        }
        Ticket {
            admission: self.clone(),
            id,
        }
    }

    /// Handshakes in flight now.
    pub fn in_flight(&self) -> usize {
        self.pending.lock().len()
    }

    /// Handshakes cut so far to make room for newer ones.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission
            .pending
            .lock()
            .retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        (c, s)
    }

    #[test]
    fn a_newcomer_beyond_the_limit_cuts_the_oldest_handshake_and_no_other() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let admission = Admission::new(3);
        let mut held = Vec::new();
        for _ in 0..4 {
            let (c, s) = pair(&l);
            let ticket = admission.enter(&s);
            held.push((c, s, ticket));
        }
        assert_eq!(admission.in_flight(), 3);
        assert_eq!(admission.evicted(), 1);
        // The oldest server end was shut down: its reader sees the end at once.
        let mut b = [0u8; 1];
        assert_eq!(held[0].1.read(&mut b).expect("read after shutdown"), 0);
        // The others are untouched: a read would block, so it times out.
        held[1]
            .1
            .set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .expect("timeout");
        assert!(held[1].1.read(&mut b).is_err());
    }

    #[test]
    fn a_finished_handshake_frees_its_slot() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let admission = Admission::new(2);
        let (_c1, s1) = pair(&l);
        let (_c2, s2) = pair(&l);
        let t1 = admission.enter(&s1);
        let _t2 = admission.enter(&s2);
        drop(t1);
        assert_eq!(admission.in_flight(), 1);
        let (_c3, s3) = pair(&l);
        let _t3 = admission.enter(&s3);
        assert_eq!(admission.in_flight(), 2);
        assert_eq!(
            admission.evicted(),
            0,
            "a freed slot was taken without a cut"
        );
    }
}
