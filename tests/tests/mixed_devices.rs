//! A mixed ring (cpu and sim ranks) gives the same results as a cpu-only ring: bit for bit
//! for integers, and for floats within the documented bound of `bcl_backends::dtype` (the two
//! rings may add in different orders): |mixed - cpu| <= 2 (n-1) u sum_r |x_r|.

use bcl_backends::half::{bf16, f16};
use bcl_backends::{Accelerator, Element};
use bcl_core::{Collective, Communicator, ReduceOp, Vendor};
use bcl_tests::{Setup, test_config};

fn values(rank: usize, len: usize, seed: u64) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(rank as u64 * 1442695040888963407 + 1);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

trait Sample: Element {
    fn of(v: f64) -> Self;
    /// Unit roundoff of the type.
    const U: f64;
}
impl Sample for f32 {
    fn of(v: f64) -> Self {
        v as f32
    }
    const U: f64 = 1.0 / (1u64 << 24) as f64;
}
impl Sample for f64 {
    fn of(v: f64) -> Self {
        v
    }
    const U: f64 = 1.0 / (1u64 << 53) as f64;
}
impl Sample for f16 {
    fn of(v: f64) -> Self {
        f16::from_f64(v)
    }
    const U: f64 = 1.0 / 2048.0;
}
impl Sample for bf16 {
    fn of(v: f64) -> Self {
        bf16::from_f64(v)
    }
    const U: f64 = 1.0 / 256.0;
}
impl Sample for i32 {
    fn of(v: f64) -> Self {
        (v * 1e9) as i32
    }
    const U: f64 = 0.0;
}

/// Allreduce (sum) `input` on every rank; sim ranks go through device buffers.
fn allreduce<T: Sample>(comms: &[Communicator], inputs: &[Vec<T>]) -> Vec<Vec<T>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(inputs)
            .map(|(c, input)| {
                s.spawn(move || {
                    let mut out = input.clone();
                    if c.accelerator().info().vendor == Vendor::Cpu {
                        c.all_reduce_in_place(&mut out, ReduceOp::Sum)
                            .expect("allreduce");
                        return out;
                    }
                    let acc: &dyn Accelerator = c.accelerator().as_ref();
                    let bytes: &mut [u8] = bcl_backends::bytemuck::cast_slice_mut(&mut out);
                    let buf = acc.allocate(bytes.len()).expect("allocate");
                    acc.copy_to_device(buf.full(), bytes, &acc.default_stream())
                        .expect("h2d");
                    c.submit(
                        Collective::AllReduce { op: ReduceOp::Sum },
                        input.len(),
                        T::DATA_TYPE,
                        None,
                        Some(&buf),
                    )
                    .expect("submit")
                    .wait()
                    .expect("allreduce");
                    acc.copy_to_host(bytes, buf.full(), &acc.default_stream())
                        .expect("d2h");
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

fn compare<T: Sample>(world: usize, len: usize) {
    let mixed =
        Communicator::init_threads_with(world, |r| test_config(Setup::TcpMixed, r)).expect("mixed");
    let cpu =
        Communicator::init_threads_with(world, |r| test_config(Setup::MemCpu, r)).expect("cpu");
    assert_ne!(
        mixed[0].ring(),
        cpu[0].ring(),
        "the mixed ring groups vendors: a different order"
    );
    let raw: Vec<Vec<f64>> = (0..world).map(|r| values(r, len, 7)).collect();
    let inputs: Vec<Vec<T>> = raw
        .iter()
        .map(|v| v.iter().map(|x| T::of(*x)).collect())
        .collect();
    let a = allreduce(&mixed, &inputs);
    let b = allreduce(&cpu, &inputs);
    for r in 0..world {
        for i in 0..len {
            let (x, y) = (a[r][i].to_f64(), b[r][i].to_f64());
            let magnitude: f64 = inputs.iter().map(|v| v[i].to_f64().abs()).sum();
            let bound = 2.0 * (world - 1) as f64 * T::U * magnitude;
            assert!(
                (x - y).abs() <= bound,
                "{:?} rank {r} element {i}: mixed {x} vs cpu {y}, bound {bound}",
                T::DATA_TYPE
            );
        }
        // Every rank of one ring holds the same bits.
        assert_eq!(
            bcl_backends::bytemuck::cast_slice::<T, u8>(&a[r]),
            bcl_backends::bytemuck::cast_slice::<T, u8>(&a[0])
        );
    }
}

#[test]
fn mixed_ring_matches_cpu_ring() {
    compare::<i32>(4, 5000);
    compare::<f32>(4, 5000);
    compare::<f64>(4, 5000);
    compare::<f16>(4, 5000);
    compare::<bf16>(4, 5000);
}

/// Ranks whose devices reduce at different speeds (sim at 1 GB/s beside cpu ranks): from
/// 1 MiB auto runs the hierarchical plan, each rank reducing a share in proportion to its
/// speed, and every rank gets the exact sum; with equal shares asked, the flat choice stays.
#[test]
fn ranks_of_different_speeds_reduce_shares_in_proportion() {
    use bcl_core::{Algorithm, CommConfig, DeviceSpec, Shares};
    let open = |shares| {
        Communicator::init_threads_with(4, |r| CommConfig {
            device: if r % 2 == 1 {
                "sim:reduce=1".parse().unwrap_or(DeviceSpec::Cpu)
            } else {
                DeviceSpec::Cpu
            },
            shares,
            ..test_config(Setup::MemCpu, r)
        })
        .expect("communicators")
    };
    let sum = Collective::AllReduce { op: ReduceOp::Sum };
    let comms = open(Shares::BySpeed);
    assert_eq!(comms[0].algorithm_for(sum, 1 << 20), Algorithm::HierRing);
    assert_eq!(comms[0].algorithm_for(sum, 1 << 19).between_hosts(), None);
    let len: i32 = (1 << 20) / 4 + 13;
    let inputs: Vec<Vec<i32>> = (0..4)
        .map(|r| (0..len).map(|i| (r * 7919 + i * 31) % 1000).collect())
        .collect();
    let out = allreduce(&comms, &inputs);
    for (r, got) in out.iter().enumerate() {
        for (i, v) in got.iter().enumerate() {
            let want: i32 = inputs.iter().map(|x| x[i]).sum();
            assert_eq!(*v, want, "rank {r} element {i}");
        }
    }
    let equal = open(Shares::Equal);
    assert_eq!(equal[0].algorithm_for(sum, 1 << 20).between_hosts(), None);
}
