//! `GpuPower`: `y = (shift + scale · x)^power` (defaults 1, 1, 0), the device twin of
//! `crate::layers::power`; backward `dx (+)= dy · power · scale · (shift + scale · x)^(power−1)`
//! (0 when power or scale is 0).

use super::neuron::{neuron_builder, GpuNeuron, NeuronFn, NeuronGrad, Values, ValuesMut};
use crate::cuda::Gpu;
use crate::error::Result;

/// Power; see the module docs.
pub type GpuPower = GpuNeuron<Power>;

/// The power function and its derivative.
#[derive(Debug, Clone, Copy)]
pub struct Power {
    /// `(power, scale, shift)`.
    coef: (f32, f32, f32),
}

neuron_builder!(PowerParams, |p| Power {
    coef: (p.power, p.scale, p.shift)
});

impl NeuronFn for Power {
    fn type_name(&self) -> &'static str {
        "power"
    }

    fn forward(&self, gpu: &Gpu, x: &Values<'_>, y: &mut ValuesMut<'_>, n: usize) -> Result<()> {
        gpu.kernels.power_forward(&gpu.compute, x, y, n, self.coef)
    }

    fn backward(&self, gpu: &Gpu, mut g: NeuronGrad<'_>) -> Result<()> {
        let (s, coef) = (&gpu.compute, self.coef);
        gpu.kernels
            .power_backward(s, &g.x, &g.dy, &mut g.dx, g.n, coef, g.accumulate)
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        square_matches_cpu,
        "name = \"p\"\ntype = \"power\"\npower = 2.0\nscale = 0.5\nshift = 1.0",
        vec![vec![3, 4, 5]],
        1101
    );

    // A positive base (shift 3 over inputs in [-2, 2]) for a fractional power.
    layer_matches_cpu!(
        fractional_power_matches_cpu,
        "name = \"p\"\ntype = \"power\"\npower = 1.5\nscale = 1.0\nshift = 3.0",
        vec![vec![4, 25]],
        1102
    );
}
