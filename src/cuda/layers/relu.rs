//! `GpuRelu`: the rectifier `y = x > 0 ? x : negative_slope · x` elementwise, the device twin of
//! `crate::layers::relu`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (x > 0 ? 1 : negative_slope)`, from the bottom's data.

use super::{pick, GpuCtx, GpuLayer, Grad};
use crate::config::layer_params::ReluParams;
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// The rectifier; see the module docs.
#[derive(Debug, Clone)]
pub struct GpuRelu {
    negative_slope: f32,
}

impl GpuRelu {
    /// The layer with its resolved parameters (defaults and ranges: [`ReluParams`]).
    pub fn new(p: &ReluParams) -> Self {
        GpuRelu {
            negative_slope: p.negative_slope,
        }
    }
}

impl GpuLayer for GpuRelu {
    fn type_name(&self) -> &'static str {
        "relu"
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
        gpu.kernels.relu_forward(
            &gpu.compute,
            self.negative_slope,
            &x.data(),
            &mut y.data_mut(),
            n,
        )
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
        let x_data = x.data.slice(..n);
        gpu.kernels.relu_backward(
            &gpu.compute,
            self.negative_slope,
            &x_data,
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
        let case = LayerCase::new("name = \"r\"\ntype = \"relu\"", vec![vec![4, 3, 5, 7]]);
        check_against_cpu(&gpu, &case, 201);
    }

    #[test]
    fn matches_cpu_leaky() {
        let gpu = gpu_or_skip!("matches_cpu_leaky");
        let case = LayerCase::new(
            "name = \"r\"\ntype = \"relu\"\nnegative_slope = 0.1",
            vec![vec![3, 1000]],
        );
        check_against_cpu(&gpu, &case, 202);
    }
}
