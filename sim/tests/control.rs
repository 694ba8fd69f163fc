//! The control-plane model: its tree arithmetic against a walk of the real tree, its request
//! counts against closed forms, and how its loads grow with the world.

use bcl_core::bootstrap::{Exchange, children};
use bcl_sim::control::{
    Constants, gathered_records, rendezvous, report_limit, report_load, report_load_tree,
    tree_depth, verdict_spread,
};
use bcl_sim::control_report::{ControlArgs, tables};
use clap::Parser;

/// Subtree sizes and depths by walking `children` from rank 0.
fn walk(world: usize) -> (f64, u32) {
    fn size(r: usize, world: usize, depth: u32, deepest: &mut u32, sum: &mut f64) -> usize {
        *deepest = (*deepest).max(depth);
        let s = 1 + children(r, world)
            .map(|c| size(c, world, depth + 1, deepest, sum))
            .sum::<usize>();
        if r != 0 {
            *sum += s as f64;
        }
        s
    }
    let (mut deepest, mut sum) = (0, 0.0);
    let all = size(0, world, 0, &mut deepest, &mut sum);
    assert_eq!(all, world, "the walk reaches every rank");
    (sum, deepest)
}

#[test]
fn the_gathered_records_and_depth_match_a_walk_of_the_tree() {
    for world in [1, 2, 16, 17, 18, 273, 274, 5000, 70_000] {
        let (sum, deepest) = walk(world);
        assert_eq!(gathered_records(world), sum, "world {world}");
        assert_eq!(tree_depth(world), deepest, "world {world}");
    }
}

#[test]
fn requests_and_bytes_follow_the_closed_forms() {
    let c = Constants::default();
    for n in [2usize, 64, 1000, 10_000] {
        let nf = n as f64;
        let star = rendezvous(Exchange::Star, n, &c);
        assert_eq!(star.requests, nf + nf * nf, "{n}");
        // Replies: a set's 5 bytes; a get's, the record in 8 bytes of framing.
        assert_eq!(star.bytes, nf * 5.0 + nf * nf * (c.record + 8.0), "{n}");
        let tree = rendezvous(Exchange::Tree, n, &c);
        let chunks = n.div_ceil(4096) as f64;
        assert_eq!(
            tree.requests,
            2.0 * nf - 1.0 + chunks + (nf - 1.0) * (1.0 + chunks),
            "{n}"
        );
        // The table alone, read by every rank but rank 0, is most of the tree's bytes.
        assert!(tree.bytes >= (nf - 1.0) * nf * c.record, "{n}");
        assert_eq!(
            star.seconds,
            star.requests * c.per_request + star.bytes * c.per_byte,
            "{n}"
        );
    }
}

#[test]
fn a_relayed_table_costs_the_levels_below_rank_0_one_part_each() {
    let c = Constants::default();
    for n in [64usize, 1000, 10_000, 100_000] {
        let relay = rendezvous(Exchange::Relay, n, &c);
        let own = relay.requests * c.per_request + relay.bytes * c.per_byte;
        let table = n as f64 * c.record;
        let part = table.min(bcl_core::health::TABLE_PART as f64);
        let (_, deepest) = walk(n);
        // Every level below rank 0's children has the table one round of 16 parts later.
        let below = f64::from(deepest - 1) * 16.0 * part * c.per_byte;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12);
        assert!(
            close(relay.seconds - own, below),
            "{n}: {} {below}",
            relay.seconds - own
        );
        // Level after level, each waiting for the whole table, took a table's round each.
        let whole = f64::from(deepest - 1) * 16.0 * table * c.per_byte;
        if n >= 10_000 {
            assert!(below * 30.0 < whole, "{n}: {below} {whole}");
        }
    }
}

#[test]
fn rank_zero_s_bytes_grow_with_the_square_of_the_world_unless_the_table_is_relayed() {
    let c = Constants::default();
    let bytes = |how, n| rendezvous(how, n, &c).bytes;
    for how in [Exchange::Star, Exchange::Tree] {
        let ratio = bytes(how, 20_000) / bytes(how, 10_000);
        assert!((3.9..4.1).contains(&ratio), "{how:?}: x{ratio}");
    }
    let ratio = bytes(Exchange::Relay, 20_000) / bytes(Exchange::Relay, 10_000);
    assert!((1.9..2.5).contains(&ratio), "relay: x{ratio}");
    // And the tree asks far fewer requests than the star from a few ranks on.
    for n in [64, 1024, 10_000] {
        let star = rendezvous(Exchange::Star, n, &c);
        let tree = rendezvous(Exchange::Tree, n, &c);
        assert!(tree.requests * 10.0 < star.requests, "{n}");
        assert!(tree.seconds < star.seconds, "{n}");
    }
}

#[test]
fn reports_overload_rank_zero_exactly_past_its_limit() {
    let c = Constants {
        per_connection: 1e-3 - 1e-6,
        per_window: 1e-6,
        window: 0.5,
        ..Constants::default()
    };
    assert!((report_limit(&c) - 501.0).abs() < 1e-9);
    assert!((report_load(501, &c) - 1.0).abs() < 1e-12);
    assert!(report_load(500, &c) < 1.0 && report_load(502, &c) > 1.0);
    // Up a tree of 16, rank 0 takes 16 connections a window whatever the world, and every
    // window: at 501 ranks, 16 ms of connections and 0.5 ms of windows per 0.5 s.
    let tree = report_load_tree(501, 16, &c);
    assert!(
        (tree - (16.0 * (1e-3 - 1e-6) + 500.0 * 1e-6) / 0.5).abs() < 1e-12,
        "{tree}"
    );
    // Fewer ranks than the fan-out: each is rank 0's child, the same connections as the star.
    assert!((report_load_tree(9, 16, &c) - report_load(9, &c)).abs() < 1e-12);
}

#[test]
fn a_verdict_reaches_each_rank_by_the_earlier_of_the_dial_and_the_flood() {
    let c = Constants {
        dial: 1.0,
        hop: 1.0,
        ..Constants::default()
    };
    // Five ranks, the detector rank 0: ranks 1..4 get it at min(k, ring distance) = 1, 2, 2, 1.
    assert_eq!(verdict_spread(5, &c), (4.0, 2.0, 2.0));
    let c = Constants {
        dial: 1.0,
        hop: 10.0,
        ..Constants::default()
    };
    // With the flood ten times slower, dialling wins for every rank: the last (rank 9) gets
    // it at 9 by dial, before the flood's 10.
    assert_eq!(verdict_spread(10, &c), (9.0, 50.0, 9.0));
}

#[test]
fn bad_settings_are_refused_by_name() {
    for (flag, value) in [
        ("--per-request", "0"),
        ("--per-byte", "-1"),
        ("--window", "inf"),
        ("--hop", "NaN"),
        ("--ranks", "1"),
    ] {
        let a = ControlArgs::parse_from(["control".to_string(), format!("{flag}={value}")]);
        let err = tables(&a).expect_err(flag);
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
    let text = tables(&ControlArgs::parse_from(["control", "--ranks", "64,1024"])).expect("tables");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("64 "))
            .count(),
        2,
        "{text}"
    );
}
