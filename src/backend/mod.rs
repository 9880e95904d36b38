//! Compute backends. `cpu` holds the kernels every layer calls (GEMM through the `gemm` crate,
//! vector helpers). Layers do math only and call these; a device backend replaces this module's
//! kernels behind the same names.

pub mod cpu;

pub use cpu::Cpu;
