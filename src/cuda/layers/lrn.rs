//! `GpuLrn`: local response normalisation on the device, the device twin of
//! `crate::layers::lrn` (whose docs give the formulas) over `(N, C, H, W)` NCHW, both regions.
//! One thread per value sums its window forward (keeping the denominator `s (N, C, H, W)` for
//! the backward) and backward, in the CPU layer's order.
//!
//! The kernels are the project's own rather than cuDNN's LRN: one code path for both regions,
//! checked against the CPU layer, and no cuDNN for nets without convolutions.

use super::{grow, nchw, one_bottom, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::LrnParams;
use crate::config::NormRegion;
use crate::cuda::kernels::LrnWindow;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::CudaSlice;

/// Local response normalisation; see the module docs.
#[derive(Debug)]
pub struct GpuLrn {
    name: String,
    window: LrnWindow,
    /// `(capacity ≥ N·C·H·W)` the denominators `s` of the last forward.
    scale: CudaSlice<f32>,
}

impl BuildGpu for LrnParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        let (k, c, d) = self.scale_terms();
        Ok(Box::new(GpuLrn {
            name: name.to_string(),
            window: LrnWindow {
                shape: [0; 4],
                half: self.local_size / 2,
                within: self.norm_region == NormRegion::WithinChannel,
                k,
                c,
                d,
                beta: self.beta,
                factor: self.gradient_factor(),
            },
            scale: scratch(gpu, 1)?,
        }))
    }
}

impl GpuLayer for GpuLrn {
    fn type_name(&self) -> &'static str {
        "lrn"
    }

    /// One bottom `(N, C, H, W)`.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        self.window.shape = nchw(&self.name, one_bottom(&self.name, bottoms)?)?;
        grow(gpu, &mut self.scale, self.window.count())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x, y] = pass.blobs.bottom_top();
        let w = &self.window;
        gpu.kernels.lrn_forward(
            &gpu.compute,
            w,
            &x.data(),
            &mut self.scale,
            &mut y.data_mut(),
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        if !grad.wanted() {
            return Ok(());
        }
        let [x, y] = pass.blobs.bottom_top();
        let n = self.window.count();
        let (xs, ys, dy) = (x.data.slice(..n), y.data.slice(..n), y.diff.slice(..n));
        gpu.kernels.lrn_backward(
            &gpu.compute,
            &self.window,
            (&xs, &ys),
            &dy,
            &self.scale,
            &mut x.diff.slice_mut(..n),
            grad.accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        across_channels_matches_cpu: "name = \"n\"\ntype = \"lrn\"", vec![vec![2, 7, 5, 6]], 1601;
        across_channels_with_settings_matches_cpu: "name = \"n\"\ntype = \"lrn\"\nlocal_size = 3\nalpha = 0.5\nbeta = 1.5\nk = 2.0", vec![vec![3, 4, 3, 3]], 1602;
        within_channel_matches_cpu: "name = \"n\"\ntype = \"lrn\"\nnorm_region = \"within_channel\"\nlocal_size = 3", vec![vec![2, 3, 6, 5]], 1603;
    }
}
