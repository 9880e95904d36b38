//! `GpuFlatten`: the axes `axis ..= end_axis` merged into one, the device twin of
//! `crate::layers::flatten`. The top's shape comes from the CPU layer's shape rule (the net
//! shapes every blob); on the device the layer is a copy forward and a pass-through backward.

use super::{copy_data, pick, GpuCtx, GpuLayer, Grad};
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// Flatten; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct GpuFlatten;

/// `y = x` forward, `dx (+)= dy` backward: the device side of a view layer.
pub(crate) fn view_forward(
    gpu: &Gpu,
    blobs: &mut [GpuBlob],
    bottom: usize,
    top: usize,
) -> Result<()> {
    let [x, y] = pick(blobs, [bottom, top]);
    copy_data(gpu, x, y)
}

/// See [`view_forward`].
pub(crate) fn view_backward(
    gpu: &Gpu,
    blobs: &mut [GpuBlob],
    bottom: usize,
    top: usize,
    grad: Grad,
) -> Result<()> {
    if !grad.wanted() {
        return Ok(());
    }
    let [x, y] = pick(blobs, [bottom, top]);
    let n = x.count();
    gpu.kernels.scaled_copy(
        &gpu.compute,
        &y.diff(),
        &mut x.diff_mut(),
        1.0,
        n,
        grad.accumulate(),
    )
}

impl GpuLayer for GpuFlatten {
    fn type_name(&self) -> &'static str {
        "flatten"
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
        let case = LayerCase::new("name = \"f\"\ntype = \"flatten\"", vec![vec![3, 4, 5, 2]]);
        check_against_cpu(&gpu, &case, 901);
    }
}
