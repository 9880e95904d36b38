//! `gpu_reshape`: Caffe's Reshape (`shape` with 0 = copy, −1 = infer; `axis`, `num_axes`), the
//! device twin of `crate::layers::reshape`. The top's shape comes from the CPU layer's rule;
//! on the device the layer is a [`GpuView`].

use super::view::GpuView;
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::ReshapeParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// Reshape; see the module docs.
pub fn gpu_reshape() -> GpuView {
    GpuView::named("reshape")
}

impl BuildGpu for ReshapeParams {
    fn build_gpu(&self, _gpu: &Gpu, _name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(gpu_reshape()))
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"r\"\ntype = \"reshape\"\nshape = [0, -1, 10]",
        vec![vec![3, 4, 5, 2]],
        902
    );
}
