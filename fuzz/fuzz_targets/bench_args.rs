#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bcl_bench::fuzzing::bench_args(data));
