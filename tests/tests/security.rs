//! Security checks: what a stranger or a careless setup can do to a communicator. A recorded
//! handshake replayed is refused (each side's proof covers the other's fresh nonce); a member
//! with the secret that claims a rank the acceptor does not expect is refused and the real
//! rank still joins; the secret shows in no line a rank prints (logs at trace level, errors,
//! the health report dumped after a fault); the rendezvous directory and the shared-memory
//! segments and the store's files are the user's alone, and a rendezvous directory of another
//! user is refused; a flood of idle connections on the store or health port stalls nothing.

use bcl_core::UniqueId;
use bcl_tests::procs::{RankSpec, finish, spawn, wait_ready};
use bcl_transport::auth::exchange;
use bcl_transport::tcp::{TcpConfig, TcpTransport};
use bcl_transport::{Secret, Transport};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");
const CONTEXT: &[u8] = b"bcl-test-v1";

/// A server that runs the handshake on every connection and reports each outcome.
fn server(secret: Secret) -> (std::net::SocketAddr, mpsc::Receiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let ok = exchange::server(&mut s, &secret, CONTEXT).is_ok();
            if tx.send(ok).is_err() {
                break;
            }
        }
    });
    (addr, rx)
}

/// What a client sent and what the server answered over one relayed connection.
type Transcript = mpsc::Receiver<(Vec<u8>, Vec<u8>)>;

/// Relay one connection from a client to `to`, recording what each side sent.
fn recording_proxy(to: std::net::SocketAddr) -> (std::net::SocketAddr, Transcript) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let Ok(server) = TcpStream::connect(to) else {
            return;
        };
        let relay = |mut from: TcpStream, mut to: TcpStream| {
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 256];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
                seen
            })
        };
        let up = relay(
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        let down = relay(server, client);
        let (sent, answered) = (
            up.join().unwrap_or_default(),
            down.join().unwrap_or_default(),
        );
        let _ = tx.send((sent, answered));
    });
    (addr, rx)
}

#[test]
fn a_recorded_handshake_replayed_is_refused() {
    let secret = Secret([7; 16]);
    let (addr, outcomes) = server(secret);
    // A real member's handshake, recorded on the way.
    let (proxy, transcript) = recording_proxy(addr);
    let mut member = TcpStream::connect(proxy).expect("connect through the proxy");
    exchange::client(&mut member, &secret, CONTEXT).expect("the member's handshake");
    assert_eq!(outcomes.recv_timeout(Duration::from_secs(5)), Ok(true));
    drop(member);
    let (sent, answered) = transcript
        .recv_timeout(Duration::from_secs(5))
        .expect("transcript");
    assert_eq!(sent.len(), 4 + 16 + 32, "hello, nonce and proof");
    // The client's bytes replayed to the server: its proof was for the old nonce.
    let mut replay = TcpStream::connect(addr).expect("connect");
    replay.write_all(&sent).expect("replay");
    let mut reply = Vec::new();
    let _ = replay.read_to_end(&mut reply);
    assert_eq!(outcomes.recv_timeout(Duration::from_secs(5)), Ok(false));
    assert!(
        !reply.ends_with(b"BCLK"),
        "the server accepted a replayed proof"
    );
    // The server's bytes replayed to a client: the proof is not for the client's nonce.
    let fake = TcpListener::bind("127.0.0.1:0").expect("bind");
    let fake_addr = fake.local_addr().expect("addr");
    let answer = answered.clone();
    let t = std::thread::spawn(move || {
        if let Ok((mut s, _)) = fake.accept() {
            let mut hello = [0u8; 20];
            let _ = s.read_exact(&mut hello);
            let _ = s.write_all(&answer);
        }
    });
    let mut c = TcpStream::connect(fake_addr).expect("connect");
    let e = exchange::client(&mut c, &secret, CONTEXT).expect_err("a replayed server");
    assert!(
        e.to_string()
            .contains("does not know the communicator's secret"),
        "{e}"
    );
    let _ = t.join();
}

