//! Launchers of the dropout kernels (`dropout.cu`): the counter-based mask of the layer contract,
//! forward and backward.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

/// The mask of one dropout pass over `(n)` = samples × `per_sample` elements: an element is kept
/// (and multiplied by `scale`) where `u ≥ ratio`, `u` the contract's hash of
/// `(seed, iter, first_sample + sample, element)`, the element numbered in NCHW order.
#[derive(Debug, Clone, Copy)]
pub struct DropoutMask {
    pub per_sample: usize,
    /// Channels per pixel when the samples are stored channels-last, 0 when stored in NCHW order.
    pub chans: usize,
    /// `(seed, iter, first_sample)`: the layer's seed, the iteration and the pass's first sample.
    pub key: (u64, u64, u64),
    pub ratio: f32,
    pub scale: f32,
}

impl DropoutMask {
    /// The mask as the kernels take it: `(per_sample, chans)` as ints (`per_sample` at least 1),
    /// then `(seed, iter, first_sample, ratio, scale)`.
    fn kernel_args(&self, op: &str) -> (i32, i32, u64, u64, u64, f32, f32) {
        let (seed, iter, first) = self.key;
        let per_sample = to_i32(op, self.per_sample.max(1));
        let chans = to_i32(op, self.chans);
        (per_sample, chans, seed, iter, first, self.ratio, self.scale)
    }
}

launchers! {
    /// Dropout forward over `(n)`: `y = x · scale` where `mask` keeps an element, else 0.
    pub fn dropout_forward(mask: &DropoutMask, x: in f32, y: out f32, n: elements as i32) {
        let (per_sample, chans, seed, iter, first, ratio, scale) = mask.kernel_args(OP);
    } => launch dropout_forward(
        in x, out y, &n, &per_sample, &chans, &seed, &iter, &first, &ratio, &scale
    );

    /// Dropout backward with the forward's mask: `dx (+)= dy · scale` where it keeps an
    /// element, else `dx (+)= 0`.
    pub fn dropout_backward(
        mask: &DropoutMask, dy: in f32, dx: out f32, n: elements as i32, accumulate: bool as i32,
    ) {
        let (per_sample, chans, seed, iter, first, ratio, scale) = mask.kernel_args(OP);
    } => launch dropout_backward(
        in dy, out dx, &n, &per_sample, &chans, &seed, &iter, &first, &ratio, &scale, &accumulate
    );
}
