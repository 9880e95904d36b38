//! Launchers of the softmax kernels (`softmax.cu`) over the channel axis of
//! `(outer, channels, inner)`.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

launchers! {
    /// Softmax over the channels of `x (outer, channels, inner)` into `y` (same shape).
    pub fn softmax_forward(x: in f32, y: out f32, (outer, channels, inner): elements as i32)
        => launch softmax_forward(in x, out y, &outer, &channels, &inner) grid outer * inner;

    /// Softmax backward from the top's data: `dx (+)= (dy − Σ_c dy·y) · y`.
    pub fn softmax_backward(
        y: in f32, dy: in f32, dx: out f32,
        (outer, channels, inner): elements as i32, accumulate: bool as i32,
    ) => launch softmax_backward(in y, in dy, out dx, &outer, &channels, &inner, &accumulate)
        grid outer * inner;
}
