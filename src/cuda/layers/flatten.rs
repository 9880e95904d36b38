//! Flatten on the device: the axes `axis ..= end_axis` merged into one, the device twin of
//! `crate::layers::flatten`. The top's shape comes from the CPU layer's shape rule (the net
//! shapes every blob); on the device the layer is a [`GpuView`](super::view::GpuView).

use super::neuron::neuron_builder;
use super::view::Identity;

neuron_builder!(FlattenParams, |_| Identity::named("flatten"));

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
