//! The cuda backend's bandwidths on one device: device-to-device copy, the fp32 sum reduce
//! kernel, and the host copies through pinned staging.
//!
//! `cargo run --release -p bcl-backends --features cuda --example cuda_bandwidth -- [DEVICE] [MiB] [ROUNDS]`

use bcl_backends::Accelerator;
use bcl_backends::cuda::CudaDevice;

fn main() {
    let mut args = std::env::args().skip(1);
    let ordinal: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let dev = match CudaDevice::open(ordinal) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuda_bandwidth: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "# {} ({}), {mib} MiB x {rounds} rounds",
        dev.info(),
        dev.info().model
    );
    match dev.measure_bandwidth(mib << 20, rounds) {
        Ok(b) => {
            println!(
                "device-to-device copy      {:8.1} GB/s (bytes copied)",
                b.device_copy
            );
            println!(
                "reduce kernel fp32 sum     {:8.1} GB/s of destination ({:.1} GB/s moved: 2 reads + 1 write)",
                b.reduce_f32_sum,
                3.0 * b.reduce_f32_sum
            );
            println!("host-to-device (staged)    {:8.1} GB/s", b.host_to_device);
            println!("device-to-host (staged)    {:8.1} GB/s", b.device_to_host);
        }
        Err(e) => {
            eprintln!("cuda_bandwidth: {e}");
            std::process::exit(1);
        }
    }
}