#[test]
fn a_member_claiming_a_rank_not_expected_is_refused_and_the_real_rank_joins() {
    let secret = Secret([9; 16]);
    let mut a = TcpTransport::bind(TcpConfig::new(secret)).expect("bind");
    let mut b = TcpTransport::bind(TcpConfig::new(secret)).expect("bind");
    let b_addr: std::net::SocketAddr = std::str::from_utf8(b.address().as_bytes())
        .expect("utf8")
        .parse()
        .expect("addr");
    let (pa, pb) = ((1, b.address().clone()), (0, a.address().clone()));
    let claims = std::thread::scope(|s| {
        let accepting = s.spawn(|| b.connect(1, &[pb], Instant::now() + Duration::from_secs(10)));
        // With the secret (the tcp transport's handshake context) but claiming rank 5, and
        // then rank 0's socket 7: rank 1 expects neither.
        let claims: Vec<Vec<u8>> = [(5u32, 1u32, 0u32), (0, 1, 7)]
            .iter()
            .map(|&(from, to, index)| {
                let mut s = TcpStream::connect(b_addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(5)))
                    .expect("timeout");
                exchange::client(&mut s, &secret, b"bcl-tcp-v1").expect("the secret is right");
                let intro: Vec<u8> = [from, to, index]
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect();
                s.write_all(&intro).expect("introduce");
                let mut answer = vec![0u8; 2];
                let _ = s.read_exact(&mut answer);
                answer
            })
            .collect();
        a.connect(0, &[pa], Instant::now() + Duration::from_secs(10))
            .expect("rank 0 connects");
        accepting
            .join()
            .expect("join")
            .expect("rank 1 accepts rank 0");
        claims
    });
    assert_eq!(claims, [b"NO".to_vec(), b"NO".to_vec()]);
    assert!(a.try_send(1, 3, b"the real one").expect("send"));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        b.progress().expect("progress");
        if let Some(m) = b.try_recv(0, 3).expect("recv") {
            assert_eq!(m.data, b"the real one");
            b.release(m);
            break;
        }
        assert!(Instant::now() < deadline, "no message from the real rank 0");
        b.wait(Duration::from_millis(5)).expect("wait");
    }
}

/// Two ranks at trace level; rank 1 is killed mid-loop, so rank 0 fails, names it and dumps
/// its health report: the secret's digits appear nowhere.
#[test]
fn the_secret_appears_in_no_log_error_or_health_report() {
    let id = UniqueId::new("127.0.0.1".parse().expect("ip")).expect("id");
    let secret = id.secret.to_hex();
    let dumps = std::env::temp_dir().join(format!("bcl-secret-dumps-{}", std::process::id()));
    let dump_dir = dumps.to_string_lossy().into_owned();
    let id_text = id.to_string();
    let env = [
        ("BCL_LOG", "trace"),
        ("BCL_DUMP_DIR", dump_dir.as_str()),
        ("BCL_TEST_ITERS", "1000000"),
        ("BCL_TEST_ELEMS", "1024"),
    ];
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world: 2,
                id: &id_text,
                scenario: "loop",
                env: &env,
                wrapper: &[],
            })
        })
        .collect();
    wait_ready(&mut children);
    let mut victim = children.pop().expect("rank 1");
    let _ = victim.kill();
    let _ = victim.wait();
    let f = finish(
        children.pop().expect("rank 0"),
        Instant::now() + Duration::from_secs(30),
        "rank 0",
    );
    let error = f.error_line().unwrap_or_default().to_string();
    assert!(
        error.contains("rank 1 ("),
        "rank 0 should name rank 1: {}",
        f.stderr
    );
    assert!(
        f.stderr.contains("DEBUG"),
        "trace logging ran: {}",
        f.stderr
    );
    let mut texts = vec![(
        "rank 0 output".to_string(),
        format!("{}{}", f.stdout, f.stderr),
    )];
    for e in std::fs::read_dir(&dumps)
        .expect("a dump was written")
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        texts.push((e.path().display().to_string(), text));
    }
    assert!(texts.len() > 1, "no health report dumped in {dump_dir}");
    for (what, text) in &texts {
        assert!(!text.contains(&secret), "{what} shows the secret");
        assert!(
            !text.contains(&secret[..12]),
            "{what} shows part of the secret"
        );
    }
    let _ = std::fs::remove_dir_all(&dumps);
}

