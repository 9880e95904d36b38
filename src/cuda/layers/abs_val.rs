//! `GpuAbsVal`: `y = |x|`, `dx (+)= sign(x) · dy` (0 at 0), the device twin of
//! `crate::layers::abs_val`.

use super::neuron::{parameterless_neuron, GpuNeuron};

/// Absolute value; see the module docs.
pub type GpuAbsVal = GpuNeuron<AbsVal>;

parameterless_neuron!(AbsVal, "abs_val", AbsValParams, abs_forward, abs_backward, reads x);

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu!(
        matches_cpu,
        "name = \"a\"\ntype = \"abs_val\"",
        vec![vec![4, 3, 5, 5]],
        1201
    );
}
