//! `GpuSoftmax`: softmax over `axis` (default 1), the device twin of `crate::layers::softmax`.
//! The bottom is viewed as `(outer, channels, inner)`; one thread per `(outer, inner)` pair
//! subtracts the maximum over the channels, exponentiates and divides by the sum. Backward from
//! the top's data: `dx (+)= (dy − Σ_c dy·y) · y`.

use super::{one_bottom_with_axis, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::SoftmaxParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// Softmax; see the module docs.
#[derive(Debug)]
pub struct GpuSoftmax {
    name: String,
    axis: usize,
    view: (usize, usize, usize),
}

impl BuildGpu for SoftmaxParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuSoftmax {
            name: name.to_string(),
            axis: self.axis,
            view: (0, 0, 0),
        }))
    }
}

impl GpuLayer for GpuSoftmax {
    fn type_name(&self) -> &'static str {
        "softmax"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom_with_axis(&self.name, bottoms, self.axis)?;
        self.view = (
            shape[..self.axis].iter().product(),
            shape[self.axis],
            shape[self.axis + 1..].iter().product(),
        );
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let [x, y] = pass.blobs.bottom_top();
        gpu.kernels
            .softmax_forward(&gpu.compute, &x.data(), &mut y.data_mut(), self.view)
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (gpu, grad) = (pass.gpu, pass.grads[0]);
        if !grad.wanted() {
            return Ok(());
        }
        let [x, y] = pass.blobs.bottom_top();
        gpu.kernels.softmax_backward(
            &gpu.compute,
            &y.data(),
            &y.diff(),
            &mut x.diff_mut(),
            self.view,
            grad.accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        over_channels_matches_cpu: "name = \"s\"\ntype = \"softmax\"", vec![vec![3, 5, 4, 2]], 1001;
        over_last_axis_matches_cpu: "name = \"s\"\ntype = \"softmax\"\naxis = 2", vec![vec![4, 3, 10]], 1002;
    }
}