/// Two ranks through a rendezvous directory made world-writable beforehand, over shared
/// memory: the directory ends up 0700, every file in it and every segment of theirs in
/// /dev/shm is readable by the user alone. A directory that belongs to another user
/// (nobody, uid 65534; the test runs as root, as CI does) is refused, naming the owner.
#[test]
fn the_rendezvous_directory_and_segments_are_the_users_alone() {
    let dir = std::env::temp_dir().join(format!("bcl-private-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let start = |rank: usize, dir: &std::path::Path| {
        Command::new(RANK_BIN)
            .env_remove("BCL_UNIQUE_ID")
            .env("BCL_STORE_DIR", dir)
            .env("BCL_RANK", rank.to_string())
            .env("BCL_WORLD_SIZE", "2")
            .env("BCL_TRANSPORT", "shm")
            .env("BCL_TEST_SCENARIO", "loop")
            .env("BCL_TEST_ITERS", "1000000")
            .env("BCL_TEST_ELEMS", "1024")
            .env("BCL_INIT_TIMEOUT_S", "20")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bcl-rank")
    };
    let mut children: Vec<_> = (0..2).map(|r| start(r, &dir)).collect();
    wait_ready(&mut children);
    // The segments are unlinked once both sides have them open; their modes are read
    // through the mappings (/proc/PID/map_files, which root may follow).
    let mut segments = 0;
    for c in &children {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", c.id())).expect("maps");
        for line in maps.lines().filter(|l| l.contains("/dev/shm/bcl.")) {
            let range = line.split_whitespace().next().expect("range");
            let mapping = format!("/proc/{}/map_files/{range}", c.id());
            let mode = std::fs::metadata(&mapping)
                .expect("the mapped segment")
                .mode()
                & 0o777;
            assert_eq!(mode, 0o600, "{line}");
            segments += 1;
        }
    }
    assert!(segments >= 2, "the ranks map no shm segments");
    let dir_mode = std::fs::metadata(&dir).expect("meta").mode() & 0o777;
    assert_eq!(dir_mode, 0o700, "the rendezvous directory");
    let files = walk(&dir);
    assert!(!files.is_empty(), "the store wrote nothing");
    for e in files {
        let meta = std::fs::metadata(&e).expect("meta");
        let mode = meta.mode() & 0o777;
        assert!(meta.is_dir() || mode & 0o077 == 0, "{e:?} mode {mode:o}");
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    // Another user's directory.
    let theirs = std::env::temp_dir().join(format!("bcl-theirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&theirs);
    std::fs::create_dir_all(&theirs).expect("mkdir");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534))
        .expect("chown to nobody (this test needs root, as CI runs it)");
    let f = finish(
        start(0, &theirs),
        Instant::now() + Duration::from_secs(30),
        "rank 0",
    );
    assert_eq!(f.code, Some(4), "init must fail: {}", f.stderr);
    assert!(
        f.stderr.contains("belongs to user 65534"),
        "the refusal names the owner: {}",
        f.stderr
    );
    assert!(
        walk(&theirs).is_empty(),
        "nothing was written into another user's directory"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&theirs);
}

/// Every path under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Idle connections held open on `addr` (once it listens) until the returned guard drops.
fn flood(addr: std::net::SocketAddr, count: usize) -> Vec<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = Vec::new();
    while held.len() < count && Instant::now() < deadline {
        match TcpStream::connect(addr) {
            Ok(s) => held.push(s),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert_eq!(
        held.len(),
        count,
        "could not hold {count} connections to {addr}"
    );
    held
}

/// 300 idle connections on rank 0's store port while the others rendezvous, then 300 on its
/// health port while collectives run: init completes, every result is right and nobody is
/// called faulty (the accept loops hand a silent connection to a bounded handshake and go on).
#[test]
fn a_flood_of_idle_connections_stalls_neither_the_store_nor_the_health_channel() {
    use bcl_core::{Communicator, ReduceOp};
    use bcl_tests::{Setup, test_config};
    let id = UniqueId::new("127.0.0.1".parse().expect("ip")).expect("id");
    let comms: Vec<Communicator> = std::thread::scope(|s| {
        let first = s.spawn(move || Communicator::init(0, 3, &id, test_config(Setup::TcpCpu, 0)));
        let held = flood(id.addr, 300);
        let rest: Vec<_> = (1..3)
            .map(|r| s.spawn(move || Communicator::init(r, 3, &id, test_config(Setup::TcpCpu, r))))
            .collect();
        let mut comms = vec![
            first
                .join()
                .expect("join")
                .expect("rank 0 despite the flood"),
        ];
        comms.extend(
            rest.into_iter()
                .map(|h| h.join().expect("join").expect("init")),
        );
        drop(held);
        comms
    });
    let health: std::net::SocketAddr = comms[0].peers()[0]
        .health
        .as_deref()
        .expect("health channel on by default")
        .parse()
        .expect("address");
    let held = flood(health, 300);
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (comms.iter().enumerate())
            .map(|(r, c)| {
                s.spawn(move || {
                    let mut last = Vec::new();
                    for round in 0..50u64 {
                        let mut v = vec![r as u64 + round; 4096];
                        c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                        last = v;
                    }
                    Ok::<_, bcl_core::Error>(last)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).collect()
    });
    drop(held);
    for r in results {
        assert_eq!(
            r.expect("allreduce under the flood"),
            vec![3 + 3 * 49; 4096]
        );
    }
    assert!(comms.iter().all(|c| c.async_error().is_none()));
}

/// More idle strangers on the store port than it lets into its handshake at once: they evict
/// each other (oldest first), so the handshakes in flight, and the threads and descriptors
/// behind them, stay at the bound; a member dialling in the middle of the flood still gets
/// in (cut, it dials again) and its requests are served.
#[test]
fn a_flood_beyond_the_handshake_bound_evicts_itself_and_a_member_still_gets_in() {
    use bcl_transport::store::Store;
    use bcl_transport::store::{HANDSHAKES_IN_FLIGHT, TcpStore, TcpStoreServer};
    let secret = Secret::derive("flood");
    let server = TcpStoreServer::start("127.0.0.1:0".parse().expect("addr"), secret).expect("up");
    let strangers = HANDSHAKES_IN_FLIGHT + 100;
    let mut held = flood(server.addr(), strangers / 2);
    let member = TcpStore::connect(
        server.addr(),
        &secret,
        Instant::now() + Duration::from_secs(10),
    )
    .expect("a member dialling into the flood gets in");
    held.extend(flood(server.addr(), strangers - strangers / 2));
    // The accept loop takes the queue at its own pace: wait until it has seen every stranger.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.handshakes().1 < (strangers - HANDSHAKES_IN_FLIGHT) as u64 {
        assert!(
            Instant::now() < deadline,
            "evictions: {:?}",
            server.handshakes()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (in_flight, _) = server.handshakes();
    assert!(
        in_flight <= HANDSHAKES_IN_FLIGHT,
        "{in_flight} handshakes in flight"
    );
    // Evicted strangers' threads end at once: the connections served settle at the bound
    // plus the member.
    while server.clients() > HANDSHAKES_IN_FLIGHT + 1 {
        assert!(
            Instant::now() < deadline,
            "{} connections still served",
            server.clients()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    member.set("k", b"v").expect("set under the flood");
    assert_eq!(
        member
            .get("k", Instant::now() + Duration::from_secs(5))
            .expect("get under the flood"),
        b"v"
    );
    // The oldest strangers were the ones cut: their server end is gone.
    let mut b = [0u8; 1];
    held[0]
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    assert_eq!(held[0].read(&mut b).expect("the cut end reads EOF"), 0);
    drop(held);
}
