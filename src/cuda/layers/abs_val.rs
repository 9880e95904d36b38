//! `GpuAbsVal`: `y = |x|`, `dx (+)= sign(x) · dy` (0 at 0), the device twin of
//! `crate::layers::abs_val`.

use super::neuron::{parameterless_neuron, GpuNeuron};
use super::{BuildGpu, GpuLayer};
use crate::config::layer_params::AbsValParams;
use crate::cuda::layout::Layout;
use crate::cuda::Gpu;
use crate::error::Result;

/// Absolute value; see the module docs.
pub type GpuAbsVal = GpuNeuron<AbsVal>;

parameterless_neuron!(AbsVal, "abs_val", abs_forward, abs_backward, reads x);

impl BuildGpu for AbsValParams {
    fn build_gpu(&self, _gpu: &Gpu, _name: &str, _layout: Layout) -> Result<Box<dyn GpuLayer>> {
        Ok(Box::new(GpuAbsVal::default()))
    }
}

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
