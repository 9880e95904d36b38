//! Launchers of the loss kernels (`loss.cu`): softmax with loss forward and backward, top-k
//! accuracy, and the device scalars that carry a loss between host synchronisations.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

impl Kernels {
    /// Softmax with loss, forward: `prob (rows, classes)` = the softmax of each row of
    /// `x (rows, classes)`, then `loss (1)` = the mean over counted rows of
    /// `−ln max(p[label], f32::MIN_POSITIVE)` and `valid (1)` = the counted rows. A row counts
    /// unless its label is `ignore` or not a class. `row_loss` `(rows)` and `row_valid`
    /// `(rows)` are scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_loss_forward(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        prob: &mut impl DevicePtrMut<f32>,
        row_loss: &mut impl DevicePtrMut<f64>,
        row_valid: &mut impl DevicePtrMut<f32>,
        loss: &mut impl DevicePtrMut<f32>,
        valid: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        ignore: Option<f32>,
    ) -> Result<()> {
        let op = "softmax_loss_forward";
        check_len(op, "x", x.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "prob", prob.len(), rows * classes);
        check_len(op, "row_loss", row_loss.len(), rows);
        check_len(op, "row_valid", row_valid.len(), rows);
        check_len(op, "loss", loss.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        let (r, c) = (to_i32(op, rows), to_i32(op, classes));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let (rlp, _rl) = row_loss.device_ptr_mut(s);
        let (rvp, _rv) = row_valid.device_ptr_mut(s);
        if rows > 0 {
            launch!(
                self, s, softmax_loss_forward, self.grid_rows(rows),
                [in x, in labels, out prob, &rlp, &rvp, &r, &c, &has_ignore, &ignore]
            )?;
        }
        launch!(
            self, s, loss_finalize, Kernels::single_block(),
            [&rlp, &rvp, &r, out loss, out valid]
        )
    }

    /// Softmax with loss, backward: `dx (rows, classes) (+)= w / max(V, 1) · (prob − onehot)`
    /// on counted rows, with `w = top_diff[0]` and `V = valid[0]` read on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn softmax_loss_backward(
        &self,
        s: &CudaStream,
        prob: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        top_diff: &impl DevicePtr<f32>,
        valid: &impl DevicePtr<f32>,
        dx: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        ignore: Option<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let op = "softmax_loss_backward";
        check_len(op, "prob", prob.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "top_diff", top_diff.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        check_len(op, "dx", dx.len(), rows * classes);
        if rows * classes == 0 {
            return Ok(());
        }
        let (r, c) = (to_i32(op, rows), to_i32(op, classes));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let acc = accumulate as i32;
        launch!(
            self, s, softmax_loss_backward, self.grid(rows * classes),
            [in prob, in labels, in top_diff, in valid, out dx, &r, &c, &has_ignore, &ignore, &acc]
        )
    }

    /// Top-k accuracy: `out (1)` = the fraction of the `rows` rows of `x (rows, classes)` whose
    /// label has fewer than `top_k` classes scoring strictly higher; rows whose label is
    /// `ignore` (or not a class) count in the denominator, never as correct. `row_correct`
    /// `(rows)` is scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn accuracy(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<f32>,
        labels: &impl DevicePtr<f32>,
        row_correct: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        classes: usize,
        top_k: usize,
        ignore: Option<f32>,
    ) -> Result<()> {
        let op = "accuracy";
        check_len(op, "x", x.len(), rows * classes);
        check_len(op, "labels", labels.len(), rows);
        check_len(op, "row_correct", row_correct.len(), rows);
        check_len(op, "out", out.len(), 1);
        let (r, c, k) = (to_i32(op, rows), to_i32(op, classes), to_i32(op, top_k));
        to_i32(op, rows * classes);
        let (has_ignore, ignore) = (ignore.is_some() as i32, ignore.unwrap_or(0.0));
        let (rcp, _rc) = row_correct.device_ptr_mut(s);
        if rows > 0 {
            launch!(
                self, s, accuracy_rows, self.grid_rows(rows),
                [in x, in labels, &rcp, &r, &c, &k, &has_ignore, &ignore]
            )?;
        }
        launch!(self, s, accuracy_finalize, Kernels::single_block(), [&rcp, &r, out out])
    }

    /// `dst[0] = (reset ? 0 : dst[0]) + weight · src[0]`.
    pub fn weighted_sum(
        &self,
        s: &CudaStream,
        src: &impl DevicePtr<f32>,
        weight: f32,
        dst: &mut impl DevicePtrMut<f32>,
        reset: bool,
    ) -> Result<()> {
        check_len("weighted_sum", "src", src.len(), 1);
        check_len("weighted_sum", "dst", dst.len(), 1);
        let reset = reset as i32;
        launch!(self, s, weighted_sum, Kernels::single_thread(), [in src, &weight, out dst, &reset])
    }

    /// `slots[slot] = (reset ? 0 : slots[slot]) + loss[0]`, in double.
    pub fn loss_slot(
        &self,
        s: &CudaStream,
        loss: &impl DevicePtr<f32>,
        slots: &mut impl DevicePtrMut<f64>,
        slot: usize,
        reset: bool,
    ) -> Result<()> {
        check_len("loss_slot", "loss", loss.len(), 1);
        check_len("loss_slot", "slots", slots.len(), slot + 1);
        let (slot, reset) = (to_i32("loss_slot", slot), reset as i32);
        launch!(self, s, loss_slot, Kernels::single_thread(), [in loss, out slots, &slot, &reset])
    }

    /// `diff_at[0] = NaN` where `loss[0]` (an iteration's summed loss, in double) is not finite:
    /// a replica's non-finite loss reaches every replica through the gradient all-reduce.
    pub fn poison_gradient(
        &self,
        s: &CudaStream,
        loss: &impl DevicePtr<f64>,
        diff_at: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        check_len("poison_gradient", "loss", loss.len(), 1);
        check_len("poison_gradient", "diff_at", diff_at.len(), 1);
        launch!(self, s, poison_gradient, Kernels::single_thread(), [in loss, out diff_at])
    }
}
