use super::connect::{RINGS_PER_RANK, may_read, ring_capacity};
use super::ring::{self, Consumer, Identity, Producer};
use super::*;

fn secret() -> Secret {
    Secret::derive("shm tests")
}

fn endpoint(ring_bytes: usize) -> ShmTransport {
    let mut c = ShmConfig::new(secret());
    c.ring_bytes = ring_bytes;
    ShmTransport::bind(c).expect("bind")
}

/// Two connected endpoints, ranks 0 and 1.
fn pair(ring_bytes: usize) -> (ShmTransport, ShmTransport) {
    let (mut a, mut b) = (endpoint(ring_bytes), endpoint(ring_bytes));
    crate::testing::connect_pair(&mut a, &mut b);
    (a, b)
}

fn names_of(t: &ShmTransport) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(&t.id))
                .collect()
        })
        .unwrap_or_default()
}

fn recv_blocking(t: &mut ShmTransport, peer: usize, tag: Tag) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        t.progress().expect("progress");
        if let Some(m) = t.try_recv(peer, tag).expect("recv") {
            return m.data;
        }
        assert!(
            Instant::now() < deadline,
            "message {tag} from {peer} never came"
        );
        t.wait(Duration::from_millis(10)).expect("wait");
    }
}

#[test]
fn messages_arrive_whole_and_in_order_per_tag() {
    let (mut a, mut b) = pair(64 << 10);
    assert!(
        names_of(&a).is_empty() && names_of(&b).is_empty(),
        "names left after connect"
    );
    // Small, odd-sized and wrapping messages, under two tags.
    let messages: Vec<(Tag, Vec<u8>)> = (0..200u32)
        .map(|i| {
            let len = (i as usize * 997) % 20_000;
            (
                u64::from(i % 2),
                (0..len).map(|j| (j as u32 ^ i) as u8).collect(),
            )
        })
        .collect();
    let mut sent = 0;
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while got[0].len() + got[1].len() < messages.len() {
        assert!(Instant::now() < deadline, "stalled");
        while sent < messages.len()
            && a.try_send(1, messages[sent].0, &messages[sent].1)
                .expect("send")
        {
            sent += 1;
        }
        b.progress().expect("progress");
        for tag in 0..2u64 {
            while let Some(m) = b.try_recv(0, tag).expect("recv") {
                got[tag as usize].push(m.data.clone());
                b.release(m);
            }
        }
    }
    for tag in 0..2u64 {
        let want: Vec<&Vec<u8>> = messages
            .iter()
            .filter(|m| m.0 == tag)
            .map(|m| &m.1)
            .collect();
        assert_eq!(
            got[tag as usize].iter().collect::<Vec<_>>(),
            want,
            "tag {tag}"
        );
    }
}

#[test]
fn a_message_larger_than_the_ring_is_fragmented() {
    let (mut a, mut b) = pair(64 << 10);
    let big: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
    assert!(a.try_send(1, 7, &big).expect("send"));
    assert!(!a.flushed(), "the remainder waits for room");
    assert!(
        !a.try_send(1, 8, b"after").expect("send"),
        "later messages wait behind it"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "stalled");
        a.progress().expect("progress");
        got = b.try_recv(0, 7).expect("recv");
    }
    assert_eq!(got.expect("message").data, big);
    assert!(a.flushed());
    assert!(a.try_send(1, 8, b"after").expect("send"));
    assert_eq!(recv_blocking(&mut b, 0, 8), b"after");
}

#[test]
fn a_full_ring_answers_not_now_until_drained() {
    let (mut a, mut b) = pair(64 << 10);
    let chunk = vec![3u8; 16 << 10];
    let mut accepted = 0;
    while a.try_send(1, 1, &chunk).expect("send") {
        accepted += 1;
        assert!(accepted < 100, "a 64 KiB ring took more than 1.6 MB");
    }
    assert_eq!(
        accepted, 3,
        "64 KiB ring: three 16 KiB records and their headers"
    );
    b.progress().expect("drain");
    assert!(a.try_send(1, 1, &chunk).expect("send after drain"));
}

