//! `GpuEuclideanLoss`: the sum-of-squares loss on the device, the device twin of
//! `crate::layers::euclidean_loss` (whose docs give the formulas).
//!
//! Bottoms: a prediction `a (N, ...)` and a target `b (N, ...)` of as many values; top: the
//! scalar loss `[]`. Forward: `diff = a − b` into a scratch `(count)`, `Σ diff²` by the
//! deterministic channel reduction in double (one channel), times `1 / 2N`. Backward:
//! `da (+)= (w / N) · diff`, `db (+)= −(w / N) · diff`, with the loss weight `w` read from the
//! top's diff on the device.

use super::{grow, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::EuclideanLossParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;
use crate::layers::euclidean_loss::paired_bottoms;
use cudarc::driver::CudaSlice;

/// The Euclidean loss; see the module docs.
#[derive(Debug)]
pub struct GpuEuclideanLoss {
    name: String,
    /// The batch `N`.
    num: usize,
    /// Values of each bottom.
    count: usize,
    /// `(capacity ≥ count)` `a − b` of the last forward.
    diff: CudaSlice<f32>,
}

impl BuildGpu for EuclideanLossParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuEuclideanLoss {
            name: name.to_string(),
            num: 0,
            count: 0,
            diff: scratch(gpu, 1)?,
        }))
    }
}

impl GpuLayer for GpuEuclideanLoss {
    fn type_name(&self) -> &'static str {
        "euclidean_loss"
    }

    /// Prediction and target, `(N, ...)` each.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        (self.num, self.count) = paired_bottoms(&self.name, bottoms)?;
        grow(gpu, &mut self.diff, self.count)
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let n = self.count;
        let [a, b, top] = pass.blobs.two_bottoms_top();
        k.scaled_copy(s, &a.data(), &mut self.diff, 1.0, n, false)?;
        k.axpy(s, -1.0, &b.data(), &mut self.diff, n)?;
        let loss = &mut top.data_mut();
        k.channel_reduce(s, &self.diff, &self.diff, true, loss, (1, 1, n), false)?;
        k.scale(s, loss, 0.5 / self.num.max(1) as f32, 1)
    }

    /// `d{a,b} (+)= ±(w / N) · diff`, `w` = the top's diff.
    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let num = self.num.max(1) as f32;
        let [a, b, top] = pass.blobs.two_bottoms_top();
        for (grad, sign, bottom) in [(pass.grads[0], 1.0, a), (pass.grads[1], -1.0, b)] {
            if grad.wanted() {
                let (dx, w) = (&mut bottom.diff_mut(), &top.diff());
                let acc = grad.accumulate();
                k.scaled_by_top_diff(s, &self.diff, w, dx, (sign, num), self.count, acc)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn matches_cpu() {
        let gpu = gpu_or_skip!("matches_cpu");
        let case = LayerCase::new(
            "name = \"loss\"\ntype = \"euclidean_loss\"",
            vec![vec![8, 5], vec![8, 5]],
        );
        check_against_cpu(&gpu, &case, 1401);
    }

    #[test]
    fn matches_cpu_with_other_shapes_and_a_loss_weight() {
        let gpu = gpu_or_skip!("matches_cpu_with_other_shapes_and_a_loss_weight");
        let case = LayerCase::new(
            "name = \"loss\"\ntype = \"euclidean_loss\"",
            vec![vec![6, 3, 4, 5], vec![6, 60]],
        )
        .with_loss_weight(0.37);
        check_against_cpu(&gpu, &case, 1402);
    }
}
