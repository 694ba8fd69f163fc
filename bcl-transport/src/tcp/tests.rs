use super::*;

/// Two connected endpoints, ranks 0 and 1, with `sockets` connections per peer and small
/// socket buffers (so that sends queue up), and room to queue `queue` bytes per peer.
fn pair(sockets: usize, queue: usize) -> (TcpTransport, TcpTransport) {
    let endpoint = || {
        let mut c = TcpConfig::new(Secret([5; 16]));
        c.sockets_per_peer = sockets;
        c.socket_buffer = 64 << 10;
        c.max_queued_per_peer = queue;
        TcpTransport::bind(c).expect("bind")
    };
    let (mut a, mut b) = (endpoint(), endpoint());
    crate::testing::connect_pair(&mut a, &mut b);
    (a, b)
}

/// Frames still queued on each connection to `peer`.
fn queued_frames(t: &TcpTransport, peer: usize) -> Vec<usize> {
    t.peers[&peer].conns.iter().map(|c| c.out.len()).collect()
}

fn receive_all(b: &mut TcpTransport, a: &mut TcpTransport, tags: std::ops::Range<u64>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for tag in tags {
        let message = loop {
            a.progress().expect("sender progress");
            b.progress().expect("receiver progress");
            if let Some(m) = b.try_recv(0, tag).expect("receive") {
                break m;
            }
            assert!(Instant::now() < deadline, "frame {tag} never arrived");
        };
        assert!(message.data.iter().all(|&x| x == tag as u8), "frame {tag}");
        b.release(message);
    }
}

#[test]
fn limited_to_one_connection_every_frame_queues_on_the_first() {
    let (mut a, mut b) = pair(2, 64 << 20);
    a.limit_connections(Some(1));
    for tag in 0..6u64 {
        assert!(a.try_send(1, tag, &vec![tag as u8; 1 << 20]).expect("send"));
    }
    let queued = queued_frames(&a, 1);
    assert_eq!(
        queued[1], 0,
        "a frame went on the second connection: {queued:?}"
    );
    assert!(
        queued[0] >= 4,
        "the frames should wait on the first: {queued:?}"
    );
    receive_all(&mut b, &mut a, 0..6);

    // Back to all connections: the frames alternate between them.
    a.limit_connections(None);
    for tag in 6..12u64 {
        assert!(a.try_send(1, tag, &vec![tag as u8; 1 << 20]).expect("send"));
    }
    let queued = queued_frames(&a, 1);
    assert!(
        queued.iter().all(|&n| n >= 2),
        "frames of both connections: {queued:?}"
    );
    receive_all(&mut b, &mut a, 6..12);
}

#[test]
fn a_full_queue_says_not_now_and_takes_the_frame_once_it_drains() {
    let (mut a, mut b) = pair(1, 1 << 20);
    let frame = vec![3u8; 1 << 20];
    assert!(a.try_send(1, 3, &frame).expect("send"));
    // Most of the first megabyte waits in the queue (64 KiB socket buffers): no room for more.
    assert!(!a.try_send(1, 4, &vec![4u8; 1 << 20]).expect("send"));
    assert_eq!(queued_frames(&a, 1), vec![1]);
    receive_all(&mut b, &mut a, 3..4);
    assert!(a.try_send(1, 4, &vec![4u8; 1 << 20]).expect("send"));
    receive_all(&mut b, &mut a, 4..5);
}

