//! The effective-training-time model: its Monte Carlo run against the closed form where first
//! order holds, and the properties the tables rest on.

use bcl_sim::ettr::{Recovery, Scenario, closed_form, monte_carlo};

const YEAR: f64 = 365.0 * 86_400.0;

fn scenario(chips: f64, recovery: Recovery) -> Scenario {
    Scenario {
        chips,
        chip_mtbf: 40_000.0 * 3600.0,
        step: 10.0,
        detect_dead: 0.02,
        detect_hung: 2.5,
        hung_share: 0.25,
        recovery,
        checkpoint: 10.0,
        interval: None,
    }
}

fn mean_mc(s: &Scenario, trials: u64) -> f64 {
    (0..trials)
        .map(|t| monte_carlo(s, YEAR, 7 + t))
        .sum::<f64>()
        / trials as f64
}

const RESTART: Recovery = Recovery::Restart { restart: 600.0 };
const IN_PLACE: Recovery = Recovery::InPlace {
    shrink: 5.0,
    fallback: 0.1,
    restart: 600.0,
};

#[test]
fn without_failures_only_the_checkpoints_cost() {
    for recovery in [RESTART, IN_PLACE] {
        let s = Scenario {
            chip_mtbf: 1e30,
            interval: Some(990.0),
            ..scenario(1000.0, recovery)
        };
        // Cycles of 990 s of work and a 10 s checkpoint, a whole number of them in a year.
        let expect = 990.0 / 1000.0;
        assert!((closed_form(&s) - expect).abs() < 1e-12);
        let mc = monte_carlo(&s, YEAR, 1);
        assert!((mc - expect).abs() < 1e-6, "{mc} against {expect}");
    }
}

#[test]
fn the_run_agrees_with_the_closed_form_where_failures_are_rare() {
    // 1000 chips: a failure every 40 h against checkpoint cycles of minutes, so failures
    // during a recovery (which first order leaves out) are rare.
    for recovery in [RESTART, IN_PLACE] {
        let s = scenario(1000.0, recovery);
        let (closed, mc) = (closed_form(&s), mean_mc(&s, 8));
        assert!(
            (closed - mc).abs() < 0.002,
            "{recovery:?}: closed form {closed}, Monte Carlo {mc}"
        );
    }
}

#[test]
fn in_place_recovery_keeps_most_of_the_time_at_100k_where_restarts_do_not() {
    let restart = mean_mc(&scenario(100_000.0, RESTART), 2);
    let in_place = mean_mc(&scenario(100_000.0, IN_PLACE), 2);
    assert!(in_place > 0.85, "in place {in_place}");
    assert!(restart < 0.7, "restart {restart}");
}

#[test]
fn the_young_daly_interval_beats_much_shorter_and_much_longer_ones() {
    let s = scenario(10_000.0, RESTART);
    let best = s.interval();
    let at = |tau: f64| {
        mean_mc(
            &Scenario {
                interval: Some(tau),
                ..s.clone()
            },
            4,
        )
    };
    let (short, opt, long) = (at(best / 4.0), at(best), at(best * 4.0));
    assert!(opt > short && opt > long, "{short} {opt} {long}");
}

#[test]
fn runs_repeat_with_their_seed_and_differ_across_seeds() {
    let s = scenario(10_000.0, IN_PLACE);
    assert_eq!(monte_carlo(&s, YEAR, 3), monte_carlo(&s, YEAR, 3));
    assert_ne!(monte_carlo(&s, YEAR, 3), monte_carlo(&s, YEAR, 4));
}

#[test]
fn bad_settings_are_named() {
    let good = scenario(1000.0, IN_PLACE);
    assert!(good.check().is_ok());
    let cases = [
        (
            Scenario {
                chips: -1.0,
                ..good.clone()
            },
            "chips",
        ),
        (
            Scenario {
                chip_mtbf: f64::INFINITY,
                ..good.clone()
            },
            "chip-mtbf",
        ),
        (
            Scenario {
                step: f64::NAN,
                ..good.clone()
            },
            "step",
        ),
        (
            Scenario {
                hung_share: 1.5,
                ..good.clone()
            },
            "hung-share",
        ),
        (
            Scenario {
                interval: Some(0.0),
                ..good.clone()
            },
            "interval",
        ),
        (
            Scenario {
                recovery: Recovery::InPlace {
                    shrink: -5.0,
                    fallback: 0.1,
                    restart: 600.0,
                },
                ..good.clone()
            },
            "shrink",
        ),
        (
            Scenario {
                recovery: Recovery::InPlace {
                    shrink: 5.0,
                    fallback: -0.1,
                    restart: 600.0,
                },
                ..good.clone()
            },
            "fallback",
        ),
    ];
    for (s, name) in cases {
        let e = s.check().expect_err(name);
        assert!(e.starts_with(name), "{name}: {e}");
    }
}
