#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bcl_transport::fuzzing::handshake_server(data));