#[test]
fn a_message_filled_in_place_arrives_whole_and_a_refused_fill_leaves_nothing() {
    let (mut a, mut b) = pair(64 << 10);
    let pattern = |i: usize| (i * 7 % 251) as u8;
    // Sizes that wrap the 64 KiB ring (a skip record before some) and one of an odd length.
    for (k, len) in [20_000usize, 30_000, 12_345, 30_000, 1]
        .into_iter()
        .enumerate()
    {
        let tag = k as Tag;
        // A refused fill first: nothing may reach the peer, not even a skip record.
        let refused = a
            .try_send_filled(1, tag, len, &mut |dest| {
                dest.fill(0xee);
                false
            })
            .expect("refused fill");
        assert_eq!(refused, Some(false), "a refused fill is not sent");
        let sent = a
            .try_send_filled(1, tag, len, &mut |dest| {
                assert_eq!(dest.len(), len, "the fill is given the message's length");
                dest.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = pattern(i));
                true
            })
            .expect("fill");
        assert_eq!(sent, Some(true), "message {k} of {len} bytes");
        let got = recv_blocking(&mut b, 0, tag);
        assert!(
            got.len() == len && got.iter().enumerate().all(|(i, b)| *b == pattern(i)),
            "message {k} arrived changed"
        );
    }
    assert!(
        b.try_recv(0, 0).expect("recv").is_none(),
        "a refused fill arrived"
    );
    // More than one record: filled by `try_send` instead.
    assert_eq!(
        a.try_send_filled(1, 9, 40 << 10, &mut |_| panic!("not filled in place"))
            .expect("large"),
        None
    );
    // A full ring: not now, and the fill is not asked.
    while a.try_send(1, 1, &[5u8; 16 << 10]).expect("send") {}
    assert_eq!(
        a.try_send_filled(1, 2, 16 << 10, &mut |_| panic!("no room to fill"))
            .expect("full"),
        Some(false)
    );
}

#[test]
fn a_parked_receiver_is_woken_by_a_send() {
    let (mut a, mut b) = pair(64 << 10);
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            assert!(a.try_send(1, 5, b"ding").expect("send"));
        });
        // One long wait: without the doorbell it would sleep the whole 8 s.
        b.wait(Duration::from_secs(8)).expect("wait");
    });
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the doorbell did not wake the receiver"
    );
    assert_eq!(recv_blocking(&mut b, 0, 5), b"ding");
}

#[test]
fn a_closed_peer_is_reported_after_its_last_message() {
    let (mut a, mut b) = pair(64 << 10);
    assert!(a.try_send(1, 9, b"last words").expect("send"));
    drop(a);
    assert!(!b.peer_lost(0), "a message is still unread");
    assert_eq!(recv_blocking(&mut b, 0, 9), b"last words");
    assert!(b.peer_lost(0));
    let err = b.try_send(0, 1, b"x").expect_err("send to a closed peer");
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 0, .. }),
        "{err}"
    );
}

#[test]
fn a_different_secret_is_refused() {
    let mut a = endpoint(64 << 10);
    let mut other = ShmConfig::new(Secret::derive("someone else"));
    other.ring_bytes = 64 << 10;
    let mut b = ShmTransport::bind(other).expect("bind");
    let (aa, ba) = (a.address().clone(), b.address().clone());
    let deadline = Instant::now() + Duration::from_secs(3);
    let (ra, rb) = std::thread::scope(|s| {
        let t = s.spawn(|| b.connect(1, &[(0, aa)], deadline));
        let ra = a.connect(0, &[(1, ba)], deadline);
        (ra, t.join().expect("thread"))
    });
    // The side that finds the stranger's ring first refuses it and removes its own ring, so
    // the other side may instead time out waiting for it.
    let errors = [
        ra.expect_err("rank 0 connected"),
        rb.expect_err("rank 1 connected"),
    ];
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, TransportError::Handshake { .. })
                && e.to_string().contains("not made by rank")),
        "{errors:?}"
    );
    assert!(
        errors.iter().all(|e| matches!(
            e,
            TransportError::Handshake { .. } | TransportError::ConnectTimeout { .. }
        )),
        "{errors:?}"
    );
    assert!(
        names_of(&a).is_empty() && names_of(&b).is_empty(),
        "names left after a refusal"
    );
}

