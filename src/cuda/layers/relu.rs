//! ReLU on the device: the rectifier `y = x > 0 ? x : negative_slope · x` elementwise, the device
//! twin of `crate::layers::relu`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (x > 0 ? 1 : negative_slope)`, from the bottom's data.

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(ReluParams, |p| Activation::Relu {
    negative_slope: p.negative_slope
});

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        matches_cpu: "name = \"r\"\ntype = \"relu\"", vec![vec![4, 3, 5, 7]], 201;
        matches_cpu_leaky: "name = \"r\"\ntype = \"relu\"\nnegative_slope = 0.1", vec![vec![3, 1000]], 202;
    }
}
