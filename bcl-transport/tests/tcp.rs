//! The TCP transport between threads on loopback: data, back-pressure, strangers, garbage.

use bcl_transport::tcp::{TcpConfig, TcpTransport};
use bcl_transport::{Landing, Secret, Transport, TransportError};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn deadline(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// Connect `n` endpoints with `sockets` sockets per peer; returns them in rank order.
fn mesh(n: usize, sockets: usize) -> Vec<TcpTransport> {
    let secret = Secret([9; 16]);
    let mut ts: Vec<TcpTransport> = (0..n)
        .map(|_| {
            let mut c = TcpConfig::new(secret);
            c.sockets_per_peer = sockets;
            TcpTransport::bind(c).expect("bind")
        })
        .collect();
    let addrs: Vec<_> = ts.iter().map(|t| t.address().clone()).collect();
    std::thread::scope(|s| {
        for (rank, t) in ts.iter_mut().enumerate() {
            let peers: Vec<_> = (0..n)
                .filter(|p| *p != rank)
                .map(|p| (p, addrs[p].clone()))
                .collect();
            s.spawn(move || t.connect(rank, &peers, deadline(10)).expect("connect"));
        }
    });
    ts
}

fn recv_blocking(t: &mut TcpTransport, peer: usize, tag: u64) -> Result<Vec<u8>, TransportError> {
    let end = deadline(10);
    loop {
        t.progress()?;
        if let Some(m) = t.try_recv(peer, tag)? {
            let data = m.data.clone();
            t.release(m);
            return Ok(data);
        }
        assert!(
            Instant::now() < end,
            "message {tag} from {peer} never arrived"
        );
        t.wait(Duration::from_millis(5))?;
    }
}

#[test]
fn messages_arrive_by_tag_over_several_sockets() {
    let mut ts = mesh(2, 3);
    let (a, b) = ts.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
    for tag in 0..6u64 {
        while !a
            .try_send(1, tag, &big[..big.len() - tag as usize])
            .expect("send")
        {
            a.progress().expect("progress");
            b.progress().expect("progress");
        }
    }
    // Receive in reverse tag order: tags overtake each other freely.
    let recv = std::thread::scope(|s| {
        let h = s.spawn(|| {
            (0..6u64)
                .rev()
                .map(|tag| recv_blocking(b, 0, tag).expect("recv"))
                .collect::<Vec<_>>()
        });
        while !a.flushed() {
            a.progress().expect("progress");
            a.wait(Duration::from_millis(1)).expect("wait");
        }
        h.join().expect("join")
    });
    for (i, got) in recv.iter().enumerate() {
        let tag = 5 - i;
        assert_eq!(got.len(), big.len() - tag);
        assert_eq!(got[..], big[..got.len()]);
    }
}

/// Frames of every size around the receive stage (16 KiB), sent back to back so that one read
/// takes several whole frames, a frame's header without its payload, or a payload's middle:
/// each arrives whole, under its tag, with its bytes.
#[test]
fn back_to_back_frames_of_mixed_sizes_arrive_whole() {
    let sizes = [
        0usize, 1, 7, 36, 16_351, 16_352, 16_368, 16_384, 16_400, 3, 0, 40_000, 5, 100_000, 16_383,
        2,
    ];
    for sockets in [1, 2] {
        let mut ts = mesh(2, sockets);
        let (a, b) = ts.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        let frame = |tag: usize, len: usize| -> Vec<u8> {
            (0..len).map(|i| (i * 31 + tag * 7) as u8).collect()
        };
        for (tag, &len) in sizes.iter().enumerate() {
            while !a.try_send(1, tag as u64, &frame(tag, len)).expect("send") {
                a.progress().expect("progress");
            }
        }
        while !a.flushed() {
            a.progress().expect("progress");
            b.progress().expect("progress");
        }
        for (tag, &len) in sizes.iter().enumerate() {
            let got = recv_blocking(b, 0, tag as u64).expect("recv");
            assert_eq!(
                got,
                frame(tag, len),
                "frame {tag} ({len} bytes), {sockets} sockets"
            );
        }
    }
}

/// The bytes of message `tag`, `len` long (no zero byte, so a byte left unwritten shows).
fn pattern(tag: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + tag * 7) % 251 + 1) as u8)
        .collect()
}

/// Receive message `tag` from `peer` into a buffer of `len` bytes with `try_recv_into`.
fn recv_into_blocking(t: &mut TcpTransport, peer: usize, tag: u64, len: usize) -> Vec<u8> {
    let mut dest = vec![0u8; len];
    let end = deadline(20);
    loop {
        t.progress().expect("progress");
        match t.try_recv_into(peer, tag, &mut dest).expect("receive") {
            Landing::Filled(_) => return dest,
            Landing::WrongLength(got) => panic!("message {tag}: {got} bytes, not {len}"),
            Landing::Pending => {}
        }
        assert!(
            Instant::now() < end,
            "message {tag} from {peer} never landed"
        );
        t.wait(Duration::from_millis(1)).expect("wait");
    }
}

