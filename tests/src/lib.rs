//! The conformance harness: one suite, instantiated per transport × backend.
//!
//! Ranks run as threads of the test process (in-process, TCP on loopback, or shared-memory
//! rings); every rank runs the same list of cases in the same order and compares every output
//! element with the closed form of `bcl_bench::pattern`. Failures are collected, not panicked,
//! so one wrong case does not leave the other ranks waiting.

pub mod netns;
pub mod procs;
pub mod resources;

use bcl_bench::buffers::{Placement, RankBuffers};
use bcl_bench::with_element_type;
use bcl_core::{
    Collective, CommConfig, Communicator, DataType, DeviceSpec, Element, ReduceOp, TransportKind,
    Vendor,
};
use std::time::Duration;

/// Which transport and which devices a suite instance uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// In-process transport, every rank on the cpu backend.
    MemCpu,
    /// TCP on loopback, every rank on the cpu backend.
    TcpCpu,
    /// TCP on loopback, odd ranks on the simulated vendor (device buffers), even on cpu.
    TcpMixed,
    /// Shared-memory rings, every rank on the cpu backend.
    ShmCpu,
    /// Shared-memory rings, odd ranks on the simulated vendor, even on cpu.
    ShmMixed,
    /// Shared-memory rings, odd ranks on the simulated vendor running every collective
    /// through host staging (`submit_staged`, the C ABI's path for GPU ranks), even on cpu.
    ShmMixedStaged,
    /// Shared-memory rings, the first `gpu_ranks` ranks on CUDA device 0 (sharing it), the
    /// others on cpu. Needs a GPU and a build with the `cuda` feature.
    ShmCuda { gpu_ranks: usize },
    /// RDMA verbs, every rank on the cpu backend. Needs a device (the Soft-RoCE VM) and a
    /// build with the `rdma` feature.
    RdmaCpu,
    /// RDMA verbs, odd ranks on the simulated vendor, even on cpu.
    RdmaMixed,
    /// RDMA verbs over two queue pairs per peer on two devices (rxe0 and rxe1 in the VM),
    /// every rank on the cpu backend.
    RdmaTwoDevices,
}

impl Setup {
    fn mixed(self) -> bool {
        matches!(
            self,
            Setup::TcpMixed | Setup::ShmMixed | Setup::ShmMixedStaged | Setup::RdmaMixed
        )
    }
}

/// Run `f(rank, comm)` on every rank at once, each on a thread of its own; the results by rank.
pub fn each<R: Send>(
    comms: &[Communicator],
    f: impl Fn(usize, &Communicator) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// A config with bounded timeouts, so a broken case fails instead of hanging.
pub fn test_config(setup: Setup, rank: usize) -> CommConfig {
    CommConfig {
        device: match setup {
            Setup::ShmCuda { gpu_ranks } if rank < gpu_ranks => DeviceSpec::Cuda(0),
            _ if setup.mixed() && rank % 2 == 1 => {
                "sim".parse::<DeviceSpec>().unwrap_or(DeviceSpec::Cpu)
            }
            _ => DeviceSpec::Cpu,
        },
        transport: match setup {
            Setup::MemCpu => TransportKind::Auto,
            Setup::TcpCpu | Setup::TcpMixed => TransportKind::Tcp,
            Setup::ShmCpu | Setup::ShmMixed | Setup::ShmMixedStaged | Setup::ShmCuda { .. } => {
                TransportKind::Shm
            }
            Setup::RdmaCpu | Setup::RdmaMixed | Setup::RdmaTwoDevices => TransportKind::Rdma,
        },
        init_timeout: Duration::from_secs(30),
        op_timeout: Duration::from_secs(30),
        // Small slices, so that even modest counts are pipelined over several messages.
        slice_bytes: 16 << 10,
        rdma_device: (setup == Setup::RdmaTwoDevices).then(|| "rxe0,rxe1".to_string()),
        ..CommConfig::default()
    }
}

pub fn communicators(setup: Setup, world: usize) -> Vec<Communicator> {
    match Communicator::init_threads_with(world, |r| test_config(setup, r)) {
        Ok(c) => c,
        Err(e) => panic!("init of {world} ranks for {setup:?} failed: {e}"),
    }
}

/// One collective call shape.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub collective: Collective,
    pub dtype: DataType,
    pub count: usize,
    pub in_place: bool,
}

