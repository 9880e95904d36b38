//! Sigmoid on the device: the logistic function `y = 1 / (1 + e^(−x))` elementwise, the device
//! twin of `crate::layers::sigmoid`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · y · (1 − y)`, from the top's data.

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(SigmoidParams, |_| Activation::Sigmoid);

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"s\"\ntype = \"sigmoid\"",
        vec![vec![6, 5, 4]],
        301
    );
}
