//! `GpuSigmoid`: the logistic function `y = 1 / (1 + e^(−x))` elementwise, the device twin of
//! `crate::layers::sigmoid`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · y · (1 − y)`, from the top's data.

use super::neuron::{parameterless_neuron, GpuNeuron};
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::SigmoidParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// The logistic function; see the module docs.
pub type GpuSigmoid = GpuNeuron<Sigmoid>;

parameterless_neuron!(Sigmoid, "sigmoid", sigmoid_forward, sigmoid_backward, reads y);

impl BuildGpu for SigmoidParams {
    fn build_gpu(&self, _gpu: &Gpu, _name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuSigmoid::default()))
    }
}

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