/// A peer that sends its last frame and leaves closes every socket at once, and one socket's
/// end can be read while another still holds that frame (a long one's payload waits in its
/// socket for the caller). The peer is not lost while the frame is there, and it is received
/// whole; once every socket has ended and nothing is left, it is.
#[test]
fn a_peer_that_leaves_after_its_last_frame_is_lost_only_once_the_frame_is_read() {
    let endpoint = || {
        let mut c = TcpConfig::new(Secret([6; 16]));
        c.sockets_per_peer = 2;
        TcpTransport::bind(c).expect("bind")
    };
    let (mut a, mut b) = (endpoint(), endpoint());
    crate::testing::connect_pair(&mut a, &mut b);
    // Tag 1 travels on the second socket; the first carries nothing but its end.
    let long: Vec<u8> = (0..256 << 10).map(|i| (i % 251) as u8).collect();
    assert!(a.try_send(1, 1, &long).expect("send"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.flushed() {
        a.progress().expect("sender progress");
        assert!(Instant::now() < deadline, "the frame never left");
    }
    drop(a);
    // Both ends and the frame are in b's sockets now (loopback); wait for the first end.
    while !b.peers[&0].conns[0].closed {
        b.progress().expect("receiver progress");
        assert!(
            Instant::now() < deadline,
            "the first socket's end never came"
        );
    }
    assert!(
        !b.peer_lost(0),
        "one socket ended, but the frame on the other is unread: the peer is not lost yet"
    );
    let mut dest = vec![0u8; long.len()];
    loop {
        match b.try_recv_into(0, 1, &mut dest).expect("the last frame") {
            Landing::Filled(_) => break,
            Landing::Pending => b.progress().expect("receiver progress"),
            Landing::WrongLength(n) => panic!("a frame of {n} bytes"),
        };
        assert!(Instant::now() < deadline, "the last frame never came whole");
    }
    assert!(dest == long, "the last frame arrived changed");
    while !b.peer_lost(0) {
        b.progress().expect("receiver progress");
        assert!(
            Instant::now() < deadline,
            "the peer is gone but never reported lost"
        );
    }
    assert!(matches!(
        b.try_recv(0, 2),
        Err(TransportError::PeerClosed { peer: 0, .. })
    ));
}

/// A round that drains the socket of the message the receiver waits for skips the poll(2),
/// and so leaves the other sockets for a later round: the first round brings the wanted
/// socket's frames only, and the other socket's frame comes within
/// `MAX_POLLS_SKIPPED` + 1 rounds even while the wanted socket keeps bringing more.
#[test]
fn the_wanted_socket_is_read_first_and_the_others_still_come() {
    let (mut a, mut b) = pair(2, 1 << 20);
    // Tags 0 and 2 travel on the first connection, tag 1 on the second.
    for tag in [1u64, 0, 2] {
        assert!(a.try_send(1, tag, &[tag as u8; 8]).expect("send"));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(b.try_recv(0, 0).expect("receive").is_none());
    b.progress().expect("progress");
    let first = b
        .try_recv(0, 0)
        .expect("receive")
        .expect("the wanted frame");
    assert_eq!(first.data, vec![0u8; 8]);
    assert!(
        b.try_recv(0, 1).expect("receive").is_none(),
        "the round that drained the wanted socket should not have read the other"
    );
    b.progress().expect("progress");
    assert_eq!(
        b.try_recv(0, 1).expect("receive").expect("tag 1").data,
        vec![1u8; 8]
    );
    assert_eq!(
        b.try_recv(0, 2).expect("receive").expect("tag 2").data,
        vec![2u8; 8]
    );

    // The wanted socket never runs dry: the other socket's frame still comes.
    assert!(a.try_send(1, 11, &[11u8; 8]).expect("send"));
    let mut rounds = 0;
    let other = loop {
        assert!(a.try_send(1, 10, &[10u8; 8]).expect("send"));
        std::thread::sleep(Duration::from_millis(5));
        let _ = b.try_recv(0, 10).expect("receive");
        b.progress().expect("progress");
        rounds += 1;
        if let Some(m) = b.try_recv(0, 11).expect("receive") {
            break m;
        }
        assert!(
            rounds <= MAX_POLLS_SKIPPED + 1,
            "the other socket's frame waited {rounds} rounds"
        );
    };
    assert_eq!(other.data, vec![11u8; 8]);
}

/// The congestion control each connection of `t` runs, as the kernel names it.
fn congestion_of(t: &TcpTransport) -> Vec<String> {
    t.peers
        .values()
        .flat_map(|p| &p.conns)
        .map(|c| {
            let raw = socket2::SockRef::from(&c.stream)
                .tcp_congestion()
                .expect("TCP_CONGESTION");
            let name = raw.split(|&b| b == 0).next().unwrap_or(&raw);
            String::from_utf8_lossy(name).into_owned()
        })
        .collect()
}

/// A named congestion control reaches every connection; unnamed, loopback connections never
/// pace (whatever the system's default); a name the kernel does not know fails the endpoint
/// with an error that names it.
#[test]
fn connections_run_the_congestion_control_asked_for_and_never_pace_on_loopback() {
    let endpoint = |congestion: Option<&str>| {
        let mut c = TcpConfig::new(Secret([6; 16]));
        c.congestion = congestion.map(str::to_string);
        TcpTransport::bind(c).expect("bind")
    };
    let (mut a, mut b) = (endpoint(Some("reno")), endpoint(Some("reno")));
    crate::testing::connect_pair(&mut a, &mut b);
    for t in [&a, &b] {
        let names = congestion_of(t);
        assert_eq!(names.len(), 2);
        assert!(names.iter().all(|n| n == "reno"), "{names:?}");
    }
    let (mut a, mut b) = (endpoint(None), endpoint(None));
    crate::testing::connect_pair(&mut a, &mut b);
    for t in [&a, &b] {
        let names = congestion_of(t);
        assert!(
            names.iter().all(|n| !PACING.contains(&n.as_str())),
            "{names:?}"
        );
    }
    let mut c = TcpConfig::new(Secret([6; 16]));
    c.congestion = Some("nosuchcc".into());
    let e = TcpTransport::bind(c).expect_err("an unknown algorithm");
    let text = e.to_string();
    assert!(
        text.contains("nosuchcc") && text.contains("BCL_TCP_CONGESTION"),
        "{text}"
    );
}
