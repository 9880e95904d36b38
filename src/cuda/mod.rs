//! The CUDA backend: one replica's net, parameters and update rule on one GPU, through cudarc
//! (driver API, cuBLAS, NVRTC). Everything here runs on the replica's own compute stream and is
//! enqueued without host synchronisation, except the calls documented as synchronising (host
//! copies of outputs, loss windows and parameters).
//!
//! - [`device`]: [`Gpu`], a device with its context, compute stream, cuBLAS handle and kernels
//!   (and cuDNN handles on it and on a side stream, loaded only when a net has a convolution).
//! - [`cudnn`]: the thin safe layer over cuDNN the convolution layer uses.
//! - [`blob`], [`params`]: activations and the flat learnable tensors in device memory.
//! - [`kernels`]: the elementwise, reduction and update kernels (one CUDA C source, compiled by
//!   NVRTC once per process and architecture).
//! - [`layers`]: the GPU layers, mirroring `crate::layers` kernel for kernel.
//! - [`layout`]: NCHW or channels-last storage of 4-D activations.
//! - [`net`]: [`GpuNet`](net::GpuNet), the layer graph of a CPU [`Net`](crate::net::Net) run on
//!   device blobs and one flat [`GpuParams`](params::GpuParams).
//! - [`update`]: [`GpuSolver`](update::GpuSolver), `crate::solver::Solver` on device memory.
//! - [`wire`]: [`GradientWire`](wire::GradientWire), a gradient bucket's all-reduce in the type
//!   of `cluster.reduce_dtype` (FP32, or bfloat16 through a staging buffer).
//!
//! Streams are ordered explicitly: cudarc's per-buffer event tracking is off in a [`Gpu`]'s
//! context (see [`device`]), so work on another stream that touches these buffers (NCCL) waits
//! on events recorded on [`Gpu::compute`], e.g. in the `on_layer_done` hook of
//! [`GpuNet::backward`](net::GpuNet::backward).
//!
//! The crate builds and its tests run on machines without CUDA: the libraries are loaded at run
//! time, [`available`] says whether a device can be used, and every GPU test skips loudly when
//! not.
//!
//! ```no_run
//! use p2ptrain::config::MathMode;
//! use p2ptrain::cuda::{self, Gpu};
//! if cuda::available() {
//!     let gpu = Gpu::new(0, MathMode::Fp32).unwrap();
//!     println!("{} GPU(s); using {}", cuda::device_count().unwrap(), gpu.name());
//! }
//! ```

pub mod blob;
pub mod cudnn;
pub mod device;
pub mod kernels;
pub mod layers;
pub mod layout;
pub mod loss_scale;
pub mod net;
pub mod params;
pub mod path_timing;
pub mod peer_wire;
pub mod update;
pub mod wire;

#[cfg(test)]
pub(crate) mod test_util;

pub use device::Gpu;

use crate::error::{Error, Result};
use cudarc::driver::CudaContext;

/// Whether a CUDA device can be used: the driver library loads and reports at least one device.
/// Never panics (a driver call without the library would).
pub fn available() -> bool {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return false;
    }
    device_count().is_ok_and(|n| n > 0)
}

/// Number of CUDA devices. An error when the driver library is missing or fails to initialise.
pub fn device_count() -> Result<usize> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Device(
            "CUDA: the driver library (libcuda.so) cannot be loaded".into(),
        ));
    }
    let n = CudaContext::device_count().map_err(|e| gpu_error("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

// The replica types can move to the thread that drives them (checked at compile time).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Gpu>();
    send::<net::GpuNet>();
    send::<update::GpuSolver>();
};

/// A runtime CUDA failure as a library error naming the operation.
pub(crate) fn gpu_error(op: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("CUDA {op}: {e}"))
}
pub mod event_clock;
pub mod nccl;
