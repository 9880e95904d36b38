//! `GpuRelu`: the rectifier `y = x > 0 ? x : negative_slope · x` elementwise, the device twin of
//! `crate::layers::relu`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (x > 0 ? 1 : negative_slope)`, from the bottom's data.

use super::neuron::{neuron_builder, GpuNeuron, NeuronFn, NeuronGrad, Values, ValuesMut};
use crate::cuda::Gpu;
use crate::error::Result;

/// The rectifier; see the module docs.
pub type GpuRelu = GpuNeuron<Relu>;

/// The rectifier's function and derivative.
#[derive(Debug, Clone, Copy)]
pub struct Relu {
    negative_slope: f32,
}

neuron_builder!(ReluParams, |p| Relu {
    negative_slope: p.negative_slope
});

impl NeuronFn for Relu {
    fn type_name(&self) -> &'static str {
        "relu"
    }

    fn forward(&self, gpu: &Gpu, x: &Values<'_>, y: &mut ValuesMut<'_>, n: usize) -> Result<()> {
        gpu.kernels
            .relu_forward(&gpu.compute, self.negative_slope, x, y, n)
    }

    fn backward(&self, gpu: &Gpu, mut g: NeuronGrad<'_>) -> Result<()> {
        let slope = self.negative_slope;
        gpu.kernels.relu_backward(
            &gpu.compute,
            slope,
            &g.x,
            &g.dy,
            &mut g.dx,
            g.n,
            g.accumulate,
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"r\"\ntype = \"relu\"",
        vec![vec![4, 3, 5, 7]],
        201
    );

    layer_matches_cpu!(
        matches_cpu_leaky,
        "name = \"r\"\ntype = \"relu\"\nnegative_slope = 0.1",
        vec![vec![3, 1000]],
        202
    );
}
