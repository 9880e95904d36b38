//! `GpuPower`: `y = (shift + scale · x)^power` (defaults 1, 1, 0), the device twin of
//! `crate::layers::power`; backward `dx (+)= dy · power · scale · (shift + scale · x)^(power−1)`
//! (0 when power or scale is 0).

use super::{pick, GpuCtx, GpuLayer, Grad};
use crate::config::layer_params::PowerParams;
use crate::cuda::blob::GpuBlob;
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaView, CudaViewMut};

/// Power; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct GpuPower {
    /// `(power, scale, shift)`.
    coef: (f32, f32, f32),
}

impl GpuPower {
    /// The layer with its resolved parameters (defaults and ranges: [`PowerParams`]).
    pub fn new(p: &PowerParams) -> Self {
        GpuPower {
            coef: (p.power, p.scale, p.shift),
        }
    }
}

impl GpuLayer for GpuPower {
    fn type_name(&self) -> &'static str {
        "power"
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
            .power_forward(&gpu.compute, &x.data(), &mut y.data_mut(), n, self.coef)
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
        gpu.kernels.power_backward(
            &gpu.compute,
            &xd,
            &y.diff(),
            &mut x.diff.slice_mut(..n),
            n,
            self.coef,
            grads[0].accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn square_matches_cpu() {
        let gpu = gpu_or_skip!("square_matches_cpu");
        let case = LayerCase::new(
            "name = \"p\"\ntype = \"power\"\npower = 2.0\nscale = 0.5\nshift = 1.0",
            vec![vec![3, 4, 5]],
        );
        check_against_cpu(&gpu, &case, 1101);
    }

    /// A positive base (shift 3 over inputs in [-2, 2]) for a fractional power.
    #[test]
    fn fractional_power_matches_cpu() {
        let gpu = gpu_or_skip!("fractional_power_matches_cpu");
        let case = LayerCase::new(
            "name = \"p\"\ntype = \"power\"\npower = 1.5\nscale = 1.0\nshift = 3.0",
            vec![vec![4, 25]],
        );
        check_against_cpu(&gpu, &case, 1102);
    }
}
