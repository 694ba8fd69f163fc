#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bcl_core::fuzzing::health_messages(data));
