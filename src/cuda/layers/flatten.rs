//! `gpu_flatten`: the axes `axis ..= end_axis` merged into one, the device twin of
//! `crate::layers::flatten`. The top's shape comes from the CPU layer's shape rule (the net
//! shapes every blob); on the device the layer is a [`GpuView`].

use super::view::GpuView;
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::FlattenParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// Flatten; see the module docs.
pub fn gpu_flatten() -> GpuView {
    GpuView::named("flatten")
}

impl BuildGpu for FlattenParams {
    fn build_gpu(&self, _gpu: &Gpu, _name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(gpu_flatten()))
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"f\"\ntype = \"flatten\"",
        vec![vec![3, 4, 5, 2]],
        901
    );
}
