//! `GpuPrelu`: the parametric ReLU on the device, the device twin of `crate::layers::prelu`:
//! `y = max(x, 0) + slope[c] · min(x, 0)` over the bottom `(N, C, inner)` (NCHW), one learnable
//! slope per channel, or one for all with `channel_shared`.
//!
//! Backward: `dslope (+)= Σ dy · m` per slope with `m = x ≤ 0 ? x : 0` (a scratch `(N·C·inner)`,
//! then the deterministic channel reduction in double); `dx (+)= x > 0 ? dy : slope[c] · dy`.

use super::{grow, one_bottom, scratch, BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::PreluParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;

/// The parametric ReLU; see the module docs.
#[derive(Debug)]
pub struct GpuPrelu {
    name: String,
    shared: bool,
    /// The bottom as `(N, C, inner)`.
    view: (usize, usize, usize),
    /// `(capacity ≥ N·C·inner)` the negative part `m` of the last backward.
    negative: CudaSlice<f32>,
}

impl BuildGpu for PreluParams {
    fn build_gpu(&self, gpu: &Gpu, name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuPrelu {
            name: name.to_string(),
            shared: self.channel_shared,
            view: (0, 0, 0),
            negative: scratch(gpu, 1)?,
        }))
    }
}

impl GpuPrelu {
    /// The slopes' view of the bottom: `(outer, slopes, inner)`, `(1, 1, count)` when shared.
    fn slope_view(&self) -> (usize, usize, usize) {
        let (n, c, inner) = self.view;
        match self.shared {
            true => (1, 1, n * c * inner),
            false => self.view,
        }
    }
}

impl GpuLayer for GpuPrelu {
    fn type_name(&self) -> &'static str {
        "prelu"
    }

    /// One bottom `(N, C, ...)`.
    fn reshape(&mut self, gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let shape = one_bottom(&self.name, bottoms)?;
        if shape.len() < 2 {
            return Err(Error::net(
                &self.name,
                format!("needs a bottom with channels (N, C, ...), got {shape:?}"),
            ));
        }
        self.view = (shape[0], shape[1], shape[2..].iter().product());
        grow(gpu, &mut self.negative, shape.iter().product())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let (_, slopes, inner) = self.slope_view();
        let [x, y] = pass.blobs.bottom_top();
        let n = x.count();
        let slope = pass.params.slice(..slopes);
        gpu.kernels.prelu_forward(
            &gpu.compute,
            &x.data(),
            &slope,
            &mut y.data_mut(),
            n,
            (slopes, inner),
        )
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        let view = self.slope_view();
        let (slopes, inner) = (view.1, view.2);
        let [x, y] = pass.blobs.bottom_top();
        let n = x.count();
        let (xs, dy) = (x.data.slice(..n), y.diff.slice(..n));
        k.prelu_negative_part(s, &xs, &mut self.negative, n)?;
        let acc = pass.param_grad.accumulate();
        let dslope = &mut pass.param_diff.slice_mut(..slopes);
        k.channel_reduce(s, &dy, &self.negative, true, dslope, view, acc)?;
        let grad = pass.grads[0];
        if !grad.wanted() {
            return Ok(());
        }
        let slope = pass.params.slice(..slopes);
        let dx = &mut x.diff.slice_mut(..n);
        k.prelu_backward(
            s,
            &xs,
            &dy,
            &slope,
            dx,
            n,
            (slopes, inner),
            grad.accumulate(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        per_channel_matches_cpu: "name = \"p\"\ntype = \"prelu\"", vec![vec![3, 4, 5, 6]], 1301;
        shared_matches_cpu: "name = \"p\"\ntype = \"prelu\"\nchannel_shared = true", vec![vec![2, 3, 7, 5]], 1302;
        two_axes_matches_cpu: "name = \"p\"\ntype = \"prelu\"", vec![vec![16, 40]], 1303;
    }
}
