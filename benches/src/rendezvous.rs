//! `bcl-bench rendezvous`: the rendezvous alone, as rank 0's tcp store sees it.
//!
//! `bcl-bench rendezvous --nranks 64,256,1024 --rounds 3` starts one tcp store server and, per
//! row, that many client threads (each a rank: its own connection and handshake, then
//! [`bcl_core::bootstrap::exchange_with`] with a record shaped like a real one: this host's
//! names, a cpu device, a tcp address), once with the star exchange and once with the tree,
//! interleaved. It prints the time from the first request to the last rank holding the
//! table, and the requests and reply bytes the server answered (rank 0's load). Connections
//! are made before that clock starts (they cost the same in both exchanges) and timed apart:
//! a connection and its handshake is what every slow-node report and delivered verdict costs
//! too (`bcl-sim control` takes these constants).

use bcl_core::bootstrap::{Exchange, exchange_with};
use bcl_core::transport::store::{TcpStore, TcpStoreServer};
use bcl_core::transport::{PeerAddress, Secret};
use bcl_core::{DeviceInfo, RankInfo};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: bcl-bench rendezvous [--nranks N[,N...]] [--rounds R] [--exchange star|tree|both]";

/// One measured rendezvous.
struct Row {
    how: Exchange,
    world: usize,
    round: usize,
    /// From starting the rank threads to every rank connected and authenticated.
    connect_s: f64,
    seconds: f64,
    requests: u64,
    bytes_out: u64,
}

pub fn main(args: &[String]) -> Result<(), String> {
    let mut worlds = vec![64usize, 256];
    let mut rounds = 3usize;
    let mut hows = vec![Exchange::Star, Exchange::Tree];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .ok_or(format!("rendezvous: {a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--nranks" | "-n" => {
                worlds = value()?
                    .split(',')
                    .map(|w| match w.trim().parse::<usize>() {
                        Ok(n) if (1..=4096).contains(&n) => Ok(n),
                        _ => Err(format!(
                            "rendezvous: --nranks takes rank counts from 1 to 4096 (threads of \
                             this process), not '{w}'"
                        )),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--rounds" => {
                rounds = match value()?.parse::<usize>() {
                    Ok(r) if (1..=100).contains(&r) => r,
                    _ => return Err("rendezvous: --rounds takes 1 to 100".into()),
                };
            }
            "--exchange" => {
                hows = match value()?.as_str() {
                    "star" => vec![Exchange::Star],
                    "tree" => vec![Exchange::Tree],
                    "both" => vec![Exchange::Star, Exchange::Tree],
                    other => {
                        return Err(format!(
                            "rendezvous: --exchange is star, tree or both, not '{other}'"
                        ));
                    }
                };
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("rendezvous: unknown argument '{other}'\n{USAGE}")),
        }
    }
    let device = bcl_core::backends::open_device(
        &bcl_core::DeviceSpec::Cpu,
        0,
        &bcl_core::backends::DeviceOptions::default(),
    )
    .map_err(|e| format!("rendezvous: the cpu device: {e}"))?
    .info()
    .clone();
    let record = bcl_core::bootstrap::encoded_len(&record(0, &device)?);
    println!("# bcl-bench rendezvous: threads as ranks, one tcp store; a record is {record} bytes");
    println!(
        "# {:>6} {:>6} {:>5} {:>10} {:>10} {:>12} {:>14} {:>12}",
        "ranks", "how", "round", "connect_s", "time_s", "requests", "reply_bytes", "req/s"
    );
    for round in 0..rounds {
        for &world in &worlds {
            for &how in &hows {
                let row = once(how, world, round, &device)?;
                println!(
                    "  {:>6} {:>6} {:>5} {:>10.3} {:>10.3} {:>12} {:>14} {:>12.0}",
                    row.world,
                    format!("{:?}", row.how).to_lowercase(),
                    row.round,
                    row.connect_s,
                    row.seconds,
                    row.requests,
                    row.bytes_out,
                    row.requests as f64 / row.seconds.max(1e-9)
                );
            }
        }
    }
    Ok(())
}

/// A record shaped like a real tcp rank's on this host (`device`: this host's cpu).
fn record(rank: usize, device: &DeviceInfo) -> Result<RankInfo, String> {
    let ip = format!("10.1.{}.{}", rank / 250 % 250, rank % 250);
    Ok(RankInfo {
        rank,
        hostname: bcl_core::backends::host::hostname(),
        host_id: bcl_core::backends::host::host_identity(),
        pid: std::process::id(),
        device: device.clone(),
        address: PeerAddress::new(format!("{ip}:{}", 40000 + rank % 20000).into_bytes())
            .map_err(|e| format!("rendezvous: an address: {e}"))?,
        health: Some(format!("{ip}:{}", 30000 + rank % 20000)),
        nic: Some("eth0".into()),
    })
}

fn once(how: Exchange, world: usize, round: usize, device: &DeviceInfo) -> Result<Row, String> {
    let secret = Secret::random().map_err(|e| format!("rendezvous: no secret: {e}"))?;
    let server = TcpStoreServer::start("127.0.0.1:0".parse().map_err(|_| "address")?, secret)
        .map_err(|e| format!("rendezvous: store server: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let records: Vec<RankInfo> = (0..world)
        .map(|r| record(r, device))
        .collect::<Result<_, _>>()?;
    let ready = Barrier::new(world + 1);
    let addr = server.addr();
    let connecting = Instant::now();
    let (before, connect_s, seconds) =
        std::thread::scope(|s| -> Result<((u64, u64), f64, f64), String> {
            let handles: Vec<_> = records
                .iter()
                .map(|me| {
                    let ready = &ready;
                    std::thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(s, move || -> Result<Instant, String> {
                            let store = TcpStore::connect(addr, &secret, deadline);
                            ready.wait();
                            let store = store.map_err(|e| format!("rank {}: {e}", me.rank))?;
                            let started = Instant::now();
                            let table = exchange_with(
                                how, &store, None, "bench", me, world, started, deadline,
                            )
                            .map_err(|e| e.to_string())?;
                            if table.len() != world {
                                return Err(format!("rank {}: {} records", me.rank, table.len()));
                            }
                            Ok(Instant::now())
                        })
                        .map_err(|e| format!("rendezvous: a rank thread: {e}"))
                })
                .collect::<Result<_, _>>()?;
            // Every rank is connected or at the barrier: no request has been made yet.
            let before = server.served();
            ready.wait();
            let started = Instant::now();
            let connect_s = (started - connecting).as_secs_f64();
            let mut last = started;
            for h in handles {
                let done = h
                    .join()
                    .map_err(|_| "rendezvous: a rank thread panicked".to_string())??;
                last = last.max(done);
            }
            Ok((before, connect_s, (last - started).as_secs_f64()))
        })?;
    let after = server.served();
    Ok(Row {
        how,
        world,
        round,
        connect_s,
        seconds,
        requests: after.0 - before.0,
        bytes_out: after.1 - before.1,
    })
}
