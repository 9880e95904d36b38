//! `GpuReshape`: Caffe's Reshape (`shape` with 0 = copy, −1 = infer; `axis`, `num_axes`), the
//! device twin of `crate::layers::reshape`. The top's shape comes from the CPU layer's rule;
//! on the device the layer is a copy forward and a pass-through backward.

use super::flatten::{view_backward, view_forward};
use super::{GpuCtx, GpuLayer, Grad};
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// Reshape; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct GpuReshape;

impl GpuLayer for GpuReshape {
    fn type_name(&self) -> &'static str {
        "reshape"
    }

    fn reshape(&mut self, _gpu: &Gpu, _bottoms: &[&[usize]]) -> Result<()> {
        Ok(())
    }

    fn forward(
        &mut self,
        gpu: &Gpu,
        _ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        _params: &CudaView<'_, f32>,
    ) -> Result<()> {
        view_forward(gpu, blobs, bottoms[0], tops[0])
    }

    fn backward(
        &mut self,
        gpu: &Gpu,
        _ctx: &GpuCtx<'_>,
        blobs: &mut [GpuBlob],
        bottoms: &[usize],
        tops: &[usize],
        grads: &[Grad],
        _params: &CudaView<'_, f32>,
        _param_grad: Grad,
        _param_diff: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        view_backward(gpu, blobs, bottoms[0], tops[0], grads[0])
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
            "name = \"r\"\ntype = \"reshape\"\nshape = [0, -1, 10]",
            vec![vec![3, 4, 5, 2]],
        );
        check_against_cpu(&gpu, &case, 902);
    }
}
