//! `GpuTanH`: the hyperbolic tangent `y = tanh(x)` elementwise, the device twin of
//! `crate::layers::tanh`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (1 − y²)`, from the top's data.

use super::neuron::{parameterless_neuron, GpuNeuron};

/// The hyperbolic tangent; see the module docs.
pub type GpuTanH = GpuNeuron<TanH>;

parameterless_neuron!(TanH, "tanh", TanhParams, tanh_forward, tanh_backward, reads y);

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