/// Long frames are read from the socket straight into the receiver's memory. Taken in send
/// order, each is held for its caller; taken backwards, the frames ahead of the wanted one on
/// the same socket are held, not claimed, and must go the ordinary way with their staged
/// bytes (a stage byte fed at the wrong offset, or a held frame never given back, fails here).
/// The sender keeps sending from its own thread, so frames arrive in pieces.
#[test]
fn long_frames_land_in_the_callers_memory_whatever_order_they_are_taken_in() {
    let sizes = [
        16_383usize,
        16_384,
        16_400,
        5,
        40_000,
        0,
        300_000,
        2_000_000,
        16_385,
        100_000,
    ];
    for sockets in [1, 2] {
        for backwards in [false, true] {
            let mut ts = mesh(2, sockets);
            let mut b = ts.pop().expect("rank 1");
            let mut a = ts.pop().expect("rank 0");
            std::thread::scope(|s| {
                s.spawn(|| {
                    for (tag, &len) in sizes.iter().enumerate() {
                        while !a.try_send(1, tag as u64, &pattern(tag, len)).expect("send") {
                            a.progress().expect("progress");
                        }
                    }
                    let end = deadline(20);
                    while !a.flushed() {
                        a.progress().expect("progress");
                        assert!(Instant::now() < end, "sender never flushed");
                    }
                });
                let mut order: Vec<usize> = (0..sizes.len()).collect();
                if backwards {
                    order.reverse();
                }
                for tag in order {
                    let len = sizes[tag];
                    // Every third one the ordinary way: both paths side by side.
                    let got = if tag % 3 == 2 {
                        recv_blocking(&mut b, 0, tag as u64).expect("recv")
                    } else {
                        recv_into_blocking(&mut b, 0, tag as u64, len)
                    };
                    assert!(
                        got == pattern(tag, len),
                        "frame {tag} ({len} bytes), {sockets} sockets, backwards {backwards}"
                    );
                }
            });
        }
    }
}

/// A destination of the wrong length is told the message's real length and left untouched,
/// and the messages behind it still arrive.
#[test]
fn a_destination_of_the_wrong_length_is_told_the_real_one_and_left_untouched() {
    let mut ts = mesh(2, 1);
    let mut b = ts.pop().expect("rank 1");
    let mut a = ts.pop().expect("rank 0");
    std::thread::scope(|s| {
        s.spawn(|| {
            for (tag, len) in [(1usize, 100_000usize), (2, 70_000)] {
                while !a.try_send(1, tag as u64, &pattern(tag, len)).expect("send") {
                    a.progress().expect("progress");
                }
            }
            while !a.flushed() {
                a.progress().expect("progress");
            }
        });
        let mut dest = vec![0xeeu8; 50_000];
        let end = deadline(20);
        let landing = loop {
            b.progress().expect("progress");
            match b.try_recv_into(0, 1, &mut dest).expect("receive") {
                Landing::Pending => assert!(Instant::now() < end, "never arrived"),
                other => break other,
            }
        };
        assert_eq!(landing, Landing::WrongLength(100_000));
        assert!(
            dest.iter().all(|&x| x == 0xee),
            "the destination was written"
        );
        assert!(recv_into_blocking(&mut b, 0, 2, 70_000) == pattern(2, 70_000));
    });
}

