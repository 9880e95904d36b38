//! Launchers of the bfloat16 gradient wire's kernels (`wire.cu`): FP32 to bfloat16 bits (round to
//! nearest, ties to even, as `crate::dist::wire::to_wire`) and bfloat16 bits back to FP32 times a
//! scale (`crate::dist::wire::from_wire_scaled`). Both over `(n)` elements of the flat gradient.

use super::{check_lens, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// `w[..n] = bf16(x[..n])`, as bfloat16 bit patterns.
    pub fn to_bf16(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        w: &mut impl DevicePtrMut<u16>,
        n: usize,
    ) -> Result<()> {
        if !check_lens("to_bf16", n, &[("x", x.len()), ("w", w.len())]) {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, to_bf16, self.grid(n), [in x, out w, &n64])
    }

    /// `x[..n] = float(w[..n]) · scale`, from bfloat16 bit patterns.
    pub fn from_bf16_scaled(
        &self,
        s: &CudaStream,
        w: &impl DevicePtr<u16>,
        x: &mut impl DevicePtrMut<f32>,
        scale: f32,
        n: usize,
    ) -> Result<()> {
        if !check_lens("from_bf16_scaled", n, &[("w", w.len()), ("x", x.len())]) {
            return Ok(());
        }
        let n64 = n as i64;
        launch!(self, s, from_bf16_scaled, self.grid(n), [in w, out x, &scale, &n64])
    }
}