#[test]
fn a_malformed_address_is_refused() {
    let mut a = endpoint(64 << 10);
    let bad = PeerAddress::new(b"127.0.0.1:80".to_vec()).expect("address");
    let e = a
        .connect(0, &[(1, bad)], Instant::now() + Duration::from_secs(1))
        .expect_err("bad address");
    assert!(
        matches!(e, TransportError::BadAddress { peer: 1, .. }),
        "{e}"
    );
}

#[test]
fn a_missing_peer_times_out_naming_it_and_leaves_no_name() {
    let mut a = endpoint(64 << 10);
    let ghost = PeerAddress::new(b"1.0123456789abcdef".to_vec()).expect("address");
    let e = a
        .connect(
            0,
            &[(1, ghost)],
            Instant::now() + Duration::from_millis(200),
        )
        .expect_err("nobody there");
    assert!(
        matches!(&e, TransportError::ConnectTimeout { rank: 0, missing } if missing == &vec![1]),
        "{e}"
    );
    assert!(names_of(&a).is_empty());
}

#[test]
fn rings_of_dead_processes_are_reclaimed() {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    let name = format!("/bcl.{dead}.00000000deadbeef.0to1");
    drop(sys::Segment::create(&name, 8192).expect("create"));
    let live = format!("/bcl.{}.00000000cafecafe.0to1", std::process::id());
    drop(sys::Segment::create(&live, 8192).expect("create"));
    let removed = reclaim_stale();
    assert!(removed.contains(&name[1..].to_string()), "{removed:?}");
    assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    assert!(
        std::path::Path::new(&format!("/dev/shm{live}")).exists(),
        "a live process's ring went"
    );
    sys::unlink(&live).expect("cleanup");
}

#[test]
fn garbage_in_a_ring_is_a_protocol_error() {
    let name = format!("/bcl.{}.00000000garbage0.0to1", std::process::id());
    let seg = sys::Segment::create(&name, ring::DATA + 4096).expect("create");
    sys::unlink(&name).expect("unlink");
    let id = Identity {
        producer_rank: 0,
        consumer_rank: 1,
        consumer_pid: 1,
        proof: [0; 32],
    };
    ring::initialize(&seg, 4096, &id);
    let (cap, _) = ring::inspect(&seg).expect("valid").expect("initialized");
    let seg2 = sys::Segment::open(&name).ok().flatten();
    assert!(seg2.is_none(), "the name is gone");
    // The producer claims a record whose length runs past what it published.
    // SAFETY: this test is the only user of the segment (its name is gone).
    #[allow(unsafe_code)]
    unsafe {
        seg.write(
            ring::DATA,
            &[1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0],
        )
    };
    seg.atomic_u64(128)
        .store(32, std::sync::atomic::Ordering::Release);
    let mut c = Consumer::new(seg, cap);
    let e = c.peek().expect_err("garbage");
    assert!(e.contains("bad record header"), "{e}");
    let _ = Producer::attach;
}

#[test]
fn messages_handed_over_in_place_match_across_wraps_and_tags() {
    let (mut a, mut b) = pair(64 << 10);
    // Sizes that leave skip records at the end of the ring; tags interleaved so that asking
    // for one tag moves records of the other into the inbox on the way.
    let messages: Vec<(Tag, Vec<u8>)> = (0..300u32)
        .map(|i| {
            let len = [24_000usize, 8, 17_000, 0, 30_000][i as usize % 5];
            (
                u64::from(i % 3 == 0),
                (0..len).map(|j| (j as u32 * 7 + i) as u8).collect(),
            )
        })
        .collect();
    let want = |tag: Tag| -> Vec<&Vec<u8>> {
        messages
            .iter()
            .filter(|m| m.0 == tag)
            .map(|m| &m.1)
            .collect()
    };
    let mut sent = 0;
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while got[0].len() + got[1].len() < messages.len() {
        assert!(Instant::now() < deadline, "stalled after {sent} sends");
        while sent < messages.len()
            && a.try_send(1, messages[sent].0, &messages[sent].1)
                .expect("send")
        {
            sent += 1;
        }
        // Ask for tag 1 first: tag-0 records ahead of it are copied aside.
        for tag in [1u64, 0] {
            let slot = &mut got[tag as usize];
            while b
                .try_recv_with(0, tag, &mut |data, _| slot.push(data.to_vec()))
                .expect("recv")
            {}
        }
    }
    for tag in 0..2u64 {
        assert_eq!(
            got[tag as usize].iter().collect::<Vec<_>>(),
            want(tag),
            "tag {tag}"
        );
    }
}

