//! `GpuAbsVal`: `y = |x|`, `dx (+)= sign(x) · dy` (0 at 0), the device twin of
//! `crate::layers::abs_val`.

use super::{pick, GpuCtx, GpuLayer, Grad};
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// Absolute value; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct GpuAbsVal;

impl GpuLayer for GpuAbsVal {
    fn type_name(&self) -> &'static str {
        "abs_val"
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
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        let n = x.count();
        gpu.kernels
            .abs_forward(&gpu.compute, &x.data(), &mut y.data_mut(), n)
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
        if !grads[0].wanted() {
            return Ok(());
        }
        let [x, y] = pick(blobs, [bottoms[0], tops[0]]);
        let n = x.count();
        let xd = x.data.slice(..n);
        gpu.kernels.abs_backward(
            &gpu.compute,
            &xd,
            &y.diff(),
            &mut x.diff.slice_mut(..n),
            n,
            grads[0].accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn matches_cpu() {
        let gpu = gpu_or_skip!("matches_cpu");
        let case = LayerCase::new("name = \"a\"\ntype = \"abs_val\"", vec![vec![4, 3, 5, 5]]);
        check_against_cpu(&gpu, &case, 1201);
    }
}
