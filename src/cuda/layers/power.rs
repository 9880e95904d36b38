//! Power on the device: `y = (shift + scale · x)^power` (defaults 1, 1, 0), the device twin of
//! `crate::layers::power`; backward `dx (+)= dy · power · scale · (shift + scale · x)^(power−1)`
//! (0 when power or scale is 0).

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(PowerParams, |p| Activation::Power {
    power: p.power,
    scale: p.scale,
    shift: p.shift
});

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
