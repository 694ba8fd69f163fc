//! The slow-node reports' tree on the wire: a parent takes windows from its children's
//! subtrees and refuses, naming nothing it keeps, a report from a rank that is not its child,
//! one that announces no or too many windows, and a window from outside the child's subtree.

use super::Health;
use super::slow::{LinkStat, RankStat, Summary, Window};
use super::wire::{self, Message, Purpose};
use crate::config::HealthConfig;
use crate::peers::RankInfo;
use bcl_transport::Secret;
use std::time::{Duration, Instant};

const WORLD: usize = 40;
const FANOUT: usize = 4;

/// Rank 1 of 40, reports' fan-out 4: its children are 5..=8; rank 5's subtree is 5 and
/// 21..=24. Every record names rank 1's own health port, so its ring link dials itself.
fn rank_one() -> (Health, Secret) {
    let secret = Secret([7; 16]);
    let config = HealthConfig {
        report_fanout: FANOUT,
        // No window closes during the test: rank 1 keeps what it was sent.
        window: Duration::from_secs(3600),
        ..HealthConfig::default()
    };
    let health = Health::start(1, secret, "127.0.0.1".parse().expect("ip"), config).expect("start");
    let addr = health.address().expect("address").to_string();
    let peers = (0..WORLD)
        .map(|rank| RankInfo::for_tests(rank, Some(addr.clone())))
        .collect();
    let ring = (0..WORLD).collect();
    health
        .watch(peers, ring, Instant::now() + Duration::from_secs(10))
        .expect("watch");
    (health, secret)
}

/// Report as `from` with `announced` windows, sending `windows`; the reply, if any.
fn report(
    health: &Health,
    secret: &Secret,
    from: usize,
    announced: u32,
    windows: &[u32],
) -> Option<Message> {
    let addr = health.address().expect("address");
    let mut s = wire::dial(
        addr,
        secret,
        from,
        Purpose::Report { windows: announced },
        Duration::from_secs(5),
    )
    .expect("dial");
    for &rank in windows {
        if wire::send(&mut s, &Message::Window(Window::new(rank))).is_err() {
            return None;
        }
    }
    wire::receive(&mut s).ok()
}

fn held(health: &Health) -> Vec<u32> {
    health.inner.relayed.lock().iter().map(|w| w.rank).collect()
}

#[test]
fn a_parent_keeps_its_children_s_windows_and_refuses_the_rest() {
    let (health, secret) = rank_one();
    // Rank 5 passes on its own window and two of its children's.
    let reply = report(&health, &secret, 5, 3, &[5, 21, 24]);
    assert!(matches!(reply, Some(Message::Summary(_))), "{reply:?}");
    assert_eq!(held(&health), vec![5, 21, 24]);

    // Not a child of rank 1 (rank 9's parent is 2).
    assert_eq!(report(&health, &secret, 9, 1, &[9]), None);
    // No windows, and more than four per rank of rank 5's subtree (5 ranks: 20).
    assert_eq!(report(&health, &secret, 5, 0, &[]), None);
    assert_eq!(report(&health, &secret, 5, 21, &[5]), None);
    // A window of rank 6 (a sibling) or of rank 0 through rank 5.
    assert_eq!(report(&health, &secret, 5, 1, &[6]), None);
    assert_eq!(report(&health, &secret, 5, 1, &[0]), None);
    assert_eq!(
        held(&health),
        vec![5, 21, 24],
        "a refused report left windows behind"
    );

    // A leaf may send two windows of its own (its last report failed or waited).
    let reply = report(&health, &secret, 8, 2, &[8, 8]);
    assert!(matches!(reply, Some(Message::Summary(_))), "{reply:?}");
    assert_eq!(held(&health), vec![5, 21, 24, 8, 8]);
}

#[test]
fn a_parent_holds_a_bounded_number_of_windows() {
    let (health, secret) = rank_one();
    // Rank 1's subtree: 1, 5..=8, 21..=36: 21 ranks, whose report may carry 84 windows; it
    // holds 83, leaving room for its own.
    for _ in 0..30 {
        let reply = report(&health, &secret, 6, 4, &[6, 6, 6, 6]);
        assert!(matches!(reply, Some(Message::Summary(_))), "{reply:?}");
    }
    assert_eq!(held(&health).len(), 83);
}

#[test]
fn a_child_is_answered_with_its_subtree_s_part_of_the_summary_and_every_verdict() {
    let (health, secret) = rank_one();
    // What rank 1 holds: a ring's links over all 40 ranks, every rank's figures, a verdict.
    let link = |from: usize, to: usize| LinkStat {
        from,
        to,
        gbps: 1.0,
        samples: 3,
    };
    let held = Summary {
        links: (0..WORLD).map(|r| link(r, (r + 1) % WORLD)).collect(),
        ranks: (0..WORLD)
            .map(|rank| RankStat {
                rank,
                ..RankStat::default()
            })
            .collect(),
        verdicts: vec!["slow link rank 30 → rank 31".into()],
        raised_total: 2,
        evaluations: 9,
    };
    *health.inner.summary.lock() = held;
    let Some(Message::Summary(got)) = report(&health, &secret, 5, 1, &[5]) else {
        panic!("no summary for rank 5");
    };
    // Rank 5's subtree: 5 and 21..=24; the ring links into or out of it.
    let ranks: Vec<usize> = got.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, vec![5, 21, 22, 23, 24]);
    let links: Vec<(usize, usize)> = got.links.iter().map(|l| (l.from, l.to)).collect();
    assert_eq!(
        links,
        vec![
            (4, 5),
            (5, 6),
            (20, 21),
            (21, 22),
            (22, 23),
            (23, 24),
            (24, 25)
        ]
    );
    assert_eq!(
        got.verdicts,
        vec!["slow link rank 30 → rank 31".to_string()]
    );
    assert_eq!((got.raised_total, got.evaluations), (2, 9));
    // Rank 1 itself keeps all it had.
    assert_eq!(health.inner.summary.lock().links.len(), WORLD);
}
