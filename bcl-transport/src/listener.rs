//! Listening sockets with room for a crowd: every rank of a job dials rank 0's store at once,
//! and its health port takes every rank's slow-node report in the same window.
//!
//! `std`'s `TcpListener::bind` listens with a backlog of 128: past that, the kernel drops
//! the extra SYNs and each dropped client waits its 1 s (then 3 s, 7 s) retransmission. With
//! 256 ranks dialling one store, every rendezvous began with a 1 s stall
//! (`bcl-bench rendezvous --nranks 256`, docs/scale.md).

use socket2::{Domain, Socket, Type};
use std::net::{SocketAddr, TcpListener};

/// The backlog asked for; the kernel caps it at `net.core.somaxconn` (4096 by default since
/// Linux 5.4).
pub const BACKLOG: i32 = 4096;

/// A listener on `addr` (port 0: any free port) with a [`BACKLOG`] of pending connections,
/// address reuse as `std` sets it.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;
    use std::time::Duration;

    /// 400 clients connect before the server accepts any: all get through the handshake
    /// (with `std`'s backlog of 128, the 130th and later wait out a SYN retransmission).
    #[test]
    fn four_hundred_clients_wait_in_the_backlog_without_a_retransmission() {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(0);
        assert!(
            somaxconn >= 512,
            "net.core.somaxconn is {somaxconn}: this machine caps every listener's backlog \
             below what a 400-rank rendezvous needs"
        );
        let listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut clients = Vec::new();
        for i in 0..400 {
            let c = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                .unwrap_or_else(|e| panic!("client {i} not taken into the backlog: {e}"));
            clients.push(c);
        }
        // And the server then takes every one of them.
        listener.set_nonblocking(true).expect("nonblocking");
        let taken = std::iter::from_fn(|| listener.accept().ok()).count();
        assert_eq!(taken, 400);
    }
}