#[test]
fn rings_shrink_to_fit_a_small_dev_shm() {
    let mib = |n: u64| n << 20;
    // Plenty of room: the configured size.
    assert_eq!(ring_capacity(4 << 20, 3, Some(mib(24 << 10))), 4 << 20);
    assert_eq!(ring_capacity(4 << 20, 3, None), 4 << 20);
    // Docker's 64 MiB with 8 ranks (7 peers, 56 rings on the host): 512 KiB rings.
    let ring = ring_capacity(4 << 20, 7, Some(mib(64)));
    assert_eq!(ring, 512 << 10);
    assert!(56 * (ring as u64 + 4096) <= mib(64) / 2);
    // Never below 64 KiB, always a power of two.
    assert_eq!(ring_capacity(4 << 20, 7, Some(mib(1))), 64 << 10);
    assert_eq!(ring_capacity(100_000, 1, Some(mib(1024))), 128 << 10);
}

#[test]
fn a_ranks_rings_stay_within_their_budget_however_large_dev_shm_is() {
    let big = Some(24u64 << 30);
    // 16 ranks on a host (15 peers): 4 MiB each, 60 MiB in all.
    assert_eq!(ring_capacity(4 << 20, 15, big), 4 << 20);
    // 64 ranks: 63 rings of 1 MiB, where half of 24 GiB would have given 2 MiB.
    assert_eq!(ring_capacity(4 << 20, 63, big), 1 << 20);
    assert_eq!(ring_capacity(4 << 20, 63, None), 1 << 20);
    for peers in [1, 7, 15, 16, 63, 127, 500] {
        let ring = ring_capacity(4 << 20, peers, big);
        assert!(
            ring.is_power_of_two() && ring >= 64 << 10,
            "{peers} peers: {ring}"
        );
        assert!(
            peers * ring <= RINGS_PER_RANK || ring == 64 << 10,
            "{peers} peers: {peers} rings of {ring} B"
        );
    }
}

/// Lines between a connected pair: a post of any size up to the largest arrives whole, the two
/// sets alternate without one post showing through another, an earlier post or a post for
/// another operation is never handed out as the awaited one, and a line changed under the
/// reader is an error.
#[test]
fn lines_carry_posts_whole_and_tell_stale_foreign_and_rewritten_ones_apart() {
    let (mut a, mut b) = pair(64 << 10);
    let max = Lines::max_payload(&a);
    assert_eq!(max, lines::MAX_PAYLOAD);
    for (post, len) in [0usize, 1, 8, 55, 56, 57, 112, 1000, max]
        .into_iter()
        .enumerate()
    {
        let stamp = ((post as u64 + 1) << 32) | 0x55;
        let payload: Vec<u8> = (0..len).map(|i| (i * 31 + post) as u8).collect();
        let mut out = vec![0u8; len];
        // Nothing yet: the set holds the post before last (or nothing).
        assert_eq!(
            b.collect(0, stamp, &mut out).expect("collect"),
            Collected::Partial
        );
        a.post(&[1], stamp, &payload).expect("post");
        assert_eq!(
            b.collect(0, stamp, &mut out).expect("collect"),
            Collected::Complete
        );
        assert_eq!(out, payload, "{len} bytes");
        // The post before it, in the other set, is still there and not this one.
        if post > 0 {
            let before = ((post as u64) << 32) | 0x55;
            let mut old = vec![0u8; len];
            let got = b.collect(0, before, &mut old).expect("collect");
            assert_ne!(got, Collected::Foreign(stamp), "{len} bytes");
        }
    }
    // The same number under another check: another operation, its first line handed over.
    let stamp = (100u64 << 32) | 0x11;
    a.post(&[1], (100u64 << 32) | 0x33, b"their signature, then data")
        .expect("post");
    let mut out = vec![0u8; 80];
    assert_eq!(
        b.collect(0, stamp, &mut out).expect("collect"),
        Collected::Foreign((100u64 << 32) | 0x33)
    );
    assert_eq!(&out[..26], b"their signature, then data");
    // A line rewritten between the last line's flag and the reader's check: an error naming
    // the peer's ring, never the mixed bytes.
    let stamp = (102u64 << 32) | 0x11;
    a.post(&[1], stamp, &[7u8; 200]).expect("post");
    let seg = b.peers[0].as_ref().expect("peer 0").inp.segment();
    let first = seg.atomic_u64(lines::LINES);
    first.store(stamp ^ (1 << 40), std::sync::atomic::Ordering::Relaxed);
    let mut out = vec![0u8; 200];
    let e = b.collect(0, stamp, &mut out).expect_err("a rewritten line");
    assert!(e.to_string().contains("rewritten"), "{e}");
    // Payloads the lines cannot hold, and a zero stamp, are refused.
    assert!(a.post(&[1], stamp, &vec![0u8; max + 1]).is_err());
    assert!(a.post(&[1], 0, b"x").is_err());
    assert!(a.post(&[5], stamp, b"x").is_err());
}

