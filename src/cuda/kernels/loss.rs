//! Launchers of the loss kernels (`loss.cu`): softmax with loss forward and backward, top-k
//! accuracy, and the device scalars that carry a loss between host synchronisations.

use super::{check_len, to_i32, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};

/// Rows of scores `(rows, classes)` with a label each `(rows)`, as the classifier kernels take
/// them: a row counts unless its label is `ignore` or not a class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LabelledRows {
    pub rows: usize,
    pub classes: usize,
    /// The ignored label, as the f32 the labels are compared with.
    pub ignore: Option<f32>,
}

impl LabelledRows {
    /// Elements of the scores: `rows · classes`.
    pub fn scores(&self) -> usize {
        self.rows * self.classes
    }

    /// Checks that the buffers of `scores` hold `(rows, classes)` elements and `labels`
    /// `(rows)`; `(rows, classes, has_ignore, ignore)` as the kernels take them.
    fn args(&self, op: &str, scores: &[(&str, usize)], labels: usize) -> (i32, i32, i32, f32) {
        for &(what, len) in scores {
            check_len(op, what, len, self.scores());
        }
        check_len(op, "labels", labels, self.rows);
        let (r, c) = (to_i32(op, self.rows), to_i32(op, self.classes));
        to_i32(op, self.scores());
        let ignore = self.ignore;
        (r, c, ignore.is_some() as i32, ignore.unwrap_or(0.0))
    }
}

impl Kernels {
    /// Softmax with loss, forward: `prob (rows, classes)` = the softmax of each row of
    /// `x (rows, classes)`, then `loss (1)` = the mean over counted rows of
    /// `−ln max(p[label], f32::MIN_POSITIVE)` and `valid (1)` = the counted rows. `row_loss`
    /// `(rows)` and `row_valid` `(rows)` are scratch.
    pub fn softmax_loss_forward(
        &self,
        s: &CudaStream,
        rows: &LabelledRows,
        (x, labels): (&impl DevicePtr<f32>, &impl DevicePtr<f32>),
        prob: &mut impl DevicePtrMut<f32>,
        (row_loss, row_valid): (&mut impl DevicePtrMut<f64>, &mut impl DevicePtrMut<f32>),
        (loss, valid): (&mut impl DevicePtrMut<f32>, &mut impl DevicePtrMut<f32>),
    ) -> Result<()> {
        let op = "softmax_loss_forward";
        let scores = [("x", x.len()), ("prob", prob.len())];
        let (r, c, has_ignore, ignore) = rows.args(op, &scores, labels.len());
        check_len(op, "row_loss", row_loss.len(), rows.rows);
        check_len(op, "row_valid", row_valid.len(), rows.rows);
        check_len(op, "loss", loss.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        let (rlp, _rl) = row_loss.device_ptr_mut(s);
        let (rvp, _rv) = row_valid.device_ptr_mut(s);
        if rows.rows > 0 {
            launch!(
                self, s, softmax_loss_forward, self.grid_rows(rows.rows),
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
    pub fn softmax_loss_backward(
        &self,
        s: &CudaStream,
        rows: &LabelledRows,
        (prob, labels): (&impl DevicePtr<f32>, &impl DevicePtr<f32>),
        (top_diff, valid): (&impl DevicePtr<f32>, &impl DevicePtr<f32>),
        dx: &mut impl DevicePtrMut<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let op = "softmax_loss_backward";
        check_len(op, "top_diff", top_diff.len(), 1);
        check_len(op, "valid", valid.len(), 1);
        let scores = [("prob", prob.len()), ("dx", dx.len())];
        let (r, c, has_ignore, ignore) = rows.args(op, &scores, labels.len());
        if rows.scores() == 0 {
            return Ok(());
        }
        let acc = accumulate as i32;
        launch!(
            self, s, softmax_loss_backward, self.grid(rows.scores()),
            [in prob, in labels, in top_diff, in valid, out dx, &r, &c, &has_ignore, &ignore, &acc]
        )
    }

    /// Top-k accuracy: `out (1)` = the fraction of the rows of `x (rows, classes)` whose label
    /// has fewer than `top_k` classes scoring strictly higher; rows that do not count are in
    /// the denominator, never correct. `row_correct` `(rows)` is scratch.
    pub fn accuracy(
        &self,
        s: &CudaStream,
        rows: &LabelledRows,
        (x, labels): (&impl DevicePtr<f32>, &impl DevicePtr<f32>),
        top_k: usize,
        row_correct: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let op = "accuracy";
        let (r, c, has_ignore, ignore) = rows.args(op, &[("x", x.len())], labels.len());
        check_len(op, "row_correct", row_correct.len(), rows.rows);
        check_len(op, "out", out.len(), 1);
        let k = to_i32(op, top_k);
        let (rcp, _rc) = row_correct.device_ptr_mut(s);
        if rows.rows > 0 {
            launch!(
                self, s, accuracy_rows, self.grid_rows(rows.rows),
                [in x, in labels, &rcp, &r, &c, &k, &has_ignore, &ignore]
            )?;
        }
        launch!(self, s, accuracy_finalize, Kernels::single_block(), [&rcp, &r, out out])
    }
}

launchers! {
    /// ArgMax: `rows` searches of `dim` values `stride` apart in `x`, the `top_k` best of each
    /// written to `y` (see `argmax_rank` in `loss.cu` and `crate::layers::arg_max` for the
    /// layout); `(out_max_val, has_axis)` select it.
    pub fn argmax(
        x: in f32,
        y: out f32 [rows * top_k * if out_max_val && !has_axis { 2 } else { 1 }],
        (rows, dim, stride): (usize, usize, usize), top_k: usize,
        (out_max_val, has_axis): (bool, bool),
    ) over [rows * dim] {
        to_i32(OP, rows * dim);
        let [rows, dim, stride, top_k] = [rows, dim, stride, top_k].map(|v| to_i32(OP, v));
        let (out_max_val, has_axis) = (i32::from(out_max_val), i32::from(has_axis));
    } => launch argmax_rank(in x, out y, &rows, &dim, &stride, &top_k, &out_max_val, &has_axis);

    /// `dst[0] = (reset ? 0 : dst[0]) + weight · src[0]`.
    pub fn weighted_sum(src: in f32 [1], weight: f32, dst: out f32 [1], reset: bool as i32)
        => launch weighted_sum(in src, &weight, out dst, &reset) on Kernels::single_thread();

    /// `slots[slot] = (reset ? 0 : slots[slot]) + loss[0]`, in double.
    pub fn loss_slot(
        loss: in f32 [1], slots: out f64 [slot + 1], slot: usize as i32, reset: bool as i32,
    ) => launch loss_slot(in loss, out slots, &slot, &reset) on Kernels::single_thread();

    /// `diff_at[0] = NaN` where `loss[0]` (an iteration's summed loss, in double) is not finite:
    /// a replica's non-finite loss reaches every replica through the gradient all-reduce.
    pub fn poison_gradient(loss: in f64 [1], diff_at: out f32 [1])
        => launch poison_gradient(in loss, out diff_at) on Kernels::single_thread();

    /// `y (+)= (sign · top_diff[0] / num) · x` over `(n)`: a loss's gradient scaled by the loss
    /// weight in its top's diff `(1)`, read on the device (EuclideanLoss: `sign` ±1, `num` the
    /// batch).
    pub fn scaled_by_top_diff(
        x: in f32, top_diff: in f32 [1], y: out f32, (sign, num): (f32, f32),
        n: elements as i32, accumulate: bool as i32,
    ) => launch scaled_by_top_diff(in x, in top_diff, out y, &sign, &num, &n, &accumulate);
}