/// A caller that takes part of a long frame and then gives up on it (its operation failed):
/// the transport cannot deliver the frame whole, so it says so, naming the peer and the tag,
/// instead of delivering a frame with a hole; the frames behind it still arrive.
#[test]
fn a_frame_given_up_halfway_is_reported_and_the_next_ones_still_arrive() {
    let secret = Secret([5; 16]);
    let mut ts: Vec<TcpTransport> = (0..2)
        .map(|_| {
            let mut c = TcpConfig::new(secret);
            c.sockets_per_peer = 1;
            c.socket_buffer = 64 << 10;
            TcpTransport::bind(c).expect("bind")
        })
        .collect();
    let addrs: Vec<_> = ts.iter().map(|t| t.address().clone()).collect();
    std::thread::scope(|s| {
        for (rank, t) in ts.iter_mut().enumerate() {
            let peer = [(1 - rank, addrs[1 - rank].clone())];
            s.spawn(move || t.connect(rank, &peer, deadline(10)).expect("connect"));
        }
    });
    let mut b = ts.pop().expect("rank 1");
    let mut a = ts.pop().expect("rank 0");
    let big = pattern(7, 4 << 20);
    // Small socket buffers: the sender's first write takes a part; the rest waits for it.
    assert!(a.try_send(1, 7, &big).expect("send"));
    let mut dest = vec![0u8; big.len()];
    let end = deadline(20);
    while dest[0] == 0 {
        b.progress().expect("progress");
        assert_eq!(
            b.try_recv_into(0, 7, &mut dest).expect("receive"),
            Landing::Pending,
            "4 MiB cannot have arrived past 64 KiB socket buffers"
        );
        assert!(Instant::now() < end, "no byte of the frame landed");
    }
    drop(dest);
    // The next frame queues behind the rest of the first: the sender retries it while it makes
    // progress, as an executor does ("not now" while its queue towards the peer is full).
    let next_frame = pattern(8, 30_000);
    let mut queued = false;
    let mut send_next = |a: &mut TcpTransport| {
        if !queued {
            queued = a.try_send(1, 8, &next_frame).expect("send");
        }
    };
    let err = loop {
        send_next(&mut a);
        a.progress().expect("sender progress");
        match b.progress() {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < end, "the loss was never reported"),
        }
    };
    assert!(
        matches!(err, TransportError::Protocol { peer: 0, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("given up halfway") && text.contains("0x7"),
        "{text}"
    );
    let next = loop {
        send_next(&mut a);
        a.progress().expect("sender progress");
        b.progress().expect("progress after the report");
        if let Some(m) = b.try_recv(0, 8).expect("recv") {
            break m;
        }
        assert!(Instant::now() < end, "the next frame never arrived");
    };
    assert!(next.data == pattern(8, 30_000));
    assert!(
        b.try_recv(0, 7).expect("recv").is_none(),
        "the holed frame was delivered"
    );
}

#[test]
fn four_ranks_full_mesh_exchange() {
    let mut ts = mesh(4, 1);
    for (rank, t) in ts.iter_mut().enumerate() {
        for peer in (0..4).filter(|p| *p != rank) {
            assert!(t.try_send(peer, 42, &[rank as u8; 10]).expect("send"));
        }
    }
    for (rank, t) in ts.iter_mut().enumerate() {
        for peer in (0..4).filter(|p| *p != rank) {
            assert_eq!(
                recv_blocking(t, peer, 42).expect("recv"),
                vec![peer as u8; 10]
            );
        }
    }
}

#[test]
fn a_stranger_is_refused_and_setup_carries_on() {
    let secret = Secret([1; 16]);
    let mut a = TcpTransport::bind(TcpConfig::new(secret)).expect("bind");
    let mut b = TcpTransport::bind(TcpConfig::new(secret)).expect("bind");
    // Rank 1 accepts from rank 0; strangers knock on rank 1's port first.
    let b_addr: std::net::SocketAddr = std::str::from_utf8(b.address().as_bytes())
        .expect("utf8")
        .parse()
        .expect("addr");
    let mut garbage = TcpStream::connect(b_addr).expect("stranger connects");
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let _silent = TcpStream::connect(b_addr).expect("silent stranger connects");
    let (pa, pb) = ((1, b.address().clone()), (0, a.address().clone()));
    std::thread::scope(|s| {
        s.spawn(|| a.connect(0, &[pa], deadline(10)).expect("rank 0 connects"));
        s.spawn(|| {
            b.connect(1, &[pb], deadline(10))
                .expect("rank 1 accepts rank 0")
        });
    });
    assert!(a.try_send(1, 5, b"still works").expect("send"));
    assert_eq!(recv_blocking(&mut b, 0, 5).expect("recv"), b"still works");
}

#[test]
fn wrong_secret_cannot_join() {
    let mut a = TcpTransport::bind(TcpConfig::new(Secret([1; 16]))).expect("bind");
    let mut b = TcpTransport::bind(TcpConfig::new(Secret([2; 16]))).expect("bind");
    let (pa, pb) = ((1, b.address().clone()), (0, a.address().clone()));
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| a.connect(0, &[pa], deadline(2)));
        let hb = s.spawn(|| b.connect(1, &[pb], deadline(2)));
        (ha.join().expect("join"), hb.join().expect("join"))
    });
    let ea = ra.expect_err("rank 0 must fail");
    assert!(matches!(ea, TransportError::Handshake { .. }), "{ea}");
    let eb = rb.expect_err("rank 1 must fail");
    assert!(
        matches!(eb, TransportError::ConnectTimeout { rank: 1, ref missing } if missing == &[0]),
        "{eb}"
    );
}

