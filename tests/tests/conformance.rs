//! The conformance suite per transport × backend × world size: every collective, dtype and
//! op, in and out of place, counts {0, 1, 7, 1000} and a 2^20 subset, checked element by
//! element against closed-form values.

use bcl_tests::{Setup, conformance};

macro_rules! suite {
    ($($name:ident: $setup:expr, $world:expr;)*) => {
        $(#[test] fn $name() { conformance($setup, $world); })*
    };
}

suite! {
    mem_cpu_1: Setup::MemCpu, 1;
    mem_cpu_2: Setup::MemCpu, 2;
    mem_cpu_3: Setup::MemCpu, 3;
    mem_cpu_4: Setup::MemCpu, 4;
    mem_cpu_7: Setup::MemCpu, 7;
    mem_cpu_8: Setup::MemCpu, 8;
    tcp_cpu_1: Setup::TcpCpu, 1;
    tcp_cpu_2: Setup::TcpCpu, 2;
    tcp_cpu_3: Setup::TcpCpu, 3;
    tcp_cpu_4: Setup::TcpCpu, 4;
    tcp_cpu_7: Setup::TcpCpu, 7;
    tcp_cpu_8: Setup::TcpCpu, 8;
    tcp_mixed_2: Setup::TcpMixed, 2;
    tcp_mixed_3: Setup::TcpMixed, 3;
    tcp_mixed_4: Setup::TcpMixed, 4;
    tcp_mixed_7: Setup::TcpMixed, 7;
    tcp_mixed_8: Setup::TcpMixed, 8;
}
