//! Launchers of the dropout kernels (`dropout.cu`): the counter-based mask of the layer contract,
//! forward and backward.

use super::{int_count, to_i32, Kernels};
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
    /// `(per_sample, chans)` as the kernels' ints (`per_sample` at least 1).
    fn ints(&self, op: &str) -> (i32, i32) {
        (to_i32(op, self.per_sample.max(1)), to_i32(op, self.chans))
    }
}

impl Kernels {
    /// Dropout forward over `(n)`: `y = x · scale` where `mask` keeps an element, else 0.
    pub fn dropout_forward(
        &self,
        s: &CudaStream,
        mask: &DropoutMask,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
    ) -> Result<()> {
        let op = "dropout_forward";
        let Some(ni) = int_count(op, n, &[("x", x.len()), ("y", y.len())]) else {
            return Ok(());
        };
        let (pi, chans) = mask.ints(op);
        let ((seed, iter, first), ratio, scale) = (mask.key, mask.ratio, mask.scale);
        launch!(
            self, s, dropout_forward, self.grid(n),
            [in x, out y, &ni, &pi, &chans, &seed, &iter, &first, &ratio, &scale]
        )
    }

    /// Dropout backward with the forward's mask: `dx (+)= dy · scale` where it keeps an
    /// element, else `dx (+)= 0`.
    pub fn dropout_backward(
        &self,
        s: &CudaStream,
        mask: &DropoutMask,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let op = "dropout_backward";
        let Some(ni) = int_count(op, n, &[("dy", dy.len()), ("dx", dx.len())]) else {
            return Ok(());
        };
        let (pi, chans) = mask.ints(op);
        let ((seed, iter, first), ratio, scale) = (mask.key, mask.ratio, mask.scale);
        let acc = accumulate as i32;
        launch!(
            self, s, dropout_backward, self.grid(n),
            [in dy, out dx, &ni, &pi, &chans, &seed, &iter, &first, &ratio, &scale, &acc]
        )
    }
}
