//! `bcl-bench`, the nccl-tests-shaped benchmark, as a library: the closed-form data patterns
//! (also used by BCL's conformance tests), the per-rank runner, the table, and the launcher
//! that spawns local rank processes.
//!
//! ```text
//!  bcl-bench allreduce --nranks 4 ──spawn──► 4 × bcl-bench --worker-rank R --unique-id ID
//!                                             each: Communicator::init → sweep sizes
//!                                             rank 0: prints the table, writes --json
//! ```

pub mod args;
pub mod buffers;
#[doc(hidden)]
pub mod fuzzing;
pub mod launch;
pub mod pattern;
pub mod plot;
pub mod progress;
pub mod rendezvous;
pub mod sweep;
pub mod table;

/// Run `$body` with `$t` bound to the Rust type of a [`bcl_core::DataType`].
#[macro_export]
macro_rules! with_element_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            bcl_core::DataType::Int8 => {
                type $t = i8;
                $body
            }
            bcl_core::DataType::Uint8 => {
                type $t = u8;
                $body
            }
            bcl_core::DataType::Int32 => {
                type $t = i32;
                $body
            }
            bcl_core::DataType::Uint32 => {
                type $t = u32;
                $body
            }
            bcl_core::DataType::Int64 => {
                type $t = i64;
                $body
            }
            bcl_core::DataType::Uint64 => {
                type $t = u64;
                $body
            }
            bcl_core::DataType::Float16 => {
                type $t = $crate::bcl_bench_half::f16;
                $body
            }
            bcl_core::DataType::Bfloat16 => {
                type $t = $crate::bcl_bench_half::bf16;
                $body
            }
            bcl_core::DataType::Float32 => {
                type $t = f32;
                $body
            }
            bcl_core::DataType::Float64 => {
                type $t = f64;
                $body
            }
        }
    };
}

#[doc(hidden)]
pub use bcl_backends::half as bcl_bench_half;
