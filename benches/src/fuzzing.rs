//! The entry point of the fuzz target `bench_args` (`fuzz/`, `scripts/fuzz.sh`): bcl-bench's
//! command line with any arguments. Not an API.

use crate::args::Args;
use clap::Parser;

/// NUL-separated arguments after `bcl-bench`: parsed or refused; what validates gives a
/// config for every rank (or an error naming the flag) and a finite sweep of sizes within
/// the flags' bounds.
pub fn bench_args(data: &[u8]) {
    let argv = std::iter::once("bcl-bench".to_string()).chain(
        data.split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned()),
    );
    let Ok(args) = Args::try_parse_from(argv) else {
        return;
    };
    if args.validate().is_err() {
        return;
    }
    for rank in 0..args.nranks.min(4) {
        let _ = args.config(rank);
    }
    let sizes = args.sizes();
    assert!(
        sizes.len() <= 65,
        "{} sizes from -b {} -e {} -f {}",
        sizes.len(),
        args.min_bytes,
        args.max_bytes,
        args.step_factor
    );
    assert!(
        sizes
            .iter()
            .all(|&s| s >= args.min_bytes && s <= args.max_bytes),
        "a size outside -b {} .. -e {}: {sizes:?}",
        args.min_bytes,
        args.max_bytes
    );
    assert!(
        sizes.windows(2).all(|w| w[0] < w[1]),
        "sizes not increasing: {sizes:?}"
    );
}
