//! The health thread: keeps the neighbour links (heartbeats both ways, silence and loss
//! detection), floods verdicts along the ring; and what helpers do with the connections the
//! accept thread (`acceptor.rs`) takes. Slow work (handshakes, probes, diagnoses, deliveries,
//! slow-node windows) runs on helper threads (`helpers.rs`), so the heartbeats never wait.

use super::Inner;
use super::diagnose::{self, Diagnosis, Symptom};
use super::helpers::spawn_helper;
use super::verdict::Verdict;
use super::wire::{self, FrameReader, Message, Purpose};
use bcl_transport::admission::Ticket;
use bcl_transport::auth::exchange;
use bcl_transport::tcp::wait_readable;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One neighbour connection.
struct Link {
    peer: usize,
    stream: TcpStream,
    reader: FrameReader,
    unsent: Vec<u8>,
    last_heard: Instant,
    last_sent: Instant,
    suspected: bool,
    said_goodbye: bool,
}

impl Link {
    fn queue(&mut self, message: &Message) {
        if let Ok(bytes) = wire::encode(message) {
            self.unsent.extend_from_slice(&bytes);
        }
    }

    /// Write what is queued, as far as the socket takes it.
    fn flush(&mut self) -> io::Result<()> {
        while !self.unsent.is_empty() {
            match self.stream.write(&self.unsent) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.unsent.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The health thread's loop, until shutdown: take the new links, flood verdicts, send heartbeats and read every link, close the slow-node window, then sleep
/// until something is due.
pub(super) fn run(inner: Arc<Inner>, woken: UnixDatagram) {
    let mut links: Vec<Link> = Vec::new();
    let mut next_window = Instant::now() + inner.config.window;
    loop {
        if inner.stop.load(Ordering::Acquire) {
            say_goodbye(&inner, links);
            return;
        }
        adopt_new_links(&inner, &mut links);
        let flood: Vec<(Verdict, Option<usize>)> = std::mem::take(&mut *inner.to_flood.lock());
        for (verdict, from) in &flood {
            for link in links.iter_mut().filter(|l| Some(l.peer) != *from) {
                link.queue(&Message::Verdict(verdict.clone()));
            }
        }
        let closed = service_links(&inner, &mut links);
        if Instant::now() >= next_window {
            next_window = Instant::now() + inner.config.window;
            if inner.peers().len() > 1 {
                inner.close_window();
            }
        }
        for (i, reason) in closed.into_iter().rev() {
            let link = links.swap_remove(i);
            if !link.said_goodbye && !inner.stop.load(Ordering::Acquire) {
                suspect(&inner, link.peer, Symptom::ConnectionLost(reason));
            }
        }
        sleep(&inner, &links, &woken, next_window);
    }
}

/// Take the neighbour connections other threads made (the successor `watch` dialled, the
/// predecessor's that a helper accepted).
fn adopt_new_links(inner: &Inner, links: &mut Vec<Link>) {
    let now = Instant::now();
    for (peer, stream) in inner.new_links.lock().drain(..) {
        links.push(Link {
            peer,
            stream,
            reader: FrameReader::default(),
            unsent: Vec::new(),
            last_heard: now,
            last_sent: now - inner.config.heartbeat,
            suspected: false,
            said_goodbye: false,
        });
    }
}

/// Heartbeat every link that is due, write what is queued, read and handle what arrived, and
/// suspect a neighbour silent for the hang timeout. Returns the links that closed (index,
/// why).
fn service_links(inner: &Arc<Inner>, links: &mut [Link]) -> Vec<(usize, String)> {
    let (now, heartbeat) = (Instant::now(), inner.config.heartbeat);
    let state = (links.iter())
        .any(|l| now.duration_since(l.last_sent) >= heartbeat)
        .then(|| inner.state());
    let mut closed = Vec::new();
    for (i, link) in links.iter_mut().enumerate() {
        if let Some(state) = &state
            && now.duration_since(link.last_sent) >= heartbeat
        {
            link.queue(&Message::Heartbeat(state.clone()));
            link.last_sent = now;
        }
        let outcome = link
            .flush()
            .and_then(|()| link.reader.fill(&mut link.stream))
            .and_then(|open| {
                while let Some(message) = link.reader.next_message()? {
                    on_message(inner, link, message);
                }
                Ok(open)
            });
        match outcome {
            Ok(true) => {}
            Ok(false) => closed.push((i, "connection closed".to_string())),
            Err(e) => closed.push((i, e.to_string())),
        }
        let silent = link.last_heard.elapsed();
        if !link.suspected && !link.said_goodbye && silent > inner.config.hang_timeout {
            link.suspected = true;
            suspect(inner, link.peer, Symptom::Silent(silent));
        }
    }
    closed
}

/// Sleep until a message, a wake-up, or the next heartbeat, silence deadline or
/// window: an idle rank's health thread wakes a few times per heartbeat at most.
fn sleep(inner: &Inner, links: &[Link], woken: &UnixDatagram, next_window: Instant) {
    let (now, heartbeat) = (Instant::now(), inner.config.heartbeat);
    let next = links
        .iter()
        .flat_map(|l| {
            let silence =
                (!l.suspected && !l.said_goodbye).then(|| l.last_heard + inner.config.hang_timeout);
            std::iter::once(l.last_sent + heartbeat).chain(silence)
        })
        .min()
        .map_or(heartbeat, |t| t.saturating_duration_since(now));
    let mut timeout = next
        .min(next_window.saturating_duration_since(now))
        .clamp(Duration::from_millis(1), heartbeat);
    if links.iter().any(|l| !l.unsent.is_empty()) {
        timeout = timeout.min(Duration::from_millis(5));
    }
    let mut sources = vec![woken.as_fd()];
    sources.extend(links.iter().map(|l| l.stream.as_fd()));
    if let Err(e) = wait_readable(&sources, timeout) {
        tracing::debug!(rank = inner.rank, "health poll failed: {e}");
        std::thread::sleep(timeout);
    }
    let mut drain = [0u8; 64];
    while woken.recv(&mut drain).is_ok() {}
}

/// Pass on the last verdicts, say goodbye, and close each link gracefully: our side first,
/// then read until the neighbour closes too, so that nothing unread turns the close into a
/// reset that would destroy the goodbye in flight.
fn say_goodbye(inner: &Inner, mut links: Vec<Link>) {
    let flood: Vec<(Verdict, Option<usize>)> = std::mem::take(&mut *inner.to_flood.lock());
    for link in &mut links {
        for (verdict, from) in &flood {
            if Some(link.peer) != *from {
                link.queue(&Message::Verdict(verdict.clone()));
            }
        }
        link.queue(&Message::Goodbye);
        let linger = Some(Duration::from_millis(100));
        let _ = link.stream.set_nonblocking(false);
        let _ = link.stream.set_write_timeout(linger);
        let _ = link.stream.set_read_timeout(linger);
        let _ = link.flush();
        let _ = link.stream.shutdown(std::net::Shutdown::Write);
    }
    let end = Instant::now() + Duration::from_millis(100);
    for link in &mut links {
        let mut sink = [0u8; 4096];
        while Instant::now() < end {
            match io::Read::read(&mut link.stream, &mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

fn on_message(inner: &Arc<Inner>, link: &mut Link, message: Message) {
    link.last_heard = Instant::now();
    match message {
        Message::Heartbeat(_) => link.suspected = false,
        Message::Verdict(v) => {
            inner.accept(v, Some(link.peer));
        }
        Message::Goodbye => {
            link.said_goodbye = true;
            inner.departed.lock().push(link.peer);
        }
        other => tracing::debug!(
            rank = inner.rank,
            peer = link.peer,
            "unexpected health message {other:?}"
        ),
    }
}

/// Diagnose `peer` on a helper thread; a fault found becomes the verdict.
fn suspect(inner: &Arc<Inner>, peer: usize, symptom: Symptom) {
    if inner.faulted.load(Ordering::Acquire) {
        return;
    }
    tracing::debug!(rank = inner.rank, peer, ?symptom, "suspecting a peer");
    let inner2 = inner.clone();
    spawn_helper(inner, "diagnose", move || {
        // A peer that fails on purpose (a desync it found, an abort) sends its verdict just
        // before it goes: give it a moment to arrive rather than blame the messenger.
        if matches!(symptom, Symptom::ConnectionLost(_))
            && inner2.await_verdict(Duration::from_millis(100))
        {
            return;
        }
        if let Diagnosis::Fault(v) = diagnose::diagnose(&inner2, peer, symptom) {
            inner2.accept(v, None);
        }
    });
}

/// Serve one accepted connection: authenticate, then do what its hello asks.
pub(super) fn handshake(
    inner: &Arc<Inner>,
    mut stream: TcpStream,
    from: std::net::SocketAddr,
    ticket: Ticket,
) {
    let timeout = Some(inner.probe_timeout * 2);
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(timeout))
        .and_then(|()| stream.set_write_timeout(timeout))
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| {
            let proven = move || drop(ticket);
            exchange::server_then(&mut stream, &inner.secret, wire::AUTH_CONTEXT, proven)
        })
        .and_then(|()| wire::receive(&mut stream));
    let (peer, purpose) = match setup {
        Ok(Message::Hello { from, purpose }) => (from as usize, purpose),
        Ok(other) => {
            tracing::warn!(rank = inner.rank, %from, "health connection began with {other:?}; closed");
            return;
        }
        Err(e) => {
            tracing::debug!(rank = inner.rank, %from, "refused a health connection: {e}");
            return;
        }
    };
    let served = match purpose {
        Purpose::Watch => stream.set_nonblocking(true).map(|()| {
            inner.new_links.lock().push((peer, stream));
            inner.wake();
        }),
        Purpose::Query => wire::send(&mut stream, &Message::State(inner.state())),
        Purpose::Probe { target } => {
            let seen = diagnose::query(inner, target as usize);
            wire::send(&mut stream, &Message::ProbeResult { target, seen })
        }
        // Acknowledged once in force here: a rank that fails on purpose (a desync it found)
        // goes only after its verdict is taken, so its closing sockets are not read as a death.
        Purpose::Deliver => wire::receive(&mut stream).and_then(|m| match m {
            Message::Verdict(v) => {
                inner.accept(v, Some(peer));
                wire::send(&mut stream, &Message::Accepted)
            }
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a verdict, got {other:?}"),
            )),
        }),
        Purpose::Report { windows } => report(inner, &mut stream, peer, windows),
        Purpose::Table { wait_ms } => super::table::serve(inner, &mut stream, peer, wait_ms),
        Purpose::Agree => wire::receive(&mut stream).and_then(|m| {
            let reply = super::membership::serve(inner, peer, m);
            wire::send(&mut stream, &reply)
        }),
    };
    if let Err(e) = served {
        tracing::debug!(rank = inner.rank, peer, "health request failed: {e}");
    }
}

/// A report from `peer`: `windows` windows from ranks of its subtree, if it is a child of
/// this rank in the reports' tree; anything else is refused, naming what was wrong.
fn report(inner: &Arc<Inner>, stream: &mut TcpStream, peer: usize, windows: u32) -> io::Result<()> {
    let fanout = inner.config.report_fanout;
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::InvalidData, why));
    if crate::tree::parent(peer, fanout) != Some(inner.rank) || peer >= inner.peers().len() {
        return refuse(format!(
            "rank {peer} reported to rank {}, which is not its parent in the reports' tree",
            inner.rank
        ));
    }
    let limit = inner.report_limit(peer);
    if windows == 0 || windows as usize > limit {
        return refuse(format!(
            "rank {peer} announced {windows} windows; its subtree may send 1 to {limit}"
        ));
    }
    for _ in 0..windows {
        match wire::receive(stream)? {
            Message::Window(w) if crate::tree::in_subtree(w.rank as usize, peer, fanout) => {
                inner.take_relayed(w);
            }
            Message::Window(w) => {
                return refuse(format!(
                    "rank {peer} passed on a window of rank {}, which is not below it",
                    w.rank
                ));
            }
            other => return refuse(format!("expected a window from rank {peer}, got {other:?}")),
        }
    }
    wire::send(stream, &Message::Summary(inner.summary_for(peer)))
}

/// Hand `verdict` to every other rank directly (the ring flood reaches the rest).
pub(super) fn deliver(inner: &Arc<Inner>, verdict: &Verdict) {
    let world = inner.peers().len();
    for rank in (0..world).filter(|r| *r != inner.rank) {
        let skip = verdict.ranks.contains(&rank)
            && matches!(
                verdict.cause,
                super::Cause::Died | super::Cause::Unresponsive
            );
        if skip || inner.is_departed(rank) {
            continue;
        }
        let Some(addr) = inner.health_address(rank) else {
            continue;
        };
        let sent = wire::dial(
            addr,
            &inner.secret,
            inner.rank,
            Purpose::Deliver,
            inner.probe_timeout,
        )
        .and_then(|mut s| {
            wire::send(&mut s, &Message::Verdict(verdict.clone()))?;
            wire::receive(&mut s).map(|_| ())
        });
        if let Err(e) = sent {
            tracing::debug!(
                rank = inner.rank,
                to = rank,
                "verdict not delivered directly: {e}"
            );
        }
    }
}