/// The cases of the suite for `world` ranks: every collective, dtype and op at small counts,
/// in and out of place; a covering subset at 2^20 elements.
pub fn cases(world: usize) -> Vec<Case> {
    let mut out = Vec::new();
    let mut k = 0usize;
    let mut root = || {
        k += 1;
        k % world
    };
    for count in [0usize, 1, 7, 1000] {
        for dtype in DataType::ALL {
            for in_place in [false, true] {
                for op in ReduceOp::ALL {
                    for c in [
                        Collective::AllReduce { op },
                        Collective::ReduceScatter { op },
                        Collective::Reduce { op, root: root() },
                    ] {
                        out.push(Case {
                            collective: c,
                            dtype,
                            count,
                            in_place,
                        });
                    }
                }
                for c in [
                    Collective::AllGather,
                    Collective::Broadcast { root: root() },
                    Collective::AllToAll,
                    Collective::Gather { root: root() },
                    Collective::Scatter { root: root() },
                ] {
                    out.push(Case {
                        collective: c,
                        dtype,
                        count,
                        in_place,
                    });
                }
            }
            if world > 1 {
                out.push(Case {
                    collective: Collective::Send { peer: world - 1 },
                    dtype,
                    count,
                    in_place: false,
                });
            }
        }
    }
    out.push(Case {
        collective: Collective::Barrier,
        dtype: DataType::Uint8,
        count: 0,
        in_place: false,
    });
    let big = 1 << 20;
    for (collective, dtype) in [
        (
            Collective::AllReduce { op: ReduceOp::Sum },
            DataType::Float32,
        ),
        (
            Collective::AllReduce { op: ReduceOp::Avg },
            DataType::Bfloat16,
        ),
        (Collective::AllReduce { op: ReduceOp::Prod }, DataType::Int8),
        (
            Collective::ReduceScatter { op: ReduceOp::Max },
            DataType::Int32,
        ),
        (Collective::AllGather, DataType::Float16),
        (Collective::Broadcast { root: world - 1 }, DataType::Uint8),
        (
            Collective::Reduce {
                op: ReduceOp::Min,
                root: 0,
            },
            DataType::Float64,
        ),
    ] {
        for in_place in [false, true] {
            // Per-rank counts of the gathering collectives shrink so buffers stay ~4 MiB.
            let count = match collective {
                Collective::AllGather | Collective::ReduceScatter { .. } => big / world,
                _ => big,
            };
            out.push(Case {
                collective,
                dtype,
                count,
                in_place,
            });
        }
    }
    out.push(Case {
        collective: Collective::AllToAll,
        dtype: DataType::Uint64,
        count: (1 << 17) / world,
        in_place: false,
    });
    for (collective, in_place) in [
        (Collective::Gather { root: world - 1 }, false),
        (Collective::Scatter { root: 0 }, true),
    ] {
        out.push(Case {
            collective,
            dtype: DataType::Float32,
            count: big / world,
            in_place,
        });
    }
    out
}

fn exercise<T: Element>(comm: &Communicator, case: &Case, staged: bool) -> Result<usize, String> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let collective = match case.collective {
        Collective::Send { .. } if rank == 0 => Collective::Send { peer: n - 1 },
        Collective::Send { .. } if rank == n - 1 => Collective::Recv { peer: 0 },
        Collective::Send { .. } => return Ok(0),
        c => c,
    };
    let placement = match comm.accelerator().info().vendor {
        Vendor::Cpu => Placement::Host,
        _ if staged => Placement::DeviceStaged,
        _ => Placement::Device,
    };
    let mut bufs = RankBuffers::<T>::new(comm, &placement, collective, case.count, case.in_place)
        .map_err(|e| e.to_string())?;
    bufs.run(comm).map_err(|e| e.to_string())?;
    bufs.wrong(comm).map_err(|e| e.to_string())
}

/// Run every case on every rank; returns one line per failure (empty: all passed).
pub fn run_cases(comms: &[Communicator], cases: &[Case]) -> Vec<String> {
    run_cases_placed(comms, cases, false)
}

/// [`run_cases`], device ranks through host staging where `staged`.
pub fn run_cases_placed(comms: &[Communicator], cases: &[Case], staged: bool) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for case in cases {
                        let r =
                            with_element_type!(case.dtype, T => exercise::<T>(comm, case, staged));
                        match r {
                            Ok(0) => {}
                            Ok(wrong) => failures.push(format!(
                                "rank {}: {case:?}: {wrong} wrong elements",
                                comm.rank()
                            )),
                            Err(e) => {
                                failures.push(format!("rank {}: {case:?}: {e}", comm.rank()));
                                if comm.async_error().is_some() {
                                    break;
                                }
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec!["a rank thread panicked".into()])
            })
            .collect()
    })
}

/// The whole suite for one setup and world size; panics listing the failures.
pub fn conformance(setup: Setup, world: usize) {
    let comms = communicators(setup, world);
    suite(
        &format!("{setup:?}"),
        &comms,
        setup == Setup::ShmMixedStaged,
    );
}

/// The whole suite on communicators made some other way (providers passed in, say); device
/// ranks through host staging where `staged`. Panics listing the failures.
pub fn suite(label: &str, comms: &[Communicator], staged: bool) {
    let world = comms.len();
    let cases = cases(world);
    let failures = run_cases_placed(comms, &cases, staged);
    assert!(
        failures.is_empty(),
        "{label} with {world} ranks: {} of {} case-runs failed:\n{}",
        failures.len(),
        cases.len() * world,
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