#[test]
fn closed_peer_and_oversized_message_are_errors_naming_the_peer() {
    // (Garbage byte streams are covered by the codec's property tests.)
    let mut ts = mesh(2, 1);
    let b = ts.pop().expect("rank 1");
    let mut a = ts.pop().expect("rank 0");
    drop(b);
    // Rank 1 is gone: rank 0's next receive from it reports the closed peer.
    let err = recv_blocking(&mut a, 1, 0).expect_err("peer closed");
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("rank 1"));

    let mut ts = mesh(2, 1);
    let mut b = ts.pop().expect("rank 1");
    let mut a = ts.pop().expect("rank 0");
    let big = vec![0u8; (64 << 20) + 1];
    let err = a.try_send(1, 0, &big).expect_err("too large");
    assert!(
        matches!(err, TransportError::TooLarge { peer: 1, .. }),
        "{err}"
    );
    b.progress().expect("idle progress is fine");
}

/// A member that passes the handshake and then sends bytes that are not frames (a bug or
/// memory corruption on its side): the receiver reports a protocol error naming that rank,
/// without panicking or allocating the announced length.
#[test]
fn garbage_and_oversized_frames_from_a_member_are_protocol_errors_naming_it() {
    use bcl_transport::auth::exchange;
    use bcl_transport::tcp::codec::encode_header;
    use std::io::Read;

    for (what, bytes) in [
        ("garbage", b"this is not a frame header at all".to_vec()),
        ("oversized", encode_header(7, u32::MAX).to_vec()),
    ] {
        let secret = Secret([4; 16]);
        let mut b = TcpTransport::bind(TcpConfig {
            sockets_per_peer: 1,
            ..TcpConfig::new(secret)
        })
        .expect("bind");
        let b_addr: std::net::SocketAddr = std::str::from_utf8(b.address().as_bytes())
            .expect("utf8")
            .parse()
            .expect("addr");
        let impostor = std::thread::spawn(move || {
            let mut s = TcpStream::connect(b_addr).expect("connect");
            exchange::client(&mut s, &secret, b"bcl-tcp-v1").expect("member knows the secret");
            // Introduce as rank 0, socket 0, to rank 1 (the connect module's wire format).
            let mut intro = [0u8; 12];
            intro[4..8].copy_from_slice(&1u32.to_le_bytes());
            s.write_all(&intro).expect("intro");
            let mut ok = [0u8; 2];
            s.read_exact(&mut ok).expect("ok");
            s.write_all(&bytes).expect("garbage");
            s
        });
        let fake_rank0 = bcl_transport::PeerAddress::new(b"127.0.0.1:9".to_vec()).expect("addr");
        b.connect(1, &[(0, fake_rank0)], deadline(10))
            .expect("accepts the member");
        let _keep_open = impostor.join().expect("impostor");
        let end = deadline(10);
        let err = loop {
            match b.progress() {
                Err(e) => break e,
                Ok(_) => {
                    assert!(Instant::now() < end, "{what}: no error");
                    b.wait(Duration::from_millis(5)).expect("wait");
                }
            }
        };
        assert!(
            matches!(err, TransportError::Protocol { peer: 0, .. }),
            "{what}: {err}"
        );
        assert!(err.to_string().contains("rank 0"), "{what}: {err}");
    }
}

/// A rank that sends its last message and leaves at once while a frame from its peer has just
/// come in unread: its close must not reset the connection, which would throw away the part
/// of that last message still in its kernel's send queue (the "died" verdict a finishing peer
/// could get when its neighbour destroyed its communicator first). The peer reads slowly, so
/// the queue is full when the sender leaves.
#[test]
fn leaving_with_unread_bytes_does_not_destroy_the_last_message_in_flight() {
    for round in 0..3u8 {
        let mut ts = mesh(2, 1);
        let mut b = ts.pop().expect("rank 1");
        let mut a = ts.pop().expect("rank 0");
        let last = vec![round; 32 << 20];
        let want = last.clone();
        let (flushed_tx, flushed_rx) = std::sync::mpsc::channel::<()>();
        let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let end = deadline(60);
            let mut told = false;
            loop {
                if !told && flushed_rx.try_recv().is_ok() {
                    // Something rank 0 will not read: it lands in its socket as it leaves.
                    assert!(b.try_send(0, 1, &[7u8; 1000]).expect("send"));
                    let _ = sent_tx.send(());
                    told = true;
                }
                b.progress()?;
                if let Some(m) = b.try_recv(0, 2)? {
                    return Ok(m.data.clone());
                }
                assert!(Instant::now() < end, "the last message never arrived");
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let mut sent = false;
        while !sent || !a.flushed() {
            if !sent {
                sent = a.try_send(1, 2, &last).expect("send");
            }
            a.progress().expect("progress");
        }
        let _ = flushed_tx.send(());
        let _ = sent_rx.recv();
        std::thread::sleep(Duration::from_millis(1));
        drop(a);
        let got: Result<Vec<u8>, TransportError> = reader.join().expect("reader");
        let got = got.unwrap_or_else(|e| panic!("round {round}: the last message was lost: {e}"));
        assert!(
            got == want,
            "round {round}: the last message arrived changed"
        );
    }
}
