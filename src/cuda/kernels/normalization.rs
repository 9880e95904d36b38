//! Launchers of the BatchNorm kernels (`normalization.cu`) over `(N, C, S)` (`S` the product
//! of the spatial axes): the statistics, in double, normalisation, the running averages and the
//! backward pass; and of the LRN kernels over `(N, C, H, W)` ([`LrnWindow`]). The batch sums
//! also read half-type bit patterns ([`StoredElem`]: the statistics of a BatchNorm chain on
//! half-type blobs).

use super::channel::channels_last_by_eight;
use super::{check_len, int_count, stored_half_arg, to_i32, Kernels, StoredElem};
use crate::error::Result;
use crate::precision::Half;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use std::sync::Arc;

/// Where the statistics BatchNorm normalises with come from: `(2C + 1)` values either way.
pub enum StatsSource<'a> {
    /// The sums of x and x² and their count, `[Σ x (C), Σ x² (C), m]` in double: batch
    /// statistics (mean and biased variance).
    Batch(&'a CudaSlice<f64>),
    /// The running statistics in the parameters, `[mean (C), var (C), factor]`: global
    /// statistics (each divided by the factor).
    Global(&'a CudaView<'a, f32>),
}

/// The statistics BatchNorm normalises with, each `(C)`: `(mean, var, inv_std)`, `inv_std =
/// 1 / √(var + eps)`.
pub type BatchStats<'a> = (
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
);

impl Kernels {
    /// BatchNorm sums over `a (N, C, S)`: `sums (2C + 1)` = `[Σ a (C), Σ a·b (C), N·S]`, with
    /// `b = a` when `b` is `None`; per channel in double. In mixed precision, `a` is rounded to
    /// `half` as it is read. `a` and `b` stored as `T` (half-type bit patterns need `half`).
    pub fn bn_sums<T: StoredElem>(
        &self,
        s: &Arc<CudaStream>,
        a: &impl DevicePtr<T>,
        b: Option<&CudaView<'_, T>>,
        sums: &mut CudaSlice<f64>,
        dims: (usize, usize, usize),
        half: Option<Half>,
    ) -> Result<()> {
        self.bn_sums_then(s, (a, b), sums, dims, half, None)
    }

    /// The batch statistics of `x (N, C, S)` where nothing all-reduces its sums: [`Self::bn_sums`]
    /// of `x` and `x²` into `sums (2C + 1)`, and from them, in the same launch as their last
    /// stage, what [`Self::bn_stats`] computes from [`StatsSource::Batch`] (the same values).
    #[allow(clippy::too_many_arguments)]
    pub fn bn_sums_and_stats<T: StoredElem>(
        &self,
        s: &Arc<CudaStream>,
        x: &impl DevicePtr<T>,
        sums: &mut CudaSlice<f64>,
        dims: (usize, usize, usize),
        half: Option<Half>,
        eps: f32,
        stats: BatchStats<'_>,
    ) -> Result<()> {
        self.bn_sums_then(s, (x, None), sums, dims, half, Some((eps, stats)))
    }

