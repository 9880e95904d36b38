//! Bias on the device: Caffe's Bias layer, the device twin of `crate::layers::bias`:
//! `y = x + b[d]` over the view `(outer, dim, inner)` of the bottom, `d` over the axes
//! `axis .. axis + num_axes` (default 1 and 1). One bottom: `b` is learnable (the layer's only
//! tensor); two bottoms: `b` is the second bottom and gets a gradient like a bottom. The layer
//! is a [`super::affine::GpuAffine`], whose docs give the backward.

use super::affine::GpuAffine;
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::BiasParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

impl BuildGpu for BiasParams {
    fn build_gpu(&self, _gpu: &Gpu, name: &str, layout: Layout) -> Result<Box<dyn GpuLayer>> {
        let (kind, axes) = (("bias", name), (self.axis, self.num_axes));
        Ok(Box::new(GpuAffine::new(kind, (false, true), axes, layout)))
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        learnable_matches_cpu: "name = \"b\"\ntype = \"bias\"", vec![vec![3, 4, 5, 2]], 611;
        second_bottom_matches_cpu: "name = \"b\"\ntype = \"bias\"", vec![vec![2, 3, 4, 4], vec![3]], 612;
    }
}
