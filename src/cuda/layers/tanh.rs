//! `GpuTanH`: the hyperbolic tangent `y = tanh(x)` elementwise, the device twin of
//! `crate::layers::tanh`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (1 − y²)`, from the top's data.

use super::neuron::{parameterless_neuron, GpuNeuron};

/// The hyperbolic tangent; see the module docs.
pub type GpuTanH = GpuNeuron<TanH>;

parameterless_neuron!(TanH, "tanh", tanh_forward, tanh_backward, reads y);

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn matches_cpu() {
        let gpu = gpu_or_skip!("matches_cpu");
        let case = LayerCase::new("name = \"t\"\ntype = \"tanh\"", vec![vec![6, 5, 4]]);
        check_against_cpu(&gpu, &case, 401);
    }
}
