//! The reduction kernels' CUDA C source (`kernels.cu`, next to this file) and its compilation
//! through NVRTC, once per device context: no CUDA toolkit is needed to build BCL, only the
//! NVRTC library where a cuda device is opened.

use super::driver;
use crate::dtype::{DataType, ReduceOp};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

/// The kernels' source, compiled at run time.
pub const KERNELS_SOURCE: &str = include_str!("kernels.cu");

/// The name of the kernel that computes `dst = dst (op) src` for `dtype` (`avg` runs as sum).
pub fn reduce_kernel_name(dtype: DataType, op: ReduceOp) -> String {
    format!("bcl_reduce_{}_{}", dtype.name(), op.accumulate_op().name())
}

/// The name of the kernel that computes `dst = dst / n` for `dtype`.
pub fn divide_kernel_name(dtype: DataType) -> String {
    format!("bcl_divide_{}", dtype.name())
}

/// Every kernel name the source must define.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for dtype in DataType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            names.push(reduce_kernel_name(dtype, op));
        }
        names.push(divide_kernel_name(dtype));
    }
    names
}

/// Why the kernels could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// No NVRTC library on the loader path.
    #[error(
        "the NVRTC library (libnvrtc.so.13) is not installed or not on the loader path \
         (LD_LIBRARY_PATH): the cuda backend compiles its kernels with it"
    )]
    NvrtcMissing,
    /// NVRTC rejected the source (a BCL bug) or the architecture.
    #[error("NVRTC could not compile kernels.cu for {arch}: {reason}")]
    Rejected { arch: String, reason: String },
}

/// Compile the kernels to PTX for a virtual architecture such as `compute_90`. Needs NVRTC,
/// not a GPU.
pub fn compile_kernels(arch: &str) -> Result<Ptx, CompileError> {
    if !driver::nvrtc_library_present() {
        return Err(CompileError::NvrtcMissing);
    }
    let options = CompileOptions {
        name: Some("bcl_kernels.cu".into()),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..CompileOptions::default()
    };
    compile_ptx_with_opts(KERNELS_SOURCE, options).map_err(|e| CompileError::Rejected {
        arch: arch.to_string(),
        reason: match e {
            cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                format!("{nvrtc:?}: {}", log.to_string_lossy())
            }
            other => format!("{other:?}"),
        },
    })
}