/// A reader asleep on its lines wakes when the post comes (the doorbell), long before its
/// timeout.
#[test]
fn a_reader_asleep_on_its_lines_wakes_for_the_post() {
    let (mut a, mut b) = pair(64 << 10);
    let stamp = (1u64 << 32) | 9;
    let poster = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        a.post(&[1], stamp, &[1u8; 300]).expect("post");
        a
    });
    let started = Instant::now();
    let mut out = vec![0u8; 300];
    while b.collect(0, stamp, &mut out).expect("collect") != Collected::Complete {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the post never woke the reader"
        );
        b.sleep(&[(0, stamp, 300)], Duration::from_secs(60))
            .expect("sleep");
    }
    assert_eq!(out, vec![1u8; 300]);
    drop(poster.join().expect("poster"));
}

#[test]
fn a_lent_message_is_copied_from_the_lenders_memory_in_any_order_and_given_back() {
    let (mut a, mut b) = pair(64 << 10);
    assert!(
        Lend::reaches(&mut a, 1) && Lend::reaches(&mut b, 0),
        "in one process each endpoint can read the other's memory"
    );
    // Larger than the ring: a loan takes 24 bytes of it whatever its length.
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(7) >> 3) as u8)
        .collect();
    let small: Vec<u8> = (0..5000u32).map(|i| (i ^ 0x5a) as u8).collect();
    let mut loans = Vec::new();
    for (tag, data) in [(1, &big), (2, &small), (3, &small), (4, &big)] {
        let loan = a
            .offer(1, tag, data)
            .expect("offer")
            .expect("room for a loan");
        loans.push(loan);
    }
    assert!(
        !a.returned(1, loans[0]).expect("returned"),
        "back before it was read"
    );
    // Tag 2 first: the loan of tag 1 is passed over into the inbox on the way.
    let mut out = vec![0u8; small.len()];
    assert_eq!(
        b.try_recv_into(0, 2, &mut out).expect("recv"),
        Landing::Filled(None)
    );
    assert_eq!(out, small);
    assert!(a.returned(1, loans[1]).expect("returned"));
    assert!(!a.returned(1, loans[0]).expect("returned"));
    // Straight into the destination.
    let mut dest = vec![0u8; big.len()];
    assert_eq!(
        b.try_recv_into(0, 1, &mut dest).expect("recv"),
        Landing::Filled(None)
    );
    assert_eq!(dest, big);
    assert!(a.returned(1, loans[0]).expect("returned"));
    // Handed to a closure, as a reduction takes it.
    let mut seen = None;
    assert!(
        b.try_recv_with(0, 3, &mut |d, _| seen = Some(d.to_vec()))
            .expect("recv")
    );
    assert_eq!(seen.as_deref(), Some(&small[..]));
    // A destination of another length: refused and given back, the destination untouched.
    let mut short = vec![9u8; 10];
    assert_eq!(
        b.try_recv_into(0, 4, &mut short).expect("recv"),
        Landing::WrongLength(big.len())
    );
    assert_eq!(short, vec![9u8; 10]);
    assert!(loans.iter().all(|&l| a.returned(1, l).expect("returned")));
}

