//! Launchers of the softmax kernels (`softmax.cu`) over the channel axis of
//! `(outer, channels, inner)`.

use super::{int_count, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// Softmax over the channels of `x (outer, channels, inner)` into `y` (same shape).
    pub fn softmax_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        (outer, channels, inner): (usize, usize, usize),
    ) -> Result<()> {
        let op = "softmax_forward";
        let n = outer * channels * inner;
        if int_count(op, n, &[("x", x.len()), ("y", y.len())]).is_none() {
            return Ok(());
        }
        let (o, c, i) = (to_i32(op, outer), to_i32(op, channels), to_i32(op, inner));
        launch!(self, s, softmax_forward, self.grid(outer * inner), [in x, out y, &o, &c, &i])
    }

    /// Softmax backward from the top's data: `dx (+)= (dy − Σ_c dy·y) · y`.
    pub fn softmax_backward(
        &self,
        s: &CudaStream,
        y: &impl DevicePtr<f32>,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (outer, channels, inner): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "softmax_backward";
        let n = outer * channels * inner;
        if int_count(op, n, &[("y", y.len()), ("dy", dy.len()), ("dx", dx.len())]).is_none() {
            return Ok(());
        }
        let (o, c, i) = (to_i32(op, outer), to_i32(op, channels), to_i32(op, inner));
        let acc = accumulate as i32;
        launch!(
            self, s, softmax_backward, self.grid(outer * inner),
            [in y, in dy, out dx, &o, &c, &i, &acc]
        )
    }
}
