//! Reshape on the device: Caffe's Reshape (`shape` with 0 = copy, −1 = infer; `axis`,
//! `num_axes`), the device twin of `crate::layers::reshape`. The top's shape comes from the CPU
//! layer's rule; on the device the layer is a [`GpuView`](super::view::GpuView).

use super::neuron::neuron_builder;
use super::view::Identity;

neuron_builder!(ReshapeParams, |_| Identity::named("reshape"));

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
