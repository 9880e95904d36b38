//! `GpuAccuracy`: the fraction of samples whose label is among the `top_k` highest scores, the
//! device twin of `crate::layers::accuracy` (same ranking: ties favour the label; same
//! denominator: every sample, ignored ones included). No backward.
//!
//! Bottoms: scores `(N, C)` (flattened at `axis`) and labels `(N)`; top: scalar `[]`,
//! `correct / N` computed as the CPU does (`correct as f32 / N as f32`), so the count behind it
//! is recovered exactly by `crate::layers::accuracy::count_from_fraction`. One warp per row counts
//! the classes scoring strictly higher than the label; a one-block reduction writes the top.

use super::{classifier_rows, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::AccuracyParams;
use crate::cuda::kernels::LabelledRows;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;

/// Top-k accuracy; see the module docs.
#[derive(Debug)]
pub struct GpuAccuracy {
    name: String,
    axis: usize,
    top_k: usize,
    /// `(N, C)` of the current bottoms, and `ignore_label`.
    rows: LabelledRows,
    /// `(capacity ≥ N)` 1 where the row is correct.
    row_correct: CudaSlice<f32>,
}

impl BuildGpu for AccuracyParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuAccuracy {
            name: name.to_string(),
            axis: self.axis,
            top_k: self.top_k,
            rows: LabelledRows {
                ignore: self.ignore_label.map(|l| l as f32),
                ..LabelledRows::default()
            },
            row_correct: scratch(gpu, 1)?,
        }))
    }
}

impl GpuLayer for GpuAccuracy {
    fn type_name(&self) -> &'static str {
        "accuracy"
    }

    /// Scores `(N, C)` with `1 ≤ top_k ≤ C`, labels `(N)`.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let (rows, classes) = classifier_rows(&self.name, bottoms, self.axis)?;
        if self.top_k == 0 || self.top_k > classes {
            return Err(Error::net(
                &self.name,
                format!("`top_k` {} must be in [1, {classes}]", self.top_k),
            ));
        }
        if self.row_correct.len() < rows {
            self.row_correct = scratch(gpu, rows)?;
        }
        (self.rows.rows, self.rows.classes) = (rows, classes);
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [scores, labels, top] = pass.blobs.two_bottoms_top();
        gpu.kernels.accuracy(
            &gpu.compute,
            &self.rows,
            (&scores.data(), &labels.data()),
            self.top_k,
            &mut self.row_correct,
            &mut top.data_mut(),
        )
    }

    /// Nothing: accuracy is not differentiated.
    fn backward(&mut self, _pass: BackwardPass<'_>) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    fn case(extra: &str, scores: &[usize], classes: usize) -> LayerCase {
        LayerCase::new(
            &format!("name = \"acc\"\ntype = \"accuracy\"\n{extra}"),
            vec![scores.to_vec(), vec![scores[0]]],
        )
        .with_labels(classes)
    }

    #[test]
    fn matches_cpu_top_1() {
        let gpu = gpu_or_skip!("matches_cpu_top_1");
        check_against_cpu(&gpu, &case("", &[97, 10], 10), 601);
    }

    #[test]
    fn matches_cpu_top_3_with_ignore_label() {
        let gpu = gpu_or_skip!("matches_cpu_top_3_with_ignore_label");
        let c = case("top_k = 3\nignore_label = 2", &[50, 7], 7).with_ignored(2.0, vec![0, 5, 9]);
        check_against_cpu(&gpu, &c, 602);
    }

    #[test]
    fn ties_favour_the_label() {
        let gpu = gpu_or_skip!("ties_favour_the_label");
        // The CPU layer's own example: rows tied, behind two, behind one, all tied.
        let mut case = case("top_k = 2", &[4, 4], 4);
        case.fixed = Some((
            vec![
                1.0, 3.0, 3.0, 0.0, 1.0, 3.0, 3.0, 0.0, 0.5, 0.2, 0.1, 0.9, 2.0, 2.0, 2.0, 2.0,
            ],
            vec![1.0, 0.0, 0.0, 3.0],
        ));
        check_against_cpu(&gpu, &case, 603);
    }

    /// Regression: NaN compares false with everything, so rows of NaN scores were counted as
    /// correct. The CPU layer's NaN example: the label scoring NaN (rows 0 and 3, every class in
    /// row 3), a NaN ahead of the label within the top 2 (row 2).
    #[test]
    fn nan_scores_are_never_correct() {
        let gpu = gpu_or_skip!("nan_scores_are_never_correct");
        let nan = f32::NAN;
        let mut case = case("top_k = 2", &[4, 4], 4);
        case.fixed = Some((
            vec![
                1.0, nan, 3.0, 0.0, 1.0, 3.0, 3.0, 0.0, 0.5, 0.2, 0.1, nan, nan, nan, nan, nan,
            ],
            vec![1.0, 0.0, 0.0, 3.0],
        ));
        check_against_cpu(&gpu, &case, 604);
    }
}
