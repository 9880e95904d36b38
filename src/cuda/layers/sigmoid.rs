//! `GpuSigmoid`: the logistic function `y = 1 / (1 + e^(−x))` elementwise, the device twin of
//! `crate::layers::sigmoid`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · y · (1 − y)`, from the top's data.

use super::neuron::{parameterless_neuron, GpuNeuron};

/// The logistic function; see the module docs.
pub type GpuSigmoid = GpuNeuron<Sigmoid>;

parameterless_neuron!(Sigmoid, "sigmoid", sigmoid_forward, sigmoid_backward, reads y);

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::{check_against_cpu, LayerCase};
    use crate::cuda::test_util::gpu_or_skip;

    #[test]
    fn matches_cpu() {
        let gpu = gpu_or_skip!("matches_cpu");
        let case = LayerCase::new("name = \"s\"\ntype = \"sigmoid\"", vec![vec![6, 5, 4]]);
        check_against_cpu(&gpu, &case, 301);
    }
}