#[test]
fn a_lender_stops_at_the_loans_it_may_have_out_and_goes_on_as_they_come_back() {
    let (mut a, mut b) = pair(64 << 10);
    let data = vec![7u8; 1000];
    let mut loans = Vec::new();
    while let Some(loan) = a.offer(1, 1, &data).expect("offer") {
        loans.push(loan);
        assert!(
            loans.len() <= ring::LOAN_SLOTS as usize,
            "more loans out than return words"
        );
    }
    assert_eq!(loans.len(), ring::LOAN_SLOTS as usize);
    assert_eq!(recv_blocking(&mut b, 0, 1), data);
    assert!(a.returned(1, loans[0]).expect("returned"));
    assert!(
        a.offer(1, 1, &data).expect("offer").is_some(),
        "one came back: one more may go"
    );
}

#[test]
fn a_lender_asleep_is_woken_when_its_loan_comes_back() {
    let (mut a, mut b) = pair(64 << 10);
    let data = vec![3u8; 200_000];
    let loan = a.offer(1, 6, &data).expect("offer").expect("room");
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(recv_blocking(&mut b, 0, 6), vec![3u8; 200_000]);
        });
        // One long wait: unless the give-back rings the doorbell it sleeps the whole 8 s.
        a.wait(Duration::from_secs(8)).expect("wait");
    });
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the give-back did not wake the lender"
    );
    assert!(a.returned(1, loan).expect("returned"));
}

#[test]
fn a_loan_of_memory_the_lender_does_not_have_or_a_bad_loan_is_an_error_naming_it() {
    let (mut a, mut b) = pair(64 << 10);
    // What a broken or hostile peer could post: a loan of an address it has not mapped.
    let p = a.peers[1].as_mut().expect("peer 1");
    p.out.push_loan(5, 8, 4096, 1);
    p.out.publish();
    let mut dest = vec![0u8; 4096];
    let e = b
        .try_recv_into(0, 5, &mut dest)
        .expect_err("an unmapped loan");
    let text = e.to_string();
    assert!(
        text.contains("process_vm_readv") && text.contains("rank 0") && text.contains(&a.id),
        "{text}"
    );
    // A loan numbered 0 (numbers start at 1) is not a loan this protocol makes.
    let p = a.peers[1].as_mut().expect("peer 1");
    p.out.push_loan(6, dest.as_ptr() as u64, 16, 0);
    p.out.publish();
    let e = b.try_recv(0, 6).expect_err("loan 0");
    assert!(e.to_string().contains("numbered 0"), "{e}");
}

#[test]
fn the_single_copy_probe_says_no_unless_it_reads_the_proof_and_a_no_keeps_the_copy_ring() {
    let proof = Box::new([0x5au8; 32]);
    let me = std::process::id();
    assert!(may_read(me, proof.as_ptr() as u64, &proof));
    assert!(
        !may_read(me, proof.as_ptr() as u64, &[0u8; 32]),
        "other bytes"
    );
    assert!(!may_read(me, 8, &proof), "an unmapped address (EFAULT)");
    // A process that is gone (ESRCH): a child that has been reaped.
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let gone = child.id();
    child.wait().expect("wait");
    assert!(
        !may_read(gone, proof.as_ptr() as u64, &proof),
        "a dead process"
    );
    // A consumer that said no is never lent to: the lender keeps copying into the ring.
    let (mut a, mut b) = pair(64 << 10);
    b.peers[0].as_ref().expect("peer 0").inp.set_borrows(false);
    assert!(!Lend::reaches(&mut a, 1));
    assert!(Lend::reaches(&mut b, 0), "the other direction still may");
}