    /// [`Self::bn_sums`], and with `stats` the statistics from the sums in its last stage.
    fn bn_sums_then<T: StoredElem>(
        &self,
        s: &Arc<CudaStream>,
        (a, b): (&impl DevicePtr<T>, Option<&CudaView<'_, T>>),
        sums: &mut CudaSlice<f64>,
        (n, c, sp): (usize, usize, usize),
        half: Option<Half>,
        stats: Option<(f32, BatchStats<'_>)>,
    ) -> Result<()> {
        let op = "bn_sums";
        let count = n * c * sp;
        check_len(op, "a", a.len(), count);
        if let Some(b) = b {
            check_len(op, "b", b.len(), count);
        }
        check_len(op, "sums", sums.len(), 2 * c + 1);
        if let Some((_, (mean, var, inv_std))) = &stats {
            for (what, len) in [
                ("mean", mean.len()),
                ("var", var.len()),
                ("inv_std", inv_std.len()),
            ] {
                check_len(op, what, len, c);
            }
        }
        if c == 0 {
            return Ok(());
        }
        to_i32(op, count);
        let (ni, ci, si) = (to_i32(op, n), to_i32(op, c), to_i32(op, sp));
        let (bp, _b) = match b {
            Some(v) => v.device_ptr(s),
            None => a.device_ptr(s),
        };
        let (hb, half) = (b.is_some() as i32, stored_half_arg::<T>(op, half));
        let per = to_i32(op, n * sp);
        let by_eight = b.is_none() && channels_last_by_eight::<T>((n, c, sp), &[a.device_ptr(s).0]);
        self.two_stage_sums(
            s,
            (op, 2),
            ((n, c, sp), by_eight.then_some(8)),
            |grid, pp, spl| {
                if by_eight {
                    return launch!(self, s, bn_sums_h8, grid, [in a, &pp, &ni, &ci, &spl, &half]);
                }
                launch!(
                    self, s, bn_sums | bn_sums_h for T, grid,
                    [in a, &bp, &hb, &pp, &ni, &ci, &si, &spl, &half]
                )
            },
            |pp, spl| {
                let rows = self.grid_rows(c);
                let Some((eps, (mean, var, inv_std))) = stats else {
                    return launch!(self, s, bn_sums_finish, rows, [&pp, out sums, &ci, &spl, &per]);
                };
                launch!(
                    self, s, bn_sums_finish_stats, rows,
                    [&pp, out sums, &ci, &spl, &per, &eps, out mean, out var, out inv_std]
                )
            },
        )
    }

    /// The statistics BatchNorm normalises with, `mean, var, inv_std (C)`, from `source`:
    /// batch statistics from the sums of x and x², or global ones from the running statistics.
    pub fn bn_stats(
        &self,
        s: &CudaStream,
        source: StatsSource<'_>,
        (c, eps): (usize, f32),
        (mean, var, inv_std): BatchStats<'_>,
    ) -> Result<()> {
        let op = "bn_stats";
        match &source {
            StatsSource::Batch(sums) => check_len(op, "sums", sums.len(), 2 * c + 1),
            StatsSource::Global(params) => check_len(op, "params", params.len(), 2 * c + 1),
        }
        let lens = [
            ("mean", mean.len()),
            ("var", var.len()),
            ("inv_std", inv_std.len()),
        ];
        let Some(ci) = int_count(op, c, &lens) else {
            return Ok(());
        };
        let grid = self.grid(c);
        match source {
            StatsSource::Batch(sums) => launch!(
                self, s, bn_batch_stats, grid,
                [in sums, &ci, &eps, out mean, out var, out inv_std]
            ),
            StatsSource::Global(params) => launch!(
                self, s, bn_global_stats, grid,
                [in params, &ci, &eps, out mean, out var, out inv_std]
            ),
        }
    }

    /// `y = (x − mean[c]) · inv_std[c]` over `(N, C, S)`.
    pub fn bn_normalize(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        (mean, inv_std): (&CudaSlice<f32>, &CudaSlice<f32>),
        y: &mut impl DevicePtrMut<f32>,
        dims: (usize, usize, usize),
    ) -> Result<()> {
        let acts = [("x", x.len()), ("y", y.len())];
        let channels = [("mean", mean.len()), ("inv_std", inv_std.len())];
        let Some((ni, ci, si)) = activation_ints("bn_normalize", dims, &acts, &channels) else {
            return Ok(());
        };
        launch!(
            self, s, bn_normalize, self.grid(ni as usize),
            [in x, in mean, in inv_std, out y, &ni, &ci, &si]
        )
    }

    /// BatchNorm backward over `(N, C, S)`. With batch statistics, `batch = Some((y, sums))`:
    /// `dx (+)= (dy − mean(dy) − mean(dy·y)·y) · inv_std`, the means from `sums (2C + 1)` =
    /// `[Σ dy, Σ dy·y, m]`. With global statistics (`None`): `dx (+)= dy · inv_std[c]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_backward(
        &self,
        s: &CudaStream,
        dy: &impl DevicePtr<f32>,
        batch: Option<(&CudaView<'_, f32>, &CudaSlice<f64>)>,
        inv_std: &CudaSlice<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        dims: (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let op = "bn_backward";
        let channels = [("inv_std", inv_std.len())];
        let Some((y, sums)) = batch else {
            let acts = [("dy", dy.len()), ("dx", dx.len())];
            let Some((ni, ci, si)) = activation_ints(op, dims, &acts, &channels) else {
                return Ok(());
            };
            let acc = accumulate as i32;
            return launch!(
                self, s, bn_backward_global, self.grid(ni as usize),
                [in dy, in inv_std, out dx, &ni, &ci, &si, &acc]
            );
        };
        check_len(op, "sums", sums.len(), 2 * dims.1 + 1);
        let acts = [("dy", dy.len()), ("y", y.len()), ("dx", dx.len())];
        let Some((ni, ci, si)) = activation_ints(op, dims, &acts, &channels) else {
            return Ok(());
        };
        let acc = accumulate as i32;
        launch!(
            self, s, bn_backward, self.grid(ni as usize),
            [in dy, in y, in sums, in inv_std, out dx, &ni, &ci, &si, &acc]
        )
    }
}

/// The checks of a kernel over the activations `(N, C, S)`: every buffer of `acts` holds `N·C·S`
/// elements and every one of `channels` `C` (panics otherwise). `(N·C·S, C, S)` as the kernel's
/// ints, or `None` when there is nothing to launch.
fn activation_ints(
    op: &str,
    (n, c, sp): (usize, usize, usize),
    acts: &[(&str, usize)],
    channels: &[(&str, usize)],
) -> Option<(i32, i32, i32)> {
    for &(what, len) in channels {
        check_len(op, what, len, c);
    }
    let ni = int_count(op, n * c * sp, acts)?;
    Some((ni, to_i32(op, c), to_i32(op, sp)))
}

impl Kernels {
    /// LRN backward: `dx (+)= dy · scale^(−beta) − (2·beta·c/d) · x · Σ_window dy · y / scale`,
    /// every operand `(N, C, H, W)`.
    #[allow(clippy::too_many_arguments)]
    pub fn lrn_backward(
        &self,
        s: &CudaStream,
        w: &LrnWindow,
        (x, y): (&impl DevicePtr<f32>, &impl DevicePtr<f32>),
        dy: &impl DevicePtr<f32>,
        scale: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let op = "lrn_backward";
        let lens = [
            ("x", x.len()),
            ("y", y.len()),
            ("dy", dy.len()),
            ("scale", scale.len()),
            ("dx", dx.len()),
        ];
        let Some(ni) = int_count(op, w.count(), &lens) else {
            return Ok(());
        };
        let [_, c, h, wd] = w.shape.map(|v| to_i32(op, v));
        let (half, within, acc) = (to_i32(op, w.half), w.within as i32, accumulate as i32);
        let (beta, factor) = (w.beta, w.factor);
        launch!(
            self, s, lrn_backward, self.grid(w.count()),
            [in x, in y, in dy, in scale, out dx, &ni, &c, &h, &wd, &half, &within, &beta, &factor, &acc]
        )
    }
}

launchers! {
    /// The running statistics update of a training forward, in `params (2C + 1)`, with the count
    /// `m = sums[2C]` for the variance correction `m / (m − 1)`.
    pub fn bn_update_running(
        params: out f32 [2 * c + 1], mean: in f32, var: in f32, sums: in f64 [2 * c + 1],
        c: elements as i32, maf: f32,
    ) => launch bn_update_running(out params, in mean, in var, in sums, &c, &maf);

    /// LRN forward over `x (N, C, H, W)`: `scale = k + c · (Σ_window x² / d)` and `y = x ·
    /// scale^(−beta)`, each `(N, C, H, W)`.
    pub fn lrn_forward(w: &LrnWindow, x: in f32, scale: out f32, y: out f32) over [w.count()] {
        let n = to_i32(OP, w.count());
        let [_, c, h, wd] = w.shape.map(|v| to_i32(OP, v));
        let (half, within) = (to_i32(OP, w.half), w.within as i32);
        let (k, cf, d, beta) = (w.k, w.c, w.d, w.beta);
    } => launch lrn_forward(
        in x, out scale, out y, &n, &c, &h, &wd, &half, &within, &k, &cf, &d, &beta
    );
}

/// The windows and constants of one LRN layer over `(N, C, H, W)`, as its kernels take them
/// (see `crate::layers::lrn` for the formulas).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LrnWindow {
    /// `(N, C, H, W)`.
    pub shape: [usize; 4],
    /// `(local_size − 1) / 2`.
    pub half: usize,
    /// The square of the channel (true) or the channels at the position (false).
    pub within: bool,
    /// `s = k + c · (Σ x² / d)`.
    pub k: f32,
    pub c: f32,
    pub d: f32,
    pub beta: f32,
    /// `2 · beta · c / d`, the backward's factor.
    pub factor: f32,
}

impl LrnWindow {
    /// Values of the blob: `N·C·H·W`.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }
}
