//! `GpuBias`: Caffe's Bias layer, the device twin of `crate::layers::bias`:
//! `y = x + b[d]` over the view `(outer, dim, inner)` of the bottom, `d` over the axes
//! `axis .. axis + num_axes` (default 1 and 1). One bottom: `b` is learnable (the layer's only
//! tensor); two bottoms: `b` is the second bottom and gets a gradient like a bottom.
//! Channels-last blobs only with one value per channel: the view is then `(N·H·W, C, 1)`.
//!
//! Backward: `dx (+)= dy`; `db[d] (+)= Σ dy` over `(outer, inner)` (in double, deterministic).

use super::scale::operand_view;
use super::{BackwardPass, BuildGpu, ForwardPass, GpuLayer};
use crate::config::layer_params::BiasParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// The bias layer; see the module docs.
#[derive(Debug)]
pub struct GpuBias {
    name: String,
    axis: usize,
    num_axes: i64,
    view: (usize, usize, usize),
    /// How a 4-D bottom is stored (channels-last only over the channel axis alone).
    layout: Layout,
    two_bottoms: bool,
}

impl BuildGpu for BiasParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuBias {
            layout,
            name: name.to_string(),
            axis: self.axis,
            num_axes: self.num_axes,
            view: (0, 0, 0),
            two_bottoms: false,
        }))
    }
}

impl GpuLayer for GpuBias {
    fn type_name(&self) -> &'static str {
        "bias"
    }

    fn reshape(&mut self, _gpu: &Gpu, bottoms: &[&[usize]]) -> Result<()> {
        let axes = (self.axis, self.num_axes);
        (self.view, self.two_bottoms) = operand_view(&self.name, self.layout, axes, bottoms)?;
        Ok(())
    }

    fn forward(&mut self, mut pass: ForwardPass<'_>) -> Result<()> {
        let gpu = pass.gpu;
        let (_, d, inner) = self.view;
        let s = &gpu.compute;
        if self.two_bottoms {
            let [x, b, y] = pass.blobs.two_bottoms_top();
            let n = x.count();
            gpu.kernels.channel_affine(
                s,
                &x.data(),
                None,
                Some(&b.data()),
                &mut y.data_mut(),
                n,
                (d, inner),
            )
        } else {
            let [x, y] = pass.blobs.bottom_top();
            let n = x.count();
            gpu.kernels.channel_affine(
                s,
                &x.data(),
                None,
                Some(&pass.params.slice(..d)),
                &mut y.data_mut(),
                n,
                (d, inner),
            )
        }
    }

    fn backward(&mut self, mut pass: BackwardPass<'_>) -> Result<()> {
        let (grads, blobs) = (pass.grads, &mut pass.blobs);
        let view = self.view;
        let d = view.1;
        let (s, k) = (&pass.gpu.compute, &pass.gpu.kernels);
        if self.two_bottoms {
            let [b, y] = blobs.pick([blobs.bottoms[1], blobs.tops[0]]);
            if grads[1].wanted() {
                let dy = y.diff();
                k.channel_reduce(
                    s,
                    &dy,
                    &dy,
                    false,
                    &mut b.diff_mut(),
                    view,
                    grads[1].accumulate(),
                )?;
            }
        } else {
            let dy = blobs.top(0).diff();
            k.channel_reduce(
                s,
                &dy,
                &dy,
                false,
                &mut pass.param_diff.slice_mut(..d),
                view,
                pass.param_grad.accumulate(),
            )?;
        }
        if grads[0].wanted() {
            let [x, y] = blobs.bottom_top();
            let n = x.count();
            k.scaled_copy(
                s,
                &y.diff(),
                &mut x.diff_mut(),
                1.0,
                n,
                grads[0].accumulate(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        learnable_matches_cpu,
        "name = \"b\"\ntype = \"bias\"",
        vec![vec![3, 4, 5, 2]],
        611
    );

    layer_matches_cpu!(
        second_bottom_matches_cpu,
        "name = \"b\"\ntype = \"bias\"",
        vec![vec![2, 3, 4, 4], vec![3]],
        612
    );
}
