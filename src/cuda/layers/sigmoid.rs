//! `GpuSigmoid`: the logistic function `y = 1 / (1 + e^(−x))` elementwise, the device twin of
//! `crate::layers::sigmoid`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · y · (1 − y)`, from the top's data.

use super::{pick, GpuCtx, GpuLayer, Grad};
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// The logistic function; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuSigmoid;

impl GpuLayer for GpuSigmoid {
    fn type_name(&self) -> &'static str {
        "sigmoid"
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
            .sigmoid_forward(&gpu.compute, &x.data(), &mut y.data_mut(), n)
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
        gpu.kernels.sigmoid_backward(
            &gpu.compute,
            &y.data(),
            &y.diff(),
            &mut x.diff_mut(),
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
        let case = LayerCase::new("name = \"s\"\ntype = \"sigmoid\"", vec![vec![6, 5, 4]]);
        check_against_cpu(&gpu, &case, 301);
    }
}
