//! Scale on the device: Caffe's Scale layer, the device twin of `crate::layers::scale`:
//! `y = x · s[d] (+ b[d])` over the view `(outer, dim, inner)` of the bottom `x`, `d` over the
//! axes `axis .. axis + num_axes` (default 1 and 1: one factor per channel); `s` learnable with
//! one bottom, the second bottom with two; `b` learnable with `bias_term`. The layer is a
//! [`super::affine::GpuAffine`], whose docs give the backward.

use super::affine::GpuAffine;
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::ScaleParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

impl BuildGpu for ScaleParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        let (kind, axes) = (("scale", name), (self.axis, self.num_axes));
        Ok(Box::new(GpuAffine::new(
            kind,
            (true, self.bias_term),
            axes,
            layout,
        )))
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        per_channel_with_bias_matches_cpu: "name = \"sc\"\ntype = \"scale\"\nbias_term = true", vec![vec![3, 4, 5, 6]], 601;
        over_two_axes_matches_cpu: "name = \"sc\"\ntype = \"scale\"\nnum_axes = 2", vec![vec![2, 3, 4, 5]], 602;
        second_bottom_as_scale_matches_cpu: "name = \"sc\"\ntype = \"scale\"", vec![vec![2, 3, 4, 4], vec![3]], 603;
    }
}
