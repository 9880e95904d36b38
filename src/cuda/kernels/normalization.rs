//! Launchers of the BatchNorm kernels (`normalization.cu`) over `(N, C, S)` (`S` the product
//! of the spatial axes): the statistics, in double, normalisation, the running averages and the
//! backward pass.

use super::{check_len, to_i32, Kernels};
use crate::cuda::gpu_error;
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use std::sync::Arc;

impl Kernels {
    /// BatchNorm sums over `a (N, C, S)`: `sums (2C + 1)` = `[Σ a (C), Σ a·b (C), N·S]`, with
    /// `b = a` when `b` is `None`; per channel in double.
    pub fn bn_sums(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<f32>,
        b: Option<&CudaView<'_, f32>>,
        sums: &mut CudaSlice<f64>,
        (n, c, sp): (usize, usize, usize),
    ) -> Result<()> {
        let op = "bn_sums";
        let count = n * c * sp;
        check_len(op, "a", a.len(), count);
        if let Some(b) = b {
            check_len(op, "b", b.len(), count);
        }
        check_len(op, "sums", sums.len(), 2 * c + 1);
        if c == 0 {
            return Ok(());
        }
        to_i32(op, count);
        let (ni, ci, si) = (to_i32(op, n), to_i32(op, c), to_i32(op, sp));
        let (bp, _b) = match b {
            Some(v) => v.device_ptr(s),
            None => a.device_ptr(s),
        };
        let hb = b.is_some() as i32;
        let (grid, splits) = self.grid_channel_sums((n, c, sp));
        let spl = to_i32(op, splits);
        let per = to_i32(op, n * sp);
        let mut partial = s
            .alloc_zeros::<f64>(2 * c * splits)
            .map_err(|e| gpu_error("bn_sums scratch", e))?;
        {
            let (pp, _p) = partial.device_ptr_mut(s);
            launch!(self, s, bn_sums, grid, [in a, &bp, &hb, &pp, &ni, &ci, &si, &spl])?;
        }
        let (pp, _p) = partial.device_ptr(s);
        launch!(self, s, bn_sums_finish, self.grid_rows(c), [&pp, out sums, &ci, &spl, &per])
    }

    /// Batch statistics `mean, var, inv_std (C)` from `sums (2C + 1)` of x and x².
    #[allow(clippy::too_many_arguments)]
    pub fn bn_batch_stats(
        &self,
        s: &CudaStream,
        sums: &CudaSlice<f64>,
        c: usize,
        eps: f32,
        mean: &mut CudaSlice<f32>,
        var: &mut CudaSlice<f32>,
        inv_std: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "bn_batch_stats";
        check_len(op, "sums", sums.len(), 2 * c + 1);
        for (what, len) in [
            ("mean", mean.len()),
            ("var", var.len()),
            ("inv_std", inv_std.len()),
        ] {
            check_len(op, what, len, c);
        }
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_batch_stats, self.grid(c),
            [in sums, &ci, &eps, out mean, out var, out inv_std]
        )
    }

    /// Global statistics `mean, var, inv_std (C)` from `params (2C + 1)` = running mean, running
    /// variance, factor.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_global_stats(
        &self,
        s: &CudaStream,
        params: &impl DevicePtr<f32>,
        c: usize,
        eps: f32,
        mean: &mut CudaSlice<f32>,
        var: &mut CudaSlice<f32>,
        inv_std: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "bn_global_stats";
        check_len(op, "params", params.len(), 2 * c + 1);
        for (what, len) in [
            ("mean", mean.len()),
            ("var", var.len()),
            ("inv_std", inv_std.len()),
        ] {
            check_len(op, what, len, c);
        }
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_global_stats, self.grid(c),
            [in params, &ci, &eps, out mean, out var, out inv_std]
        )
    }

    /// `y = (x − mean[c]) · inv_std[c]` over `(N, C, S)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_normalize(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        mean: &CudaSlice<f32>,
        inv_std: &CudaSlice<f32>,
        y: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
    ) -> Result<()> {
        let op = "bn_normalize";
        let count = n * c * sp;
        check_len(op, "x", x.len(), count);
        check_len(op, "y", y.len(), count);
        check_len(op, "mean", mean.len(), c);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        launch!(
            self, s, bn_normalize, self.grid(count),
            [in x, in mean, in inv_std, out y, &ni, &ci, &si]
        )
    }

    /// The running statistics update of a training forward, in `params (2C + 1)`, with the count
    /// `m = sums[2C]` for the variance correction `m / (m − 1)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_update_running(
        &self,
        s: &CudaStream,
        params: &mut impl DevicePtrMut<f32>,
        mean: &CudaSlice<f32>,
        var: &CudaSlice<f32>,
        sums: &CudaSlice<f64>,
        c: usize,
        maf: f32,
    ) -> Result<()> {
        let op = "bn_update_running";
        check_len(op, "params", params.len(), 2 * c + 1);
        check_len(op, "mean", mean.len(), c);
        check_len(op, "var", var.len(), c);
        check_len(op, "sums", sums.len(), 2 * c + 1);
        if c == 0 {
            return Ok(());
        }
        let ci = to_i32(op, c);
        launch!(
            self, s, bn_update_running, self.grid(c),
            [out params, in mean, in var, in sums, &ci, &maf]
        )
    }

    /// Batch-statistics backward over `(N, C, S)`: `dx (+)= (dy − mean(dy) − mean(dy·y)·y) ·
    /// inv_std`, the means from `sums (2C + 1)` = `[Σ dy, Σ dy·y, m]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        y: &impl DevicePtr<f32>,
        sums: &CudaSlice<f64>,
        inv_std: &CudaSlice<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "bn_backward";
        let count = n * c * sp;
        check_len(op, "dy", dy.len(), count);
        check_len(op, "y", y.len(), count);
        check_len(op, "dx", dx.len(), count);
        check_len(op, "sums", sums.len(), 2 * c + 1);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        let acc = accumulate as i32;
        launch!(
            self, s, bn_backward, self.grid(count),
            [in dy, in y, in sums, in inv_std, out dx, &ni, &ci, &si, &acc]
        )
    }

    /// Global-statistics backward: `dx (+)= dy · inv_std[c]` over `(N, C, S)`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_backward_global(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        inv_std: &CudaSlice<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        (n, c, sp): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "bn_backward_global";
        let count = n * c * sp;
        check_len(op, "dy", dy.len(), count);
        check_len(op, "dx", dx.len(), count);
        check_len(op, "inv_std", inv_std.len(), c);
        if count == 0 {
            return Ok(());
        }
        let (ni, ci, si) = (to_i32(op, count), to_i32(op, c), to_i32(op, sp));
        let acc = accumulate as i32;
        launch!(
            self, s, bn_backward_global, self.grid(count),
            [in dy, in inv_std, out dx, &ni, &ci, &si, &acc]
        )
    }
}
