//! TanH on the device: the hyperbolic tangent `y = tanh(x)` elementwise, the device twin of
//! `crate::layers::tanh`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (1 − y²)`, from the top's data.

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(TanhParams, |_| Activation::Tanh);

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"t\"\ntype = \"tanh\"",
        vec![vec![6, 5, 4]],
        401
    );
}
