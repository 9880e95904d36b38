//! Launchers of the dropout kernels (`dropout.cu`): the counter-based mask of the layer contract,
//! forward and backward.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// Dropout forward over `(n)` = samples × `per_sample`: `y = u ≥ ratio ? x · scale : 0`,
    /// `u` the contract's hash of `(seed, iter, first_sample + sample, element)`, the element
    /// numbered in NCHW order: `chans > 0` says the samples are stored channels-last with
    /// `chans` channels per pixel, 0 that they are stored in that order.
    #[allow(clippy::too_many_arguments)]
    pub fn dropout_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<f32>,
        n: usize,
        (per_sample, chans): (usize, usize),
        (seed, iter, first_sample): (u64, u64, u64),
        ratio: f32,
        scale: f32,
    ) -> Result<()> {
        let op = "dropout_forward";
        check_len(op, "x", x.len(), n);
        check_len(op, "y", y.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, pi) = (to_i32(op, n), to_i32(op, per_sample.max(1)));
        let chans = to_i32(op, chans);
        launch!(
            self, s, dropout_forward, self.grid(n),
            [in x, out y, &ni, &pi, &chans, &seed, &iter, &first_sample, &ratio, &scale]
        )
    }

    /// Dropout backward: `dx (+)= u ≥ ratio ? dy · scale : 0` with the forward's mask.
    #[allow(clippy::too_many_arguments)]
    pub fn dropout_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        n: usize,
        (per_sample, chans): (usize, usize),
        (seed, iter, first_sample): (u64, u64, u64),
        ratio: f32,
        scale: f32,
        accumulate: bool,
    ) -> Result<()> {
        let op = "dropout_backward";
        check_len(op, "dy", dy.len(), n);
        check_len(op, "dx", dx.len(), n);
        if n == 0 {
            return Ok(());
        }
        let (ni, pi) = (to_i32(op, n), to_i32(op, per_sample.max(1)));
        let chans = to_i32(op, chans);
        let acc = accumulate as i32;
        launch!(
            self, s, dropout_backward, self.grid(n),
            [in dy, out dx, &ni, &pi, &chans, &seed, &iter, &first_sample, &ratio, &scale, &acc]
        )
    }
}
