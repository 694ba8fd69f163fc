//! Rendezvous stores: set/get across threads, bounded waits, and the TCP store's handshake.

use bcl_transport::Secret;
use bcl_transport::store::{FileStore, MemoryStore, Store, StoreError, TcpStore, TcpStoreServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn exercise(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.set("rank/1", b"hello").expect("set");
    });
    let got = a
        .get("rank/1", Instant::now() + Duration::from_secs(10))
        .expect("get");
    assert_eq!(got, b"hello");
    setter.join().expect("join");
    assert_eq!(a.try_get("absent").expect("try_get"), None);
    let start = Instant::now();
    let err = a
        .get("absent", Instant::now() + Duration::from_millis(200))
        .expect_err("timeout");
    assert!(
        matches!(err, StoreError::Timeout { ref key, .. } if key == "absent"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a bounded wait overran"
    );
}

#[test]
fn memory_store() {
    let s = MemoryStore::new();
    exercise(Arc::new(s.clone()), Arc::new(s));
}

#[test]
fn file_store() {
    let dir = std::env::temp_dir().join(format!("bcl-filestore-{}", std::process::id()));
    let a = FileStore::new(&dir).expect("dir");
    exercise(Arc::new(a.clone()), Arc::new(a));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tcp_store_and_its_handshake() {
    let secret = Secret([3; 16]);
    let server =
        TcpStoreServer::start("127.0.0.1:0".parse().expect("addr"), secret).expect("start");
    let d = Instant::now() + Duration::from_secs(5);
    let a = TcpStore::connect(server.addr(), &secret, d).expect("client a");
    let b = TcpStore::connect(server.addr(), &secret, d).expect("client b");
    exercise(Arc::new(a), Arc::new(b));

    let err = TcpStore::connect(server.addr(), &Secret([4; 16]), d).expect_err("wrong secret");
    assert!(err.to_string().contains("handshake failed"), "{err}");
    // A raw stranger sending garbage does not hurt the server.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(server.addr()).expect("connect");
        let _ = s.write_all(&[0xff; 64]);
    }
    let c = TcpStore::connect(server.addr(), &secret, d).expect("server still serves");
    assert_eq!(c.try_get("rank/1").expect("get"), Some(b"hello".to_vec()));
}

/// A client that asks for a key with a long wait and then goes away (a rank killed during
/// init) is not waited for: its connection is let go within a few checks, not at the end of
/// its wait (up to an hour).
#[test]
fn a_client_that_left_while_waiting_for_a_key_is_let_go() {
    use std::io::Write;
    let secret = Secret([9; 16]);
    let server =
        TcpStoreServer::start("127.0.0.1:0".parse().expect("addr"), secret).expect("server");
    let mut raw = std::net::TcpStream::connect(server.addr()).expect("connect");
    bcl_transport::auth::exchange::client(&mut raw, &secret, b"bcl-store-v1").expect("handshake");
    // Request::Get { key: "never", wait_ms: 3_600_000 } as postcard writes it: variant 1,
    // the key's length and bytes, the wait as a varint.
    let mut body = vec![1u8, 5];
    body.extend_from_slice(b"never");
    body.extend_from_slice(&[0x80, 0xdd, 0xdb, 0x01]);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    raw.write_all(&frame).expect("request");
    // The server is waiting for the key now: no answer comes.
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut answer = [0u8; 16];
    use std::io::Read;
    assert!(
        raw.read(&mut answer).is_err(),
        "the server answered a request for a key nobody set"
    );
    assert_eq!(server.clients(), 1);
    drop(raw);
    let gone_by = Instant::now() + Duration::from_secs(3);
    while server.clients() > 0 {
        assert!(
            Instant::now() < gone_by,
            "the server still serves a client that left 3 s ago"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The server counts what it answers and what its replies weigh (the control-plane figures
/// come from these), and a reply arrives as one frame: a length, then the body.
#[test]
fn the_tcp_store_counts_requests_and_reply_bytes() {
    use std::io::{Read, Write};
    let secret = Secret([5; 16]);
    let server =
        TcpStoreServer::start("127.0.0.1:0".parse().expect("addr"), secret).expect("server");
    let d = Instant::now() + Duration::from_secs(5);
    let a = TcpStore::connect(server.addr(), &secret, d).expect("client");
    assert_eq!(server.served(), (0, 0), "a handshake is not a request");
    a.set("k", &[7u8; 100]).expect("set");
    assert_eq!(a.get("k", d).expect("get"), vec![7u8; 100]);
    assert_eq!(a.try_get("absent").expect("try_get"), None);
    // Replies as postcard writes them, each after a 4-byte length: Done (variant 0); Value
    // (variant 1), Some (1), a length of 100 (one varint byte) and the bytes; Value, None (0).
    let expected = (4 + 1) + (4 + 1 + 1 + 1 + 100) + (4 + 1 + 1);
    assert_eq!(server.served(), (3, expected));

    // Over a raw connection: the reply to a get is its length and then exactly that body.
    let mut raw = std::net::TcpStream::connect(server.addr()).expect("connect");
    bcl_transport::auth::exchange::client(&mut raw, &secret, b"bcl-store-v1").expect("handshake");
    // Request::Get { key: "k", wait_ms: 0 }: variant 1, key length 1, "k", varint 0.
    let body = [1u8, 1, b'k', 0];
    raw.write_all(&(body.len() as u32).to_le_bytes())
        .expect("len");
    raw.write_all(&body).expect("body");
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).expect("reply length");
    assert_eq!(u32::from_le_bytes(len), 1 + 1 + 1 + 100);
    let mut reply = vec![0u8; 103];
    raw.read_exact(&mut reply).expect("reply body");
    assert_eq!(&reply[..3], &[1, 1, 100]);
    assert!(reply[3..].iter().all(|&b| b == 7));
    assert_eq!(server.served(), (4, expected + 4 + 103));
}
