//! AbsVal on the device: `y = |x|`, `dx (+)= sign(x) · dy` (0 at 0), the device twin of
//! `crate::layers::abs_val`.

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(AbsValParams, |_| Activation::Abs);

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
