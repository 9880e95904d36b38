//! `GpuSoftmaxWithLoss`: softmax over classes fused with the multinomial logistic loss, the
//! device twin of `crate::layers::softmax_with_loss` (whose docs give the formulas).
//!
//! Bottoms: scores `(N, C)` (flattened at `axis`) and labels `(N)`; top: the scalar loss `[]`.
//! Forward: one warp per row computes the max-subtracted softmax into `prob (N, C)` and the
//! row's loss; a one-block reduction writes the mean over counted rows into the top and the
//! count `V` into a device scalar — all on the device, no host synchronisation.
//! Backward: `dscores (+)= w · (prob − onehot(label)) / max(V, 1)` on counted rows, with the loss
//! weight `w` read from the top's diff on the device.
//!
//! A label that is neither `ignore_label` nor a class in `[0, C)` makes the CPU layer panic;
//! here that row is skipped like an ignored one (the data readers reject such labels before
//! they reach a net).

use super::{classifier_rows, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::SoftmaxWithLossParams;
use crate::cuda::kernels::LabelledRows;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaView};

/// Softmax and multinomial logistic loss; see the module docs.
#[derive(Debug)]
pub struct GpuSoftmaxWithLoss {
    name: String,
    axis: usize,
    /// `(N, C)` of the current bottoms, and `ignore_label`.
    rows: LabelledRows,
    /// `(capacity ≥ N·C)` softmax probabilities of the last forward.
    prob: CudaSlice<f32>,
    /// `(capacity ≥ N)` per-row loss, in double.
    row_loss: CudaSlice<f64>,
    /// `(capacity ≥ N)` 1 where the row counts, 0 where not.
    row_valid: CudaSlice<f32>,
    /// `(1)` counted rows `V` of the last forward.
    valid: CudaSlice<f32>,
}

impl GpuSoftmaxWithLoss {
    /// `(N, C)` probabilities of the last forward (for tests and diagnostics).
    pub fn prob(&self) -> CudaView<'_, f32> {
        self.prob.slice(..self.rows.scores())
    }

    /// `(1)` rows of the last forward whose label counted.
    pub fn valid(&self) -> &CudaSlice<f32> {
        &self.valid
    }
}

impl BuildGpu for SoftmaxWithLossParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuSoftmaxWithLoss {
            name: name.to_string(),
            axis: self.axis,
            rows: LabelledRows {
                ignore: self.ignore_label.map(|l| l as f32),
                ..LabelledRows::default()
            },
            prob: scratch(gpu, 1)?,
            row_loss: scratch(gpu, 1)?,
            row_valid: scratch(gpu, 1)?,
            valid: scratch(gpu, 1)?,
        }))
    }
}

impl GpuLayer for GpuSoftmaxWithLoss {
    fn type_name(&self) -> &'static str {
        "softmax_with_loss"
    }

    /// Scores `(N, C)` and labels `(N)`.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let (rows, classes) = classifier_rows(&self.name, bottoms, self.axis)?;
        if self.prob.len() < rows * classes {
            self.prob = scratch(gpu, rows * classes)?;
        }
        if self.row_loss.len() < rows {
            self.row_loss = scratch(gpu, rows)?;
            self.row_valid = scratch(gpu, rows)?;
        }
        (self.rows.rows, self.rows.classes) = (rows, classes);
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [scores, labels, top] = pass.blobs.two_bottoms_top();
        gpu.kernels.softmax_loss_forward(
            &gpu.compute,
            &self.rows,
            (&scores.data(), &labels.data()),
            &mut self.prob,
            (&mut self.row_loss, &mut self.row_valid),
            (&mut top.data_mut(), &mut self.valid),
        )
    }

    /// `dscores += w · (p − onehot) / V` on counted rows, `w` = the top's diff.
    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        if !grad.wanted() {
            return Ok(());
        }
        let [scores, labels, top] = pass.blobs.two_bottoms_top();
        gpu.kernels.softmax_loss_backward(
            &gpu.compute,
            &self.rows,
            (&self.prob, &labels.data()),
            (&top.diff(), &self.valid),
            &mut scores.diff_mut(),
            grad.accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    fn case(extra: &str, scores: &[usize], classes: usize) -> LayerCase {
        LayerCase::new(
            &format!("name = \"loss\"\ntype = \"softmax_with_loss\"\n{extra}"),
            vec![scores.to_vec(), vec![scores[0]]],
        )
        .with_labels(classes)
    }

    #[test]
    fn matches_cpu() {
        let gpu = gpu_or_skip!("matches_cpu");
        check_against_cpu(&gpu, &case("", &[16, 10], 10), 501);
    }

    #[test]
    fn matches_cpu_with_many_classes_and_a_loss_weight() {
        let gpu = gpu_or_skip!("matches_cpu_with_many_classes_and_a_loss_weight");
        check_against_cpu(
            &gpu,
            &case("", &[9, 1000], 1000).with_loss_weight(0.37),
            502,
        );
    }

    #[test]
    fn matches_cpu_with_ignore_label() {
        let gpu = gpu_or_skip!("matches_cpu_with_ignore_label");
        let c = case("ignore_label = -1", &[6, 3, 2], 6).with_ignored(-1.0, vec![1, 4]);
        check_against_cpu(&gpu, &c, 503);
    }

    #[test]
    fn matches_cpu_when_every_label_is_ignored() {
        let gpu = gpu_or_skip!("matches_cpu_when_every_label_is_ignored");
        let c = case("ignore_label = 3", &[4, 5], 5).with_ignored(3.0, vec![0, 1, 2, 3]);
        check_against_cpu(&gpu, &c, 504);
    }
}
