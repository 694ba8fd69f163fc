#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bcl::fuzzing::c_abi_two_ranks(data));
