//! ELU on the device: `y = max(x, 0) + alpha · (e^min(x, 0) − 1)` elementwise, the device twin
//! of `crate::layers::elu`. Bottom and top have the same shape `(N, ...)`.
//!
//! Backward: `dx (+)= dy · (x > 0 ? 1 : alpha · (e^x − 1) + alpha)`, from the bottom's data.

use super::neuron::neuron_builder;
use crate::cuda::kernels::Activation;

neuron_builder!(EluParams, |p| Activation::Elu { alpha: p.alpha });

#[cfg(test)]
mod tests {
    use crate::cuda::layers::testing::layer_matches_cpu;

    layer_matches_cpu! {
        matches_cpu: "name = \"e\"\ntype = \"elu\"", vec![vec![4, 3, 5, 7]], 1201;
        matches_cpu_with_alpha: "name = \"e\"\ntype = \"elu\"\nalpha = 0.3", vec![vec![3, 1000]], 1202;
    }
}
